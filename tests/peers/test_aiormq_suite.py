"""aiormq's own test suite against halfmoon and RabbitMQ in the same run: plain, then TLS.

Both servers run the same tests (``scopes.py``); every test RabbitMQ passes,
halfmoon must pass, except the known gaps (``known_gaps.py``, docs/amqp.md).
The TLS run gives RabbitMQ, which listens in plain AMQP only here, a TLS front
(``tls_terminator.py``); halfmoon runs with ``tls.mode=enforcing`` and
certificates made by the test.
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
from tests.peers.sources import AIORMQ, fetch, venv_python
from tests.peers.tls_terminator import tls_terminator

RUN_TIMEOUT = 600.0

pytestmark = [pytest.mark.slow, outer_timeout(1 + (1 + RETRIES), RUN_TIMEOUT)]


@pytest.fixture(scope="module")
def suite() -> tuple[Path, Path]:
    require_rabbitmq()
    require_halfmoon_amqp()
    return venv_python(), fetch(AIORMQ)


def test_aiormq_suite_passes_what_rabbitmq_passes(suite: tuple[Path, Path], tmp_path: Path) -> None:
    python, source = suite
    args = scopes.AIORMQ_PLAIN_ARGS
    reference = run_suite(
        python, source, args, url=rabbitmq_url(), deselect=scopes.AIORMQ_SLOW,
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert reference.with_id("passed"), reference.output
    with halfmoon_amqp(tmp_path / "data") as halfmoon:
        judge(
            python, source, args, reference, url=halfmoon.url, gaps=known_gaps.patterns("aiormq"),
            left_out=scopes.AIORMQ_SLOW, timeout=RUN_TIMEOUT,
        )  # fmt: skip


def test_aiormq_tls_suite_passes_what_rabbitmq_passes(
    suite: tuple[Path, Path], tmp_path: Path
) -> None:
    python, source = suite
    args = scopes.AIORMQ_TLS_ARGS
    with tls_terminator(tmp_path / "front", rabbitmq_address()) as front_port:
        reference = run_suite(
            python, source, args, url=rabbitmq_url(), tls_port=front_port,
            deselect=scopes.AIORMQ_SLOW, timeout=RUN_TIMEOUT,
        )  # fmt: skip
    assert reference.with_id("passed"), reference.output
    with halfmoon_amqp(tmp_path / "data", tls=server_certificate(tmp_path / "ca")) as halfmoon:
        judge(
            python, source, args, reference, url=halfmoon.url, tls_port=halfmoon.tls_port,
            gaps=known_gaps.patterns("aiormq-tls"), left_out=scopes.AIORMQ_SLOW,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
