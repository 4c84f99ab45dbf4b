"""Priority messages (RocketMQ's RIP-80): a priority is a queue.

RocketMQ (5.4+) keeps its storage unchanged and maps priorities to queues:

- send: a PRIORITY message with priority ``p`` (an int >= 0) goes to queue
  ``min(p, write queues - 1)`` (``SendMessageProcessor``); a priority beyond
  the last queue is clamped, not refused. Messages of one priority keep their
  send order (one queue).
- receive: on a topic of type PRIORITY, a pop scans the queues from the
  highest queue id down (``priorityOrderAsc = true``, the default: 0 is the
  lowest priority) and stops once the batch is full
  (``PopMessageProcessor.popMsgFromTopic``), instead of starting at a rotating
  queue. So a backlog is consumed highest priority first. FIFO (orderly)
  requests never use this order. ``priority.factor`` (default 100: every
  request) is the share of requests that do; halfmoon has no such knob and
  behaves as the default.
- a priority on a message that is not a PRIORITY message (delay, FIFO,
  transaction) is dropped by the broker (``clearProperty``).

halfmoon does the same: :func:`priority_queue` at send, and the pop service
walks a priority topic's queues in :func:`scan_order` on every receive. A
message that comes back after its invisible time is redelivered in place
(halfmoon has no retry topic), so it keeps its priority: RocketMQ's
``useSeparateRetryQueue`` behaviour rather than its default, where retries
go through ``%RETRY%`` and lose it.
"""

from __future__ import annotations

from halfmoon.errors import InvalidArgument

# The wire field is an int32.
MAX_PRIORITY = 2**31 - 1


class IllegalPriority(InvalidArgument):
    code = "ILLEGAL_MESSAGE_PRIORITY"
    protocol_code = "BAD_REQUEST"  # the protocol has no priority code


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise IllegalPriority(f"message priority must be an integer, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise IllegalPriority(
            f"message priority must be 0 (lowest) or more, got {priority}; "
            "higher numbers are consumed first"
        )
    return priority


def priority_queue(priority: int, queue_count: int) -> int:
    """The queue a message of ``priority`` goes to: the priority, clamped to the last queue."""
    return min(priority, queue_count - 1)


def scan_order(queue_ids: list[int]) -> list[int]:
    """The order a receive walks a priority topic's queues: highest priority first."""
    return sorted(queue_ids, reverse=True)
