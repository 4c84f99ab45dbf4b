"""The admin API's edge check: every route but ``/healthz`` needs a user and a permission.

Credentials are HTTP Basic (access key, secret key) or ``Authorization:
Bearer ACCESS_KEY:SECRET_KEY``, for the same users the gRPC clients sign
with. What a route needs (:func:`route_needs`), in ACL 2.0's terms:

- reads (GET): Get on the named topic or group, or Get on Cluster;
  listings and status: List or Get on Cluster;
- writes: the action (Create for POST to a collection, Update for POST/PATCH
  to a resource, Delete for DELETE) on the named topic or group, or the same
  action on Cluster; creating a topic or group, Create on the name the body
  gives (``Topic:orders-*`` with Create may create ``orders-eu``), or on Cluster;
- names are the stored ones, ``?namespace=NS`` applied, as the handler will
  act on them (:func:`stored_path_names`), so ``Namespace:NS`` policies see
  them and a ``Topic:orders-*`` policy does not reach ``NS%orders-1``;
- ``/v1/users``, ``/v1/acls`` and ``/v1/definitions`` (which holds users and their
  secret keys): super users only;
- a resource the path does not name but the request acts on is checked too, once
  the handler knows it (:func:`authorize_also`): the group ``clone-offset``
  writes to (``to``), the topic a dead letter is resent to (the body's or the
  one stored in the letter), the topic whose bodies ``peek`` shows (Get), the
  topic in which ``reset-offset``, ``purge``, ``clone-offset`` and
  ``progress?topic=`` move or show a group's offsets (:data:`OFFSETS_IN_TOPIC`:
  their answers show its queues and offsets); without a topic, ``clone-offset`` and
  ``progress`` act on and show only the topics the user has that right on
  (:func:`may_also`). The permission follows from what a request acts on, never only
  from the path the caller chose.

So a *read-only* dashboard user is a normal user with ``Cluster: Get, List``
and an *admin* a super user (or ``Cluster: All``). Authorization runs before
the handler, so a user without the permission learns nothing about whether
the resource exists.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from halfmoon.auth import CLUSTER, Guard, Need, Resource, Unauthenticated, group, topic
from halfmoon.server.admin_http import error_reply
from halfmoon.server.admin_namespace import created_name, stored_path_names

GUARD_KEY: web.AppKey[Guard] = web.AppKey("guard", Guard)
_USER = "halfmoon_admin_user"  # the authenticated user, for authorize_also
# The dashboard's page, script and style sheet hold no data, and /v1/whoami only says
# whether the request's credentials verify: the login form must load before there are
# credentials. Every figure on the page comes from a protected route.
OPEN_ROUTES = frozenset(
    {
        ("GET", "/healthz"),
        ("GET", "/v1/whoami"),
        ("GET", "/"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/"),
        ("GET", "/dashboard/{file}"),
    }
)
SUPER_ONLY = ("/v1/users", "/v1/acls", "/v1/definitions")  # definitions hold secret keys
# What a group's offsets in a named topic need on that topic (beyond the group's own
# permission): a consumer's Sub, or Get, as reading the topic's state does.
OFFSETS_IN_TOPIC = ("Sub", "Get")
_WRITE_ACTIONS = {"PATCH": "Update", "PUT": "Update", "DELETE": "Delete", "POST": "Update"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_needs(
    method: str, template: str, names: dict[str, str], created: str | None = None
) -> list[Need] | None:
    """What ``method`` on route ``template`` with path ``names`` needs; None: super users only.

    ``created``: the name a POST to ``/v1/topics`` or ``/v1/groups`` creates, when known.
    """
    if template.startswith(SUPER_ONLY):
        return None
    resource: Resource | None = None
    if "group" in names and template.startswith("/v1/groups"):
        resource = group(names["group"])
    elif "topic" in names:
        resource = topic(names["topic"])
    if method in ("GET", "HEAD"):
        if resource is None:
            return [Need.of(CLUSTER, "List", "Get")]
        return [Need(((resource, "Get"), (CLUSTER, "Get")))]
    action = _WRITE_ACTIONS.get(method, "Update")
    if resource is None:
        if method == "POST" and template in ("/v1/topics", "/v1/groups"):
            if created:
                made = topic(created) if template == "/v1/topics" else group(created)
                return [Need(((made, "Create"), (CLUSTER, "Create")))]
            action = "Create"
        return [Need.of(CLUSTER, action)]
    return [Need(((resource, action), (CLUSTER, action)))]


def authorize_also(request: web.Request, resource: Resource, *actions: str) -> None:
    """Raise Forbidden unless the request's user may do one of ``actions`` on ``resource``
    (or on Cluster).

    For what a handler resolves after the edge check: a body's target, a stored message's
    topic. Call it before looking the resource up, so that a refusal reads the same whether
    it exists. Callable from a worker thread; a no-op when authentication is off.
    """
    guard = request.app.get(GUARD_KEY)
    user = request.get(_USER)
    if guard is None or not guard.enabled or user is None:
        return
    route = request.match_info.route.resource
    template = route.canonical if route is not None else request.path
    need = Need(tuple((on, action) for on in (resource, CLUSTER) for action in actions))
    guard.authorize(user, [need], request.remote or "", f"{request.method} {template}")


def may_also(request: web.Request, resource: Resource, *actions: str) -> bool:
    """Whether the request's user may do one of ``actions`` on ``resource`` (or on Cluster):
    :func:`authorize_also` as a question, for an answer that leaves out what the user may not
    see (a group's progress in a topic that is not the user's). True when authentication is off.
    """
    guard = request.app.get(GUARD_KEY)
    user = request.get(_USER)
    if guard is None or not guard.enabled or user is None or user.is_super:
        return True
    peer = request.remote or ""
    return any(
        guard.may(user, on, action, peer) for on in (resource, CLUSTER) for action in actions
    )


@web.middleware
async def admin_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = request.app.get(GUARD_KEY)
    if guard is None or not guard.enabled:
        return await handler(request)
    route = request.match_info.route.resource
    template = route.canonical if route is not None else request.path
    if (request.method, template) in OPEN_ROUTES:
        return await handler(request)
    peer = request.remote or ""
    operation = f"{request.method} {template}"
    try:
        user = guard.authenticate_http(request.headers.get("Authorization", ""), peer, operation)
    except Unauthenticated as exc:
        # A browser (the dashboard) asks for credentials on this header.
        answer = error_reply(exc.http_status, exc.code, exc.message)
        answer.headers["WWW-Authenticate"] = 'Basic realm="halfmoon", charset="UTF-8"'
        return answer
    request[_USER] = user
    names = stored_path_names(request)
    needs = route_needs(request.method, template, names, await created_name(request))
    if needs is None:
        guard.require_super(user, peer, operation)
    else:
        guard.authorize(user, needs, peer, operation)
    return await handler(request)
