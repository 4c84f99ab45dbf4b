"""Plain messages encoded by a proxy (``halfmoon.broker.encoded``): the broker stores the same
records as from the messages themselves, refuses what the full path refuses, and never
writes a malformed encoding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock, MessageType, OutgoingMessage
from halfmoon.broker.encoded import EncodedMessage, encode_for_broker, encode_message, is_plain
from halfmoon.broker.errors import IllegalMessageKey, IllegalMessageTag, IllegalTopic
from halfmoon.broker.message import IllegalPropertyKey
from halfmoon.cluster.internal import wire
from halfmoon.errors import HalfmoonError
from halfmoon.store.config import StoreConfig
from halfmoon.store.store import MessageStore

NOW_S = 1_700_000_000.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    """Two brokers over real stores with one fixed clock: one fed messages, one encodings."""
    opened = []
    for name in ("messages", "encoded"):
        store = MessageStore(
            StoreConfig(data_dir=tmp_path / name, flush="async"), clock=lambda: NOW_S
        )
        broker = Broker(store, tmp_path / name / "meta", BrokerConfig(), FakeClock())
        broker.create_topic("t", queue_count=4)
        broker.create_topic("f", queue_count=4, message_type=MessageType.FIFO)
        opened.append((broker, store))
    yield opened[0][0], opened[1][0]
    for broker, store in opened:
        broker.close()
        store.close()


def _raw(broker: Broker, offset: int) -> bytes:
    view = broker.store.read_at(offset)
    segment = broker.store._commitlog.segment_for(offset)  # type: ignore[attr-defined]
    start = offset - segment.start
    return bytes(segment.mm[start : start + view.size])


PLAIN = [
    OutgoingMessage("t", b"body", message_id="id-1"),
    OutgoingMessage(
        "t",
        b"x" * 300,
        message_id="id-2",
        tag="TagA",
        keys=["k1", "k2"],
        properties={"a": "1", "b": "\u00e9t\u00e9"},
        born_host="10.0.0.1:5000",
        born_timestamp=1_699_999_999_000,
        producer_group="pg",
    ),
    OutgoingMessage("t", b"q", message_id="id-3", queue_id=2),
    OutgoingMessage(
        "f", b"fifo", message_id="id-4", message_type=MessageType.FIFO, message_group="g1"
    ),
]


def test_the_encoded_path_stores_the_same_records_byte_for_byte(
    pair: tuple[Broker, Broker],
) -> None:
    plain, encoded = pair
    for message in PLAIN:
        assert is_plain(message)
        want = plain.send_nowait([message]).write().result
        got = encoded.send_nowait(encode_for_broker([message])).write().result
        assert got == want
        assert _raw(encoded, got[0].commit_log_offset) == _raw(plain, want[0].commit_log_offset)
        assert encoded.store.query_by_key("t" if message.topic == "t" else "f", "id-1") == (
            plain.store.query_by_key("t" if message.topic == "t" else "f", "id-1")
        )
    assert encoded.store.query_by_key("t", "k2")[0].unique_id == "id-2"


def test_a_send_of_many_encoded_messages_is_one_append(pair: tuple[Broker, Broker]) -> None:
    _, encoded = pair
    results = encoded.send_nowait(encode_for_broker(PLAIN[:3] * 3)).write().result
    assert [r.queue_id for r in results][2::3] == [2, 2, 2]
    ends = [r.end_offset for r in results]
    assert ends == sorted(ends) and len(set(ends)) == 9


def test_what_the_short_path_cannot_take_goes_the_full_way(
    pair: tuple[Broker, Broker],
) -> None:
    plain, encoded = pair
    encoded.config.auto_create_topics = True
    created = encoded.send_nowait(encode_for_broker([OutgoingMessage("new", b"x")])).write().result
    assert created[0].topic == "new" and encoded.find_topic("new") is not None
    refused = [
        OutgoingMessage("f", b"x"),  # a normal message to a FIFO topic
        OutgoingMessage("t", b"x", queue_id=9),
        OutgoingMessage("t", b"x" * (BrokerConfig().max_body_size + 1)),
        OutgoingMessage("f", b"x", message_type=MessageType.FIFO, message_group="g" * 200),
    ]
    for message in refused:
        with pytest.raises(HalfmoonError) as full:
            plain.send_nowait([message]).write()
        with pytest.raises(HalfmoonError) as short:
            encoded.send_nowait(encode_for_broker([message])).write()
        assert (type(short.value), str(short.value)) == (type(full.value), str(full.value))


def test_the_proxy_refuses_what_the_broker_would(pair: tuple[Broker, Broker]) -> None:
    with pytest.raises(IllegalMessageTag):
        encode_message(OutgoingMessage("t", b"x", tag="a|b"))
    with pytest.raises(IllegalMessageKey):
        encode_message(OutgoingMessage("t", b"x", keys=["has space"]))
    with pytest.raises(IllegalPropertyKey):
        encode_message(OutgoingMessage("t", b"x", properties={"TAGS": "sneaky"}))
    with pytest.raises(IllegalTopic):
        encode_message(OutgoingMessage("%RETRY%g", b"x"))
    # Not plain: left as they are, for the full path.
    assert not is_plain(OutgoingMessage("t", b"x", message_type=MessageType.DELAY))
    assert not is_plain(OutgoingMessage("t", b"x", message_type=MessageType.FIFO))
    assert not is_plain(OutgoingMessage("t", b"x", message_group="g"))
    kept = OutgoingMessage("t", b"x", message_type=MessageType.TRANSACTION)
    assert encode_for_broker([kept]) == [kept]


def _bad(**changes: object) -> EncodedMessage:
    encoded = encode_message(OutgoingMessage("t", b"body", message_id="id-bad", tag="x"))
    for name, value in changes.items():
        setattr(encoded, name, value)
    return encoded


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"properties": b"UNIQ_KEY\x01\xff\xfe\x02"}, "ILLEGAL_MESSAGE_FIELD"),  # not UTF-8
        ({"properties": b"no separators"}, "ILLEGAL_MESSAGE_FIELD"),
        ({"properties": b"a\x01b\x01c\x02"}, "ILLEGAL_MESSAGE_FIELD"),
        ({"properties": b"\x01value\x02"}, "ILLEGAL_MESSAGE_FIELD"),  # an empty key
        ({"properties": b"k\x01" + b"v" * 70_000 + b"\x02"}, "MESSAGE_PROPERTIES_TOO_LARGE"),
        ({"body": b"x" * (5 * 1024 * 1024)}, "MESSAGE_BODY_TOO_LARGE"),
        ({"born_host": "h" * 300}, "ILLEGAL_MESSAGE_FIELD"),
    ],
)
def test_a_malformed_encoding_is_refused_and_nothing_is_written(
    pair: tuple[Broker, Broker], changes: dict[str, object], code: str
) -> None:
    _, encoded = pair
    store = encoded.store
    before = store.stats().commit_log_max_offset
    good = encode_message(OutgoingMessage("t", b"fine", message_id="id-good"))
    with pytest.raises(HalfmoonError) as refused:
        encoded.send_nowait([good, _bad(**changes)]).write()  # all or nothing
    assert refused.value.code == code
    assert store.stats().commit_log_max_offset == before


def test_encoded_messages_cross_the_internal_protocol() -> None:
    message = encode_message(PLAIN[1])
    assert wire.decode(wire.encode([[message]])) == [[message]]
    assert message.to_outgoing() == PLAIN[1]


def test_an_encoding_claiming_another_type_goes_the_full_way(pair: tuple[Broker, Broker]) -> None:
    """Only plain messages are stored as they are: an encoded message a peer marked as a delay
    or transaction message is rebuilt and takes the full path (a half stays invisible)."""
    _, encoded = pair
    encoded.create_topic("tx", queue_count=1, message_type=MessageType.TRANSACTION)
    half = encode_message(OutgoingMessage("tx", b"x", message_id="id-half"))
    half.message_type = MessageType.TRANSACTION
    result = encoded.send_nowait([half]).write().result[0]
    assert result.transaction_id is not None  # stored as a half message, not a visible one
    assert encoded.store.max_offset("tx", 0) == 0
