"""Every shell block of docs/ runs as printed (but benchmarks.md's, below).

Each block runs on a virtual network of its own (tests/netns/network.py): the
machines it names (``# m1``, ``# m2: ...`` comments switch machine; m1 until
one does) are network namespaces that resolve ``m1``, ``m2``, ``m3`` (and the
machine's own host name) to each other, so two machines' ``--listen
0.0.0.0:8091`` do not collide and nothing reaches this machine's other
servers. Commands run in order through ``sh``, ``export`` lines apply to
every machine of the block. A server (``halfmoon serve``, ``halfmoon broker``,
``halfmoon proxy``, ``halfmoon outbox relay``, ``etcd``) is started in the
background and waited for until it says it is ready; any other command must
exit 0. A block naming ``etcd://m1:2379`` (or ``127.0.0.1:2379``) without
starting etcd gets one on m1; a block that runs ``halfmoon`` commands without
starting a server of its own gets ``halfmoon serve`` on m1 (the server a
reader of the page has running: one per block, as each block has a network of
its own). A ```toml block whose first line is ``# FILE`` is written to FILE
before the page's commands run, and the certificates a block names under
``/etc`` are made as docs/security.md says an operator makes them. The only
substitutions are paths: the directories under ``/var/lib`` and ``/tmp/etcd``
a block writes to go to the test's temporary directory, one per machine, and
``.venv/bin/`` is the test's own interpreter's (commands run as in a checkout).

A block that cannot run carries ``<!-- not runnable: REASON -->`` on the line
before it, with one of two reasons: ``the test suite's own commands`` (then it
holds nothing but pytest commands: the nemesis suite's, which run for
minutes), or ``installs packages`` (nothing but ``./run install EXTRA`` and
``pip install '...[EXTRA]'``, each EXTRA one of pyproject.toml's and of
``./run install``'s; tests/test_run_script.py runs ``./run install`` on stubs).

docs/spark.md's blocks run in tests/spark/test_doc_commands.py, with the other Spark
jobs. docs/benchmarks.md is left out whole (LEFT_OUT): its commands run benchmarks
for minutes each; tests/bench runs short forms of them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.netns.conftest import network, network_available  # noqa: F401 - fixtures
from tests.netns.network import Host, VirtualNetwork
from tests.server.certificates import CertificateAuthority
from tests.server.conftest import ROOT

LEFT_OUT = {"benchmarks.md": "its commands run benchmarks for minutes each"}
DOCS = tuple(
    sorted(
        p.name
        for p in (ROOT / "docs").glob("*.md")
        if "```sh" in p.read_text() and p.name not in LEFT_OUT
    )
)
BLOCK = re.compile(r"(?:<!-- not runnable: (?P<reason>[^>]*?) -->\n)?```sh\n(?P<code>.*?)```", re.S)
CONFIG_FILE = re.compile(r"```toml\n# (?P<name>[\w.-]+)\n(?P<text>.*?)```", re.S)
SUITE_ONLY = "the test suite's own commands"
INSTALLS = "installs packages"
MACHINE = re.compile(r"^#\s*(m\d)\b")
SERVERS = {
    "halfmoon broker": re.compile(r"halfmoon broker ready"),
    "halfmoon proxy": re.compile(r"halfmoon ready"),
    "halfmoon serve": re.compile(r"halfmoon ready"),
    "halfmoon outbox relay": re.compile(r"outbox relay running"),
    "etcd": re.compile(r"ready to serve client requests"),
}
BROKERS = ("halfmoon serve", "halfmoon broker", "halfmoon proxy")  # what clients talk to
READY_TIMEOUT_S = 90.0
COMMAND_TIMEOUT_S = 300.0  # a Spark job starts a JVM and a session: up to 90 s here


@dataclass
class Command:
    machine: str
    text: str

    @property
    def server(self) -> str | None:
        if "--print-config" in self.text.split():  # prints and exits: no server
            return None
        return next((s for s in SERVERS if self.text.startswith(s + " ")), None)


@dataclass
class Block:
    doc: str
    index: int
    commands: list[Command] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}-{self.index}"

    @property
    def machines(self) -> list[str]:
        return sorted({"m1", *(c.machine for c in self.commands)})


def _logical_lines(code: str) -> Iterator[str]:
    pending = ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield (pending + line).strip()
        pending = ""


def parse(doc: str, index: int, code: str) -> Block:
    block = Block(doc, index)
    machine = "m1"
    for line in _logical_lines(code):
        if not line:
            continue
        if line.startswith("#"):
            found = MACHINE.match(line)
            machine = found.group(1) if found else machine
            continue
        if line.startswith("export "):
            block.exports.append(line)
            continue
        block.commands.append(Command(machine, line))
    return block


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        text = (ROOT / "docs" / doc).read_text()
        for index, match in enumerate(BLOCK.finditer(text)):
            if match.group("reason") is None:
                found.append(parse(doc, index, match.group("code")))
    return found


def test_every_doc_with_shell_blocks_is_run_or_left_out_by_name() -> None:
    with_shell = {p.name for p in (ROOT / "docs").glob("*.md") if "```sh" in p.read_text()}
    assert with_shell == set(DOCS) | set(LEFT_OUT)
    assert {"security.md", "spark.md", "toolkit.md", "configuration.md"} <= set(DOCS)


def _extras() -> set[str]:
    """The extras both pyproject.toml and ``./run install`` know."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    offered = re.search(
        r"install\)\n.*?case \"\$extra\" in\n\s*(.*?)\)", (ROOT / "run").read_text(), re.S
    )
    assert offered is not None, "./run has no install command"
    return set(declared["optional-dependencies"]) & {e.strip() for e in offered.group(1).split("|")}


def _installs(line: str) -> bool:
    found = re.fullmatch(r"\./run install (\w+)|pip install '[\w.-]+\[(\w+)\]'", line)
    return found is not None and (found.group(1) or found.group(2)) in _extras()


def test_blocks_not_run_say_why_and_hold_only_what_the_reason_allows() -> None:
    for doc in DOCS:
        for match in BLOCK.finditer((ROOT / "docs" / doc).read_text()):
            reason = match.group("reason")
            if reason is None:
                continue
            assert reason in (SUITE_ONLY, INSTALLS), f"{doc}: {reason}"
            for line in _logical_lines(match.group("code")):
                line = line.split("  #")[0].strip()
                if not line or line.startswith("#"):
                    continue
                words = [w for w in line.split() if not re.match(r"^[A-Z_]+=", w)]
                if reason == SUITE_ONLY:
                    assert words[0].endswith("/pytest"), line
                else:
                    assert _installs(line), f"{doc}: {line}"
    assert len(blocks()) >= 20  # every block but the nemesis suite's and an install


class Machines:
    """The block's machines on a virtual network; the servers it started on them."""

    def __init__(self, net: VirtualNetwork, block: Block, root: Path) -> None:
        self.root = root
        self.hosts: dict[str, Host] = {name: net.add_host(name) for name in block.machines}
        self.hosts_files: list[Path] = []
        names = "".join(f"{h.ip} {name}\n" for name, h in self.hosts.items())
        for host in self.hosts.values():
            # ip netns exec binds /etc/netns/NS/hosts over /etc/hosts for what it runs; the
            # machine's own name is its address there, as on a real machine (Spark asks).
            path = Path("/etc/netns") / host.namespace / "hosts"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"127.0.0.1 localhost\n{names}{host.ip} {socket.gethostname()}\n")
            self.hosts_files.append(path)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        # As in a checkout: its modules (examples.*) importable wherever a command runs.
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.env["PYTHONUNBUFFERED"] = "1"
        self.exports = ""
        self.servers: list[tuple[Command, subprocess.Popen[bytes], Path]] = []

    def localized(self, text: str, machine: str) -> str:
        """``text`` with the paths a machine writes, and its certificates, under this test's
        directory (one directory per machine; the certificates shared by all)."""
        own = self.root / machine
        for path in ("/var/lib/halfmoon", "/var/lib/etcd", "/tmp/etcd"):
            text = text.replace(path, str(own / path.strip("/").replace("/", "-")))
        for path in ("/etc/halfmoon/", "/etc/etcd/"):
            text = text.replace(path, str(self.root / path.strip("/").replace("/", "-")) + "/")
        return re.sub(r"(?<![\w/]).venv/bin/", f"{Path(sys.executable).parent}/", text)

    def write_config_files(self, doc: str) -> str:
        """The page's ```toml blocks that name their file, written into the working
        directory; their text."""
        written = ""
        for found in CONFIG_FILE.finditer((ROOT / "docs" / doc).read_text()):
            text = self.localized(found.group("text"), "m1")
            (self.root / found.group("name")).write_text(text)
            written += text
        return written

    def provision(self, block: Block) -> None:
        """The certificates and keys the block names under /etc, made as docs/security.md
        says an operator makes them: one CA for etcd, one for the internal protocol, one
        for the clients' side, each server's naming every machine."""
        named = " ".join([*block.exports, *(c.text for c in block.commands)])
        wanted = set(re.findall(r"/etc/(?:halfmoon|etcd)/[\w.-]+", named))
        if not wanted:
            return
        hosts = list(self.hosts)
        made: dict[str, Path] = {}
        for kind in ("etcd", "internal", "edge"):
            directory = self.root / "pki" / kind
            directory.mkdir(parents=True)
            ca = CertificateAuthority(directory, f"{kind} test CA")
            made[f"{kind}-ca"] = ca.bundle
            for name in {"etcd": ("m1", "etcd-client"), "internal": ("peer",)}.get(
                kind, ("proxy", "server")
            ):
                issued = ca.issue(name, hosts=hosts)
                made[name], made[f"{name}-key"] = issued.cert, issued.key
        sources = {
            "/etc/etcd/ca.pem": made["etcd-ca"],
            "/etc/etcd/m1.pem": made["m1"],
            "/etc/etcd/m1.key": made["m1-key"],
            "/etc/halfmoon/etcd-ca.pem": made["etcd-ca"],
            "/etc/halfmoon/etcd-client.pem": made["etcd-client"],
            "/etc/halfmoon/etcd-client.key": made["etcd-client-key"],
            "/etc/halfmoon/internal-ca.pem": made["internal-ca"],
            "/etc/halfmoon/peer.pem": made["peer"],
            "/etc/halfmoon/peer.key": made["peer-key"],
            "/etc/halfmoon/proxy.pem": made["proxy"],
            "/etc/halfmoon/proxy.key": made["proxy-key"],
            "/etc/halfmoon/server.pem": made["server"],
            "/etc/halfmoon/server.key": made["server-key"],
        }
        for path in sorted(wanted):
            target = Path(self.localized(path, "m1"))
            target.parent.mkdir(parents=True, exist_ok=True)
            if path == "/etc/halfmoon/auth.key":
                target.write_text(secrets.token_hex(32))
            else:
                assert path in sources, f"the test makes no {path}: add it to provision()"
                shutil.copy(sources[path], target)
            target.chmod(0o600)

    def _argv(self, machine: str, text: str, server: bool = False) -> list[str]:
        # A server is exec'd (its signals reach it); another command runs in the shell,
        # so a line of several (';', '|') runs whole.
        command = f"exec {text}" if server else text
        script = f"{self.exports}\n{command}" if self.exports else command
        return ["ip", "netns", "exec", self.hosts[machine].namespace, "sh", "-c", script]

    def run(self, command: Command) -> None:
        done = subprocess.run(
            self._argv(command.machine, self.localized(command.text, command.machine)),
            env=self.env, cwd=self.root, capture_output=True, text=True,
            timeout=COMMAND_TIMEOUT_S,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{command.machine}$ {command.text}\nexit {done.returncode}\n{done.stderr[-3000:]}"
        )

    def start(self, command: Command) -> None:
        assert command.server is not None
        (self.root / command.machine).mkdir(parents=True, exist_ok=True)
        log = self.root / f"server-{len(self.servers)}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                self._argv(command.machine, self.localized(command.text, command.machine), True),
                env=self.env, cwd=self.root, stdout=output, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.servers.append((command, process, log))
        ready = SERVERS[command.server]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.search(log.read_text(errors="replace")):
            said = log.read_text(errors="replace")[-3000:]
            assert process.poll() is None, f"{command.machine}$ {command.text}\n{said}"
            assert time.monotonic() < deadline, f"not ready: {command.machine}$ {command.text}"
            time.sleep(0.1)

    def start_etcd(self) -> None:
        data = self.root / "m1" / "etcd-data"
        self.start(
            Command(
                "m1",
                f"etcd --data-dir {data} --listen-client-urls http://0.0.0.0:2379 "
                "--advertise-client-urls http://m1:2379 "
                "--listen-peer-urls http://127.0.0.1:2380 "
                "--initial-advertise-peer-urls http://127.0.0.1:2380 "
                "--initial-cluster default=http://127.0.0.1:2380",
            )
        )

    def close(self) -> None:
        for _, process, _ in reversed(self.servers):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process, _ in reversed(self.servers):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for path in self.hosts_files:
            shutil.rmtree(path.parent, ignore_errors=True)


BLOCKS = blocks()
# Spark's page runs its jobs in the Spark group of workers (tests/spark/test_doc_commands.py),
# where one worker at a time runs Spark (tests/conftest.py's work_group).
SPARK_DOC = "spark.md"
NOT_SPARK = [b for b in BLOCKS if b.doc != SPARK_DOC]


def test_only_the_spark_page_runs_spark_jobs() -> None:
    for block in NOT_SPARK:
        assert not any(c.text.startswith("halfmoon spark ") for c in block.commands), block.id


@pytest.mark.slow
@pytest.mark.parametrize("block", NOT_SPARK, ids=[b.id for b in NOT_SPARK])
def test_doc_commands_run_as_printed(
    block: Block,
    network: VirtualNetwork,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    run_as_printed(block, network, tmp_path)


def run_as_printed(block: Block, network: VirtualNetwork, tmp_path: Path) -> None:  # noqa: F811
    """Run ``block`` on machines of ``network`` (see the module's docstring)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed (./run test installs it)")
    machines = Machines(network, block, tmp_path)
    try:
        machines.exports = machines.localized("\n".join(block.exports), "m1")
        machines.provision(block)
        config = machines.write_config_files(block.doc)
        starts_etcd = any(c.server == "etcd" for c in block.commands)
        names_etcd = any(
            "etcd://m1:2379" in text or "etcd://127.0.0.1:2379" in text
            for text in [*block.exports, *(c.text for c in block.commands), config]
        )
        if names_etcd and not starts_etcd:
            machines.start_etcd()
        if not any(c.server in BROKERS for c in block.commands) and any(
            c.text.startswith("halfmoon ") for c in block.commands
        ):
            machines.start(Command("m1", f"halfmoon serve --data-dir {tmp_path / 'm1' / 'data'}"))
        for command in block.commands:
            if command.server is not None:
                machines.start(command)
            else:
                machines.run(command)
        for command, process, log in machines.servers:  # all still serving at the end
            assert process.poll() is None, f"{command.text}\n{log.read_text()[-3000:]}"
    finally:
        machines.close()
