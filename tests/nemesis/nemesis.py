"""The nemesis: one fault at a time, drawn from a seeded RNG, until told to stop.

Each round waits 0.5 to 2 s, then draws a target (a broker, a proxy, or etcd3)
and one of:

- **kill**: SIGKILL, and a restart on the same data directory and address
  0.5 to 3 s later;
- **pause**: SIGSTOP, and SIGCONT 0.5 to 4 s later (past the 2 s lease: a
  paused master is deposed while it sleeps);
- **partition**: the target's host cut off, for 1 to 5 s, either from every
  other host and from the test process (the clients), or (half the time)
  from a random part of the other hosts only: a master that still reaches
  etcd but not its replicas, a proxy that reaches one broker but not etcd.

Every fault is logged with its time since the start, for reading a failed
run's history against. :meth:`Nemesis.heal_all` ends every fault and brings
every part back.
"""

from __future__ import annotations

import random
import threading
import time

from tests.nemesis.cluster import NemesisCluster, Part

FAULTS = ("kill", "pause", "partition")


class Nemesis:
    def __init__(
        self, cluster: NemesisCluster, seed: int, faults: tuple[str, ...] = FAULTS
    ) -> None:
        self.cluster = cluster
        self.faults = faults
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.log: list[str] = []
        self.errors: list[str] = []
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def note(self, text: str) -> None:
        self.log.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def _run(self) -> None:
        while not self.stopping.wait(self.rng.uniform(0.5, 2.0)):
            if not self.faults:
                continue  # a control run: the same load, no fault
            target = self.rng.choice(self.cluster.targets())
            fault = self.rng.choice(self.faults)
            try:
                getattr(self, fault)(target)
            except Exception as error:  # noqa: BLE001  # a restart that failed: noted, retried at heal
                self.errors.append(f"{fault} {target.name}: {error}")
                self.note(f"{fault} {target.name} failed: {str(error)[:200]}")

    def kill(self, target: Part) -> None:
        self.note(f"kill {target.name}")
        target.kill()
        self.stopping.wait(self.rng.uniform(0.5, 3.0))
        target.start()
        self.note(f"restarted {target.name}")

    def pause(self, target: Part) -> None:
        self.note(f"pause {target.name}")
        target.pause()
        self.stopping.wait(self.rng.uniform(0.5, 4.0))
        target.resume()
        self.note(f"resume {target.name}")

    def partition(self, target: Part) -> None:
        network = self.cluster.network
        others = [part for part in self.cluster.parts.values() if part is not target]
        if self.rng.random() < 0.5:
            cut = [part.host for part in others] + [network.gateway]
            self.note(f"partition {target.name} from everything")
        else:  # a partial partition: some peers reach it, others do not
            chosen = self.rng.sample(others, self.rng.randint(1, len(others) - 1))
            cut = [part.host for part in chosen]
            self.note(f"partition {target.name} from {','.join(p.name for p in chosen)}")
        network.isolate(target.host, *cut)
        self.stopping.wait(self.rng.uniform(1.0, 5.0))
        network.heal()
        self.note(f"heal {target.name}")

    def start(self) -> Nemesis:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)

    def heal_all(self) -> None:
        """No partition, nothing paused, everything running."""
        self.cluster.network.heal()
        for part in self.cluster.parts.values():
            part.resume()
        for part in self.cluster.parts.values():
            if not part.alive():
                part.start()
                self.note(f"restarted {part.name} (healing)")
        self.note("healed")
