"""serve refuses to expose an unauthenticated broker; the checks behind it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from halfmoon.auth.errors import InsecureListen
from halfmoon.config import Config, ConfigError
from halfmoon.server.edge_security import check_exposure, check_tls
from tests.server.conftest import ROOT


def config(listen: str, admin: str = "127.0.0.1:0", **auth: object) -> Config:
    cfg = Config()
    cfg.server.listen, cfg.server.admin_listen = listen, admin
    for key, value in auth.items():
        setattr(cfg.auth, key, value)
    return cfg


def test_loopback_without_auth_is_fine():
    check_exposure(config("127.0.0.1:0"))
    check_exposure(config("[::1]:0", "localhost:0"))


@pytest.mark.parametrize(
    "listen, admin", [("0.0.0.0:0", "127.0.0.1:0"), ("127.0.0.1:0", "10.1.2.3:0")]
)
def test_network_listener_without_auth_is_refused_unless_insecure(listen, admin):
    with pytest.raises(InsecureListen, match="--insecure"):
        check_exposure(config(listen, admin))
    check_exposure(config(listen, admin, insecure=True))
    check_exposure(config(listen, admin, enabled=True))


def test_serve_says_why_and_exits_with_usage_status(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "serve", "--data-dir", str(tmp_path),
         "--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "INSECURE_LISTEN" in done.stderr and "authentication is off" in done.stderr


def test_tls_modes_need_their_files():
    cfg = Config()
    cfg.tls.mode = "enforcing"
    with pytest.raises(ConfigError, match="tls.cert"):
        check_tls(cfg.tls)
    cfg.tls.mode = "permissive"
    with pytest.raises(ConfigError, match="tls.mode=permissive needs tls.cert"):
        check_tls(cfg.tls)


def test_proxy_refuses_exposure_and_unavailable_cluster_auth():
    exposed = subprocess.run(
        [sys.executable, "-m", "halfmoon", "proxy", "--broker", "127.0.0.1:1",
         "--listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert exposed.returncode == 2 and "INSECURE_LISTEN" in exposed.stderr, exposed.stderr
    with_auth = subprocess.run(
        [sys.executable, "-m", "halfmoon", "proxy", "--broker", "127.0.0.1:1",
         "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--set", "auth.enabled=true"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert with_auth.returncode != 0 and "UNSUPPORTED" in with_auth.stderr, with_auth.stderr
