"""A virtual network of Linux network namespaces, for partition tests with real processes.

:class:`VirtualNetwork` makes one namespace per host (``ip netns add``), joined
to a bridge in the test's own namespace by a veth pair each, so every etcd
member, broker and proxy has an address of its own (``10.X.Y.N/24``) and the
test process reaches them all through the bridge (its address is
:attr:`VirtualNetwork.gateway`). Processes start inside a host with
:meth:`Host.wrap` (``ip netns exec NS ...``, which execs: the pid is the
program's, so SIGKILL and SIGSTOP reach it).

Faults are rules of one nftables table of the bridge family, owned by this
network and hooked only on its bridge: the bridge is a switch that drops
what it is told to. A partition drops frames between two addresses in both
directions, silently (senders see no error, TCP retransmits into the void,
as on a cut cable); loss drops a random share (``numgen random``); heal
removes every rule. Delay needs the kernel's ``netem`` queueing discipline,
which not every kernel has (:func:`netem_available`).

Everything is named ``hm<pid>...`` after the test process's pid (base 36), so a
later run can tell leftovers of a killed run (a dead pid) from a concurrent
run's, and removes them: :func:`remove_leftovers`. :meth:`VirtualNetwork.close`
kills the processes left in the namespaces and deletes the namespaces, the
bridge and the table, also when the test failed.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

PREFIX = "hm"
_networks = itertools.count()
# Names this module makes: namespaces "hm<pid36>n<k>-<host>", bridges "hm<pid36>b<k>",
# host-side veth ends "hm<pid36>v<k>h<i>", nftables tables "hm<pid36>t<k>".
OWNED = re.compile(rf"^{PREFIX}([0-9a-z]{{4}})[nbvt]")


class NetworkUnavailable(Exception):
    """Namespaces, a bridge or nftables cannot be made here."""


def base36(number: int, width: int = 4) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while number:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
    return out.rjust(width, "0")[-width:]


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkUnavailable(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable(reason: str) -> NoReturn:
    """Skip the test, saying why the network cannot be built; under ``CI=true`` fail it."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run the partition tests")
    pytest.skip(reason)


def require_tools() -> None:
    """Skip (fail under ``CI=true``) where the network cannot be built, saying why."""
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        unavailable("network namespaces need root")
    if missing:
        unavailable(
            f"{', '.join(missing)} not installed (./run test installs iproute2 and nftables)"
        )


def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (delay), tried on a namespace's loopback."""
    name = f"{PREFIX}{base36(os.getpid())}nprobe"
    run("ip", "netns", "add", name, check=False)
    try:
        done = run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                   "netem", "delay", "1ms", check=False)  # fmt: skip
        return done.returncode == 0
    finally:
        run("ip", "netns", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(name: str) -> int | None:
    match = OWNED.match(name)
    return int(match.group(1), 36) if match else None


def _kill_namespace_processes(namespace: str) -> None:
    pids = run("ip", "netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGCONT)  # a stopped process would not die until resumed
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_leftovers() -> list[str]:
    """Remove namespaces, links and tables of runs whose process is gone; what was removed.

    A run that was SIGKILLed (or lost its machine's power to a debugger) could not
    clean up; its processes may still run inside its namespaces, and are killed."""
    removed: list[str] = []
    mine = base36(os.getpid())
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = _owner(name)
        if owner is not None and base36(owner) != mine and not _alive(owner):
            _kill_namespace_processes(name)
            run("ip", "netns", "del", name, check=False)
            removed.append(name)
    for line in run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        owner = _owner(name)
        if owner is not None and base36(owner) != mine and not _alive(owner):
            run("ip", "link", "del", name, check=False)
            removed.append(name)
    # Files ip netns exec binds over /etc for a namespace (tests/test_doc_commands.py's hosts).
    etc_netns = Path("/etc/netns")
    for directory in etc_netns.iterdir() if etc_netns.is_dir() else ():
        owner = _owner(directory.name)
        if owner is not None and base36(owner) != mine and not _alive(owner):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(str(directory))
    tables = run("nft", "list", "tables", "bridge", check=False).stdout.split()
    for name in tables:
        owner = _owner(name)
        if owner is not None and base36(owner) != mine and not _alive(owner):
            run("nft", "delete", "table", "bridge", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.128.0.0/9 that no route of this namespace covers (concurrent runs too)."""
    taken = []
    for line in run("ip", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "blackhole", "prohibit"):
            word = line.split()[1]
        try:
            taken.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for _ in range(200):
        subnet = ipaddress.ip_network(
            f"10.{random.randint(128, 254)}.{random.randint(0, 255)}.0/24"
        )
        if not any(subnet.overlaps(net) for net in taken if net.prefixlen > 0):
            return subnet  # type: ignore[return-value]
    raise NetworkUnavailable("no free /24 in 10.128.0.0/9")


@dataclass
class Host:
    """One namespace with one address on the network."""

    name: str
    namespace: str
    ip: str

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace, *command]

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        return run(*self.wrap(list(command)))


@dataclass
class VirtualNetwork:
    """Hosts on one bridge, and the faults between them (see the module's docstring)."""

    hosts: dict[str, Host] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = base36(os.getpid())
        self.index = base36(next(_networks), 2)
        self.bridge = f"{PREFIX}{owner}b{self.index}"
        self.table = f"{PREFIX}{owner}t{self.index}"
        self.namespace_prefix = f"{PREFIX}{owner}n{self.index}-"
        self.veth_prefix = f"{PREFIX}{owner}v{self.index}h"
        self.subnet = _free_subnet()
        addresses = self.subnet.hosts()
        self.gateway = str(next(addresses))  # the bridge: the test process's address
        self._addresses = addresses
        self._faults: list[str] = []
        self._netem: set[str] = set()
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            run("nft", "add", "table", "bridge", self.table)
            # The bridge's own chains: frames between two hosts (forward) and frames to the
            # test process (input). Rules go in both; none is there until a fault is made.
            for chain, hook in (("between", "forward"), ("toward_gateway", "input"),
                                ("from_gateway", "output")):  # fmt: skip
                run("nft", "add", "chain", "bridge", self.table, chain,
                    f"{{ type filter hook {hook} priority 0; policy accept; }}")  # fmt: skip
        except NetworkUnavailable:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        """A new namespace with loopback up and one address on the bridge."""
        host = Host(name, f"{self.namespace_prefix}{name}", str(next(self._addresses)))
        veth = f"{self.veth_prefix}{len(self.hosts)}"
        self.hosts[name] = host
        run("ip", "netns", "add", host.namespace)
        run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
            "netns", host.namespace)  # fmt: skip
        run("ip", "link", "set", veth, "master", self.bridge, "up")
        run("ip", "-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        run("ip", "-n", host.namespace, "link", "set", "eth0", "up")
        return host

    def _address(self, end: Host | str) -> str:
        return end.ip if isinstance(end, Host) else self.hosts[end].ip if end in self.hosts else end

    def _rule(self, source: str, destination: str, verdict: str) -> None:
        if source == self.gateway:
            chain = "from_gateway"
        elif destination == self.gateway:
            chain = "toward_gateway"
        else:
            chain = "between"
        run("nft", "add", "rule", "bridge", self.table, chain,
            "ip", "saddr", source, "ip", "daddr", destination, *verdict.split())  # fmt: skip
        self._faults.append(f"{source}->{destination}: {verdict}")

    def partition(self, a: Host | str, b: Host | str, *, one_way: bool = False) -> None:
        """Drop every packet between ``a`` and ``b`` (only ``a`` → ``b`` with ``one_way``).

        An end is a :class:`Host`, a host's name, or an address (:attr:`gateway`: the
        test process)."""
        source, destination = self._address(a), self._address(b)
        self._rule(source, destination, "drop")
        if not one_way:
            self._rule(destination, source, "drop")

    def isolate(self, host: Host | str, *others: Host | str) -> None:
        """Partition ``host`` from each of ``others``."""
        for other in others:
            self.partition(host, other)

    def lose(self, a: Host | str, b: Host | str, percent: int) -> None:
        """Drop ``percent`` % of the packets between ``a`` and ``b``, each at random."""
        source, destination = self._address(a), self._address(b)
        verdict = f"numgen random mod 100 < {percent} drop"
        self._rule(source, destination, verdict)
        self._rule(destination, source, verdict)

    def delay(self, host: Host | str, milliseconds: int, jitter_ms: int = 0) -> None:
        """Delay everything ``host`` sends by ``milliseconds`` (``tc netem`` on its link)."""
        name = host.name if isinstance(host, Host) else host
        namespace = self.hosts[name].namespace
        command = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay",
                   f"{milliseconds}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])  # fmt: skip
        run("ip", "netns", "exec", namespace, *command)
        self._netem.add(namespace)

    def heal(self) -> None:
        """Remove every partition, loss and delay."""
        for chain in ("between", "toward_gateway", "from_gateway"):
            run("nft", "flush", "chain", "bridge", self.table, chain)
        for namespace in self._netem:
            run("ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", "eth0", "root",
                check=False)  # fmt: skip
        self._netem.clear()
        self._faults.clear()

    @property
    def faults(self) -> list[str]:
        return list(self._faults)

    def close(self) -> None:
        """Kill what still runs inside the hosts, delete them, the bridge and the table."""
        for host in self.hosts.values():
            _kill_namespace_processes(host.namespace)
            run("ip", "netns", "del", host.namespace, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        run("nft", "delete", "table", "bridge", self.table, check=False)
        self.hosts.clear()
