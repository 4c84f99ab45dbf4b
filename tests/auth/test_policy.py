"""ACL 2.0 evaluation: prefix resources, deny wins, super users bypass, source IPs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.auth.errors import IllegalPolicy
from halfmoon.auth.policy import Resource, User, decide, entry_from_dict, parse_resource

alice = User("alice", "secret-key")
root = User("root", "secret-key", "Super")


def entries(*docs):
    return [entry_from_dict(d) for d in docs]


def test_prefix_match_and_default_deny():
    acl = entries({"resource": "Topic:orders-*", "actions": ["Pub"]})
    assert decide(alice, acl, Resource("Topic", "orders-eu"), "Pub", "10.0.0.1")
    assert not decide(alice, acl, Resource("Topic", "payments"), "Pub", "10.0.0.1")
    assert not decide(alice, acl, Resource("Topic", "orders-eu"), "Sub", "10.0.0.1")
    assert not decide(alice, acl, Resource("Group", "orders-eu"), "Pub", "10.0.0.1")


def test_deny_wins_over_allow():
    acl = entries(
        {"resource": "Topic:*", "actions": ["All"]},
        {"resource": "Topic:secret", "actions": ["Sub"], "decision": "Deny"},
    )
    assert decide(alice, acl, Resource("Topic", "public"), "Sub", "1.2.3.4")
    assert not decide(alice, acl, Resource("Topic", "secret"), "Sub", "1.2.3.4")
    assert decide(alice, acl, Resource("Topic", "secret"), "Pub", "1.2.3.4")


def test_super_user_bypasses_everything():
    acl = entries({"resource": "Topic:*", "actions": ["All"], "decision": "Deny"})
    assert decide(root, acl, Resource("Topic", "x"), "Pub", "1.2.3.4")


def test_source_ips():
    acl = entries({"resource": "Topic:t", "actions": ["Pub"], "source_ips": ["10.0.0.0/8"]})
    assert decide(alice, acl, Resource("Topic", "t"), "Pub", "10.1.2.3")
    assert decide(alice, acl, Resource("Topic", "t"), "Pub", "::ffff:10.1.2.3")
    assert not decide(alice, acl, Resource("Topic", "t"), "Pub", "192.168.0.1")
    assert not decide(alice, acl, Resource("Topic", "t"), "Pub", "garbage")


def test_namespace_covers_its_topics_and_groups():
    acl = entries({"resource": "Namespace:tenant1", "actions": ["Pub", "Sub"]})
    assert decide(alice, acl, Resource("Topic", "tenant1%orders"), "Pub", "1.1.1.1")
    assert decide(alice, acl, Resource("Group", "tenant1%billing"), "Sub", "1.1.1.1")
    assert not decide(alice, acl, Resource("Topic", "tenant2%orders"), "Pub", "1.1.1.1")
    assert not decide(alice, acl, Resource("Topic", "orders"), "Pub", "1.1.1.1")


@pytest.mark.parametrize(
    "document",
    [
        None,
        [],
        {"resource": "Queue:x", "actions": ["Pub"]},
        {"resource": "Topic:", "actions": ["Pub"]},
        {"resource": "Topic:a*b", "actions": ["Pub"]},
        {"resource": "Topic:x", "actions": []},
        {"resource": "Topic:x", "actions": ["Fly"]},
        {"resource": "Topic:x", "actions": ["Pub"], "decision": "Maybe"},
        {"resource": "Topic:x", "actions": ["Pub"], "source_ips": ["300.1.1.1"]},
        {"resource": "Topic:x", "actions": ["Pub"], "extra": 1},
    ],
)
def test_bad_documents_are_refused_with_a_reason(document):
    with pytest.raises(IllegalPolicy):
        entry_from_dict(document)


def test_cluster_resource_parses_without_name():
    assert parse_resource("cluster") == Resource("Cluster")


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)
_documents = st.dictionaries(
    st.sampled_from(["resource", "actions", "source_ips", "decision", "x"]), _values
)


@settings(max_examples=400, deadline=None)
@given(_documents, st.sampled_from(["Pub", "Sub", "Get"]), st.text(max_size=20))
def test_fuzzed_policy_documents_never_crash_nor_let_in_beyond_their_words(doc, action, name):
    try:
        entry = entry_from_dict(doc)
    except IllegalPolicy:
        return
    allowed = decide(alice, [entry], Resource("Topic", name), action, "127.0.0.1")
    if allowed:  # only an Allow entry naming the action (or All) may let in
        assert entry.decision == "Allow"
        assert action in entry.actions or "All" in entry.actions
