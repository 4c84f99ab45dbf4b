"""Login with the admin API's users: a read-only user sees everything and can change
nothing (no mutating control on any page, and the API refuses anyway); a super user
gets the controls back. Against ``halfmoon serve`` with authentication on."""

from __future__ import annotations

from tests.dashboard.conftest import READER, SUPER, log_in

MUTATING = (
    "#create-topic, #update-topic, #send-test, #reset-offset, #commit, #rollback, #resume,"
    " #create-group, #update-group, button.danger, #purge, #export, #import,"
    # Selection boxes (transactions); the system-topics toggle only filters the view.
    " main input[type=checkbox]:not(#show-system)"
)
# The only buttons a read-only user may see: searching, paging and the body views.
READ_ONLY_BUTTONS = {
    "search",
    "previous",
    "next",
    "find by id",
    "find by key",
    "find in time range",
}


def test_a_read_only_user_sees_everything_and_no_mutating_control(page, secured):
    browser_page = log_in(page, READER)
    page.wait_loaded("overview")
    assert page.page.locator("#user").inner_text().startswith("reader (read-only)")
    for route, name in [
        ("overview", "overview"),
        ("topics", "topics"),
        ("topic?name=visible", "topic"),
        ("groups", "groups"),
        ("group?name=watchers", "group"),
        ("backlog?group=watchers&topic=visible", "backlog"),
        ("producers", "producers"),
        ("definitions", "definitions"),
        ("messages", "messages"),
        ("transactions", "transactions"),
        ("cluster", "cluster"),
    ]:
        page.open(route, name)
        assert browser_page.locator(MUTATING).count() == 0, route
        buttons = set(browser_page.locator("main button").all_inner_texts())
        assert buttons <= READ_ONLY_BUTTONS, (route, buttons - READ_ONLY_BUTTONS)
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
    for route, name, control in [
        ("topic?name=visible", "topic", "#update-topic"),
        ("group?name=watchers", "group", "#reset-offset"),
        ("transactions", "transactions", "#commit"),
    ]:
        page.open(route, name)
        assert browser_page.locator(control).count() == 1, route
    page.open("topics", "topics")
    form = browser_page.locator("#create-topic")
    form.locator("input[name=name]").fill("made-by-root")
    form.get_by_role("button", name="create topic").click()
    browser_page.wait_for_selector("main tbody a:text-is('made-by-root')")
    assert secured.admin_call("GET", "/v1/topics/made-by-root")[0] == 200
