"""A real ``halfmoon serve`` with data in it, and Debian's chromium driven by playwright.

playwright's own browser download does not work everywhere this suite runs, so the
browser is the system's ``/usr/bin/chromium`` (``./run test`` installs Debian's
package when it is missing). Without it the tests skip, and under ``CI=true`` they
fail instead. Every page a test opens fails the test on a JavaScript console error
or an uncaught exception. Screenshots are the tests' artifacts: they go to
``artifacts/dashboard/<test>/`` at the repository's root (git-ignored; ``$HALFMOON_ARTIFACTS``
names another root), kept after the run for a person or a CI job to look at.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import ServerProcess

CHROMIUM = Path(os.environ.get("HALFMOON_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ACTION_TIMEOUT_MS = 15_000
ARTIFACTS = Path(
    os.environ.get("HALFMOON_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts")
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


# Package scope, not session: playwright's sync API runs an event loop in the main thread while
# it is open, and the tests after this package call asyncio.run() there.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: ./run test installs Debian's chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    # playwright is a test dependency only: `halfmoon serve` never imports it.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def goto(page: Any, url: str) -> None:
    """``page.goto(url)``, once more if the host's network changed under the first load."""
    from playwright.sync_api import Error

    try:
        page.goto(url)
    except Error as error:
        if NETWORK_CHANGED not in str(error):
            raise
        page.goto(url)


class DashboardPage:
    """One browser page on the dashboard; records console errors and screenshots."""

    def __init__(self, page: Any, base: str, shots: Path) -> None:
        self.page = page
        self.base = base
        self.shots = shots
        self.errors: list[str] = []
        page.set_default_timeout(ACTION_TIMEOUT_MS)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("dialog", lambda dialog: dialog.accept())  # confirmations: yes

    def _console(self, message: Any) -> None:
        # Chromium aborts the requests in flight when the host's addresses change, and the
        # partition tests beside this one add and remove bridges: that abort is the host's, not
        # the dashboard's (whose GETs are tried again).
        if message.type == "error" and NETWORK_CHANGED not in message.text:
            self.errors.append(f"console: {message.text}")

    def open(self, route: str, loaded: str) -> Any:
        """Go to ``#/route`` and wait until the page named ``loaded`` has drawn."""
        goto(self.page, f"{self.base}/dashboard/#/{route}")
        self.wait_loaded(loaded)
        return self.page

    def wait_loaded(self, name: str) -> None:
        self.page.wait_for_selector(f"main[data-loaded='{name}']")

    def screenshot(self, name: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def dashboard_in(browser: Any, server: ServerProcess, shots: Path) -> Iterator[DashboardPage]:
    """A fresh browser context on ``server``'s dashboard; fails on any console error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = DashboardPage(context.new_page(), server.admin, shots)
    try:
        yield page
    finally:
        context.close()
    assert not page.errors, page.errors


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Path:
    """This test's screenshot directory under the artifacts root, emptied first (made by
    the first screenshot)."""
    path = ARTIFACTS / "dashboard" / re.sub(r"[^\w.-]+", "_", request.node.name)
    shutil.rmtree(path, ignore_errors=True)
    return path


@pytest.fixture
def dashboard(browser: Any, server: ServerProcess, shots: Path) -> Iterator[DashboardPage]:
    yield from dashboard_in(browser, server, shots)


SUPER = ("root", "root-secret-key")
READER = ("reader", "reader-secret-key")


# One secured server for every test module that logs in (it takes a while to start).
@pytest.fixture(scope="package")
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
def page(browser: Any, secured: ServerProcess, shots: Path) -> Iterator[DashboardPage]:
    """A dashboard page on the server with authentication on (log in with log_in)."""
    yield from dashboard_in(browser, secured, shots)


def log_in(dashboard: DashboardPage, credentials: tuple[str, str]) -> Any:
    page = dashboard.open("overview", "login")
    page.fill("#login input[name=access_key]", credentials[0])
    page.fill("#login input[name=secret_key]", credentials[1])
    page.click("#login button")
    return page
