"""A client id belongs to the first user that signs with it, until it goes unused."""

from __future__ import annotations

from halfmoon.server.client_owners import ClientOwners


def test_a_client_id_is_its_first_users_until_it_goes_idle() -> None:
    now = [0.0]
    owners = ClientOwners(idle_s=300, clock=lambda: now[0])
    assert owners.claim("host@1", "alice")
    assert not owners.claim("host@1", "eve")
    now[0] = 299.0
    assert owners.claim("host@1", "alice")  # in use: the claim is renewed
    now[0] = 598.0
    assert not owners.claim("host@1", "eve")
    now[0] = 600.0  # 301 s without alice: the id is free again
    assert owners.claim("host@1", "eve")
    assert not owners.claim("host@1", "alice")


def test_idle_claims_are_forgotten_so_the_map_stays_bounded() -> None:
    now = [0.0]
    owners = ClientOwners(idle_s=10, clock=lambda: now[0])
    for i in range(1000):
        owners.claim(f"c{i}", "alice")
    now[0] = 11.0
    owners.claim("fresh", "bob")
    assert len(owners) == 1
