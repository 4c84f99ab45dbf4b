import pytest

from halfmoon.errors import InvalidArgument
from halfmoon.store import (
    IllegalMessageField,
    IllegalPropertyKey,
    IllegalPropertyValue,
    IllegalQueueId,
    IllegalTopic,
    Message,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
)
from tests.store.storeutil import message, open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path, max_body_size=1000, max_properties_size=200)
    yield s
    s.close()


@pytest.mark.parametrize(
    "topic", ["", "a" * 128, "has space", "slash/topic", "dot.topic", "tab\t", "ü", "a\n", None]
)
def test_bad_topic_names_are_refused(store, topic):
    with pytest.raises(IllegalTopic) as info:
        store.append([Message(topic=topic, body=b"x")])
    assert info.value.code == "ILLEGAL_TOPIC"
    assert "letters, digits" in info.value.message


@pytest.mark.parametrize("topic", ["a", "a" * 127, "%RETRY%group_1", "Topic-9_x"])
def test_good_topic_names_are_accepted(store, topic):
    assert store.put([Message(topic=topic, body=b"x")])[0].queue_offset == 0


def test_oversize_body_is_refused(store):
    with pytest.raises(MessageBodyTooLarge) as info:
        store.append([Message(topic="t", body=b"x" * 1001)])
    assert info.value.code == "MESSAGE_BODY_TOO_LARGE" and "1001" in info.value.message
    assert store.put([Message(topic="t", body=b"x" * 1000)])


def test_record_larger_than_a_segment_is_refused(tmp_path):
    with (
        open_store(tmp_path, max_body_size=1 << 20) as s,
        pytest.raises(MessageBodyTooLarge, match="segment"),
    ):
        s.append([Message(topic="t", body=b"x" * 70_000)])


@pytest.mark.parametrize("key", ["", "a\x01b", "a\x02"])
def test_bad_property_keys_are_refused(store, key):
    with pytest.raises(IllegalPropertyKey) as info:
        store.append([Message(topic="t", body=b"", properties={key: "v"})])
    assert info.value.code == "ILLEGAL_MESSAGE_PROPERTY_KEY"


@pytest.mark.parametrize("value", ["a\x01", "\x02", 5])
def test_bad_property_values_are_refused(store, value):
    with pytest.raises(IllegalPropertyValue):
        store.append([Message(topic="t", body=b"", properties={"k": value})])


def test_properties_too_large_are_refused(store):
    with pytest.raises(MessagePropertiesTooLarge) as info:
        store.append([Message(topic="t", body=b"", properties={"k": "v" * 300})])
    assert info.value.code == "MESSAGE_PROPERTIES_TOO_LARGE"


@pytest.mark.parametrize("queue_id", [-1, 2**31, "0"])
def test_bad_queue_ids_are_refused(store, queue_id):
    with pytest.raises(IllegalQueueId):
        store.append([Message(topic="t", body=b"", queue_id=queue_id)])


@pytest.mark.parametrize(
    "field,value", [("flags", 2**31), ("born_timestamp", 2**63), ("born_host", "h" * 300)]
)
def test_out_of_range_fields_are_refused(store, field, value):
    bad = Message(topic="t", body=b"")
    setattr(bad, field, value)
    with pytest.raises(IllegalMessageField):
        store.append([bad])


def test_a_batch_with_one_bad_message_writes_nothing(store):
    before = store.stats().commit_log_max_offset
    batch = [message(0, topic="t"), message(1, topic="t"), Message(topic="bad topic", body=b"")]
    with pytest.raises(InvalidArgument):
        store.append(batch)
    assert store.stats().commit_log_max_offset == before
    assert store.max_offset("t", 0) == 0
    assert store.put([message(2, topic="t")])[0].queue_offset == 0
