"""The relay's side table: gRPC peers of spliced connections resolve to their clients."""

from __future__ import annotations

import pytest

from halfmoon.server import client_address
from halfmoon.server.client_address import SplicedPeers, client_peer, grpc_peer


@pytest.mark.parametrize(
    "host, port, written",
    [
        ("10.0.0.7", 5555, "ipv4:10.0.0.7:5555"),
        ("::1", 80, "ipv6:[::1]:80"),
        ("fe80::1%eth0", 80, "ipv6:[fe80::1]:80"),
        ("::ffff:10.0.0.7", 1, "ipv4:10.0.0.7:1"),  # a dual-stack listener's IPv4 client
    ],
)
def test_addresses_are_written_as_grpc_writes_peers(host: str, port: int, written: str) -> None:
    assert grpc_peer(host, port) == written


class Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


def test_a_spliced_connection_resolves_to_its_client_until_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = SplicedPeers()
    monkeypatch.setattr(client_address, "SPLICED", table)
    relay, client = "ipv4:127.0.0.1:40001", "ipv4:10.0.0.7:5555"
    assert client_peer(Context(relay)) == relay  # unknown: the address as seen
    table.remember(relay, client)
    assert client_peer(Context(relay)) == client and len(table) == 1
    assert client_peer(Context("ipv4:10.9.9.9:1")) == "ipv4:10.9.9.9:1"
    # Closed: still resolved for the requests gRPC reads from the connection's last bytes.
    table.closed(relay, client)
    assert client_peer(Context(relay)) == client and len(table) == 0
    # Until FORGET_AFTER has passed (an expired entry goes at the next close).
    clock = [0.0]
    monkeypatch.setattr(client_address.time, "monotonic", lambda: clock[0])
    table.remember(relay, client)
    table.closed(relay, client)
    clock[0] += client_address.FORGET_AFTER + 1
    table.closed("ipv4:127.0.0.1:40002", "ipv4:10.0.0.8:1")
    assert client_peer(Context(relay)) == relay


def test_a_new_connection_on_the_same_port_replaces_the_old_client() -> None:
    table = SplicedPeers()
    relay = "ipv4:127.0.0.1:40001"
    table.remember(relay, "ipv4:10.0.0.7:1")
    table.closed(relay, "ipv4:10.0.0.7:1")
    table.remember(relay, "ipv4:10.0.0.8:2")
    assert table.resolve(relay) == "ipv4:10.0.0.8:2"
    table.closed(relay, "ipv4:10.0.0.7:1")  # a late close of the old one changes nothing
    assert table.resolve(relay) == "ipv4:10.0.0.8:2"
