"""The last administrator cannot lock everyone out, and a locked-out broker is recovered.

A real ``halfmoon serve`` with authentication on: the admin API and the CLI
refuse to delete, disable or demote the last enabled super user
(``LAST_SUPER_USER``); a restart with ``auth.bootstrap_recover`` and a new
``HALFMOON_BOOTSTRAP_SECRET_KEY`` gives the bootstrap user back, also when the
data directory holds no super user at all (as a broker of an older version
could be left).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

SUPER = ("root", "root-secret-key")
OPS = ("ops", "ops-secret-key")


def as_user(server: ServerProcess, user: tuple[str, str]) -> ServerProcess:
    other = copy.copy(server)
    other.credentials = user
    return other


def secured(data_dir: Path, secret: str, *settings: str) -> ServerProcess:
    return ServerProcess(
        data_dir,
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", *settings),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": secret},
        credentials=("root", secret),
    )


def test_the_last_super_user_is_kept_and_a_restart_with_recovery_lets_root_back_in(
    tmp_path: Path,
) -> None:
    server = secured(tmp_path / "data", SUPER[1]).start()
    try:
        for method, body in (
            ("DELETE", None),
            ("PATCH", {"enabled": False}),
            ("PATCH", {"user_type": "Normal"}),
        ):
            code, answer = server.admin_call(method, "/v1/users/root", body)
            assert code == 409, (method, body, answer)
            assert answer["error"]["code"] == "LAST_SUPER_USER", answer  # type: ignore[index]
            assert "last enabled super user" in answer["error"]["message"]  # type: ignore[index]
        done = server.cli("user", "delete", "root")
        assert done.returncode != 0 and "LAST_SUPER_USER" in done.stderr, done
        code, _ = server.admin_call(
            "POST", "/v1/users", {"access_key": OPS[0], "secret_key": OPS[1], "user_type": "Super"}
        )
        assert code == 201
        assert server.admin_call("DELETE", "/v1/users/root")[0] == 200  # ops remains
        ops = as_user(server, OPS)
        code, answer = ops.admin_call("DELETE", "/v1/users/ops")
        assert code == 409 and answer["error"]["code"] == "LAST_SUPER_USER", answer  # type: ignore[index]
    finally:
        assert server.stop() == 0, server.log_tail()

    # ops's secret is lost. Without the flag, the bootstrap user is not made again (a user
    # exists); with it, root is back as an enabled super user with the new secret.
    plain = secured(tmp_path / "data", "new-root-secret-key").start()
    try:
        assert plain.admin_call("GET", "/v1/users")[0] == 401
    finally:
        assert plain.stop() == 0
    recovering = secured(
        tmp_path / "data", "new-root-secret-key", "auth.bootstrap_recover=true"
    ).start()
    try:
        code, answer = recovering.admin_call("GET", "/v1/users")
        assert code == 200, answer
        users = {u["access_key"]: u for u in answer["users"]}  # type: ignore[index]
        assert users["root"]["user_type"] == "Super" and users["root"]["enabled"] is True
        assert users["ops"]["user_type"] == "Super"  # the others are left as they were
        assert any("event=bootstrap_user_recovered user=root" in line for line in recovering.lines)
        assert "new-root-secret-key" not in "\n".join(recovering.lines)
    finally:
        assert recovering.stop() == 0


def test_recovery_without_a_super_user_and_without_a_secret(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A data directory whose users hold no enabled super user (an older broker's deleted
    # admin): nobody can manage users through the API.
    store = AuthStore(data / "auth" / "users.json", SecretBox.from_file(data / "auth" / "key"))
    store.create_user("alice", "alice-secret-key")
    recovering = secured(data, SUPER[1], "auth.bootstrap_recover=true").start()
    try:
        code, answer = recovering.admin_call("GET", "/v1/users")
        assert code == 200, answer
        assert [u["access_key"] for u in answer["users"]] == ["alice", "root"]  # type: ignore[index]
    finally:
        assert recovering.stop() == 0
    # The flag without the new secret: a clear refusal at start, nothing changed.
    without_secret = ServerProcess(
        data,
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "auth.bootstrap_recover=true",
        ),
    )
    with pytest.raises(RuntimeError, match="ILLEGAL_CONFIG") as refused:
        without_secret.start()
    assert "bootstrap_recover" in str(refused.value) and "Traceback" not in str(refused.value)
    assert [
        u.access_key
        for u in AuthStore(store.path, SecretBox.from_file(data / "auth" / "key")).users()
    ] == ["alice", "root"]  # type: ignore[arg-type]
