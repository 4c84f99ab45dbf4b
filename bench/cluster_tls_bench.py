"""What mutual TLS on the internal protocol costs: sends through a proxy to a broker process,
plaintext between them vs ``[internal]`` mutual TLS, in one run.

Two pairs of processes (one ``halfmoon broker`` and one ``halfmoon proxy
--broker`` each): ``plain`` and ``mtls``, the latter with ``internal.ca``,
``internal.cert`` and ``internal.key`` on both. The clients speak plaintext
to the proxies, so the difference is the proxy ↔ broker hop alone. Each round
runs both kinds (alternating which goes first) with ``--senders`` concurrent
senders of halfmoon's client sending batches of ``--batch`` messages for
``--seconds``; printed: messages per second, p99 batch latency, CPU per
message of the proxy and the broker (from /proc), and the ratios to
``plain``. ``--batch 1`` measures single sends (the proxy coalesces them).

    .venv/bin/python -m bench.cluster_tls_bench --rounds 3 --seconds 5 [--batch 32]

The certificates are made for the run (the ``cryptography`` package of the
test extra) and removed with it. The machine is shared: run it more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.auth_bench import Sample, comparison_table
from bench.cluster_bench import cpu_seconds
from bench.cluster_procs import BrokerServer, ProxyServer
from halfmoon.client import Message, Producer

TOPIC = "TlsBench"
BODY = b"x" * 256
KINDS = ("plain", "mtls")


class SecuredProxy(ProxyServer):
    """A proxy with extra ``--set`` settings (the [internal] files)."""

    def __init__(self, broker: BrokerServer, settings: tuple[str, ...]) -> None:
        super().__init__(broker)
        self.extra = tuple(arg for s in settings for arg in ("--set", s))

    def command(self) -> list[str]:
        return [*super().command(), *self.extra]


def _internal_settings(directory: Path) -> tuple[str, ...]:
    from tests.server.certificates import CertificateAuthority  # the test extra's cryptography

    ca = CertificateAuthority(directory, "internal CA")
    peer = ca.issue("peer")
    return (f"internal.ca={ca.bundle}", f"internal.cert={peer.cert}", f"internal.key={peer.key}")


async def _round(pair: tuple[BrokerServer, ProxyServer], args: argparse.Namespace) -> Sample:
    broker, proxy = pair
    sample = Sample()
    async with Producer(proxy.grpc, request_timeout=10) as producer:
        await producer.send_batch([Message(TOPIC, BODY)])  # warms the path
        loop = asyncio.get_running_loop()
        pids = (broker.pid, proxy.pid)
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        started = time.perf_counter()
        stop_at = loop.time() + args.seconds

        async def sender() -> None:
            batch = [Message(TOPIC, BODY) for _ in range(args.batch)]
            while loop.time() < stop_at:
                t0 = time.perf_counter()
                if args.batch == 1:
                    await producer.send(batch[0])
                else:
                    await producer.send_batch(batch)
                sample.latencies.append(time.perf_counter() - t0)
                sample.messages += len(batch)

        await asyncio.gather(*(sender() for _ in range(args.senders)))
        sample.seconds = time.perf_counter() - started
        sample.cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    return sample


async def run(args: argparse.Namespace) -> dict[str, Sample]:
    with tempfile.TemporaryDirectory(prefix="halfmoon-tls-bench-") as tmp:
        settings = {"plain": (), "mtls": _internal_settings(Path(tmp))}
        pairs: dict[str, tuple[BrokerServer, ProxyServer]] = {}
        try:
            for kind in KINDS:
                flags = tuple(arg for s in settings[kind] for arg in ("--set", s))
                broker = BrokerServer(cluster=flags).start()
                proxy = SecuredProxy(broker, settings[kind])
                pairs[kind] = (broker, proxy)
                proxy.start()
                proxy.create_topic(TOPIC)
            totals = {kind: Sample() for kind in KINDS}
            for index in range(args.rounds):
                order = KINDS if index % 2 == 0 else tuple(reversed(KINDS))
                for kind in order:
                    totals[kind].add(await _round(pairs[kind], args))
        finally:
            for broker, proxy in pairs.values():
                proxy.stop()
                broker.stop()
    return totals


def report(totals: dict[str, Sample], args: argparse.Namespace) -> str:
    header = (
        f"sends through a proxy to a broker: batch {args.batch}, {args.senders} senders, "
        f"{args.rounds} rounds x {args.seconds:g} s, 256-byte bodies; cpu = proxy + broker"
    )
    return comparison_table(header, "internal", totals)  # ratios to "plain", run first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--senders", type=int, default=4)
    args = parser.parse_args(argv)
    totals = asyncio.run(run(args))
    print(report(totals, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
