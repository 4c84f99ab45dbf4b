"""The virtual network itself: addresses that reach each other, partitions that really cut,
loss that really drops, and nothing left behind (also after a run that was SIGKILLed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.netns.network import Host, VirtualNetwork, remove_leftovers, run

# A TCP server inside a host: accepts and answers "ok" to every connection.
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen(); print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"ok"); c.close()
"""
# A TCP client inside a host: "ok", or the error's name.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])) as c:
        print(c.recv(2).decode())
except OSError as e:
    print(type(e).__name__)
"""


def serve(host: Host) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        host.wrap([sys.executable, "-c", SERVER, host.ip]), stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    return server


def dial(source: Host | None, target: str, timeout: float = 1.0) -> str:
    """Connect from ``source`` (None: the test process) to ``target``: "ok" or the error."""
    if source is None:
        try:
            with socket.create_connection((target, 7000), timeout=timeout) as c:
                return c.recv(2).decode()
        except OSError as exc:
            return type(exc).__name__
    return source.run(sys.executable, "-c", CLIENT, target, str(timeout)).stdout.strip()


def test_hosts_reach_each_other_until_partitioned_and_again_after_healing(
    network: VirtualNetwork,
) -> None:
    a, b, c = (network.add_host(name) for name in ("a", "b", "c"))
    servers = [serve(host) for host in (a, b)]
    try:
        assert dial(c, a.ip) == dial(c, b.ip) == dial(None, a.ip) == dial(a, b.ip) == "ok"
        network.partition(a, b)
        # Silently: no refusal, no unreachable host; the connection just never happens.
        assert dial(a, b.ip) == "TimeoutError"
        assert dial(b, a.ip) == "TimeoutError"
        assert dial(c, a.ip) == dial(c, b.ip) == dial(None, b.ip) == "ok"
        network.partition(a, network.gateway)  # the test process is an end too
        assert dial(None, a.ip) == "TimeoutError"
        assert dial(None, b.ip) == "ok"
        network.heal()
        assert dial(a, b.ip) == dial(b, a.ip) == dial(None, a.ip) == "ok"
        network.partition(a, b, one_way=True)  # a's packets to b are lost: no handshake
        assert dial(a, b.ip) == dial(b, a.ip) == "TimeoutError"
        assert network.faults == [f"{a.ip}->{b.ip}: drop"]
    finally:
        for server in servers:
            server.kill()


def test_loss_drops_about_the_share_asked(network: VirtualNetwork) -> None:
    a = network.add_host("a")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind((network.gateway, 0))
    receiver.settimeout(0.5)
    port = receiver.getsockname()[1]
    network.lose(a, network.gateway, 50)
    sender = f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(400):
    s.sendto(b"x", ("{network.gateway}", {port}))
"""
    a.run(sys.executable, "-c", sender)
    received = 0
    try:
        while True:
            receiver.recv(16)
            received += 1
    except TimeoutError:
        pass
    receiver.close()
    assert 100 < received < 300, received  # 200 expected; far from 0 and from 400


def test_close_removes_namespaces_bridge_table_and_processes(network: VirtualNetwork) -> None:
    a = network.add_host("a")
    sleeper = subprocess.Popen(a.wrap(["sleep", "600"]))
    # `ip netns exec` joins the namespace, then execs sleep: only then is it the namespace's
    # to kill (a process still on its way in is not listed by `ip netns pids`).
    deadline = time.monotonic() + 30
    while str(sleeper.pid) not in run("ip", "netns", "pids", a.namespace).stdout.split():
        assert sleeper.poll() is None, "sleep ended before it was killed"
        assert time.monotonic() < deadline, "sleep never entered the namespace"
        time.sleep(0.01)
    network.close()
    assert sleeper.wait(timeout=10) != 0  # killed
    assert a.namespace not in run("ip", "netns", "list").stdout
    assert network.bridge not in run("ip", "-o", "link", "show").stdout
    assert network.table not in run("nft", "list", "tables").stdout


BUILD_AND_HANG = """
import subprocess, sys
from tests.netns.network import VirtualNetwork
net = VirtualNetwork()
host = net.add_host("a")
subprocess.Popen(host.wrap(["sleep", "600"]))
print(host.namespace, net.bridge, net.table, flush=True)
sys.stdin.read()
"""


def test_leftovers_of_a_killed_run_are_removed(network_available: None) -> None:
    run_ = subprocess.Popen(
        [sys.executable, "-c", BUILD_AND_HANG],
        cwd=Path(__file__).resolve().parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run_.stdout is not None
    namespace, bridge, table = run_.stdout.readline().split()
    # The sleep is started, not yet in the namespace: `ip netns pids` lists it once
    # `ip netns exec` has joined it and exec'd (as in the test above).
    deadline = time.monotonic() + 30
    while not (sleepers := run("ip", "netns", "pids", namespace).stdout.split()):
        assert time.monotonic() < deadline, "sleep never entered the namespace"
        time.sleep(0.01)
    run_.kill()  # no cleanup of any kind
    run_.wait(timeout=10)
    removed = remove_leftovers()
    assert {namespace, bridge, table} <= set(removed), removed
    assert namespace not in run("ip", "netns", "list").stdout
    assert bridge not in run("ip", "-o", "link", "show").stdout
    assert table not in run("nft", "list", "tables").stdout
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in sleepers):
        assert time.monotonic() < deadline, "the killed run's process still runs"
        time.sleep(0.05)


ROOT = Path(__file__).resolve().parents[2]


def _running(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# A test run in a child pytest where namespaces cannot be made: without root (``os.geteuid``
# answering a user's id), or ``ip netns add`` refused (``VirtualNetwork`` raising).
CANNOT_CONFTEST = """
import os
from tests.netns import conftest as netns
from tests.netns.conftest import network, network_available
from tests.netns.network import NetworkUnavailable

def refused():
    raise NetworkUnavailable("ip netns add hm0000n0-a: Operation not permitted")

if os.environ["HM_CANNOT"] == "root":
    os.geteuid = lambda: 1000
else:
    netns.VirtualNetwork = refused
"""


@pytest.mark.parametrize(
    ("cannot", "reason"),
    [
        ("root", "network namespaces need root"),
        ("netns", "cannot build a virtual network: ip netns add hm0000n0-a: Operation not"),
    ],
)
@pytest.mark.parametrize("ci", [True, False], ids=["CI", "local"])
def test_without_namespaces_a_test_skips_saying_why_and_fails_under_ci(
    tmp_path: Path, cannot: str, reason: str, ci: bool
) -> None:
    (tmp_path / "conftest.py").write_text(CANNOT_CONFTEST)
    (tmp_path / "test_partition.py").write_text("def test_cut(network):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {"HM_CANNOT": cannot, "PYTHONPATH": str(ROOT), **({"CI": "true"} if ci else {})}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rfs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert reason in done.stdout, done.stdout
    if ci:
        # pytest.fail in a fixture counts as an error: the run fails (exit status 1) either way.
        assert done.returncode == 1 and "1 error" in done.stdout, done.stdout
        assert "CI must run the partition tests" in done.stdout
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout
