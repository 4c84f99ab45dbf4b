"""A process using halfmoon's gRPC client can start children through ``fork``.

grpcio 1.80 and later restart their poller in a child forked by
``subprocess.Popen(preexec_fn=...)``; the child may die before it ``exec``s
(PySpark's gateway launch: "Java gateway process exited"). Importing halfmoon
turns grpc's fork handlers off, so none of a thousand such children dies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

FORKS = 1000  # the crash hit 0.3-1% of children here: 1000 forks all but never miss it

_CHILD = textwrap.dedent(
    f"""
    import subprocess, threading
    import halfmoon.client  # first: grpc must not be imported before halfmoon
    import grpc
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    call = grpc.insecure_channel(f"127.0.0.1:{{port}}").unary_unary("/halfmoon.Test/Nothing")
    stop = threading.Event()

    def keep_calling():  # a channel with calls in flight while the children start
        while not stop.is_set():
            try:
                call(b"", timeout=0.05)
            except grpc.RpcError:
                pass

    threading.Thread(target=keep_calling, daemon=True).start()
    died = sum(
        subprocess.Popen(["true"], preexec_fn=lambda: None, stderr=subprocess.DEVNULL).wait() != 0
        for _ in range({FORKS})
    )
    stop.set()
    print(died)
    """
)


def test_children_forked_beside_a_live_grpc_channel_reach_exec() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0", f"children that died before exec: {done.stdout.strip()}"


def test_an_explicit_choice_in_the_environment_is_kept() -> None:
    script = "import os, halfmoon; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"},
    )  # fmt: skip
    assert done.stdout.strip() == "true", done.stderr
