"""The ACL model and decision (broker.security.acls) and its file
(broker.security.acl_store), in tables: each row one ACL set, one question,
Kafka's answer."""

from __future__ import annotations

import json
import os

import pytest

from broker.security.acl_store import AclStore, AclStoreError, decode, encode, offline
from broker.security.acls import (
    AclAuthorizer,
    AclBinding,
    AclBindingFilter,
    AuthorizerSettings,
    InvalidAclError,
)
from broker.security.acls import (
    AclOperation as Op,
)
from broker.security.acls import (
    AclPermissionType as Perm,
)
from broker.security.acls import (
    PatternType as Pat,
)
from broker.security.acls import (
    ResourceType as Res,
)

ALLOW, DENY = Perm.ALLOW, Perm.DENY


def acl(rtype, name, principal, op, perm=ALLOW, host="*", pattern=Pat.LITERAL):
    return AclBinding.of(rtype, name, principal, op, perm, host=host, pattern_type=pattern)


BOB_WRITES_ORDERS = acl(Res.TOPIC, "orders", "User:bob", Op.WRITE)

# (acls, principal, host, operation, resource type, name, allowed?, why)
DECISIONS = [
    ([], "User:bob", "10.0.0.1", Op.READ, Res.TOPIC, "orders", False, "no ACL: allow.everyone.if.no.acl.found is false"),
    ([BOB_WRITES_ORDERS], "User:bob", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders", True, "literal allow"),
    ([BOB_WRITES_ORDERS], "User:alice", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders", False, "another principal"),
    ([BOB_WRITES_ORDERS], "User:bob", "10.0.0.1", Op.READ, Res.TOPIC, "orders", False, "another operation"),
    ([BOB_WRITES_ORDERS], "User:bob", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders2", False, "literal is exact"),
    ([BOB_WRITES_ORDERS], "User:bob", "10.0.0.1", Op.WRITE, Res.GROUP, "orders", False, "another resource type"),
    ([BOB_WRITES_ORDERS], "User:bob", "10.0.0.1", Op.DESCRIBE, Res.TOPIC, "orders", True, "WRITE implies DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ)], "User:bob", "h", Op.DESCRIBE, Res.TOPIC, "t", True, "READ implies DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.DELETE)], "User:bob", "h", Op.DESCRIBE, Res.TOPIC, "t", True, "DELETE implies DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.ALTER)], "User:bob", "h", Op.DESCRIBE, Res.TOPIC, "t", True, "ALTER implies DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.CREATE)], "User:bob", "h", Op.DESCRIBE, Res.TOPIC, "t", False, "CREATE does not imply DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.ALTER_CONFIGS)], "User:bob", "h", Op.DESCRIBE_CONFIGS, Res.TOPIC, "t", True, "ALTER_CONFIGS implies DESCRIBE_CONFIGS"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.DESCRIBE)], "User:bob", "h", Op.READ, Res.TOPIC, "t", False, "DESCRIBE implies nothing"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.ALL)], "User:bob", "h", Op.DELETE, Res.TOPIC, "t", True, "ALL allows every operation"),
    ([acl(Res.TOPIC, "t", "User:*", Op.READ)], "User:carol", "h", Op.READ, Res.TOPIC, "t", True, "principal wildcard"),
    ([acl(Res.TOPIC, "*", "User:bob", Op.READ)], "User:bob", "h", Op.READ, Res.TOPIC, "anything", True, "resource wildcard"),
    ([acl(Res.TOPIC, "ord", "User:bob", Op.READ, pattern=Pat.PREFIXED)], "User:bob", "h", Op.READ, Res.TOPIC, "orders", True, "prefix"),
    ([acl(Res.TOPIC, "ord", "User:bob", Op.READ, pattern=Pat.PREFIXED)], "User:bob", "h", Op.READ, Res.TOPIC, "or", False, "shorter than the prefix"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ, host="10.0.0.1")], "User:bob", "10.0.0.2", Op.READ, Res.TOPIC, "t", False, "another host"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ, host="10.0.0.1")], "User:bob", "10.0.0.1", Op.READ, Res.TOPIC, "t", True, "that host"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ), acl(Res.TOPIC, "t", "User:bob", Op.READ, DENY)], "User:bob", "h", Op.READ, Res.TOPIC, "t", False, "DENY wins over ALLOW"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ), acl(Res.TOPIC, "*", "User:*", Op.ALL, DENY)], "User:bob", "h", Op.READ, Res.TOPIC, "t", False, "wildcard DENY of ALL wins"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ), acl(Res.TOPIC, "t", "User:bob", Op.READ, DENY, host="10.9.9.9")], "User:bob", "10.0.0.1", Op.READ, Res.TOPIC, "t", True, "a DENY from another host"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.ALL), acl(Res.TOPIC, "t", "User:bob", Op.READ, DENY)], "User:bob", "h", Op.DESCRIBE, Res.TOPIC, "t", True, "a DENY of READ does not deny DESCRIBE"),
    ([acl(Res.TOPIC, "t", "User:bob", Op.READ), acl(Res.TOPIC, "t", "User:bob", Op.DESCRIBE, DENY)], "User:bob", "h", Op.READ, Res.TOPIC, "t", True, "a DENY of DESCRIBE does not deny READ"),
    ([acl(Res.TOPIC, "t", "User:alice", Op.READ)], "User:bob", "h", Op.READ, Res.TOPIC, "t", False, "an ACL exists for others: no fallback to allow-everyone"),
    ([acl(Res.CLUSTER, "kafka-cluster", "User:bob", Op.IDEMPOTENT_WRITE)], "User:bob", "h", Op.IDEMPOTENT_WRITE, Res.CLUSTER, "kafka-cluster", True, "cluster"),
    ([acl(Res.TRANSACTIONAL_ID, "app-", "User:bob", Op.WRITE, pattern=Pat.PREFIXED)], "User:bob", "h", Op.WRITE, Res.TRANSACTIONAL_ID, "app-1", True, "prefixed transactional id"),
    ([acl(Res.TRANSACTIONAL_ID, "app-", "User:bob", Op.WRITE, pattern=Pat.PREFIXED)], "User:bob", "h", Op.DESCRIBE, Res.TRANSACTIONAL_ID, "app-1", True, "WRITE on a transactional id implies DESCRIBE"),
]


@pytest.mark.parametrize("acls, principal, host, operation, rtype, name, allowed, why", DECISIONS, ids=[row[-1] for row in DECISIONS])
def test_decision(acls, principal, host, operation, rtype, name, allowed, why):
    authorizer = AclAuthorizer(acls)
    assert authorizer.authorize(principal, host, operation, rtype, name) is allowed
    # The cached answer is the same answer.
    assert authorizer.authorize(principal, host, operation, rtype, name) is allowed


# (settings, acls, principal, allowed?, why)
SETTINGS = [
    (AuthorizerSettings(allow_everyone_if_no_acl_found=True), [], "User:anyone", True, "no ACL and allow.everyone.if.no.acl.found"),
    (AuthorizerSettings(allow_everyone_if_no_acl_found=True), [acl(Res.TOPIC, "t", "User:alice", Op.READ)], "User:bob", False, "allow-everyone only where no ACL applies"),
    (AuthorizerSettings(super_users={"User:admin"}), [acl(Res.TOPIC, "t", "User:admin", Op.ALL, DENY)], "User:admin", True, "a super user passes even a DENY"),
    (AuthorizerSettings(super_users={"User:admin"}), [], "User:bob", False, "others are not super users"),
]


@pytest.mark.parametrize("settings, acls, principal, allowed, why", SETTINGS, ids=[row[-1] for row in SETTINGS])
def test_settings(settings, acls, principal, allowed, why):
    assert AclAuthorizer(acls, settings).authorize(principal, "h", Op.READ, Res.TOPIC, "t") is allowed


def test_super_users_are_parsed_as_kafka_writes_them():
    assert AuthorizerSettings.parse_super_users("User:admin; User:ops;") == {"User:admin", "User:ops"}
    with pytest.raises(ValueError):
        AuthorizerSettings.parse_super_users("admin")


def test_replace_forgets_cached_decisions():
    authorizer = AclAuthorizer([])
    assert not authorizer.authorize("User:bob", "h", Op.WRITE, Res.TOPIC, "orders")
    authorizer.replace([BOB_WRITES_ORDERS])
    assert authorizer.authorize("User:bob", "h", Op.WRITE, Res.TOPIC, "orders")
    authorizer.replace([])
    assert not authorizer.authorize("User:bob", "h", Op.WRITE, Res.TOPIC, "orders")


# authorize_any (KIP-679): (acls, allowed?, why) for User:bob WRITE on some topic
ANY_TOPIC = [
    ([], False, "no ACL"),
    ([BOB_WRITES_ORDERS], True, "a literal allow"),
    ([acl(Res.TOPIC, "o", "User:bob", Op.WRITE, pattern=Pat.PREFIXED)], True, "a prefixed allow"),
    ([BOB_WRITES_ORDERS, acl(Res.TOPIC, "orders", "User:bob", Op.WRITE, DENY)], False, "the one allow is denied"),
    ([BOB_WRITES_ORDERS, acl(Res.TOPIC, "ord", "User:bob", Op.WRITE, DENY, pattern=Pat.PREFIXED)], False, "denied by a prefix"),
    ([BOB_WRITES_ORDERS, acl(Res.TOPIC, "*", "User:*", Op.ALL, DENY)], False, "wildcard deny"),
    ([BOB_WRITES_ORDERS, acl(Res.TOPIC, "other", "User:bob", Op.WRITE, DENY)], True, "a deny elsewhere"),
    ([acl(Res.TOPIC, "orders", "User:bob", Op.READ)], False, "READ is not WRITE"),
]


@pytest.mark.parametrize("acls, allowed, why", ANY_TOPIC, ids=[row[-1] for row in ANY_TOPIC])
def test_authorize_any(acls, allowed, why):
    assert AclAuthorizer(acls).authorize_any("User:bob", "h", Op.WRITE, Res.TOPIC) is allowed


INVALID = [
    (acl(Res.ANY, "t", "User:bob", Op.READ), "resource type"),
    (acl(Res.TOPIC, "t", "User:bob", Op.READ, pattern=Pat.MATCH), "pattern type"),
    (acl(Res.TOPIC, "t", "User:bob", Op.ANY), "operation"),
    (acl(Res.TOPIC, "t", "User:bob", Op.READ, Perm.ANY), "permission"),
    (acl(Res.TOPIC, "t", "bob", Op.READ), "Type:name"),
    (acl(Res.TOPIC, "", "User:bob", Op.READ), "empty resource name"),
    (acl(Res.CLUSTER, "c", "User:bob", Op.ALTER), "kafka-cluster"),
    (acl(Res.TOPIC, "t", "User:bob", Op.READ, host=""), "host"),
]


@pytest.mark.parametrize("binding, says", INVALID, ids=[row[1] for row in INVALID])
def test_invalid_acls_are_refused(binding, says):
    with pytest.raises(InvalidAclError, match=says):
        binding.validate()


LITERAL_T = acl(Res.TOPIC, "orders", "User:bob", Op.READ)
WILDCARD_T = acl(Res.TOPIC, "*", "User:bob", Op.READ)
PREFIX_T = acl(Res.TOPIC, "ord", "User:bob", Op.READ, pattern=Pat.PREFIXED)
GROUP_G = acl(Res.GROUP, "orders", "User:alice", Op.READ, DENY, host="10.0.0.1")

# (filter, which of LITERAL_T, WILDCARD_T, PREFIX_T, GROUP_G match)
FILTERS = [
    (AclBindingFilter(), {LITERAL_T, WILDCARD_T, PREFIX_T, GROUP_G}),
    (AclBindingFilter(resource_type=Res.TOPIC), {LITERAL_T, WILDCARD_T, PREFIX_T}),
    (AclBindingFilter(resource_type=Res.TOPIC, name="orders"), {LITERAL_T}),
    (AclBindingFilter(resource_type=Res.TOPIC, name="orders", pattern_type=Pat.LITERAL), {LITERAL_T}),
    (AclBindingFilter(resource_type=Res.TOPIC, name="orders", pattern_type=Pat.MATCH), {LITERAL_T, WILDCARD_T, PREFIX_T}),
    (AclBindingFilter(resource_type=Res.TOPIC, pattern_type=Pat.PREFIXED), {PREFIX_T}),
    (AclBindingFilter(principal="User:alice"), {GROUP_G}),
    (AclBindingFilter(host="10.0.0.1"), {GROUP_G}),
    (AclBindingFilter(permission_type=Perm.DENY), {GROUP_G}),
    (AclBindingFilter(operation=Op.WRITE), set()),
    (AclBindingFilter(resource_type=Res.ANY, name="orders", pattern_type=Pat.ANY), {LITERAL_T, GROUP_G}),
]


@pytest.mark.parametrize("acl_filter, expected", FILTERS)
def test_filters(acl_filter, expected):
    authorizer = AclAuthorizer([LITERAL_T, WILDCARD_T, PREFIX_T, GROUP_G])
    assert set(authorizer.matching(acl_filter)) == expected


def test_a_filter_with_an_unknown_code_is_invalid():
    with pytest.raises(InvalidAclError, match="UNKNOWN"):
        AclBindingFilter(resource_type=99).validate()
    AclBindingFilter().validate()


# -- the file ------------------------------------------------------------------------------------

EVERY_KIND = [LITERAL_T, WILDCARD_T, PREFIX_T, GROUP_G, acl(Res.CLUSTER, "kafka-cluster", "User:ops", Op.ALTER), acl(Res.TRANSACTIONAL_ID, "app", "User:bob", Op.WRITE)]


def test_store_round_trip_and_missing_file(tmp_path):
    store = AclStore(str(tmp_path))
    assert store.load() == []
    store.save(EVERY_KIND)
    assert set(AclStore(str(tmp_path)).load()) == set(EVERY_KIND)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def damaged(data: bytes):
    document = json.loads(data)
    document["acls"][0]["operation"] = "ALL"  # a valid ACL, but not the one written
    return json.dumps(document).encode()


# (how the file is damaged, what the error says)
DAMAGE = [
    (lambda data: data[: len(data) // 2], "damaged"),
    (lambda data: b"", "damaged"),
    (damaged, "checksum"),
    (lambda data: data.replace(b'"format": 1', b'"format": 7'), "format"),
    (lambda data: b"[]", "format"),
]


@pytest.mark.parametrize("damage, says", DAMAGE)
def test_a_damaged_file_is_an_error_never_no_acls(tmp_path, damage, says):
    store = AclStore(str(tmp_path))
    store.save(EVERY_KIND)
    with open(store.path, "rb") as handle:
        data = handle.read()
    with open(store.path, "wb") as handle:
        handle.write(damage(data))
    with pytest.raises(AclStoreError, match=says):
        store.load()


def test_an_invalid_acl_in_a_well_formed_file_is_an_error():
    import hashlib

    bad = [{"resource_type": "CLUSTER", "name": "other", "pattern_type": "LITERAL", "principal": "User:x", "host": "*", "operation": "ALTER", "permission_type": "ALLOW"}]
    canonical = json.dumps(bad, sort_keys=True, separators=(",", ":")).encode()
    data = json.dumps({"format": 1, "sha256": hashlib.sha256(canonical).hexdigest(), "acls": bad}).encode()
    with pytest.raises(AclStoreError, match="invalid ACL"):
        decode(data)
    assert decode(encode(EVERY_KIND)) and set(decode(encode(EVERY_KIND))) == set(EVERY_KIND)


def test_offline_editing_refuses_a_running_brokers_directory(tmp_path):
    import fcntl

    with offline(str(tmp_path / "new")) as store:  # before the first start: created
        store.save([LITERAL_T])
    with open(tmp_path / "new" / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(AclStoreError, match="running broker"), offline(str(tmp_path / "new")):
            pass


def test_a_resource_without_a_name_is_nobodys():
    prefixed = acl(Res.TOPIC, "a", "User:bob", Op.READ, pattern=Pat.PREFIXED)
    assert AclAuthorizer([prefixed, acl(Res.TOPIC, "*", "User:bob", Op.READ)]).authorize("User:bob", "h", Op.READ, Res.TOPIC, None) is False


def test_a_denial_is_logged_once_until_the_acls_change(caplog):
    import logging

    authorizer = AclAuthorizer([BOB_WRITES_ORDERS])
    with caplog.at_level(logging.INFO, logger="broker.security.audit"):
        for _ in range(3):
            authorizer.authorize("User:eve", "10.0.0.9", Op.WRITE, Res.TOPIC, "orders")
        authorizer.authorize("User:bob", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders")
        authorizer.replace([BOB_WRITES_ORDERS])
        authorizer.authorize("User:eve", "10.0.0.9", Op.WRITE, Res.TOPIC, "orders")
    lines = [r.getMessage() for r in caplog.records if r.name == "broker.security.audit"]
    assert lines == ["principal User:eve is denied operation WRITE from host 10.0.0.9 on resource TOPIC:orders"] * 2
