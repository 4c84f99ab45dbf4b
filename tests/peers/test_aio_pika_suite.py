"""aio-pika's own test suite against halfmoon and RabbitMQ in the same run (``./run peer``).

About 15 minutes a server, so it runs only with ``HALFMOON_PEER_FULL=1``
(``./run peer`` sets it). aio-pika's conftest starts RabbitMQ in Docker; the
plugin in ``plugin/`` stands in for its Docker client, and the tests run
unchanged. Plain first, then ``test_amqps.py`` over TLS (RabbitMQ through the
TLS front, halfmoon with ``tls.mode=permissive``: plain and TLS on one port).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.peers import known_gaps, scopes
from tests.peers.runner import RETRIES, judge, outer_timeout, run_suite
from tests.peers.servers import (
    halfmoon_amqp,
    rabbitmq_address,
    rabbitmq_url,
    require_halfmoon_amqp,
    require_rabbitmq,
    server_certificate,
)
from tests.peers.sources import AIO_PIKA, fetch, venv_python
from tests.peers.tls_terminator import tls_terminator

RUN_TIMEOUT = 3000.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not scopes.FULL, reason="aio-pika's suite runs in ./run peer"),
    # RabbitMQ plain and TLS, then a judge (its run and retries) of each against halfmoon.
    outer_timeout(2 + 2 * (1 + RETRIES), RUN_TIMEOUT),
]


def test_aio_pika_suite_passes_what_rabbitmq_passes(tmp_path: Path) -> None:
    require_rabbitmq()
    require_halfmoon_amqp()
    python, source = venv_python(), fetch(AIO_PIKA)
    gaps = known_gaps.patterns("aio-pika")
    plain, tls = scopes.AIO_PIKA_PLAIN_ARGS, scopes.AIO_PIKA_TLS_ARGS
    reference = run_suite(python, source, plain, url=rabbitmq_url(), timeout=RUN_TIMEOUT)
    with tls_terminator(tmp_path / "front", rabbitmq_address()) as front_port:
        reference_tls = run_suite(
            python, source, tls, url=rabbitmq_url(), tls_port=front_port, timeout=RUN_TIMEOUT
        )
    assert reference.with_id("passed") and reference_tls.with_id("passed"), reference.output
    with halfmoon_amqp(tmp_path / "data") as halfmoon:
        judge(
            python, source, plain, reference, url=halfmoon.url, gaps=gaps,
            retry_args=("--timeout", "120", "--tb=native"), timeout=RUN_TIMEOUT,
        )  # fmt: skip
    # Permissive: aio-pika's conftest dials the plain port (its readiness check, the
    # amqp_url fixture) while test_amqps.py connects over TLS; RabbitMQ's run has both too.
    certificate = server_certificate(tmp_path / "ca")
    with halfmoon_amqp(tmp_path / "tls-data", tls=certificate, tls_mode="permissive") as halfmoon:
        judge(
            python, source, tls, reference_tls, url=halfmoon.url, tls_port=halfmoon.tls_port,
            gaps=gaps, retry_args=("--timeout", "120", "--tb=native"), timeout=RUN_TIMEOUT,
        )  # fmt: skip
