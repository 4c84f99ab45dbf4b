"""Lite topic names (RIP-83): which store queue holds a lite topic, and which names are legal.

A lite topic is a child of a parent topic of type ``lite``; each one has its
own queue. RocketMQ stores it as the light message queue
``%LMQ%$<parent>$<lite>``. halfmoon's store allows only letters, digits,
``%``, ``_`` and ``-`` in topic names, so the queue is the store topic
``%LITE%<parent>%<lite>`` (queue 0): lite names never contain ``%``, so the
last ``%`` separates them even when the parent's name has one.

Legal lite topic names are RocketMQ's proxy rule: 1 to ``max_size``
characters from letters, digits, ``-`` and ``_`` (64 by default, the
``max_lite_topic_size`` consumers get in their settings). Every place that
takes a lite topic name (send, SyncLiteSubscription, ack, change invisible
duration, dead-letter, the admin API) checks it here and refuses a bad one
with ``ILLEGAL_LITE_TOPIC``.
"""

from __future__ import annotations

import re

from halfmoon.errors import InvalidArgument

LITE_QUEUE_PREFIX = "%LITE%"
DEFAULT_MAX_LITE_TOPIC_SIZE = 64
# The store's limit on topic names; a lite queue's name must fit in it.
MAX_STORE_TOPIC_LENGTH = 127
_LITE_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


class IllegalLiteTopic(InvalidArgument):
    code = "ILLEGAL_LITE_TOPIC"


class LiteTopicQuotaExceeded(InvalidArgument):
    """A send would create one lite topic more than the parent topic may have."""

    code = "LITE_TOPIC_QUOTA_EXCEEDED"


class LiteSubscriptionQuotaExceeded(InvalidArgument):
    """A consumer would subscribe to more lite topics than its quota allows."""

    code = "LITE_SUBSCRIPTION_QUOTA_EXCEEDED"


def check_lite_topic(
    name: object, parent: str = "", max_size: int = DEFAULT_MAX_LITE_TOPIC_SIZE
) -> str:
    """``name`` if it is a legal lite topic name (under ``parent``); else IllegalLiteTopic."""
    if not isinstance(name, str) or not name.strip():
        raise IllegalLiteTopic("lite topic name is empty; name the lite topic (e.g. session-42)")
    if len(name) > max_size:
        raise IllegalLiteTopic(
            f"lite topic {name[:80]!r} is {len(name)} characters long; the limit is {max_size}"
        )
    if not _LITE_NAME.match(name):
        raise IllegalLiteTopic(
            f"illegal lite topic {name!r}: use letters, digits, '-' and '_' only"
        )
    if parent and len(lite_queue_topic_unchecked(parent, name)) > MAX_STORE_TOPIC_LENGTH:
        raise IllegalLiteTopic(
            f"lite topic {name!r} under {parent!r} is too long: the parent and lite topic "
            "names together may have at most "
            f"{MAX_STORE_TOPIC_LENGTH - len(LITE_QUEUE_PREFIX) - 1} "
            "characters"
        )
    return name


def lite_queue_topic_unchecked(parent: str, lite_topic: str) -> str:
    return f"{LITE_QUEUE_PREFIX}{parent}%{lite_topic}"


def lite_queue_topic(
    parent: str, lite_topic: str, max_size: int = DEFAULT_MAX_LITE_TOPIC_SIZE
) -> str:
    """The store topic (queue 0) that holds ``lite_topic`` of ``parent``."""
    check_lite_topic(lite_topic, parent, max_size)
    return lite_queue_topic_unchecked(parent, lite_topic)


def split_lite_queue_topic(name: str) -> tuple[str, str] | None:
    """(parent, lite topic) of a lite queue's store topic; None for any other topic."""
    if not name.startswith(LITE_QUEUE_PREFIX):
        return None
    parent, sep, lite = name[len(LITE_QUEUE_PREFIX) :].rpartition("%")
    if not sep or not parent or not lite:
        return None
    return parent, lite


def parent_topic_of(name: str) -> str | None:
    split = split_lite_queue_topic(name)
    return split[0] if split is not None else None
