"""Which of each suite's tests the harness runs, and why the rest are left out.

The default test command runs a bounded scope (a few minutes for both servers
together); ``HALFMOON_PEER_FULL=1`` (``./run peer`` sets it) runs every test the
scope leaves out for time. What is left out for another reason is left out of
both runs, with the reason here and in docs/amqp.md.
"""

from __future__ import annotations

import os

FULL = os.environ.get("HALFMOON_PEER_FULL", "") not in ("", "0")

# pika: tests/acceptance with the blocking adapter and the async adapters (select's
# default, select, poll and epoll loops, asyncio, tornado, gevent). Left out:
# io_services_tests.py exercises pika's I/O loops on raw sockets with no broker (one of
# them resolves www.google.com, which this machine cannot); twisted_adapter_tests.py
# needs Twisted, which the suites' environment does not install.
PIKA_ARGS = [
    "tests/acceptance/blocking_adapter_test.py",
    "tests/acceptance/async_adapter_tests.py",
    "tests/acceptance/enforce_one_basicget_test.py",
    "--timeout", "30", "-o", "addopts=",
]  # fmt: skip

# aiormq: its conftest runs most tests once per URL (amqp, amqp-named, amqps,
# amqps-client). The plain run takes amqp (and, in the full run, amqp-named, the same
# tests with a connection name); the TLS run takes amqps and amqps-client.
# test_future_store.py, test_tools.py and test_protocol_errors.py test the client alone
# (no server in them): left out of both runs.
_AIORMQ_COMMON = [
    "tests", "--timeout", "30", "--ignore", "tests/test_future_store.py",
    "--ignore", "tests/test_tools.py", "--ignore", "tests/test_protocol_errors.py",
]  # fmt: skip
AIORMQ_PLAIN_ARGS = [
    *_AIORMQ_COMMON, "-k",
    "not amqps and not ssl" if FULL else "not amqps and not ssl and not amqp-named",
]  # fmt: skip
AIORMQ_TLS_ARGS = [
    *_AIORMQ_COMMON, "-k",
    "amqps or ssl" if FULL else "(amqps and not amqps-client) or ssl",
]  # fmt: skip
if not FULL:
    # The TLS run's bounded scope: connection and channel behaviour over TLS (the
    # other modules' tests repeat the plain run's, only wrapped in TLS).
    AIORMQ_TLS_ARGS[0:1] = ["tests/test_connection.py", "tests/test_channel.py"]

# Left out of the bounded runs for time (each takes 6-21 s against RabbitMQ: they wait
# out heartbeats, stuck connections or 2,047 channels); the full run has them.
AIORMQ_SLOW = () if FULL else (
    "*::test_no_free_channels*",
    "*::test_closing_waiter_cancelled_before_connection_loss*",
    "*::test_connection_stuck*",
    "*::test_writer_closed_on_connection_loss*",
    "*::test_concurrent_channel_number_reuse*",
)  # fmt: skip

# aio-pika (``./run peer`` only, about 15 minutes a server): its whole ``tests``, in
# two runs: plain, then test_amqps.py over TLS. ``--tb=native``: rendering a failure in
# test_amqp_robust_proxy.py's reconnect stairway with pytest's own tracebacks (which
# parse the source) hit CPython 3.11.7's "AST constructor recursion depth mismatch" and
# ended the whole run with INTERNALERROR two thirds through; native tracebacks parse
# nothing.
AIO_PIKA_PLAIN_ARGS = [
    "tests", "--timeout", "120", "--tb=native", "--ignore", "tests/test_amqps.py",
]  # fmt: skip
AIO_PIKA_TLS_ARGS = ["tests/test_amqps.py", "--timeout", "120", "--tb=native"]
