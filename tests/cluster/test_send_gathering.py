"""How a proxy's sends to one broker are gathered into requests (``StreamSender``).

The link to the broker is a fake here, so each test decides when the broker
answers and sees exactly which request carried which sends.
"""

from __future__ import annotations

import asyncio
from typing import Any

from halfmoon.broker.message import OutgoingMessage
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.send import stream as send_stream
from halfmoon.cluster.internal.send.stream import StreamSender


class FakeLink:
    """Records the requests written; the test answers them with :meth:`answer`."""

    def __init__(self, sender: StreamSender) -> None:
        self.sender = sender
        self.requests: list[tuple[int, list[list[Any]]]] = []

    def write(self, request: bytes) -> None:
        request_id, _timeout_ms, batches = wire.decode(request)
        self.requests.append((request_id, batches))

    def cancel(self) -> None:
        pass

    def answer(self, index: int) -> None:
        request_id, batches = self.requests[index]
        answers = [[m.message_id for m in batch] for batch in batches]
        self.sender._answered(wire.encode([request_id, answers]))

    def sizes(self) -> list[int]:
        return [len(batches) for _, batches in self.requests]


def _sender(linger_s: float = send_stream.LINGER_S) -> tuple[StreamSender, FakeLink]:
    sender = StreamSender("127.0.0.1:1", (), timeout_s=30, send_port=1, linger_s=linger_s)
    link = FakeLink(sender)
    sender._current_link = lambda: link  # type: ignore[method-assign]
    return sender, link


def _send(sender: StreamSender, name: str) -> asyncio.Task[Any]:
    return asyncio.ensure_future(sender.send([OutgoingMessage("t", b"x", message_id=name)]))


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_sender_never_waits() -> None:
    async def scenario() -> None:
        sender, link = _sender(linger_s=10.0)  # a linger that would show
        for i in range(3):
            task = _send(sender, f"m{i}")
            await _turns()
            assert link.sizes() == [1] * (i + 1)  # out in the next turn, alone
            link.answer(i)
            assert await task == [f"m{i}"]

    asyncio.run(scenario())


def test_the_next_request_waits_for_the_answered_senders_to_come_back() -> None:
    async def scenario() -> None:
        sender, link = _sender(linger_s=10.0)
        first = [_send(sender, f"a{i}") for i in range(4)]
        await _turns()
        assert link.sizes() == [4]
        link.answer(0)
        await asyncio.gather(*first)
        again = [_send(sender, f"b{i}") for i in range(3)]
        await _turns()
        assert link.sizes() == [4]  # three of the four are back: the request waits
        again.append(_send(sender, "b3"))
        await _turns()
        assert link.sizes() == [4, 4]  # the fourth is back: out at once, not after the linger
        link.answer(1)
        assert [await t for t in again] == [["b0"], ["b1"], ["b2"], ["b3"]]

    asyncio.run(scenario())


def test_senders_waiting_at_an_answer_count_toward_the_next_request() -> None:
    async def scenario() -> None:
        sender, link = _sender(linger_s=10.0)
        first = [_send(sender, f"a{i}") for i in range(2)]
        await _turns()
        late = [_send(sender, f"c{i}") for i in range(2)]  # arrive while the request is out
        await _turns()
        assert link.sizes() == [2]
        link.answer(0)
        await asyncio.gather(*first)
        await _turns()
        assert link.sizes() == [2]  # 2 waiting, 2 + 2 expected
        more = [_send(sender, f"a{i}") for i in range(2)]
        await _turns()
        assert link.sizes() == [2, 4]
        link.answer(1)
        await asyncio.gather(*late, *more)

    asyncio.run(scenario())


def test_gathering_gives_up_after_the_linger() -> None:
    async def scenario() -> None:
        sender, link = _sender(linger_s=0.05)
        first = [_send(sender, f"a{i}") for i in range(8)]
        await _turns()
        link.answer(0)
        await asyncio.gather(*first)
        loop = asyncio.get_running_loop()
        started = loop.time()
        straggler = _send(sender, "b0")  # the only one to come back
        await _turns()
        assert link.sizes() == [8]
        while len(link.sizes()) < 2:  # the linger's own timer sends it
            assert loop.time() - started < 5, "the gathered request never went out"
            await asyncio.sleep(0.005)
        assert link.sizes() == [8, 1]
        assert loop.time() - started >= 0.04  # it did wait for the others first
        link.answer(1)
        assert await straggler == ["b0"]

    asyncio.run(scenario())


def _deadline_sender() -> tuple[StreamSender, FakeLink, list[object]]:
    """A sender with a short deadline and two requests in flight; the list collects what it
    reports to its ``on_failure`` (the broker found unreachable)."""
    failures: list[object] = []
    sender = StreamSender(
        "127.0.0.1:1", (), timeout_s=0.3, send_port=1, linger_s=0.0, max_in_flight=2,
        on_failure=failures.append,
    )  # fmt: skip
    link = FakeLink(sender)
    sender._current_link = lambda: link  # type: ignore[method-assign]
    return sender, link, failures


def test_a_slow_but_answering_broker_fails_only_the_late_request() -> None:
    """An overloaded broker answers late, not never: the request past its deadline fails
    alone; the requests behind it stay in flight and the broker is not reported (which would
    refuse every send to it for a moment)."""

    async def scenario() -> None:
        sender, link, failures = _deadline_sender()
        late = _send(sender, "late")
        await _turns()
        # Half its deadline later (time passing in the scenario, not a synchronisation), so
        # the request sent after the answer below is due well after this one.
        await asyncio.sleep(0.15)
        quick = _send(sender, "quick")
        await _turns()
        assert link.sizes() == [1, 1]
        link.answer(1)  # the broker answers the second request, not (yet) the first
        assert await quick == ["quick"]
        behind = _send(sender, "behind")
        await _turns()
        assert link.sizes() == [1, 1, 1]
        try:
            await late
        except wire.BrokerDeadlineExceeded:
            pass
        else:
            raise AssertionError("the unanswered request must fail with its deadline")
        assert failures == []  # alive: not reported
        assert not behind.done()  # still in flight: the stream was not reset
        link.answer(2)
        assert await behind == ["behind"]

    asyncio.run(scenario())


def test_a_silent_broker_is_reported_and_the_requests_behind_fail_at_once() -> None:
    async def scenario() -> None:
        sender, link, failures = _deadline_sender()
        first = _send(sender, "first")
        await _turns()
        second = _send(sender, "second")
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(results[0], wire.BrokerDeadlineExceeded)
        assert isinstance(results[1], wire.BrokerUnavailable)  # failed with the reset
        assert len(failures) == 1

    asyncio.run(scenario())
