"""Where a broker group lives in etcd.

::

    /halfmoon/<cluster>/broker-groups/<group>/members/<member>   a live member (its lease):
                                                                 endpoint, role, pid
    /halfmoon/<cluster>/broker-groups/<group>/master             the master (its lease): member,
                                                                 endpoint, epoch
    /halfmoon/<cluster>/broker-groups/<group>/epoch              the group's epoch (no lease:
                                                                 survives every master)
    /halfmoon/<cluster>/broker-groups/<group>/isr                the in-sync replicas, written
                                                                 by the master of that epoch
    /halfmoon/<cluster>/broker-groups/<group>/switchover         a planned switchover asked for
                                                                 and its outcome (no lease)

``broker-groups``, not ``groups``: that directory holds consumer groups. The
master also writes ``/halfmoon/<cluster>/brokers/<group>`` under its lease,
the entry proxies route by, so a group is one broker to them, named by the
group (RocketMQ's brokerName, shared by a master and its slaves).
"""

from __future__ import annotations

from dataclasses import dataclass

from halfmoon.cluster.coordination.keys import ClusterKeys, check_name


@dataclass(frozen=True)
class GroupKeys:
    cluster: str
    group: str

    def __post_init__(self) -> None:
        check_name("broker group", self.group)

    @property
    def prefix(self) -> str:
        return f"{ClusterKeys(self.cluster).prefix}broker-groups/{self.group}/"

    @property
    def master(self) -> str:
        return self.prefix + "master"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def isr(self) -> str:
        return self.prefix + "isr"

    @property
    def switchover(self) -> str:
        """A planned switchover asked for and its outcome
        (``halfmoon.cluster.coordination.switchover``)."""
        return self.prefix + "switchover"

    def member(self, name: str) -> str:
        return self.prefix + "members/" + check_name("broker", name)

    @property
    def route(self) -> str:
        """The broker entry proxies route the group's queues by."""
        return ClusterKeys(self.cluster).broker(self.group)
