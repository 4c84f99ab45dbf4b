"""Real ``halfmoon broker`` processes for tests: started on free loopback ports, stopped or
SIGKILLed, restarted on the same port and data directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.waiting import wait_until

READY = re.compile(r"halfmoon broker ready .*internal=(\S+)(?: send_port=(\d+))?")
START_TIMEOUT_S = 30.0


class BrokerProcess:
    """One broker process; ``address`` is where its internal protocol listens."""

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "broker-a",
        fake_clock_ms: int | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wrapper: tuple[str, ...] = (),
        address: str = "127.0.0.1:0",
        own_process_group: bool = False,
    ) -> None:
        self.own_process_group = own_process_group  # os.killpg reaches it
        self.data_dir = data_dir
        self.wrapper = wrapper  # a command the broker runs under (``ip netns exec NS``)
        self.name = name
        self.fake_clock_ms = fake_clock_ms
        self.extra = extra
        self.env = dict(env or {})  # added to this process's environment (changeable per start)
        self.address = address
        self.send_port: int | None = None  # the send listener's, once started (None: off)
        self.output: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> BrokerProcess:
        command = [
            *self.wrapper,
            sys.executable,
            "-m",
            "halfmoon",
            "broker",
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,  # port 0 the first time, then the same port again
            "--flush",
            "sync",
            *self.extra,
        ]
        if self.fake_clock_ms is not None:
            command += ["--fake-clock-ms", str(self.fake_clock_ms)]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            process_group=0 if self.own_process_group else None,
        )
        ready = threading.Event()
        found: list[re.Match[str]] = []

        def drain(stream: object) -> None:  # keeps the pipe from filling up
            for line in stream:  # type: ignore[attr-defined]
                self.output.append(line)
                match = READY.search(line)
                if match and not found:
                    found.append(match)
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=drain, args=(self.process.stderr,), daemon=True).start()
        ready.wait(START_TIMEOUT_S)
        if not found:
            self.kill()
            raise RuntimeError("broker did not start:\n" + "".join(self.output[-30:]))
        self.address = found[0].group(1)
        self.send_port = int(found[0].group(2)) if found[0].group(2) else None
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return self.process.returncode

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP, then wait until every thread is stopped: the signal takes effect
        asynchronously, and a call sent in between could still be answered."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(
            lambda: _all_threads_stopped(self.pid), timeout, f"process {self.pid} to stop", 0.01
        )

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def wait_stopped(self, timeout: float = 20.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in state T (stopped), from /proc."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread exited meanwhile
        if state not in ("T", "t"):
            return False
    return True
