"""The AMQP 0-9-1 front end (docs/amqp.md): pika, aio-pika, kombu and Celery against halfmoon.

A front end like the gRPC servicer: it reaches the broker through the facade
(:mod:`halfmoon.broker.facade`) only. :class:`AmqpServer` listens; one
module per protocol object (connection, channel, consumer, transaction,
exchange types, topology) holds the rest.
"""

from halfmoon.amqp.server import AmqpServer

__all__ = ["AmqpServer"]
