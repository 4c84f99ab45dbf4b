"""Concurrent sends to one broker coalesced into few internal requests (group commit).

Callers hand their batch to :meth:`SendCoalescer.submit` and get a future.
``max_in_flight`` sender threads each loop: take everything waiting (up to
``max_messages`` messages and ``max_bytes`` of bodies), send it as one
``Send`` request, and hand each caller its own results or error. Whatever
arrives while a request is in flight goes in the next one, so under load a
request carries as many sends as arrived during one round trip and one
fsync, and the broker's cost per message approaches the store's; alone, a
send goes out at once (no timer, no added latency).

Each caller's batch stays one unit on the broker (stored all or nothing, as
``send`` promises); a failure of the whole request (broker down, deadline)
fails every caller in it with that error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from halfmoon.broker.encoded import SentMessage
from halfmoon.broker.produce import SendResult
from halfmoon.cluster.internal.connection import BrokerConnection
from halfmoon.errors import HalfmoonError

DEFAULT_MAX_IN_FLIGHT = 1  # measured: 1 coalesces more (32 vs 21 per request at 64 senders)
DEFAULT_MAX_MESSAGES = 1024
DEFAULT_MAX_BYTES = 4 * 1024 * 1024

_Waiting = tuple[list[SentMessage], "Future[list[SendResult]]"]


class CoalescerClosed(HalfmoonError):
    """A send was submitted to a closed connection."""

    code = "BROKER_CONNECTION_CLOSED"
    protocol_code = "INTERNAL_SERVER_ERROR"
    http_status = 500


class SendCoalescer:
    def __init__(
        self,
        connection: BrokerConnection,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        observer: Callable[[int, int], None] | None = None,
    ) -> None:
        self._connection = connection
        self._observer = observer  # told (messages, callers' sends) of each request
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._waiting: list[_Waiting] = []
        self._changed = threading.Condition()
        self._closed = False
        self.requests = 0  # internal Send requests made
        self.sends = 0  # callers' batches carried by them
        self._threads = [
            threading.Thread(target=self._run, name=f"halfmoon-send-{i}", daemon=True)
            for i in range(max_in_flight)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, messages: Sequence[SentMessage]) -> Future[list[SendResult]]:
        future: Future[list[SendResult]] = Future()
        with self._changed:
            if self._closed:
                raise CoalescerClosed("the connection to the broker is closed")
            self._waiting.append((list(messages), future))
            self._changed.notify()
        return future

    def close(self) -> None:
        """Send what is waiting, then stop the sender threads."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=self._connection.timeout_s + 1)

    def _take(self) -> list[_Waiting] | None:
        with self._changed:
            while not self._waiting:
                if self._closed:
                    return None
                self._changed.wait()
            taken: list[_Waiting] = []
            count = size = 0
            for entry in self._waiting:
                entry_size = sum(len(m.body) for m in entry[0])
                if taken and (
                    count + len(entry[0]) > self._max_messages
                    or size + entry_size > self._max_bytes
                ):
                    break
                taken.append(entry)
                count += len(entry[0])
                size += entry_size
            del self._waiting[: len(taken)]
            self.requests += 1
            self.sends += len(taken)
        if self._observer is not None:
            self._observer(count, len(taken))
        return taken

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            try:
                answers = self._connection.send([messages for messages, _ in taken])
            except HalfmoonError as error:
                for _, future in taken:
                    future.set_exception(error)
                continue
            except Exception as exc:  # noqa: BLE001 - the callers must hear of it, not wait
                for _, future in taken:
                    future.set_exception(exc)
                continue
            for (_, future), answer in zip(taken, answers, strict=True):
                if isinstance(answer, HalfmoonError):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
