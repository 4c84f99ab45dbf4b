"""The internal protocol's codec: what it carries, and what it refuses to build."""

from __future__ import annotations

import msgpack
import pytest

from halfmoon.broker import GroupConfig, MessageType, OutgoingMessage, RetryPolicy, TopicNotFound
from halfmoon.broker.browse import ScanResult
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import DecisionSource, Resolution
from halfmoon.cluster.internal import wire
from halfmoon.errors import HalfmoonError


def test_every_listed_type_round_trips_with_tuples_bytes_and_int_keys() -> None:
    message = OutgoingMessage(
        "orders", b"\x00\xffbody", tag="t", keys=["k"], properties={"a": "b"}, queue_id=3
    )
    group = GroupConfig("billing", retry_policy=RetryPolicy(levels_ms=(1, 2, 3)))
    scan = ScanResult([], 1, 2, {"x": 1}, {0: 5, 1: 7}, False)
    value = [message, group, scan, MessageType.FIFO, TxnState.COMMITTED, (1, "two"), None]
    assert wire.decode(wire.encode(value)) == value
    assert wire.decode(wire.encode(group)).retry_policy.levels_ms == (1, 2, 3)  # still a tuple


def test_a_type_not_in_the_table_is_refused_when_encoding() -> None:
    class Secret:
        pass

    with pytest.raises(TypeError, match="cannot carry"):
        wire.encode([Secret()])


def test_decoding_builds_only_listed_types() -> None:
    forged = msgpack.packb(
        msgpack.ExtType(wire.EXT_OBJECT, msgpack.packb(["os.system", ["echo owned"]])),
        use_bin_type=True,
    )
    with pytest.raises(wire.MalformedRequest, match="unknown object type"):
        wire.decode(forged)
    with pytest.raises(wire.MalformedRequest, match="unknown extension"):
        wire.decode(msgpack.packb(msgpack.ExtType(99, b"")))
    with pytest.raises(wire.MalformedRequest):
        wire.decode(b"\xc1 not msgpack")
    with pytest.raises(wire.MalformedRequest):  # a listed type with the wrong fields
        wire.decode(
            msgpack.packb(
                msgpack.ExtType(wire.EXT_OBJECT, msgpack.packb(["TopicConfig", list(range(50))]))
            )
        )


def test_errors_cross_as_the_same_class_with_code_and_message() -> None:
    error = wire.decode(wire.encode(TopicNotFound("orders")))
    assert type(error) is TopicNotFound
    assert error.code == "TOPIC_NOT_FOUND" and "orders" in error.message
    assert error.topic == "orders"  # the attributes front ends quote come along
    unknown = wire.decode(wire.encode(HalfmoonError("x", code="SOMETHING_NEW")))
    assert type(unknown) is HalfmoonError and unknown.code == "SOMETHING_NEW"
    renamed = wire.error_from_fields(["elsewhere.NoSuchError", "ODD_CODE", "m", {}])
    assert type(renamed) is HalfmoonError and renamed.code == "ODD_CODE"
    guarded = wire.error_from_fields(
        ["halfmoon.errors.HalfmoonError", "X", "m", {"message": "no", "__class__": "no", "ok": 1}]
    )
    assert guarded.message == "m" and type(guarded) is HalfmoonError and guarded.ok == 1


def test_the_version_token_names_version_and_type_table() -> None:
    version, fingerprint = wire.version_token().split(":")
    assert int(version) == wire.WIRE_VERSION and len(fingerprint) == 16


def test_a_decisions_resolution_and_source_cross_as_themselves() -> None:
    for member in (*Resolution, *DecisionSource):
        assert wire.decode(wire.encode([member])) == [member]
        assert type(wire.decode(wire.encode(member))) is type(member)
