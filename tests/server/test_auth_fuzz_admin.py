"""Fuzzing the admin API's security inputs against a real server: ACL documents and the
``Authorization`` header.

tests/auth fuzzes the parsers in-process and test_auth_official_python the
gRPC header; here the documents and headers go through HTTP, the store and
the guard of a running ``halfmoon serve``. Nothing may crash the server or
answer 500; a document the server accepts must let its user do exactly what
the policy model (:func:`halfmoon.auth.policy.decide`) says of the stored
entries, and nothing else; a header that is not the genuine one gets 401.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halfmoon.auth.policy import Resource, decide, entry_from_dict
from halfmoon.auth.store import User
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

SUPER = ("root", "root-secret-key")
FUZZEE = ("fuzzee", "fuzzee-secret-key")
PROBE = "probe-topic"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-auth-fuzz"),
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]},
        credentials=SUPER,
    ).start()
    user = {"access_key": FUZZEE[0], "secret_key": FUZZEE[1]}
    assert proc.admin_call("POST", "/v1/users", user)[0] == 201
    proc.create_topic(PROBE)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()
        assert not [line for line in proc.lines if "Traceback" in line], proc.log_tail()


def call(
    server: ServerProcess, method: str, path: str, body: bytes | None, authorization: str
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        server.admin + path,
        data=body,
        method=method,
        headers={"content-type": "application/json", "authorization": authorization},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def basic(user: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(":".join(user).encode()).decode()


_text = st.text(max_size=24)
_resources = st.one_of(
    st.sampled_from(
        [
            f"Topic:{PROBE}",
            "Topic:probe-*",
            "Topic:prob*",
            "Topic:*",
            "Topic:other",
            "Cluster",
            f"Group:{PROBE}",
            "Namespace:probe",
            "Topic:",
            "topic:probe-topic",
            "Topic:a*b",
            "*",
        ]
    ),  # fmt: skip
    _text,
    st.integers(),
    st.none(),
)
_actions = st.one_of(
    st.lists(
        st.one_of(
            st.sampled_from(["Pub", "Sub", "Get", "List", "All", "get", "ALL", "Fly", ""]), _text
        ),
        max_size=4,
    ),
    _text,
    st.none(),
)
_ips = st.one_of(
    st.lists(
        st.one_of(
            st.sampled_from(
                ["127.0.0.1", "127.0.0.0/8", "10.0.0.0/8", "::1", "300.1.1.1", "0.0.0.0/0"]
            ),
            _text,
        ),
        max_size=3,
    ),
    _text,
    st.none(),
)
_entries = st.dictionaries(
    st.sampled_from(["resource", "actions", "source_ips", "decision", "extra"]),
    st.one_of(_resources, _actions, _ips, st.sampled_from(["Allow", "Deny", "deny", "Maybe"])),
)
_structured = st.fixed_dictionaries(
    {"resource": _resources, "actions": _actions},
    optional={
        "source_ips": _ips,
        "decision": st.sampled_from(["Allow", "Deny", "allow", "Maybe", ""]),
    },
)
# Documents the store accepts, so that the let-in check has something to check.
_valid = st.fixed_dictionaries(
    {
        "resource": st.sampled_from(
            [
                f"Topic:{PROBE}",
                "Topic:probe-*",
                "Topic:prob*",
                "Topic:*",
                "Topic:other",
                "Cluster",
                f"Group:{PROBE}",
                "Namespace:probe",
            ]
        ),  # fmt: skip
        "actions": st.lists(
            st.sampled_from(["Pub", "Sub", "Get", "List", "All", "Create"]), min_size=1, max_size=3
        ),
    },
    optional={
        "source_ips": st.lists(
            st.sampled_from(["127.0.0.1", "127.0.0.0/8", "10.0.0.0/8", "::1", "0.0.0.0/0"]),
            max_size=2,
        ),
        "decision": st.sampled_from(["Allow", "Deny"]),
    },
)
_bodies = st.one_of(
    st.builds(
        lambda p: json.dumps({"policies": p}).encode(),
        st.lists(_valid, min_size=1, max_size=3, unique_by=lambda e: e["resource"]),
    ),
    st.builds(lambda p: json.dumps({"policies": p}).encode(), st.lists(_structured, max_size=3)),
    st.builds(lambda p: json.dumps({"policies": p}).encode(), st.lists(_entries, max_size=3)),
    st.builds(lambda v: json.dumps(v).encode(), st.one_of(_text, st.integers(), _entries)),
    st.binary(max_size=64),
)


def test_fuzzed_acl_documents_never_crash_and_never_let_in_beyond_their_words(
    server: ServerProcess,
) -> None:
    root = basic(SUPER)
    fuzzee = User(FUZZEE[0], FUZZEE[1])
    accepted = 0

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_bodies)
    def attempt(body: bytes) -> None:
        nonlocal accepted
        code, answer = call(server, "PATCH", "/v1/acls/User:fuzzee", body, root)
        assert code in (200, 400, 413), (code, answer, body)
        stored = call(server, "GET", "/v1/acls/User:fuzzee", None, root)
        if code != 200:  # refused: the user has no ACL (each example starts from none)
            assert stored[0] == 404, stored
            return
        accepted += 1
        entries = [entry_from_dict(p) for p in json.loads(stored[1])["policies"]]
        may = any(
            decide(fuzzee, entries, resource, "Get", "127.0.0.1")
            for resource in (Resource("Topic", PROBE), Resource("Cluster", ""))
        )
        probe = call(server, "GET", f"/v1/topics/{PROBE}", None, basic(FUZZEE))
        assert probe[0] == (200 if may else 403), (probe, entries)
        assert call(server, "DELETE", "/v1/acls/User:fuzzee", None, root)[0] == 200

    attempt()
    assert accepted > 0  # the strategy reaches valid documents, not only refusals
    assert server.alive()


def genuine(header: str) -> bool:
    """Whether ``header`` carries fuzzee's exact access key and secret (Basic or Bearer)."""
    pair = ":".join(FUZZEE)
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() == pair
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode() == pair
        except ValueError:
            return False
    return False


def test_fuzzed_admin_authorization_headers_get_401(server: ServerProcess) -> None:
    printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=120)
    near = st.builds(
        lambda scheme, cut, junk: scheme + " " + (":".join(FUZZEE))[:cut] + junk,
        st.sampled_from(["Basic", "Bearer", "basic", "BEARER", "Digest"]),
        st.integers(0, len(":".join(FUZZEE))),
        printable,
    )
    near_basic = st.builds(
        lambda cut, junk: (
            "Basic " + base64.b64encode(((":".join(FUZZEE))[:cut] + junk).encode()).decode()
        ),
        st.integers(0, len(":".join(FUZZEE))),
        printable,
    )

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(printable, near, near_basic))
    def attempt(header: str) -> None:
        code, _ = call(server, "GET", "/v1/topics", None, header)
        if genuine(header):  # fuzzee has no policy: authenticated, then forbidden
            assert code == 403, (code, header)
        else:
            assert code == 401, (code, header)

    attempt()
    assert server.alive()
