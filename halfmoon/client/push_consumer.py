"""PushConsumer: a listener called for every message, the consumer does the rest.

Two message models, as in RocketMQ:

* **clustering** (default): the group shares the messages. Each subscribed
  topic has a receive loop (``ReceiveMessage``, long polling) that hands
  messages to the listener, at most ``concurrency`` at a time. SUCCESS acks;
  LATER (or an exception) makes the message invisible for the group's backoff
  delay, so it comes back later; once it has been delivered
  ``max_reconsume_times + 1`` times (default: the group's maximum delivery
  attempts) it is forwarded to the dead-letter queue instead.
  *Orderly* consumption (the default for FIFO groups) runs messages of one
  message group one after another; when one fails, the rest of its group in
  the batch is pushed back behind it, so order holds across retries.
* **broadcasting**: every consumer instance sees every message. Each instance
  pulls every readable queue by offset (``PullMessage``) and keeps its own
  offsets (in memory, or in ``offset_store`` — a JSON file — across restarts).
  A failing message is retried in place up to the maximum, then skipped and
  logged: broadcasting has no group-wide retry queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.client import as_config
from halfmoon.client.connection import ClientConfig
from halfmoon.client.consumer import ConsumerBase, cancel_and_wait
from halfmoon.client.errors import ClientClosed, ClientError
from halfmoon.client.message import MessageView, view_of
from halfmoon.client.route import QueueInfo
from halfmoon.client.selector import MessageSelector

log = logging.getLogger("halfmoon.client.push")


class ConsumeResult(enum.Enum):
    """What a listener answers: SUCCESS consumes the message, LATER retries it later."""

    SUCCESS = "SUCCESS"
    LATER = "LATER"


MessageListener = Callable[[MessageView], ConsumeResult | None | Awaitable[ConsumeResult | None]]

CLUSTERING = "clustering"
BROADCASTING = "broadcasting"
# After a failed receive (server restarting, say), wait this long before the next.
_RECEIVE_PAUSE = 0.5


class PushConsumer(ConsumerBase):
    """Calls ``listener(message)`` for each message of the subscribed topics.

    The listener may be a plain function (run in a worker thread) or a
    coroutine function; returning ``None`` counts as SUCCESS, raising as LATER.
    ``orderly=None`` follows the group (orderly for FIFO groups).
    """

    client_type = pb.ClientType.PUSH_CONSUMER

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector],
        listener: MessageListener,
        *,
        concurrency: int = 16,
        orderly: bool | None = None,
        max_reconsume_times: int | None = None,
        message_model: str = CLUSTERING,
        invisible_duration: float = 30.0,
        batch_size: int | None = None,
        consume_from: str = "latest",
        offset_store: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(as_config(config, **options), group, subscriptions)
        if message_model not in (CLUSTERING, BROADCASTING):
            raise ValueError(
                f"message_model must be {CLUSTERING!r} or {BROADCASTING!r}, not {message_model!r}"
            )
        if consume_from not in ("latest", "earliest"):
            raise ValueError("consume_from must be 'latest' or 'earliest'")
        if not subscriptions:
            raise ValueError("a push consumer needs at least one subscription")
        self.listener = listener
        self.concurrency = max(concurrency, 1)
        self._orderly_option = orderly
        self.max_reconsume_times = max_reconsume_times
        self.message_model = message_model
        self.invisible_duration = invisible_duration
        self._batch_size_option = batch_size
        self.consume_from = consume_from
        self.offset_store = Path(offset_store) if offset_store is not None else None
        self.offsets: dict[str, int] = {}  # broadcasting: "topic/broker@queue" -> next offset
        self._loops: list[asyncio.Task[Any]] = []
        self._workers: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(self.concurrency)
        self._async_listener = inspect.iscoroutinefunction(listener)
        self.ready = asyncio.Event()  # broadcasting: every queue has its start offset
        self.consumed = 0
        self.retried = 0
        self.dead_lettered = 0

    @property
    def orderly(self) -> bool:
        return self.fifo if self._orderly_option is None else self._orderly_option

    @property
    def max_attempts(self) -> int:
        """Deliveries before a message goes to the dead-letter queue."""
        if self.max_reconsume_times is not None:
            return self.max_reconsume_times + 1
        return self.retry_policy.max_attempts

    def _settings(self) -> pb.Settings:
        settings = super()._settings()
        if self.message_model == BROADCASTING:
            # Broadcasting pulls by offset; the server tracks it as a pull consumer.
            settings.client_type = pb.ClientType.PULL_CONSUMER
        return settings

    # -- lifecycle -------------------------------------------------------------------

    async def _on_started(self) -> None:
        await super()._on_started()
        if self.message_model == BROADCASTING:
            self._load_offsets()
            starters = []
            for topic, selector in self.subscriptions.items():
                for queue in (await self.routes.get(topic)).readable():
                    starters.append(self._start_queue(queue, selector))
            await asyncio.gather(*starters)
            self.ready.set()
        else:
            for topic, selector in self.subscriptions.items():
                self._loops.append(
                    asyncio.create_task(
                        self._receive_loop(topic, selector), name=f"halfmoon-push-{topic}"
                    )
                )
            self.ready.set()

    async def _on_closing(self) -> None:
        await cancel_and_wait(self._loops)
        if self._workers:
            await asyncio.wait(list(self._workers), timeout=self.config.request_timeout)
            await cancel_and_wait(list(self._workers))
        if self.message_model == BROADCASTING:
            self._save_offsets()

    # -- listener ------------------------------------------------------------------------

    async def _invoke(self, message: MessageView) -> ConsumeResult:
        try:
            if self._async_listener:
                result = await self.listener(message)  # type: ignore[misc]
            else:
                result = await asyncio.to_thread(self.listener, message)
                if inspect.isawaitable(result):
                    result = await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing listener means "later"
            log.info(
                "event=listener_failed message_id=%s attempt=%d error=%r",
                message.message_id,
                message.delivery_attempt,
                exc,
            )
            return ConsumeResult.LATER
        return ConsumeResult.LATER if result is ConsumeResult.LATER else ConsumeResult.SUCCESS

    async def _on_command(self, endpoint: str, command: svc.TelemetryCommand) -> None:
        if command.WhichOneof("command") != "verify_message_command":
            await super()._on_command(endpoint, command)
            return
        # consumeMessageDirectly (mqadmin queryMsgByUniqueKey -g -d): run the listener on the
        # message now, off the telemetry reader, and say how it went. Nothing is acked: the
        # message came from the operator, not from a receive.
        verify = command.verify_message_command
        self._spawn(self._verify(endpoint, verify.nonce, view_of(verify.message, endpoint)))

    async def _verify(self, endpoint: str, nonce: str, message: MessageView) -> None:
        result = await self._invoke(message)
        if result is ConsumeResult.SUCCESS:
            self._answer_verify(endpoint, nonce, pb.Code.OK, "consumed by the listener")
        else:
            self._answer_verify(
                endpoint,
                nonce,
                pb.Code.FAILED_TO_CONSUME_MESSAGE,
                "the listener answered LATER (or raised)",
            )

    # -- clustering ------------------------------------------------------------------------

    async def _receive_loop(self, topic: str, selector: MessageSelector) -> None:
        while not self._closed:
            try:
                # Never hold more messages than we can process: their invisible time runs.
                await self._slots.acquire()
                self._slots.release()
                free = self._slots._value  # noqa: SLF001 - how many workers are idle
                batch = max(
                    1,
                    min(
                        self._batch_size_option or self.receive_batch_size, free if free > 0 else 1
                    ),
                )
                messages = await self._receive(
                    topic, selector, batch, self.invisible_duration, self.long_polling_timeout
                )
            except asyncio.CancelledError:
                raise
            except ClientClosed:
                return
            except ClientError as exc:
                log.info("event=receive_failed topic=%s error=%s", topic, exc)
                await asyncio.sleep(_RECEIVE_PAUSE)
                continue
            if not messages:
                continue
            if self.orderly:
                by_group: dict[str, list[MessageView]] = {}
                for message in messages:
                    by_group.setdefault(message.message_group or message.message_id, []).append(
                        message
                    )
                for group_messages in by_group.values():
                    await self._slots.acquire()
                    self._spawn(self._consume_in_order(group_messages))
            else:
                for message in messages:
                    await self._slots.acquire()
                    self._spawn(self._consume_one(message))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._workers.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._workers.discard(t)
            self._slots.release()

        task.add_done_callback(done)

    async def _consume_one(self, message: MessageView) -> None:
        await self._settle(message, await self._invoke(message))

    async def _consume_in_order(self, messages: list[MessageView]) -> None:
        for index, message in enumerate(messages):
            result = await self._invoke(message)
            await self._settle(message, result)
            if result is ConsumeResult.LATER:
                # Keep the rest of this message group behind the failed one.
                delay = self.retry_policy.delay(message.delivery_attempt) + 1.0
                for later in messages[index + 1 :]:
                    with contextlib.suppress(ClientError):
                        await self._change_invisible(later, delay)
                return

    async def _settle(self, message: MessageView, result: ConsumeResult) -> None:
        try:
            if result is ConsumeResult.SUCCESS:
                await self._ack(message)
                self.consumed += 1
            elif message.delivery_attempt >= self.max_attempts:
                await self._forward_to_dead_letter(message, self.max_attempts)
                self.dead_lettered += 1
                log.info(
                    "event=dead_lettered message_id=%s attempts=%d",
                    message.message_id,
                    message.delivery_attempt,
                )
            else:
                await self._change_invisible(
                    message, self.retry_policy.delay(message.delivery_attempt)
                )
                self.retried += 1
        except ClientError as exc:
            # The message comes back after its invisible time anyway: at-least-once holds.
            log.warning(
                "event=settle_failed message_id=%s result=%s error=%s",
                message.message_id,
                result.value,
                exc,
            )

    # -- broadcasting ------------------------------------------------------------------------

    @staticmethod
    def _offset_key(queue: QueueInfo) -> str:
        return f"{queue.topic}/{queue.key}"

    async def _start_queue(self, queue: QueueInfo, selector: MessageSelector) -> None:
        key = self._offset_key(queue)
        if key not in self.offsets:
            self.offsets[key] = await self._query_offset(queue, self.consume_from)
        self._loops.append(
            asyncio.create_task(self._pull_loop(queue, selector), name=f"halfmoon-broadcast-{key}")
        )

    async def _pull_loop(self, queue: QueueInfo, selector: MessageSelector) -> None:
        key = self._offset_key(queue)
        batch = self._batch_size_option or self.receive_batch_size
        while not self._closed:
            try:
                messages, next_offset = await self._pull(
                    queue, self.offsets[key], batch, selector, self.long_polling_timeout
                )
            except asyncio.CancelledError:
                raise
            except ClientClosed:
                return
            except ClientError as exc:
                log.info("event=pull_failed queue=%s error=%s", key, exc)
                await asyncio.sleep(_RECEIVE_PAUSE)
                continue
            for message in messages:
                await self._consume_broadcast(message)
            self.offsets[key] = next_offset

    async def _consume_broadcast(self, message: MessageView) -> None:
        for attempt in range(1, self.max_attempts + 1):
            message.delivery_attempt = attempt
            if await self._invoke(message) is ConsumeResult.SUCCESS:
                self.consumed += 1
                return
            if attempt < self.max_attempts:
                self.retried += 1
                await asyncio.sleep(self.retry_policy.delay(attempt))
        self.dead_lettered += 1
        log.warning(
            "event=broadcast_message_skipped message_id=%s attempts=%d",
            message.message_id,
            self.max_attempts,
        )

    def _load_offsets(self) -> None:
        if self.offset_store is None or not self.offset_store.exists():
            return
        try:
            data = json.loads(self.offset_store.read_text())
            self.offsets.update({str(k): int(v) for k, v in data.get(self.group, {}).items()})
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("event=offset_store_unreadable path=%s error=%r", self.offset_store, exc)

    def _save_offsets(self) -> None:
        if self.offset_store is None:
            return
        data: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.offset_store.read_text())
        data[self.group] = dict(self.offsets)
        tmp = self.offset_store.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.offset_store)
