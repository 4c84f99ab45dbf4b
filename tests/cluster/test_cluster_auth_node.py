"""The official Node.js client's authentication scenarios (tests/server/test_auth_node.py)
through a cluster: etcd, two brokers, two proxies, users and ACLs in etcd.

The scenarios are imported unchanged; only the server differs. The Node client
is given one proxy (grpc-js cannot resolve a list of them).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.server import test_auth_node as local
from tests.server.conftest import ServerProcess
from tests.server.test_official_node_client import OneProxyCluster

node = local.node
scripts = local.scripts
# Collected here, against this module's cluster.
test_allowed_send_with_credentials = local.test_allowed_send_with_credentials
test_send_without_pub_is_forbidden = local.test_send_without_pub_is_forbidden
test_bad_credentials_are_refused = local.test_bad_credentials_are_refused
test_receive_without_sub_is_forbidden = local.test_receive_without_sub_is_forbidden
test_transaction_checks_go_to_the_producer_allowed_to_pub = (
    local.test_transaction_checks_go_to_the_producer_allowed_to_pub
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("cluster-auth-node")
    key = directory / "auth.key"
    key.write_text(secrets.token_hex(32))
    proc = local._start(
        directory, *local.QUICK_CHECKS, f"auth.key_file={key}", kind=OneProxyCluster
    )
    try:
        yield proc
    finally:
        proc.stop()
