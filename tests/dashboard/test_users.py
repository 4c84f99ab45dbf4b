"""The Users and ACLs pages: a super user creates a user, gives it a policy and disables
it through the page, and the admin API then holds exactly that; a read-only user gets
no mutating control there, only the API's refusal in the banner."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

from tests.dashboard.conftest import READER, SUPER, dashboard_in, goto, log_in

USER_CONTROLS = "#create-user, #update-user, #create-policy, main button.danger"


def test_a_super_user_manages_users_and_policies_and_a_reader_cannot(page, secured, browser, shots):
    browser_page = log_in(page, SUPER)
    page.wait_loaded("overview")
    page.open("users", "users")
    assert browser_page.locator("main tbody a:text-is('reader')").count() == 1
    assert READER[1] not in browser_page.content()  # never a secret
    name = f"orders-{uuid.uuid4().hex[:8]}"
    form = browser_page.locator("#create-user")
    form.locator("input[name=access_key]").fill(name)
    form.locator("input[name=secret_key]").fill("orders-secret-key")
    form.get_by_role("button", name="create user").click()
    browser_page.wait_for_selector(f"main h2:text-is('User {name}')")
    assert "type Normal, enabled" in browser_page.locator("main p").first.inner_text()

    policy = browser_page.locator("#create-policy")
    policy.locator("input[name=resource]").fill("Topic:orders")
    policy.locator("input[name=actions]").fill("Pub, Sub")
    policy.locator("input[name=source_ips]").fill("10.0.0.0/8")
    policy.locator("select[name=decision]").select_option("Deny")
    policy.get_by_role("button", name="add policy").click()
    browser_page.wait_for_selector("#policies td:text-is('Topic:orders')")
    row = browser_page.locator("#policies tbody tr").first.inner_text()
    assert "Pub, Sub" in row and "10.0.0.0/8" in row and "Deny" in row

    update = browser_page.locator("#update-user")
    update.locator("select[name=enabled]").select_option("disabled")
    update.get_by_role("button", name="update").click()  # confirmed by the fixture
    browser_page.wait_for_selector("main p:has-text('type Normal, disabled')")
    page.screenshot("user")

    status, user = secured.admin_call("GET", f"/v1/users/{name}")
    assert status == 200 and user == {"access_key": name, "user_type": "Normal", "enabled": False}
    status, acl = secured.admin_call("GET", f"/v1/acls/User:{name}")
    assert status == 200
    assert acl["policies"] == [
        {
            "resource": "Topic:orders",
            "actions": ["Pub", "Sub"],
            "source_ips": ["10.0.0.0/8"],
            "decision": "Deny",
        }
    ]
    page.open("users", "users")
    assert browser_page.locator(f"main tbody a:text-is('{name}')").count() == 1
    assert browser_page.locator(USER_CONTROLS).count() > 0

    # The reader in a browser of its own: its console must show nothing but the refusals.
    with contextmanager(dashboard_in)(browser, secured, shots) as reader:
        reader_page = log_in(reader, READER)
        reader.wait_loaded("overview")
        for route in ("users", f"user?name={name}"):
            goto(reader_page, f"{secured.admin}/dashboard/#/{route}")
            reader_page.wait_for_selector("#banner:not([hidden]):has-text('FORBIDDEN')")
            assert reader_page.locator(USER_CONTROLS).count() == 0, route
            reader_page.evaluate("document.getElementById('banner').hidden = true")
        reader.errors[:] = [e for e in reader.errors if "status of 403" not in e]


def test_the_last_super_user_is_offered_no_delete_and_a_refused_disable_shows_why(page, secured):
    browser_page = log_in(page, SUPER)
    page.wait_loaded("overview")
    page.open("users", "users")
    # root is the only enabled super user: its own row offers no delete, the others do.
    own = browser_page.locator("main tbody tr", has=browser_page.locator("a:text-is('root')"))
    assert own.locator("button.danger").count() == 0
    assert own.locator(".last-super-user").count() == 1
    reader = browser_page.locator("main tbody tr", has=browser_page.locator("a:text-is('reader')"))
    assert reader.locator("button.danger").count() == 1

    # Disabling it through its page is refused by the API, and the page says why.
    page.open("user?name=root", "user")
    update = browser_page.locator("#update-user")
    update.locator("select[name=enabled]").select_option("disabled")
    update.get_by_role("button", name="update").click()  # confirmed by the fixture
    browser_page.wait_for_selector("#banner:not([hidden]):has-text('LAST_SUPER_USER')")
    page.screenshot("last-super-user")
    status, user = secured.admin_call("GET", "/v1/users/root")
    assert status == 200 and user["enabled"] is True
    page.errors[:] = [e for e in page.errors if "status of 409" not in e]

    # With a second super user, either may go: the delete is offered again.
    second = f"admin-{uuid.uuid4().hex[:8]}"
    body = {"access_key": second, "secret_key": "second-secret-key", "user_type": "Super"}
    assert secured.admin_call("POST", "/v1/users", body)[0] == 201
    try:
        page.open("users", "users")
        assert own.locator("button.danger").count() == 1
    finally:
        assert secured.admin_call("DELETE", f"/v1/users/{second}")[0] == 200
