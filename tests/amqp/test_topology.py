"""halfmoon/amqp/topology.py and exchange/: routing, redeclare rules, persistence."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from halfmoon.amqp.exchange import headers, topic
from halfmoon.amqp.names import stored_name
from halfmoon.amqp.reply_codes import AmqpChannelError
from halfmoon.amqp.topology import Exchange, LocalTopologyStore, Topology


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.b", "a.b", True), ("a.*", "a.b", True), ("a.*", "a.b.c", False),
        ("a.#", "a", True), ("a.#", "a.b.c", True), ("#", "", True), ("#.c", "a.b.c", True),
        ("a.#.c", "a.c", True), ("a.#.c", "a.x.y.c", True), ("*", "", True), ("*.*", "a", False),
        ("a.*.#", "a", False),
    ],
)  # fmt: skip
def test_topic_matching(pattern: str, key: str, expected: bool) -> None:
    assert topic.matches(pattern, {}, key, {}) is expected


def test_headers_matching_all_any_and_x_arguments() -> None:
    args = {"x-match": "all", "a": 1, "b": 2}
    assert headers.matches("", args, "", {"a": 1, "b": 2, "c": 3})
    assert not headers.matches("", args, "", {"a": 1})
    assert headers.matches("", {**args, "x-match": "any"}, "", {"b": 2})
    assert headers.matches("", {"x-match": "any-with-x", "x-k": 1}, "", {"x-k": 1})


def test_stored_names_are_distinct_and_legal() -> None:
    names = ["a.b", "a-2eb", "a_b", "é", "x" * 255, "x" * 254 + "y"]
    stored = {stored_name("", n) for n in names}
    assert len(stored) == len(names)
    for s in stored:
        assert len(s) <= 100 and all(c.isalnum() or c in "_-" for c in s)
    assert stored_name("ns", "q").startswith("ns%")


def test_routing_follows_exchange_bindings_without_looping(tmp_path: Path) -> None:
    vhost = Topology().vhost("/", "")
    vhost.declare_exchange(Exchange("x1", "fanout"), passive=False)
    vhost.declare_exchange(Exchange("x2", "fanout"), passive=False)
    vhost.declare_queue("q", "c1", passive=False, durable=True, exclusive=False,
                        auto_delete=False, arguments={})  # fmt: skip
    vhost.bind("x1", "x2", True, "", {}, "c1")
    vhost.bind("x2", "x1", True, "", {}, "c1")  # a cycle
    vhost.bind("x2", "q", False, "", {}, "c1")
    assert [q.name for q in vhost.route("x1", "k", {})] == ["q"]
    with pytest.raises(AmqpChannelError) as info:
        vhost.declare_exchange(Exchange("x1", "direct"), passive=False)
    assert info.value.code == 406


def test_durable_topology_is_saved_and_transient_is_not(tmp_path: Path) -> None:
    path = tmp_path / "amqp.json"
    topology = Topology(LocalTopologyStore(path))
    asyncio.run(topology.open())
    vhost = topology.vhost("/", "")
    vhost.declare_exchange(Exchange("keep", "topic", arguments={"b": b"\x00"}), passive=False)
    vhost.declare_exchange(Exchange("drop", "topic", durable=False), passive=False)
    for name, durable in (("kq", True), ("tq", False)):
        vhost.declare_queue(name, "c", passive=False, durable=durable, exclusive=False,
                            auto_delete=False, arguments={"x-max-length": 5})  # fmt: skip
    vhost.bind("keep", "kq", False, "a.*", {"k": 1}, "c")
    vhost.bind("keep", "tq", False, "a.*", {}, "c")
    asyncio.run(topology.save())
    reread = Topology(LocalTopologyStore(path))
    asyncio.run(reread.open())
    again = reread.vhost("/", "")
    assert set(again.exchanges) >= {"keep"} and "drop" not in again.exchanges
    assert again.exchanges["keep"].arguments == {"b": b"\x00"}
    assert set(again.queues) == {"kq"}
    assert [q.name for q in again.route("keep", "a.b", {})] == ["kq"]
