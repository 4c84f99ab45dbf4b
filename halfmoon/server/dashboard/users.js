// The Users and ACLs pages, on the same helpers as dashboard.js (loaded first): users
// with their type and enabled flag (the API never returns a secret), and one user's
// ACL policies. /v1/users and /v1/acls are for super users only, so the controls
// appear only for them; anyone else gets the API's refusal in the banner.
"use strict";

// Who may manage users: a super user, or anyone when authentication is off.
const managesUsers = (...nodes) => (session.canManageUsers ? nodes : []);
const splitList = (text) => text.split(",").map((s) => s.trim()).filter(Boolean);
const subjectOf = (accessKey) => `User:${accessKey}`;

function userTypeSelect(current) {
  return el("select", { name: "user_type" },
    ["Normal", "Super"].map((t) => el("option", { selected: t === current }, t)));
}

async function usersPage(root) {
  const { users } = await get("/v1/users");
  const createForm = el("form", { class: "inline", id: "create-user", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const accessKey = formValue(f, "access_key");
    act(() => api("POST", "/v1/users", { access_key: accessKey,
      secret_key: f.elements.secret_key.value, user_type: formValue(f, "user_type") }),
    null, `#/user?name=${q(accessKey)}`);
  } },
  el("input", { name: "access_key", placeholder: "new access key", required: true }),
  el("input", { name: "secret_key", type: "password", placeholder: "secret key (8+ characters)",
    required: true, minlength: 8, autocomplete: "new-password" }),
  userTypeSelect("Normal"),
  el("button", { type: "submit" }, "create user"));
  // The API refuses to delete the last enabled super user (LAST_SUPER_USER): nobody could
  // manage users afterwards. Its row offers no delete, so an admin cannot lock itself out.
  const managers = users.filter((u) => u.enabled && u.user_type === "Super");
  const isLastManager = (u) => managers.length === 1 && managers[0].access_key === u.access_key;
  root.replaceChildren(el("h2", {}, "Users"), ...managesUsers(createForm),
    table(["access key", "type", "enabled", ""], users.map((u) => [
      el("a", { href: `#/user?name=${q(u.access_key)}` }, u.access_key), u.user_type,
      u.enabled ? "yes" : "no",
      managesUsers(isLastManager(u)
        ? el("span", { class: "muted last-super-user" }, "last super user")
        : el("button", { class: "danger", onclick: () => act(
          () => api("DELETE", `/v1/users/${q(u.access_key)}`),
          `Delete user ${u.access_key} and its ACL policies?`) }, "delete"))])));
}

async function userPage(root, params) {
  const name = params.get("name");
  const [user, acls] = await Promise.all([get(`/v1/users/${q(name)}`),
    get(`/v1/acls?subject=${q(subjectOf(name))}`)]);
  const policies = acls.acls.length ? acls.acls[0].policies : [];
  const updateForm = el("form", { class: "inline", id: "update-user", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const change = { user_type: formValue(f, "user_type"), enabled: formValue(f, "enabled") === "enabled" };
    // An empty field keeps the current secret: the page never knows it.
    if (f.elements.secret_key.value) change.secret_key = f.elements.secret_key.value;
    act(() => api("PATCH", `/v1/users/${q(name)}`, change), `Change user ${name}?`);
  } }, "type", userTypeSelect(user.user_type),
  el("select", { name: "enabled" }, ["enabled", "disabled"].map((s) =>
    el("option", { selected: (s === "enabled") === user.enabled }, s))),
  el("input", { name: "secret_key", type: "password", placeholder: "new secret key (optional)",
    minlength: 8, autocomplete: "new-password" }),
  el("button", { type: "submit" }, "update"));
  const policyForm = el("form", { class: "inline", id: "create-policy", onsubmit: (e) => {
    e.preventDefault();
    const f = e.target;
    const policy = { resource: formValue(f, "resource"), actions: splitList(formValue(f, "actions")),
      source_ips: splitList(formValue(f, "source_ips")), decision: formValue(f, "decision") };
    act(() => api("POST", "/v1/acls", { subject: subjectOf(name), policies: [policy] }));
  } },
  el("input", { name: "resource", placeholder: "resource, e.g. Topic:orders or Group:*", required: true }),
  el("input", { name: "actions", placeholder: "actions, e.g. Pub, Sub", required: true }),
  el("input", { name: "source_ips", placeholder: "source IPs (optional), e.g. 10.0.0.0/8" }),
  el("select", { name: "decision" }, el("option", {}, "Allow"), el("option", {}, "Deny")),
  el("button", { type: "submit" }, "add policy"));
  root.replaceChildren(el("h2", {}, `User ${name}`),
    el("p", {}, `type ${user.user_type}, ${user.enabled ? "enabled" : "disabled"}`),
    ...managesUsers(el("section", {}, el("h2", {}, "Change"), updateForm)),
    el("section", { id: "policies" }, el("h2", {}, `ACL policies (${subjectOf(name)})`),
      policies.length ? table(["resource", "actions", "source IPs", "decision", ""], policies.map((p) => [
        p.resource, p.actions.join(", "), p.source_ips.join(", ") || "any", p.decision,
        managesUsers(el("button", { class: "danger", onclick: () => act(
          () => api("DELETE", `/v1/acls/${q(subjectOf(name))}?resource=${q(p.resource)}`),
          `Delete ${name}'s policy for ${p.resource}?`) }, "delete"))]))
        : el("p", { class: "muted" }, "no policy: a normal user without one is refused everything (a super user needs none)"),
      ...managesUsers(policyForm)));
}

PAGES.users = [usersPage, false];
PAGES.user = [userPage, false];
TITLES.users = "Users";
TITLES.user = "User";
