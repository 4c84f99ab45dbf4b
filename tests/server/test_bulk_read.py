"""``halfmoon.v1.BulkRead`` against a real ``halfmoon serve``: the guarantees of PullMessage,
many messages per answer.

Committed messages only (pending and rolled-back transactions never appear;
a pending one appears once committed), filters run on the broker, bounds and
retention answer ILLEGAL_OFFSET with a stable status, bad input gets a clear
BAD_REQUEST (or the broker's own code) and the server keeps serving, and with
authentication on a caller needs Sub on the topic and on the group, as for
PullMessage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import msgpack
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.bulkread.format import METHOD, BulkAnswer, BulkRequest
from halfmoon.client import Message, SyncProducer
from halfmoon.client.credentials import Credentials
from halfmoon.client.errors import Forbidden, Unauthorized
from halfmoon.spark.wire import Queue, Wire
from tests.server.conftest import ServerProcess, wait_until

GROUP = "bulk-readers"
Code = pb.Code


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-bulk")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def call(server: ServerProcess, payload: bytes, timeout: float = 10.0) -> BulkAnswer:
    with grpc.insecure_channel(server.grpc) as channel:
        raw = channel.unary_unary(METHOD)(payload, timeout=timeout)
    return BulkAnswer.decode(raw)


def read(server: ServerProcess, topic: str, offset: int = 0, **fields: object) -> BulkAnswer:
    request = BulkRequest(group=GROUP, topic=topic, queue_id=0, offset=offset, **fields)  # type: ignore[arg-type]
    return call(server, request.encode())


def fill(server: ServerProcess, topic: str, messages: list[Message]) -> None:
    with SyncProducer(server.grpc) as producer:
        producer.send_batch(messages)


def test_one_answer_carries_the_whole_range_as_columns(server: ServerProcess) -> None:
    server.create_topic("bulk-plain", queues=1)
    fill(
        server,
        "bulk-plain",
        [
            Message("bulk-plain", b"m%d" % i, tag="t", keys=[f"k{i}"], properties={"n": str(i)})
            for i in range(3000)
        ],
    )
    answer = read(server, "bulk-plain", max_messages=5000)
    assert (answer.code, answer.status, answer.count) == (Code.OK, "FOUND", 3000)
    assert answer.next_offset == 3000 and (answer.min_offset, answer.max_offset) == (0, 3000)
    columns = answer.columns
    assert columns["queue_offset"] == list(range(3000))
    assert columns["body"][7] == b"m7" and columns["keys"][7] == ["k7"]
    assert columns["properties"][7] == {"n": "7"} and columns["tag"][7] == "t"
    assert set(columns["topic"]) == {"bulk-plain"} and set(columns["message_type"]) == {"NORMAL"}
    assert all(len(m) == 34 for m in columns["message_id"])

    # Bounds: count, bytes (at least one message), and the end of the asked range.
    assert read(server, "bulk-plain", max_messages=10).columns["queue_offset"] == list(range(10))
    tiny = read(server, "bulk-plain", 5, max_bytes=1)
    assert tiny.count == 1 and tiny.next_offset == 6
    ranged = read(server, "bulk-plain", 100, end_offset=150)
    assert ranged.columns["queue_offset"] == list(range(100, 150)) and ranged.next_offset == 150
    at_end = read(server, "bulk-plain", 3000)
    assert (at_end.code, at_end.status, at_end.count) == (Code.OK, "NO_MESSAGE", 0)
    past = read(server, "bulk-plain", 3500)
    assert (past.code, past.status) == (Code.ILLEGAL_OFFSET, "OFFSET_OVERFLOW")
    assert past.next_offset == 3000 and "[0, 3000]" in past.message


def test_only_committed_messages_are_read(server: ServerProcess) -> None:
    server.create_topic("bulk-mixed", message_type="mixed", queues=1)
    fill(server, "bulk-mixed", [Message("bulk-mixed", b"plain-%d" % i) for i in range(3)])
    wire = Wire(server.grpc)
    wire.send_halves([Message("bulk-mixed", b"committed")], "bulk-g-commit")
    wire.end_group("bulk-g-commit", "bulk-mixed", commit=True)
    wire.send_halves([Message("bulk-mixed", b"rolled-back")], "bulk-g-rollback")
    wire.end_group("bulk-g-rollback", "bulk-mixed", commit=False)
    wire.send_halves([Message("bulk-mixed", b"pending")], "bulk-g-pending")
    fill(server, "bulk-mixed", [Message("bulk-mixed", b"after")])

    answer = read(server, "bulk-mixed")
    assert answer.columns["body"] == [b"plain-0", b"plain-1", b"plain-2", b"committed", b"after"]
    committed = answer.columns["body"].index(b"committed")
    assert answer.columns["message_type"][committed] == "TRANSACTION"
    assert answer.columns["properties"][committed] == {}  # the group property never leaks

    wire.end_group("bulk-g-pending", "bulk-mixed", commit=True)
    later = read(server, "bulk-mixed", answer.next_offset)
    assert later.columns["body"] == [b"pending"]


def test_filters_run_on_the_broker_and_never_pass_the_end(server: ServerProcess) -> None:
    server.create_topic("bulk-filtered", queues=1)
    fill(
        server,
        "bulk-filtered",
        [
            Message("bulk-filtered", b"%d" % i, tag="even" if i % 2 == 0 else "odd",
                    properties={"n": str(i)})
            for i in range(20)
        ],
    )  # fmt: skip
    tagged = read(server, "bulk-filtered", filter_kind="TAG", filter_expression="odd")
    assert tagged.columns["queue_offset"] == list(range(1, 20, 2)) and tagged.next_offset == 20
    sql = read(server, "bulk-filtered", filter_kind="SQL92", filter_expression="n >= 15")
    assert sql.columns["body"] == [b"15", b"16", b"17", b"18", b"19"]
    ranged = read(
        server, "bulk-filtered", 0, end_offset=5, filter_kind="SQL92", filter_expression="n >= 15"
    )
    assert (ranged.status, ranged.count, ranged.next_offset) == ("NO_MATCHED_MESSAGE", 0, 5)
    bad = read(server, "bulk-filtered", filter_kind="SQL92", filter_expression="n >")
    assert bad.code == Code.ILLEGAL_FILTER_EXPRESSION and bad.status == "ILLEGAL_FILTER_EXPRESSION"


def test_an_empty_read_long_polls_until_a_message_arrives(server: ServerProcess) -> None:
    server.create_topic("bulk-poll", queues=1)
    timer = threading.Timer(0.5, lambda: fill(server, "bulk-poll", [Message("bulk-poll", b"late")]))
    began = time.monotonic()
    timer.start()
    try:
        answer = read(server, "bulk-poll", wait_ms=10_000)
    finally:
        timer.join()
    assert answer.columns["body"] == [b"late"] and time.monotonic() - began < 8
    empty = read(server, "bulk-poll", 1, wait_ms=300)
    assert (empty.status, empty.count) == ("NO_MESSAGE", 0)


@pytest.mark.parametrize(
    ("payload", "code", "words"),
    [
        (b"\xc1 not msgpack", Code.BAD_REQUEST, "not valid msgpack"),
        (msgpack.packb([1, 2]), Code.BAD_REQUEST, "msgpack map"),
        (msgpack.packb({"v": 2, "group": "g"}), Code.BAD_REQUEST, "version 2 is not supported"),
        (msgpack.packb({"v": 1, "topic": "bulk-plain", "queue_id": 0, "offset": 0}),
         Code.BAD_REQUEST, "group is missing"),
        (BulkRequest(GROUP, "bulk-plain", 0, "7").encode(),  # type: ignore[arg-type]
         Code.BAD_REQUEST, "offset must be int"),
        (msgpack.packb({"v": 1, "group": GROUP, "topic": "bulk-plain", "queue_id": 0,
                        "offset": 0, "colour": "red"}), Code.BAD_REQUEST, "unknown request fields"),
        (BulkRequest(GROUP, "bulk-plain", 0, -1).encode(), Code.ILLEGAL_OFFSET, ">= 0"),
        (BulkRequest(GROUP, "bulk-plain", 0, 0, max_messages=0).encode(),
         Code.BAD_REQUEST, "max_messages must be 1 to 16384"),
        (BulkRequest(GROUP, "bulk-plain", 0, 0, max_bytes=1 << 30).encode(),
         Code.BAD_REQUEST, "max_bytes"),
        (BulkRequest(GROUP, "bulk-plain", 0, 9, end_offset=3).encode(),
         Code.ILLEGAL_OFFSET, "before offset"),
        (BulkRequest(GROUP, "bulk-plain", 99, 0).encode(), Code.BAD_REQUEST, "queue"),
        (BulkRequest(GROUP, "no-such-topic", 0, 0).encode(), Code.TOPIC_NOT_FOUND, "no-such"),
        (BulkRequest("", "bulk-plain", 0, 0).encode(), Code.BAD_REQUEST, "group is missing"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_clear_answer_and_the_server_keeps_serving(
    server: ServerProcess, payload: bytes, code: int, words: str
) -> None:
    if "bulk-plain" not in server.cli("topic", "list").stdout:
        server.create_topic("bulk-plain", queues=1)
    answer = call(server, payload)
    assert answer.code == code, answer
    assert words in answer.message and answer.count == 0
    assert server.alive()


def test_retention_answers_offset_too_small_with_the_oldest_kept_offset(tmp_path) -> None:
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "store.segment_size=1MiB",
            "store.retention_hours=0.0002",
            "store.retention_check_interval=0.2",
        ),
    ).start()
    try:
        server.create_topic("bulk-short", queues=1)
        with SyncProducer(server.grpc) as producer:
            for _ in range(6):
                producer.send_batch([Message("bulk-short", b"x" * 60_000) for _ in range(8)])
        wire = Wire(server.grpc)
        queue = wire.queues("bulk-short")[0]
        earliest = wait_until(
            lambda: wire.query_offset(queue, "earliest"), 30, "retention to remove segments"
        )
        answer = read(server, "bulk-short", 0)
        assert (answer.code, answer.status, answer.count) == (
            Code.ILLEGAL_OFFSET,
            "OFFSET_TOO_SMALL",
            0,
        )
        assert answer.next_offset >= earliest and answer.min_offset == answer.next_offset
        kept = read(server, "bulk-short", answer.next_offset)
        assert kept.code == Code.OK and kept.columns["queue_offset"][0] == answer.next_offset
    finally:
        server.stop()


# -- authentication and authorization ----------------------------------------------------------

ROOT_USER = ("root", "root-secret-key")


def test_with_authentication_a_reader_needs_sub_on_the_topic_and_the_group(tmp_path) -> None:
    server = ServerProcess(
        tmp_path / "data",
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT_USER[1]},
        credentials=ROOT_USER,
    ).start()
    try:
        server.create_topic("bulk-secret", message_type="mixed", queues=1)
        server.create_group(GROUP)
        for user in ("topic-only", "reader"):
            done = server.cli("user", "create", user, "--user-secret", f"{user}-secret-key")
            assert done.returncode == 0, done.stderr
        grants = [
            ("topic-only", "Topic:bulk-secret", "Sub"),
            ("reader", "Topic:bulk-secret", "Sub"),
            ("reader", f"Group:{GROUP}", "Sub"),
        ]
        for user, resource, actions in grants:
            done = server.cli(
                "acl", "create", f"User:{user}", "--resource", resource, "--actions", actions
            )
            assert done.returncode == 0, done.stderr
        root = Credentials(*ROOT_USER)
        Wire(server.grpc, root).send_halves([Message("bulk-secret", b"x")], "bulk-auth")
        Wire(server.grpc, root).end_group("bulk-auth", "bulk-secret", commit=True)
        queue = Queue("bulk-secret", 0, "", server.grpc)

        def bulk(credentials: Credentials | None) -> BulkAnswer:
            return Wire(server.grpc, credentials).bulk_read(GROUP, queue, 0, None, 10, 1 << 20)

        with pytest.raises(Unauthorized):
            bulk(None)
        with pytest.raises(Unauthorized):
            bulk(Credentials("reader", "a-wrong-secret"))
        with pytest.raises(Forbidden, match=f"Group:{GROUP}"):
            bulk(Credentials("topic-only", "topic-only-secret-key"))
        assert bulk(Credentials("reader", "reader-secret-key")).columns["body"] == [b"x"]
    finally:
        server.stop()
