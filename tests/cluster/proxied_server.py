"""A ``halfmoon broker`` process with a ``halfmoon proxy`` in front of it, driven as one server.

It has :class:`~tests.server.conftest.ServerProcess`'s interface (the proxy's
gRPC and admin addresses, ``create_topic``, ``stop``, ``kill``), so tests
written against ``halfmoon serve`` run unchanged through the proxy.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.cluster.broker_processes import BrokerProcess
from tests.server.conftest import ServerProcess


class ProxiedServer(ServerProcess):
    def __init__(
        self, data_dir: Path, *, broker_args: tuple[str, ...] = (), **kwargs: object
    ) -> None:
        super().__init__(data_dir, **kwargs)  # type: ignore[arg-type]
        broker_settings = [s for s in self.settings if not s.startswith("server.")]
        self.broker = BrokerProcess(
            data_dir / "broker",
            extra=(
                *(arg for setting in broker_settings for arg in ("--set", setting)),
                *broker_args,
            ),
        )

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "halfmoon", "proxy",
            "--broker", self.broker.address,
            "--listen", self.grpc,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
        ]  # fmt: skip
        for setting in self.settings:  # the store and transaction keys are the broker's
            if setting.startswith("server."):
                cmd += ["--set", setting]
        return cmd

    def start(self, timeout: float = 30.0) -> ProxiedServer:
        if self.broker.process is None or self.broker.process.poll() is not None:
            self.broker.start()
        super().start(timeout)
        return self

    def stop(self, timeout: float = 20.0) -> int:
        try:
            return super().stop(timeout)
        finally:
            assert self.broker.stop(timeout) == 0, "".join(self.broker.output[-30:])

    def kill(self) -> None:
        super().kill()
        self.broker.kill()
