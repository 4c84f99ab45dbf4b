"""pika's own acceptance tests against halfmoon and RabbitMQ in the same run.

pika's tests dial 127.0.0.1:5672 and nothing else. RabbitMQ holds that port
here, so the reference run is the suite as it is; the halfmoon run happens in
a network namespace of its own (``unshare -n``, ``netns_run.py``) where a
halfmoon server started inside owns 5672. Every test RabbitMQ passes, halfmoon
must pass, except the known gaps (``known_gaps.py``, docs/amqp.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers import known_gaps, scopes
from tests.peers.runner import RETRIES, compare, merge_retry, outer_timeout, run_suite
from tests.peers.servers import (
    IN_CI,
    rabbitmq_address,
    rabbitmq_url,
    require_halfmoon_amqp,
    require_rabbitmq,
)
from tests.peers.sources import PIKA, fetch, venv_python

RUN_TIMEOUT = 600.0

pytestmark = [pytest.mark.slow, outer_timeout(1 + (1 + RETRIES), RUN_TIMEOUT)]
NETNS_RUN = Path(__file__).resolve().parent / "netns_run.py"


def _require_netns() -> None:
    unshare = shutil.which("unshare")
    works = (
        unshare is not None
        and (
            subprocess.run([unshare, "-n", "ip", "link", "set", "lo", "up"], capture_output=True)
        ).returncode
        == 0
    )
    if not works:
        reason = "pika's suite needs a network namespace of its own (root, unshare, ip)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def test_pika_acceptance_suite_passes_what_rabbitmq_passes(tmp_path: Path) -> None:
    require_rabbitmq()
    require_halfmoon_amqp()
    if rabbitmq_address() != ("127.0.0.1", 5672):
        pytest.skip(f"pika's suite dials 127.0.0.1:5672; RabbitMQ is at {rabbitmq_url()}")
    _require_netns()
    python, source = venv_python(), fetch(PIKA)
    reference = run_suite(python, source, scopes.PIKA_ARGS, url=rabbitmq_url(), timeout=RUN_TIMEOUT)
    assert reference.with_id("passed"), reference.output
    gaps = known_gaps.patterns("pika")

    def in_namespace(attempt: int) -> list[str]:
        return [
            "unshare", "-n", sys.executable, str(NETNS_RUN),
            "--data-dir", str(tmp_path / f"data-{attempt}"),
            "--log", str(tmp_path / f"halfmoon-{attempt}.log"), "--",
        ]  # fmt: skip

    candidate = run_suite(
        python, source, scopes.PIKA_ARGS, url="amqp://guest:guest@127.0.0.1:5672/",
        deselect=gaps, timeout=RUN_TIMEOUT, wrap=in_namespace(0),
    )  # fmt: skip
    verdict = compare(reference, candidate, gaps)
    for attempt in range(1, RETRIES + 1):
        if not verdict.missing:
            break
        retry = run_suite(
            python, source, [*verdict.missing, "--timeout", "30", "-o", "addopts="],
            url="amqp://guest:guest@127.0.0.1:5672/", timeout=RUN_TIMEOUT,
            wrap=in_namespace(attempt),
        )  # fmt: skip
        candidate = merge_retry(candidate, retry)
        verdict = compare(reference, candidate, gaps)
    log = (tmp_path / "halfmoon-0.log").read_text()[-3000:]
    assert not verdict.missing, f"{verdict.summary()}\n{candidate.output}\nhalfmoon:\n{log}"
