"""The send path: plan a batch (:mod:`produce`), append it (half messages
through the transaction service), count it, and answer with each message's
result and the future that holds once the batch is durable."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from halfmoon.broker.clock import Clock
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.encoded import EncodedMessage, plain_type
from halfmoon.broker.facade_types import ALREADY_DURABLE, Written
from halfmoon.broker.lite import LiteTopics
from halfmoon.broker.lite_names import split_lite_queue_topic
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.produce import SendResult, fanout_copies, plan_send
from halfmoon.broker.queue_select import QueueSelector
from halfmoon.broker.recall import recall_handle
from halfmoon.broker.topics import TIMER_TOPIC, TopicConfig, TopicRegistry, check_topic_name
from halfmoon.broker.trace import TraceRecorder
from halfmoon.broker.transactions import TransactionService
from halfmoon.store.api import EncodedRecord, Store


class SendPath:
    def __init__(
        self,
        store: Store,
        config: BrokerConfig,
        clock: Clock,
        topics: TopicRegistry,
        get_topic: Callable[[str], TopicConfig],
        selector: QueueSelector,
        lite: LiteTopics,
        transactions: TransactionService,
        received: Callable[[list[str]], None],
        trace: TraceRecorder | None = None,
        admit: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        # Raises to refuse a send before anything is written (a sync-replicated master short
        # of in-sync replicas: halfmoon.replication.leader).
        self._admit = admit
        self._config = config
        self._clock = clock
        self._topics = topics
        self._get_topic = get_topic  # may auto-create the topic
        self._selector = selector
        self._lite = lite
        self._transactions = transactions
        self._received = received  # the traffic counters, one topic name per message
        self._trace = trace

    def send_nowait(
        self, messages: Sequence[OutgoingMessage | EncodedMessage]
    ) -> Written[list[SendResult]]:
        if self._admit is not None:
            self._admit()
        results = self._send(messages)
        if not results:
            return Written(results, ALREADY_DURABLE)
        return Written(results, self._store.durable(max(r.end_offset for r in results)))

    def fanout_nowait(
        self, message: OutgoingMessage, others: Sequence[str]
    ) -> Written[list[SendResult]]:
        if self._admit is not None:
            self._admit()
        results = self._fanout(message, others)
        if not results:
            return Written(results, ALREADY_DURABLE)
        return Written(results, self._store.durable(max(r.end_offset for r in results)))

    def _fanout(self, message: OutgoingMessage, others: Sequence[str]) -> list[SendResult]:
        """One record for ``message`` in its topic and each of ``others``
        (``Store.append_fanout``), one message id for all. What the store cannot hold as
        one record is sent as one message per topic, with that same id: a half message
        (its transaction state is per message), a delay message still waiting (the timer
        holds one real topic per record), a lite message, an operator's resend."""
        copies = fanout_copies(message, others)
        if (
            not others
            or message.message_type is MessageType.TRANSACTION
            or message.message_type is MessageType.LITE
            or message.resent_from is not None
        ):
            return self._send(copies)
        planned = plan_send(
            copies, self._get_topic, self._selector, self._config, self._clock.now_ms()
        )
        if any(p.delayed for p in planned):
            return self._send(copies)
        appended = self._store.append_fanout(
            planned[0].record, [(p.record.topic, p.queue_id) for p in planned[1:]]
        )
        self._received([p.topic for p in planned])
        return [
            SendResult(
                message_id=p.message_id,
                topic=p.topic,
                queue_id=p.queue_id,
                queue_offset=r.queue_offset,
                commit_log_offset=r.commit_log_offset,
                end_offset=r.end_offset,
            )
            for p, r in zip(planned, appended, strict=True)
        ]

    def sends_cheaply(
        self, messages: Sequence[OutgoingMessage | EncodedMessage], others: Sequence[str] = ()
    ) -> bool:
        """Whether sending ``messages`` (each also to ``others``, a fanout's) only appends:
        every topic exists (none to create) and no transaction group member needs an index
        lookup; never blocks."""
        find = self._topics.find
        pending = self._transactions.group_pending
        return all(find(topic) is not None for topic in others) and all(
            find(m.topic) is not None
            and (
                m.message_type is not MessageType.TRANSACTION  # (an encoded message never is)
                or isinstance(m, OutgoingMessage)
                and (
                    m.transaction_group is None
                    or pending(m.transaction_group)  # a known open group: no index lookup
                )
            )
            for m in messages
        )

    def _send(self, sent: Sequence[OutgoingMessage | EncodedMessage]) -> list[SendResult]:
        if not sent:
            return []
        if any(type(m) is EncodedMessage for m in sent):
            encoded = self._send_encoded(sent)
            if encoded is not None:
                return encoded
        messages = [m.to_outgoing() if isinstance(m, EncodedMessage) else m for m in sent]
        planned = plan_send(
            list(messages), self._get_topic, self._selector, self._config, self._clock.now_ms()
        )
        for p in planned:
            lite = split_lite_queue_topic(p.record.topic)
            if lite is not None:
                self._lite.reserve(*lite)
        transaction_ids: list[str | None] = [None] * len(planned)
        if any(m.message_type is MessageType.TRANSACTION for m in messages):
            appended, transaction_ids = self._transactions.append(
                messages, planned
            )  # halves: invisible
        else:
            appended = self._store.append([p.record for p in planned])
        self._received([p.topic for p in planned])
        if self._trace is not None:
            for msg, p in zip(messages, planned, strict=True):
                if msg.resent_from is not None:  # an operator's resend of a dead letter
                    self._trace.record(
                        msg.resent_from,
                        p.topic,
                        "resent",
                        message_id=p.message_id,
                        to_topic=p.topic,
                    )
                    self._trace.record(
                        p.message_id, p.topic, "resent_from", message_id=msg.resent_from
                    )
        broker = self._config.name
        return [
            SendResult(
                message_id=p.message_id,
                topic=p.topic,
                queue_id=p.queue_id,
                queue_offset=-1
                if p.delayed
                else r.queue_offset,  # a half message: its half-queue offset
                commit_log_offset=r.commit_log_offset,
                end_offset=r.end_offset,
                transaction_id=txn,
                recall_handle=recall_handle(broker, p.topic, p.message_id, p.record, r)
                if p.delayed and r.topic == TIMER_TOPIC
                else None,
            )
            for p, r, txn in zip(planned, appended, transaction_ids, strict=True)
        ]

    def _send_encoded(
        self, messages: Sequence[OutgoingMessage | EncodedMessage]
    ) -> list[SendResult] | None:
        """Plain messages a proxy encoded (:mod:`halfmoon.broker.encoded`), stored as they
        are; None, with nothing done, when any of them needs the full path (a message not
        encoded, a topic to create, a refusal the full path words)."""
        config = self._config
        if not config.writable:
            return None
        find = self._topics.find
        select = self._selector.select
        max_body, max_group = config.max_body_size, config.max_message_group_length
        records: list[EncodedRecord] = []
        for m in messages:
            if type(m) is not EncodedMessage:
                return None
            group = m.message_group
            if not plain_type(m.message_type, group):
                return None  # only plain messages are stored as they are
            check_topic_name(m.topic)  # remembered once legal: reserved names are refused
            topic = find(m.topic)
            if (
                topic is None
                or not topic.writable
                or not topic.accepts(m.message_type)
                or len(m.body) > max_body
            ):
                return None
            if group is not None:
                if len(group) > max_group:
                    return None
                queue_id = select(topic.name, topic.queue_count, group)
            elif m.queue_id is not None:
                if not 0 <= m.queue_id < topic.queue_count:
                    return None
                queue_id = m.queue_id
            else:
                queue_id = select(topic.name, topic.queue_count)
            records.append(
                (
                    topic.name,
                    queue_id,
                    m.born_timestamp,
                    m.born_host,
                    m.body,
                    m.properties,
                    m.tag,
                    m.keys,
                )
            )
        appended = self._store.append_encoded(records)
        self._received([record[0] for record in records])
        return [
            SendResult(
                message_id=m.message_id,
                topic=r.topic,
                queue_id=r.queue_id,
                queue_offset=r.queue_offset,
                commit_log_offset=r.commit_log_offset,
                end_offset=r.end_offset,
            )
            for m, r in zip(messages, appended, strict=True)
        ]
