"""Login with the admin API's users: a read-only user sees everything and can change
nothing (no mutating control on any page, and the API refuses anyway); a super user
gets the controls back. Against ``halfmoon serve`` with authentication on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.conftest import DashboardPage
from tests.server.conftest import ServerProcess

SUPER = ("root", "root-secret-key")
READER = ("reader", "reader-secret-key")
MUTATING = "#create-topic, #send-test, #reset-offset, #commit, #rollback, #resume, button.danger"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-dashboard-auth"),
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]},
        credentials=SUPER,
    ).start()
    try:
        for method, path, body in [
            ("POST", "/v1/users", {"access_key": READER[0], "secret_key": READER[1]}),
            (
                "POST",
                "/v1/acls",
                {
                    "subject": "User:reader",
                    "policies": [{"resource": "Cluster", "actions": ["Get", "List"]}],
                },
            ),
            ("POST", "/v1/topics", {"name": "visible", "queue_count": 1}),
            ("POST", "/v1/groups", {"name": "watchers"}),
        ]:
            status, answer = proc.admin_call(method, path, body)
            assert status == 201, (path, answer)
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture
def page(browser: Any, secured: ServerProcess, tmp_path: Path) -> Iterator[DashboardPage]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    dashboard = DashboardPage(context.new_page(), secured.admin, tmp_path)
    try:
        yield dashboard
    finally:
        context.close()
    assert not dashboard.errors, dashboard.errors


def log_in(dashboard: DashboardPage, credentials: tuple[str, str]) -> Any:
    page = dashboard.open("overview", "login")
    page.fill("#login input[name=access_key]", credentials[0])
    page.fill("#login input[name=secret_key]", credentials[1])
    page.click("#login button")
    return page


def test_a_read_only_user_sees_everything_and_no_mutating_control(page, secured):
    browser_page = log_in(page, READER)
    page.wait_loaded("overview")
    assert page.page.locator("#user").inner_text().startswith("reader (read-only)")
    for route, name in [
        ("topics", "topics"),
        ("topic?name=visible", "topic"),
        ("group?name=watchers", "group"),
        ("transactions", "transactions"),
    ]:
        page.open(route, name)
        assert browser_page.locator(MUTATING).count() == 0, route
    page.open("topics", "topics")
    assert browser_page.locator("main tbody a:text-is('visible')").count() == 1
    page.screenshot("read-only-topics")
    # The API refuses the read-only user's write anyway, with the same credentials.
    status = browser_page.evaluate(
        """async () => (await fetch('/v1/topics', {method: 'POST',
             headers: {'Content-Type': 'application/json',
                       Authorization: sessionStorage.getItem('halfmoon.credentials')},
             body: JSON.stringify({name: 'sneaky'})})).status"""
    )
    assert status == 403
    assert secured.admin_call("GET", "/v1/topics/sneaky")[0] == 404
    page.errors[:] = [e for e in page.errors if "status of 403" not in e]  # the refusal


def test_a_wrong_secret_is_refused_and_a_super_user_gets_the_controls(page, secured):
    browser_page = log_in(page, ("root", "not-the-secret"))
    browser_page.wait_for_function(
        "() => document.querySelector('#login-reason')?.textContent.includes('secret key is wrong')"
    )
    browser_page.fill("#login input[name=access_key]", SUPER[0])
    browser_page.fill("#login input[name=secret_key]", SUPER[1])
    browser_page.click("#login button")
    page.wait_loaded("overview")
    page.open("topics", "topics")
    form = browser_page.locator("#create-topic")
    form.locator("input[name=name]").fill("made-by-root")
    form.get_by_role("button", name="create topic").click()
    browser_page.wait_for_selector("main tbody a:text-is('made-by-root')")
    assert secured.admin_call("GET", "/v1/topics/made-by-root")[0] == 200
