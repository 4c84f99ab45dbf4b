"""consumeMessageDirectly on the worker that holds the client's telemetry stream.

mqadmin's ``queryMsgByUniqueKey -g G -d CLIENT`` (``POST
/v1/messages/{id}/consume``): find the stored message, check that the client
is a connected consumer of the group, send it ``VerifyMessageCommand`` and
wait for its answer (:mod:`halfmoon.server.client_commands`). The admin API
runs these steps for a client connected to its own worker; in cluster mode a
proxy worker runs them for a request another worker relayed to it
(:mod:`halfmoon.cluster.proxy.command_relay`), so both paths answer alike.
"""

from __future__ import annotations

import asyncio

from halfmoon.broker.facade import Broker
from halfmoon.broker.message import MessageView
from halfmoon.server.client_commands import ClientAnswer, ClientNotConnected
from halfmoon.server.convert import wire_message
from halfmoon.server.telemetry import ClientRegistry


async def stored_message(broker: Broker, message_id: str, topic: str | None) -> MessageView:
    """The stored message with this id (in ``topic``, or in any topic); MessageNotFound or
    TopicNotFound when there is none."""
    found = await asyncio.to_thread(broker.messages_by_id, message_id, topic)
    # A dead-letter copy keeps the id: prefer the message in its own topic.
    return next((m for m in found if "%DLQ%" not in m.topic), found[0])


def holds(clients: ClientRegistry | None, client_id: str, group: str) -> bool:
    """Whether ``client_id`` is a consumer of ``group`` with a telemetry stream on this worker."""
    session = clients.get(client_id) if clients is not None else None
    return session is not None and session.group == group and session.has_stream


async def verify_here(
    clients: ClientRegistry | None,
    client_id: str,
    group: str,
    view: MessageView,
    timeout_s: float,
) -> ClientAnswer:
    """Ask ``client_id``, connected here, to consume ``view`` in its listener; its answer.

    ClientNotConnected when it is not a consumer of ``group`` with a stream here,
    ClientDidNotAnswer when it stays silent for ``timeout_s``."""
    session = clients.get(client_id) if clients is not None else None
    if clients is None or session is None or session.group != group:
        raise ClientNotConnected(
            f"no consumer {client_id!r} of group {group!r} is connected here: list them with "
            f"'halfmoon consumer status {group}'"
        )
    return await clients.replies.verify_message(
        clients.send_command, client_id, wire_message(view), timeout_s
    )


async def consume_here(
    clients: ClientRegistry,
    broker: Broker,
    client_id: str,
    group: str,
    message_id: str,
    topic: str,
    timeout_s: float,
) -> ClientAnswer:
    """The whole call for a client connected here, the message named by id and topic (what
    a relayed request carries: the message itself may exceed what etcd takes in a key)."""
    view = await stored_message(broker, message_id, topic)
    return await verify_here(clients, client_id, group, view, timeout_s)
