"""The server's own settings: where it listens and how it paces its work.

Durations are float seconds here; the whole-program config
(``halfmoon.config``) reads ``500ms`` / ``6s`` / ``1m`` and converts.
"""

from __future__ import annotations

from dataclasses import dataclass

from halfmoon.errors import InvalidArgument


@dataclass
class ServerConfig:
    # gRPC endpoint (apache.rocketmq.v2.MessagingService). Port 0 binds a free port;
    # the ready line reports the real one.
    listen: str = "127.0.0.1:8081"
    # Admin HTTP API (JSON + /metrics), served by halfmoon.server.admin.
    admin_listen: str = "127.0.0.1:8082"
    # Longest a ReceiveMessage / PullMessage may wait for a message (the client asks
    # for less or more; RocketMQ's proxy caps at 20-30 s).
    long_polling_max: float = 30.0
    # Long-polling timeout announced to consumers in their Settings.
    long_polling_default: float = 20.0
    # How long a clean shutdown waits for in-flight RPCs before cancelling them.
    shutdown_grace: float = 5.0
    # How often broker.tick() runs (delay deliveries, offset/state snapshots).
    tick_interval: float = 0.1
    # Receive batch size announced to push consumers; also the cap on a request's batch.
    receive_batch_size: int = 32
    max_receive_batch_size: int = 1024
    # Producer retry policy announced in Settings (RocketMQ proxy defaults).
    producer_max_attempts: int = 3
    producer_backoff_initial: float = 0.01
    producer_backoff_max: float = 1.0
    producer_backoff_multiplier: float = 2.0
    # Largest gRPC request accepted (a batch of messages), bytes.
    max_request_bytes: int = 64 * 1024 * 1024
    # Threads that run broker calls off the event loop.
    worker_threads: int = 8
    # Host advertised in routes when the client's request names no endpoint.
    advertise_host: str | None = None
    # Push consumers' receives (auto_renew) get their invisible time renewed while the
    # listener works, as RocketMQ's proxy does (enableProxyAutoRenew); see server/renewal.py.
    auto_renew: bool = True
    # Invisible time of an auto-renewed receive; the client's own is ignored (RocketMQ
    # proxy's defaultInvisibleTimeMills). At least broker.min_receive_invisible_ms.
    auto_renew_invisible_time: float = 60.0
    # A handle is renewed once it would become visible within this (renewAheadTimeMillis).
    renew_ahead_time: float = 10.0
    # Longest pause between two looks for due handles (renewSchedulePeriodMillis); also
    # how long a client whose telemetry stream ended has to open a new one before its
    # handles are released.
    renew_schedule_period: float = 5.0
    # The n-th renewal hides the message this long; the last entry repeats (RocketMQ's
    # RenewStrategyPolicy: 1, 3, 5, 10, 30 min, 1 h).
    renew_durations: tuple[float, ...] = (60.0, 180.0, 300.0, 600.0, 1800.0, 3600.0)
    # Renewing stops this long after the first delivery: the message then gets the
    # group's retry backoff, as a failed delivery (renewMaxTimeMillis).
    renew_max_time: float = 3 * 3600.0
    # Failed renewals of one handle before it is left to expire (maxRenewRetryTimes).
    renew_max_retries: int = 3
    # Invisible time left to the handles of a client that went away, so another consumer
    # gets them soon (invisibleTimeMillisWhenClear).
    renew_clear_invisible_time: float = 1.0
    # Most handles renewed at once; deliveries beyond it are served unrenewed (a warning).
    renew_max_handles: int = 100_000


def parse_host_port(address: str, *, what: str = "address") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raises InvalidArgument with a fix."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"{what} {address!r} must look like HOST:PORT, e.g. 127.0.0.1:8081")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidArgument(f"{what} {address!r} has a non-numeric port") from None
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"{what} {address!r}: port must be between 0 and 65535")
    return host, port
