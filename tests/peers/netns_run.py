"""Run a command in a network namespace of its own beside a halfmoon server owning 5672.

pika's acceptance tests dial ``127.0.0.1:5672`` (and nothing else): they can
only reach halfmoon where halfmoon holds that port, which on this machine
RabbitMQ does. The harness starts this module under ``unshare -n``; it brings
the namespace's loopback up, starts ``halfmoon serve`` with its AMQP listener
on 127.0.0.1:5672 (gRPC and admin on their defaults, free in a fresh
namespace), waits for its ready line, runs the command, stops the server and
exits with the command's status. The server's output goes to ``--log``.

    unshare -n python -m tests.peers.netns_run --data-dir D --log L -- CMD...
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_LINE = "halfmoon ready"
READY_TIMEOUT = 60.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--amqp-listen", default="127.0.0.1:5672")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HALFMOON_SERVER_AMQP_LISTEN=args.amqp_listen)
    root = Path(__file__).resolve().parents[2]
    log = open(args.log, "w")  # noqa: SIM115 - open for the server's whole life
    server = subprocess.Popen(
        [sys.executable, "-m", "halfmoon", "serve", "--data-dir", args.data_dir,
         "--set", "store.segment_size=16MiB"],
        cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    ready = threading.Event()

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            log.write(line)
            log.flush()
            if READY_LINE in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT
    while not ready.wait(0.05):
        if server.poll() is not None or time.monotonic() > deadline:
            print(f"halfmoon serve did not start (see {args.log})", file=sys.stderr)
            server.kill()
            return 3
    try:
        return subprocess.run(command, env=dict(os.environ)).returncode
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
