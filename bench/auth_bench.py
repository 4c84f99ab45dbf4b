"""What authentication and TLS cost: batched sends with them off, auth on, auth + TLS on,
and the two kinds of client of ``tls.mode=permissive`` (TLS and plaintext on one port).

Four ``halfmoon serve`` processes run in the same run (off; auth; auth + TLS
enforcing; auth + TLS permissive, which serves both ``perm-tls`` and
``perm-plain``), each kind in alternating order each round (none always warmer). Each round sends
batches of ``--batch`` messages from ``--senders`` concurrent senders of
halfmoon's client for ``--seconds``; the table shows messages per second,
the p99 batch latency, the server's CPU per message (from /proc) and the
ratios to "off". The issue's targets: authentication costs at most 10 %,
TLS at most 25 % of batched send throughput.

    .venv/bin/python -m bench.auth_bench --rounds 3 --seconds 5

Certificates are made for the run (the ``cryptography`` package of the
test extra) and removed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.cluster_bench import cpu_seconds
from bench.server_proc import HalfmoonServer
from halfmoon.client import Credentials, Message, Producer

TOPIC = "AuthBench"
SUPER = Credentials("bench", "bench-secret-key")
BODY = b"x" * 256


@dataclass
class Sample:
    messages: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def add(self, other: Sample) -> None:
        self.messages += other.messages
        self.seconds += other.seconds
        self.cpu += other.cpu
        self.latencies += other.latencies

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def p99_ms(self) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def cpu_us_per_message(self) -> float:
        return self.cpu / self.messages * 1e6 if self.messages else 0.0


KINDS = ("off", "auth", "auth+tls", "perm-tls", "perm-plain")
# perm-tls and perm-plain are two kinds of client of the same permissive server.
SERVER_OF = {"perm-plain": "perm-tls"}
TLS_CLIENTS = ("auth+tls", "perm-tls")


def _settings(kind: str, certs: Path) -> tuple[str, ...]:
    common = ("broker.auto_create_topics=true",)
    if kind == "off":
        return common
    auth = (*common, "auth.enabled=true", f"auth.bootstrap_access_key={SUPER.access_key}")
    if kind == "auth":
        return auth
    return (
        *auth,
        "tls.mode=" + ("permissive" if kind == "perm-tls" else "enforcing"),
        f"tls.cert={certs}/server.pem",
        f"tls.key={certs}/server.key",
    )


def _make_certificates(directory: Path) -> Path:
    from tests.server.certificates import CertificateAuthority  # the test extra's cryptography

    ca = CertificateAuthority(directory)
    issued = ca.issue("server")
    assert issued.cert == directory / "server.pem"
    return ca.bundle


async def _round(server: HalfmoonServer, kind: str, ca: Path, args: argparse.Namespace) -> Sample:
    options: dict[str, object] = {}
    if kind != "off":
        options["credentials"] = SUPER
    if kind in TLS_CLIENTS:
        options.update(tls=True, tls_root_certificates=str(ca))
    sample = Sample()
    async with Producer(server.grpc, request_timeout=10, **options) as producer:
        await producer.send_batch([Message(TOPIC, BODY)])  # creates the topic, warms the path
        loop = asyncio.get_running_loop()
        cpu_before, started = cpu_seconds(server.pid), time.perf_counter()
        stop_at = loop.time() + args.seconds

        async def sender() -> None:
            batch = [Message(TOPIC, BODY) for _ in range(args.batch)]
            while loop.time() < stop_at:
                t0 = time.perf_counter()
                await producer.send_batch(batch)
                sample.latencies.append(time.perf_counter() - t0)
                sample.messages += len(batch)

        await asyncio.gather(*(sender() for _ in range(args.senders)))
        sample.seconds = time.perf_counter() - started
        sample.cpu = cpu_seconds(server.pid) - cpu_before
    return sample


async def run(args: argparse.Namespace) -> dict[str, Sample]:
    kinds = tuple(k for k in KINDS if k in args.kinds)
    os.environ["HALFMOON_BOOTSTRAP_SECRET_KEY"] = SUPER.secret_key
    with tempfile.TemporaryDirectory(prefix="halfmoon-auth-bench-") as tmp:
        certs = Path(tmp)
        ca = _make_certificates(certs)
        started = {SERVER_OF.get(k, k) for k in kinds}
        servers = {k: HalfmoonServer(settings=_settings(k, certs)).start() for k in started}
        totals = {k: Sample() for k in kinds}
        try:
            for index in range(args.rounds):
                order = kinds if index % 2 == 0 else tuple(reversed(kinds))
                for kind in order:
                    server = servers[SERVER_OF.get(kind, kind)]
                    totals[kind].add(await _round(server, kind, ca, args))
        finally:
            for server in servers.values():
                server.stop()
    return totals


def report(totals: dict[str, Sample], args: argparse.Namespace) -> str:
    header = (
        f"batched sends: batch {args.batch}, {args.senders} senders, {args.rounds} rounds "
        f"x {args.seconds:g} s, 256-byte bodies"
    )
    return comparison_table(header, "config", totals)


def comparison_table(header: str, label: str, totals: dict[str, Sample]) -> str:
    """One line per kind: rate, p99 and CPU per message, with ratios to the first kind."""
    base = next(iter(totals.values()))
    lines = [
        header,
        f"{label:<10} {'msg/s':>10} {'ratio':>7} {'p99 ms':>8} "
        f"{'cpu us/msg':>11} {'cpu ratio':>10}",
    ]
    for kind, sample in totals.items():
        ratio = sample.rate / base.rate if base.rate else 0.0
        cpu_ratio = sample.cpu_us_per_message / base.cpu_us_per_message if base.cpu else 0.0
        lines.append(
            f"{kind:<10} {sample.rate:>10.0f} {ratio:>7.2f} {sample.p99_ms:>8.1f} "
            f"{sample.cpu_us_per_message:>11.1f} {cpu_ratio:>10.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument(
        "--kinds",
        type=lambda text: tuple(text.split(",")),
        default=KINDS,
        help=f"comma-separated subset of {','.join(KINDS)}",
    )
    args = parser.parse_args(argv)
    totals = asyncio.run(run(args))
    print(report(totals, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
