"""``onceflow acls add|list|remove``: offline on a data directory (the way to
grant the first administrator), then over the wire on the running broker,
with the broker enforcing what the command stored; and the refusals (a
running broker's directory, a missing resource, an unknown operation)."""

from __future__ import annotations

import logging

import pytest

from broker.broker import EmbeddedBroker
from broker.security.acl_store import AclStore
from onceflow.cli import main
from protocol.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import raw_request


@pytest.fixture(autouse=True)
def root_handlers_restored():
    """``main`` configures logging onto this test's captured stderr; the
    brokers of later tests must not log into that closed stream."""
    before = list(logging.root.handlers)
    yield
    logging.root.handlers[:] = before


def run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["acls", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out, captured.err


def test_offline_then_over_the_wire(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    # Before the first start: the administrator (here every local connection).
    status, out, _ = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:ANONYMOUS", "--allow-host", "127.0.0.1", "--operation", "Alter", "--operation", "describe_configs", "--cluster")
    assert status == 0 and "added 2 ACLs" in out
    assert "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)" in out
    status, out, _ = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:bob", "--consumer", "--topic", "orders", "--group", "billing")
    assert status == 0 and "added 3 ACLs" in out
    status, out, _ = run(capsys, "list", "--data-dir", data_dir, "--principal", "User:bob")
    assert status == 0 and out.count("principal=User:bob") == 3 and "User:ANONYMOUS" not in out
    stored = set(AclStore(data_dir).load())
    assert AclBinding.of(ResourceType.GROUP, "billing", "User:bob", AclOperation.READ) in stored and len(stored) == 5

    with EmbeddedBroker(data_dir, properties={"authorizer.class.name": "acl"}) as broker:
        bootstrap = ["--bootstrap-server", broker.bootstrap]
        status, _, err = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:x", "--operation", "Read", "--topic", "t")
        assert status == 1 and "in use by a running broker" in err
        status, out, _ = run(capsys, "add", *bootstrap, "--allow-principal", "User:ANONYMOUS", "--producer", "--topic", "app-", "--transactional-id", "app-", "--resource-pattern-type", "prefixed")
        assert status == 0 and "added 5 ACLs" in out
        # In force at once: this connection may now write app-* topics.
        broker.call(lambda b: b.replicas.create_topic("app-out", 1))
        produce = {"transactional_id": None, "acks": 1, "timeout_ms": 5000, "topic_data": [{"name": "app-out", "partition_data": [{"index": 0, "records": encode_batch([(None, b"v", (), 0)])}]}]}
        assert raw_request(broker.port, ApiKey.PRODUCE, 9, produce)["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE
        status, out, _ = run(capsys, "list", *bootstrap, "--topic", "app-out", "--resource-pattern-type", "match")
        assert status == 0 and "name=app-, patternType=PREFIXED" in out and out.count("principal=User:ANONYMOUS") == 3
        status, out, _ = run(capsys, "remove", *bootstrap, "--allow-principal", "User:ANONYMOUS", "--operation", "Write", "--topic", "app-", "--resource-pattern-type", "prefixed")
        assert status == 0 and "removed 1 ACLs" in out
        assert raw_request(broker.port, ApiKey.PRODUCE, 9, produce)["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        status, out, _ = run(capsys, "remove", *bootstrap, "--topic", "orders")
        assert status == 0 and "removed 2 ACLs" in out
    stored = set(AclStore(data_dir).load())
    assert AclBinding.of(ResourceType.TRANSACTIONAL_ID, "app-", "User:ANONYMOUS", AclOperation.WRITE, pattern_type=PatternType.PREFIXED) in stored
    assert not [b for b in stored if b.pattern.name == "orders"]
    assert not [b for b in stored if b.pattern.name == "app-" and b.pattern.resource_type == ResourceType.TOPIC and b.entry.operation == AclOperation.WRITE]
    assert all(b.entry.permission_type == AclPermissionType.ALLOW for b in stored)


def test_refusals_are_one_line(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    status, _, err = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:bob", "--operation", "Read")
    assert status == 2 and "name at least one resource" in err
    status, _, err = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:bob", "--operation", "Steal", "--topic", "t")
    assert status == 2 and "unknown operation 'Steal'" in err
    status, _, err = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "bob", "--operation", "Read", "--topic", "t")
    assert status == 2 and "Type:name" in err
    status, _, err = run(capsys, "remove", "--data-dir", data_dir)
    assert status == 2 and "name the resources" in err
    (tmp_path / "data" / "acls.json").write_text("garbage")
    status, _, err = run(capsys, "list", "--data-dir", data_dir)
    assert status == 1 and "damaged" in err


def test_over_the_wire_without_alter_on_the_cluster_is_refused(tmp_path, capsys):
    with EmbeddedBroker(str(tmp_path / "data"), properties={"authorizer.class.name": "acl"}) as broker:
        status, _, err = run(capsys, "add", "--bootstrap-server", broker.bootstrap, "--allow-principal", "User:bob", "--operation", "Read", "--topic", "t")
        assert status == 1 and "CLUSTER_AUTHORIZATION_FAILED" in err
    with EmbeddedBroker(str(tmp_path / "open")) as broker:
        status, _, err = run(capsys, "list", "--bootstrap-server", broker.bootstrap)
        assert status == 1 and "SECURITY_DISABLED" in err


def test_the_broker_refuses_an_unknown_authorizer_or_a_bad_super_users(tmp_path, capsys):
    for setting, says in (("authorizer.class.name=com.example.Mine", "authorizer.class.name must be acl"), ("super.users=admin", "super.users wants principals")):
        status = main(["broker", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--config", setting])
        err = capsys.readouterr().err
        assert status == 2 and says in err and "Traceback" not in err


def test_remove_with_a_principal_and_no_host_removes_the_any_host_acl_only(tmp_path, capsys):
    """As kafka-acls: a principal named without --allow-host means host *,
    on remove as on add; an ACL for one host is left alone."""
    data_dir = str(tmp_path / "data")
    for hosts in ([], ["--allow-host", "10.0.0.1"]):
        status, _, _ = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:bob", *hosts, "--operation", "Read", "--topic", "t")
        assert status == 0
    status, out, _ = run(capsys, "remove", "--data-dir", data_dir, "--allow-principal", "User:bob", "--operation", "Read", "--topic", "t")
    assert status == 0 and "removed 1 ACLs" in out
    assert [b.entry.host for b in AclStore(data_dir).load()] == ["10.0.0.1"]


def test_add_without_an_operation_grants_all_as_kafka_acls_does(tmp_path, capsys):
    data_dir = str(tmp_path / "data")
    status, out, err = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:bob", "--topic", "orders")
    assert status == 0 and "added 1 ACLs" in out, err
    assert "operation=ALL" in out
    assert set(AclStore(data_dir).load()) == {AclBinding.of(ResourceType.TOPIC, "orders", "User:bob", AclOperation.ALL)}
    # --producer names its operations: no All beside them.
    status, out, _ = run(capsys, "add", "--data-dir", data_dir, "--allow-principal", "User:carol", "--producer", "--topic", "out")
    assert status == 0 and "added 3 ACLs" in out
    carol = {b.entry.operation for b in AclStore(data_dir).load() if b.entry.principal == "User:carol"}
    assert carol == {AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE}
