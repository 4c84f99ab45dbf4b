"""Every admin API route of a cluster proxy, from the OpenAPI document, without credentials,
read-only and admin (tests/server/test_auth_admin.py's table, against a cluster).

The users are made through the second proxy and the routes called on the first: the
table holds on every proxy, with the users and ACLs they share through etcd.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.cluster.cluster_server import ClusterServer, wait_until
from tests.server import test_auth_admin as local

pytestmark = pytest.mark.slow

# Collected here, against this module's cluster.
test_route_protection = local.test_route_protection
test_unauthenticated_answer_asks_for_basic_credentials = (
    local.test_unauthenticated_answer_asks_for_basic_credentials
)
test_bearer_and_basic_both_work = local.test_bearer_and_basic_both_work
test_cli_user_and_acl_commands_and_no_secret_in_output = (
    local.test_cli_user_and_acl_commands_and_no_secret_in_output
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    directory = tmp_path_factory.mktemp("cluster-auth-admin")
    key = directory / "auth.key"
    key.write_text(secrets.token_hex(32))
    proc = ClusterServer(
        directory,
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", f"auth.key_file={key}"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": local.SUPER[1]},
        credentials=local.SUPER,
    ).start()
    other = proc.proxies[1]
    reader = {"access_key": local.READER[0], "secret_key": local.READER[1]}
    assert other.admin_call("POST", "/v1/users", reader)[0] == 201
    policies = [{"resource": "Cluster", "actions": ["Get", "List"]}]
    acl = {"subject": "User:reader", "policies": policies}
    assert other.admin_call("POST", "/v1/acls", acl)[0] == 201
    wait_until(lambda: proc.admin_call("GET", "/v1/acls/User:reader")[0] == 200, 5, "the ACL")
    try:
        yield proc
    finally:
        proc.stop()
