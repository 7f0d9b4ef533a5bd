"""Authorisation on every request (broker.security.authorizer), over real
sockets: raw requests for the exact answers, and confluent-kafka,
kafka-python and aiokafka for what a user sees. Until SASL is on, every
connection is User:ANONYMOUS; principals are told apart by the host they
connect from (127.0.0.1 and 127.0.0.2, both loopback).

Each denial is also checked to have changed nothing: no record in the log,
no transactional id at the coordinator, no offsets in the group."""

from __future__ import annotations

import socket
import uuid

import pytest

from broker.apis import SUPPORTED_APIS
from broker.security.acl_store import AclStore
from broker.security.acls import AclBinding
from broker.security.acls import AclOperation as Op
from broker.security.acls import AclPermissionType as Perm
from broker.security.acls import PatternType as Pat
from broker.security.acls import ResourceType as Res
from broker.security.authorizer import RULES
from protocol.errors import ErrorCode
from protocol.messages import APIS, ApiKey
from protocol.records import encode_batch

ANON = "User:ANONYMOUS"
LOCAL = "127.0.0.1"
STRANGER_HOST = "127.0.0.2"


def allow(rtype, name, op, principal=ANON, host="*", pattern=Pat.LITERAL):
    return AclBinding.of(rtype, name, principal, op, Perm.ALLOW, host=host, pattern_type=pattern)


def deny(rtype, name, op, principal=ANON, host="*"):
    return AclBinding.of(rtype, name, principal, op, Perm.DENY, host=host)


@pytest.fixture
def acl_broker(tmp_path):
    """``make(acls, **properties)``: a broker with the ACL authorizer and
    these ACLs stored before it starts (the offline path)."""
    from broker.broker import EmbeddedBroker

    started = []

    def make(acls=(), **properties):
        data_dir = str(tmp_path / f"data{len(started)}")
        import os

        os.makedirs(data_dir, exist_ok=True)
        AclStore(data_dir).save(acls)
        props = {"authorizer.class.name": "acl", **{k.replace("_", "."): v for k, v in properties.items()}}
        broker = EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0, properties=props).start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.stop()


def request(port, api_key, version, body, *, source=LOCAL):
    """One request on a fresh connection from ``source`` (a loopback address)."""
    from protocol.framing import ClientConnection

    connection = ClientConnection(client_id="acl-test")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        _correlation, frame = connection.send_request(api_key, version, body)
        sock.sendall(frame)
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed without an answer")
            connection.receive_data(data)
            response = connection.next_response()
            if response is not None:
                return response.body


def produce_body(*topics, transactional_id=None, producer_id=-1, epoch=-1, transactional=False):
    batch = encode_batch([(b"k", b"v", (), 0)], producer_id=producer_id, producer_epoch=epoch, base_sequence=0 if producer_id >= 0 else -1, is_transactional=transactional)
    return {"transactional_id": transactional_id, "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": t, "partition_data": [{"index": 0, "records": batch}]} for t in topics]}


def log_end(broker, topic, partition=0):
    return broker.call(lambda b: b.replicas.get_log(topic, partition).high_watermark)


def create(broker, *topics):
    for topic in topics:
        broker.call(lambda b, t=topic: b.replicas.create_topic(t, 1))


def test_every_api_the_broker_serves_has_a_rule():
    assert set(SUPPORTED_APIS) <= set(RULES), f"no authorisation rule for {sorted(set(SUPPORTED_APIS) - set(RULES))}"


def test_without_an_authorizer_nothing_is_checked_and_the_acl_apis_say_security_disabled(embedded_broker):
    port = embedded_broker.port
    create(embedded_broker, "open")
    answer = request(port, ApiKey.PRODUCE, 9, produce_body("open"))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE
    creation = {"resource_type": Res.TOPIC, "resource_name": "t", "resource_pattern_type": Pat.LITERAL, "principal": ANON, "host": "*", "operation": Op.READ, "permission_type": Perm.ALLOW}
    answer = request(port, ApiKey.CREATE_ACLS, 3, {"creations": [creation]})
    assert answer["results"][0]["error_code"] == ErrorCode.SECURITY_DISABLED
    answer = request(port, ApiKey.DESCRIBE_ACLS, 3, {"resource_type_filter": Res.ANY, "pattern_type_filter": Pat.ANY, "operation": Op.ANY, "permission_type": Perm.ANY})
    assert answer["error_code"] == ErrorCode.SECURITY_DISABLED


def test_produce_is_denied_per_topic_and_the_denied_topic_gets_nothing(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "allowed", Op.WRITE)])
    create(broker, "allowed", "denied")
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("allowed", "denied"))
    codes = {t["name"]: t["partition_responses"][0]["error_code"] for t in answer["responses"]}
    assert codes == {"allowed": ErrorCode.NONE, "denied": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert log_end(broker, "allowed") == 1
    assert log_end(broker, "denied") == 0
    # acks=0 with only denied topics: no answer due, still nothing written.
    body = produce_body("denied")
    body["acks"] = 0
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        from protocol.framing import ClientConnection

        sock.sendall(ClientConnection(client_id="x").send_request(ApiKey.PRODUCE, 9, body)[1])
    assert request(broker.port, ApiKey.METADATA, 12, {"topics": None}) is not None
    assert log_end(broker, "denied") == 0


def test_transactional_produce_needs_write_on_the_transactional_id(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "t", Op.WRITE)])
    create(broker, "t")
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("t", transactional_id="app", producer_id=1000, epoch=0, transactional=True))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # Transactional batches with no transactional id at all are refused the same way.
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("t", producer_id=1000, epoch=0, transactional=True))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert log_end(broker, "t") == 0


def test_metadata_hides_what_may_not_be_described_and_auto_creation_needs_create(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "seen", Op.DESCRIBE), allow(Res.TOPIC, "made-", Op.CREATE, pattern=Pat.PREFIXED), allow(Res.TOPIC, "made-", Op.DESCRIBE, pattern=Pat.PREFIXED), allow(Res.TOPIC, "wish", Op.DESCRIBE)])
    create(broker, "seen", "hidden")
    listing = request(broker.port, ApiKey.METADATA, 12, {"topics": None, "include_topic_authorized_operations": True})
    assert [t["name"] for t in listing["topics"]] == ["seen"]
    assert listing["topics"][0]["topic_authorized_operations"] == 1 << Op.DESCRIBE
    named = request(broker.port, ApiKey.METADATA, 12, {"topics": [{"name": "hidden"}, {"name": "seen"}, {"name": "wish"}, {"name": "made-1"}], "allow_auto_topic_creation": True})
    codes = {t["name"]: t["error_code"] for t in named["topics"]}
    # hidden: may not describe; wish: may describe but not create.
    assert codes == {"hidden": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "seen": ErrorCode.NONE, "wish": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "made-1": ErrorCode.NONE}
    topics = broker.call(lambda b: set(b.replicas.topics))
    assert "made-1" in topics and "wish" not in topics
    # v0: an empty list is all topics, still filtered.
    assert [t["name"] for t in request(broker.port, ApiKey.METADATA, 0, {"topics": []})["topics"]] == ["made-1", "seen"] or {t["name"] for t in request(broker.port, ApiKey.METADATA, 0, {"topics": []})["topics"]} == {"made-1", "seen"}


def test_fetch_and_list_offsets_need_read_and_describe(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "readable", Op.READ)])
    create(broker, "readable", "secret")
    topics = [{"topic": t, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]} for t in ("readable", "secret")]
    answer = request(broker.port, ApiKey.FETCH, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "topics": topics})
    assert {t["topic"]: t["partitions"][0]["error_code"] for t in answer["responses"]} == {"readable": ErrorCode.NONE, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    # Only denied topics: answered at once, not after max_wait_ms.
    answer = request(broker.port, ApiKey.FETCH, 12, {"replica_id": -1, "max_wait_ms": 60_000, "min_bytes": 1, "max_bytes": 1 << 20, "topics": topics[1:]})
    assert answer["responses"][0]["partitions"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    offsets = request(broker.port, ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [{"name": t, "partitions": [{"partition_index": 0, "timestamp": -1}]} for t in ("readable", "secret")]})
    assert {t["name"]: t["partitions"][0]["error_code"] for t in offsets["topics"]} == {"readable": ErrorCode.NONE, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_a_stranger_cannot_fence_a_transactional_id_it_may_not_write(acl_broker):
    """The attack of issue 18: InitProducerId on someone else's
    transactional id bumps its epoch and aborts its open transaction. Here
    the victim may write from 127.0.0.1 only; the stranger comes from
    127.0.0.2 and is refused, the epoch stays, the victim's transaction
    commits."""
    from txn import Producer

    broker = acl_broker([allow(Res.TRANSACTIONAL_ID, "victim", Op.WRITE, host=LOCAL), allow(Res.TOPIC, "out", Op.WRITE, host=LOCAL), allow(Res.TOPIC, "out", Op.READ), allow(Res.GROUP, "read-", Op.READ, pattern=Pat.PREFIXED)])
    create(broker, "out")
    with Producer(bootstrap_servers=broker.bootstrap, transactional_id="victim") as victim:
        victim.init_transactions()
        victim.begin_transaction()
        victim.send("out", b"before the attack").result(30)
        epoch_before = broker.call(lambda b: b.transactions.coordinator.txns["victim"].producer_epoch)
        for body in ({"transactional_id": "victim", "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1},):
            answer = request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, body, source=STRANGER_HOST)
            assert answer["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        metadata = broker.call(lambda b: b.transactions.coordinator.txns["victim"])
        end = request(broker.port, ApiKey.END_TXN, 3, {"transactional_id": "victim", "producer_id": metadata.producer_id, "producer_epoch": metadata.producer_epoch, "committed": False}, source=STRANGER_HOST)
        assert end["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert broker.call(lambda b: b.transactions.coordinator.txns["victim"].producer_epoch) == epoch_before
        victim.send("out", b"after the attack").result(30)
        victim.commit_transaction()
    from tests.helpers import read_values

    assert read_values(broker.bootstrap, "out", partitions=1, expect=2) == [b"before the attack", b"after the attack"]


def test_init_producer_id_without_write_creates_no_transactional_state(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "t", Op.WRITE)])
    answer = request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "nobody", "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1})
    assert answer["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert broker.call(lambda b: "nobody" in b.transactions.coordinator.txns) is False
    # Idempotent: WRITE on some topic is enough (KIP-679) ...
    assert request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1})["error_code"] == ErrorCode.NONE


def test_idempotent_init_needs_idempotent_write_or_write_on_a_topic(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "t", Op.READ)])
    body = {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1}
    assert request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, body)["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    broker = acl_broker([allow(Res.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)])
    assert request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, body)["error_code"] == ErrorCode.NONE


def test_group_apis_need_read_and_a_stranger_cannot_read_a_groups_offsets(acl_broker):
    broker = acl_broker([allow(Res.GROUP, "mine", Op.READ, host=LOCAL), allow(Res.TOPIC, "t", Op.READ, host=LOCAL)])
    create(broker, "t", "u")
    commit = {"group_id": "mine", "generation_id_or_member_epoch": -1, "member_id": "", "topics": [{"name": n, "partitions": [{"partition_index": 0, "committed_offset": 5}]} for n in ("t", "u")]}
    answer = request(broker.port, ApiKey.OFFSET_COMMIT, 8, commit)
    assert {t["name"]: t["partitions"][0]["error_code"] for t in answer["topics"]} == {"t": ErrorCode.NONE, "u": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    fetch_all = {"group_id": "mine", "topics": None, "require_stable": False}
    mine = request(broker.port, ApiKey.OFFSET_FETCH, 7, fetch_all)
    assert [(t["name"], t["partitions"][0]["committed_offset"]) for t in mine["topics"]] == [("t", 5)]
    stranger = request(broker.port, ApiKey.OFFSET_FETCH, 7, fetch_all, source=STRANGER_HOST)
    assert stranger["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED and stranger["topics"] == []
    batched = request(broker.port, ApiKey.OFFSET_FETCH, 8, {"groups": [{"group_id": "mine", "topics": None}], "require_stable": False}, source=STRANGER_HOST)
    assert batched["groups"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    # The stranger's commit changes nothing.
    commit["topics"][0]["partitions"][0]["committed_offset"] = 99
    answer = request(broker.port, ApiKey.OFFSET_COMMIT, 8, commit, source=STRANGER_HOST)
    assert answer["topics"][0]["partitions"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert request(broker.port, ApiKey.OFFSET_FETCH, 7, fetch_all)["topics"][0]["partitions"][0]["committed_offset"] == 5
    join = {"group_id": "mine", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000, "member_id": "", "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
    assert request(broker.port, ApiKey.JOIN_GROUP, 7, join, source=STRANGER_HOST)["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert request(broker.port, ApiKey.FIND_COORDINATOR, 3, {"key": "mine", "key_type": 0}, source=STRANGER_HOST)["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    listed = request(broker.port, ApiKey.LIST_GROUPS, 4, {"states_filter": []}, source=STRANGER_HOST)
    assert listed["groups"] == []
    assert [g["group_id"] for g in request(broker.port, ApiKey.LIST_GROUPS, 4, {"states_filter": []})["groups"]] == ["mine"]


def creation(rtype, name, op, principal=ANON, perm=Perm.ALLOW, pattern=Pat.LITERAL, host="*"):
    return {"resource_type": rtype, "resource_name": name, "resource_pattern_type": pattern, "principal": principal, "host": host, "operation": op, "permission_type": perm}


ANY_FILTER = {"resource_type_filter": Res.ANY, "resource_name_filter": None, "pattern_type_filter": Pat.ANY, "principal_filter": None, "host_filter": None, "operation": Op.ANY, "permission_type": Perm.ANY}


def test_acl_apis_need_alter_and_describe_on_the_cluster_and_survive_a_restart(acl_broker, tmp_path):
    admin_acls = [allow(Res.CLUSTER, "kafka-cluster", Op.ALTER, host=LOCAL)]
    broker = acl_broker(admin_acls)
    port = broker.port
    refused = request(port, ApiKey.CREATE_ACLS, 3, {"creations": [creation(Res.TOPIC, "t", Op.READ)]}, source=STRANGER_HOST)
    assert refused["results"][0]["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    made = request(port, ApiKey.CREATE_ACLS, 3, {"creations": [creation(Res.TOPIC, "t", Op.READ), creation(Res.TOPIC, "app-", Op.WRITE, pattern=Pat.PREFIXED), creation(Res.CLUSTER, "other", Op.ALTER)]})
    assert [r["error_code"] for r in made["results"]] == [ErrorCode.NONE, ErrorCode.NONE, ErrorCode.INVALID_REQUEST]
    # ALTER implies DESCRIBE: the admin may list.
    listed = request(port, ApiKey.DESCRIBE_ACLS, 3, ANY_FILTER)
    assert listed["error_code"] == ErrorCode.NONE
    assert {(r["resource_type"], r["resource_name"], r["pattern_type"]) for r in listed["resources"]} == {(Res.CLUSTER, "kafka-cluster", Pat.LITERAL), (Res.TOPIC, "t", Pat.LITERAL), (Res.TOPIC, "app-", Pat.PREFIXED)}
    assert request(port, ApiKey.DESCRIBE_ACLS, 3, ANY_FILTER, source=STRANGER_HOST)["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # v0 has no pattern type: its filter is LITERAL, prefixed ACLs are not shown.
    v0 = request(port, ApiKey.DESCRIBE_ACLS, 0, {**ANY_FILTER, "resource_type_filter": Res.TOPIC})
    assert [r["resource_name"] for r in v0["resources"]] == ["t"]
    match = request(port, ApiKey.DESCRIBE_ACLS, 3, {**ANY_FILTER, "resource_type_filter": Res.TOPIC, "resource_name_filter": "app-1", "pattern_type_filter": Pat.MATCH})
    assert [r["resource_name"] for r in match["resources"]] == ["app-"]
    # The new ACL is in force at once: READ on t.
    create(broker, "t")
    fetch = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    assert request(port, ApiKey.FETCH, 12, fetch)["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
    deleted = request(port, ApiKey.DELETE_ACLS, 3, {"filters": [{**ANY_FILTER, "resource_type_filter": Res.TOPIC, "resource_name_filter": "t", "pattern_type_filter": Pat.LITERAL}]})
    assert [m["resource_name"] for m in deleted["filter_results"][0]["matching_acls"]] == ["t"]
    assert request(port, ApiKey.FETCH, 12, fetch)["responses"][0]["partitions"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    data_dir = broker.config.data_dir
    broker.stop()
    stored = set(AclStore(data_dir).load())
    assert stored == set(admin_acls) | {allow(Res.TOPIC, "app-", Op.WRITE, pattern=Pat.PREFIXED)}


def test_super_users_may_do_everything_and_deny_wins_for_others(acl_broker):
    broker = acl_broker([deny(Res.TOPIC, "*", Op.ALL), allow(Res.TOPIC, "t", Op.WRITE)], super_users="User:ANONYMOUS")
    create(broker, "t")
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("t"))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE
    broker = acl_broker([deny(Res.TOPIC, "*", Op.ALL), allow(Res.TOPIC, "t", Op.WRITE)], super_users="User:admin")
    create(broker, "t")
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("t"))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_allow_everyone_if_no_acl_found(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "guarded", Op.READ)], allow_everyone_if_no_acl_found="true")
    create(broker, "free", "guarded")
    codes = {t["name"]: t["partition_responses"][0]["error_code"] for t in request(broker.port, ApiKey.PRODUCE, 9, produce_body("free", "guarded"))["responses"]}
    assert codes == {"free": ErrorCode.NONE, "guarded": ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_a_damaged_acl_file_stops_the_broker_from_starting(tmp_path):
    from broker.broker import DataDirError, EmbeddedBroker

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "acls.json").write_text('{"format": 1, "sha256": "00", "acls": []}')
    with pytest.raises(DataDirError, match="damaged"):
        EmbeddedBroker(str(data_dir), properties={"authorizer.class.name": "acl"}).start()


def test_admin_apis_are_checked(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "mine-", Op.ALL, pattern=Pat.PREFIXED)])
    create(broker, "theirs")
    made = request(broker.port, ApiKey.CREATE_TOPICS, 5, {"topics": [{"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []} for n in ("mine-1", "theirs-1")], "timeout_ms": 5000})
    assert {t["name"]: t["error_code"] for t in made["topics"]} == {"mine-1": ErrorCode.NONE, "theirs-1": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert broker.call(lambda b: "theirs-1" in b.replicas.topics) is False
    gone = request(broker.port, ApiKey.DELETE_TOPICS, 4, {"topic_names": ["theirs", "mine-1"], "timeout_ms": 5000})
    assert {t["name"]: t["error_code"] for t in gone["responses"]} == {"theirs": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "mine-1": ErrorCode.NONE}
    assert broker.call(lambda b: "theirs" in b.replicas.topics) is True
    configs = request(broker.port, ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 2, "resource_name": "theirs", "configuration_keys": None}, {"resource_type": 4, "resource_name": "0", "configuration_keys": None}]})
    assert [r["error_code"] for r in configs["results"]] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    marker = {"markers": [{"producer_id": 1, "producer_epoch": 0, "transaction_result": False, "topics": [{"name": "theirs", "partition_indexes": [0]}], "coordinator_epoch": 0}]}
    assert request(broker.port, ApiKey.WRITE_TXN_MARKERS, 1, marker)["markers"][0]["topics"][0]["partitions"][0]["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert log_end(broker, "theirs") == 0


# -- real clients -------------------------------------------------------------------------------------------


def test_confluent_kafka_gets_kafkas_errors_and_works_once_allowed(acl_broker):
    from confluent_kafka import KafkaError, KafkaException, Producer

    topic = f"cf-{uuid.uuid4().hex[:6]}"
    broker = acl_broker([allow(Res.TOPIC, topic, Op.WRITE), allow(Res.CLUSTER, "kafka-cluster", Op.CREATE)])
    create(broker, topic, "forbidden")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "message.timeout.ms": 10000})
    outcomes = {}
    for name in (topic, "forbidden"):
        producer.produce(name, b"value", on_delivery=lambda err, msg, name=name: outcomes.setdefault(name, err))
    producer.flush(30)
    assert outcomes[topic] is None
    assert outcomes["forbidden"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert log_end(broker, "forbidden") == 0
    transactional = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "not-mine"})
    with pytest.raises(KafkaException) as raised:
        transactional.init_transactions(20)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert broker.call(lambda b: "not-mine" in b.transactions.coordinator.txns) is False


def test_kafka_python_gets_kafkas_errors(acl_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import TopicAuthorizationFailedError

    broker = acl_broker([allow(Res.TOPIC, "ok", Op.WRITE), allow(Res.TOPIC, "ok", Op.READ)])
    create(broker, "ok", "secret")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", max_block_ms=10000)
    producer.send("ok", b"v").get(30)
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send("secret", b"v").get(30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=10000)
    consumer.assign([TopicPartition("ok", 0)])
    consumer.seek_to_beginning()
    assert next(iter(consumer)).value == b"v"
    consumer.close()
    assert log_end(broker, "secret") == 0


def test_aiokafka_gets_kafkas_errors(acl_broker):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import (
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError,
    )

    broker = acl_broker([allow(Res.TOPIC, "ok", Op.ALL)])
    create(broker, "ok", "secret")

    async def scenario():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", request_timeout_ms=10000)
        await producer.start()
        try:
            await producer.send_and_wait("ok", b"v")
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait("secret", b"v")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("ok", bootstrap_servers=broker.bootstrap, group_id="no-group-acl", auto_offset_reset="earliest")
        with pytest.raises(GroupAuthorizationFailedError):
            await consumer.start()
            await asyncio.wait_for(consumer.getone(), 20)
        await consumer.stop()

    asyncio.run(scenario())
    assert log_end(broker, "secret") == 0


# -- every denial encodes, in every version ----------------------------------------------------------------

BATCH = encode_batch([(b"k", b"v", (), 0)])
T_ID = uuid.uuid4()  # topic "t"'s id (Fetch v13+ names topics by id)
PARTS = [{"partition": 0, "partition_index": 0, "index": 0, "records": BATCH, "fetch_offset": 0, "timestamp": -1, "offset": 0, "committed_offset": 1}]
SAMPLES = {
    ApiKey.PRODUCE: {"transactional_id": None, "acks": -1, "topic_data": [{"name": "t", "partition_data": PARTS}]},
    ApiKey.FETCH: {"replica_id": -1, "topics": [{"topic": "t", "topic_id": T_ID, "partitions": PARTS}]},
    ApiKey.LIST_OFFSETS: {"topics": [{"name": "t", "partitions": PARTS}]},
    ApiKey.METADATA: {"topics": [{"name": "t"}], "allow_auto_topic_creation": True},
    ApiKey.OFFSET_COMMIT: {"group_id": "g", "topics": [{"name": "t", "partitions": PARTS}]},
    ApiKey.OFFSET_FETCH: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}], "groups": [{"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}]}]},
    ApiKey.FIND_COORDINATOR: {"key": "g", "key_type": 0, "coordinator_keys": ["g"]},
    ApiKey.JOIN_GROUP: {"group_id": "g", "member_id": "m"},
    ApiKey.HEARTBEAT: {"group_id": "g"},
    ApiKey.LEAVE_GROUP: {"group_id": "g"},
    ApiKey.SYNC_GROUP: {"group_id": "g"},
    ApiKey.DESCRIBE_GROUPS: {"groups": ["g"]},
    ApiKey.LIST_GROUPS: {},
    ApiKey.CREATE_TOPICS: {"topics": [{"name": "t", "num_partitions": 1}]},
    ApiKey.DELETE_TOPICS: {"topic_names": ["t"], "topics": [{"name": "t", "topic_id": uuid.uuid4()}]},
    ApiKey.DELETE_RECORDS: {"topics": [{"name": "t", "partitions": PARTS}]},
    ApiKey.INIT_PRODUCER_ID: {"transactional_id": "x"},
    ApiKey.ADD_PARTITIONS_TO_TXN: {"v3_and_below_transactional_id": "x", "v3_and_below_topics": [{"name": "t", "partitions": [0]}], "transactions": []},
    ApiKey.ADD_OFFSETS_TO_TXN: {"transactional_id": "x", "group_id": "g"},
    ApiKey.END_TXN: {"transactional_id": "x"},
    ApiKey.WRITE_TXN_MARKERS: {"markers": [{"producer_id": 1, "topics": [{"name": "t", "partition_indexes": [0]}]}]},
    ApiKey.TXN_OFFSET_COMMIT: {"transactional_id": "x", "group_id": "g", "topics": [{"name": "t", "partitions": PARTS}]},
    ApiKey.DESCRIBE_ACLS: {},
    ApiKey.CREATE_ACLS: {"creations": [{}]},
    ApiKey.DELETE_ACLS: {"filters": [{}]},
    ApiKey.DESCRIBE_CONFIGS: {"resources": [{"resource_type": 2, "resource_name": "t"}, {"resource_type": 4, "resource_name": "0"}]},
    ApiKey.ALTER_CONFIGS: {"resources": [{"resource_type": 2, "resource_name": "t"}]},
    ApiKey.INCREMENTAL_ALTER_CONFIGS: {"resources": [{"resource_type": 4, "resource_name": "0"}]},
    ApiKey.CREATE_PARTITIONS: {"topics": [{"name": "t", "count": 2}]},
    ApiKey.DELETE_GROUPS: {"groups_names": ["g"]},
    ApiKey.OFFSET_DELETE: {"group_id": "g", "topics": [{"name": "t", "partitions": PARTS}]},
    ApiKey.DESCRIBE_CLIENT_QUOTAS: {},
    ApiKey.ALTER_CLIENT_QUOTAS: {"entries": [{"entity": [{"entity_type": "user", "entity_name": "bob"}]}]},
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: {},
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: {"deletions": [{"name": "bob"}], "upsertions": [{"name": "alice"}]},
    ApiKey.DESCRIBE_CLUSTER: {"include_cluster_authorized_operations": True},
    ApiKey.DESCRIBE_PRODUCERS: {"topics": [{"name": "t", "partition_indexes": [0]}]},
    ApiKey.DESCRIBE_TRANSACTIONS: {"transactional_ids": ["x"]},
    ApiKey.LIST_TRANSACTIONS: {},
}
CASES = [(api, version) for api in SAMPLES for version in range(APIS[api].response.valid[0], APIS[api].response.valid[1] + 1)]


@pytest.mark.parametrize("api, version", CASES, ids=[f"{ApiKey(a).name}-v{v}" for a, v in CASES])
def test_every_denial_encodes_in_every_version(api, version):
    """A denied request's answer (with a handler's empty answer where the
    rule still calls one) is a valid response of that API and version."""
    import types

    from broker.security.acls import AclAuthorizer
    from broker.security.authorizer import Check, TopicView
    from broker.security.session import Session
    from protocol import schema

    no_topics = types.SimpleNamespace(topics={}, topics_by_id={T_ID: types.SimpleNamespace(name="t")})
    check = Check(AclAuthorizer([]), Session(), TopicView(no_topics, auto_create=True))
    verdict = RULES[api](check, version, dict(SAMPLES[api]))
    assert verdict is not None, "nothing is allowed here: every rule has something to deny"
    response = verdict.finish(None if verdict.body is None else {})
    if response is None:
        assert api == ApiKey.PRODUCE or verdict.body is not None
        return
    schema.encode(APIS[api].response, version, response)


# -- whole flows and restarts ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_acls_made_over_the_wire_survive_sigkill(broker_process, tmp_path):
    """CreateAcls is answered only once acls.json is on disk: a SIGKILL right
    after loses nothing, and a DeleteAcls is as durable."""
    from txn import Admin

    seed = str(tmp_path / "broker0")
    import os

    os.makedirs(seed, exist_ok=True)
    AclStore(seed).save([allow(Res.CLUSTER, "kafka-cluster", Op.ALTER)])
    broker = broker_process("authorizer.class.name=acl")
    wanted = [allow(Res.TOPIC, f"t{i}", Op.READ, principal=f"User:u{i}") for i in range(20)]
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_acls(wanted)
    broker.kill()
    broker.start()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert set(admin.describe_acls()) == set(wanted) | {allow(Res.CLUSTER, "kafka-cluster", Op.ALTER)}
        from protocol.acls import AclBindingFilter

        removed = admin.delete_acls([AclBindingFilter(resource_type=Res.TOPIC, name="t", pattern_type=Pat.MATCH)])
        assert removed == []
        removed = admin.delete_acls([AclBindingFilter(principal="User:u3")])
        assert removed == [wanted[3]]
    broker.kill()
    broker.start()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert set(admin.describe_acls()) == (set(wanted) - {wanted[3]}) | {allow(Res.CLUSTER, "kafka-cluster", Op.ALTER)}


@pytest.mark.slow
def test_confluent_kafka_transactions_and_groups_with_the_right_acls_and_each_missing_one(acl_broker):
    """A consume-transform-produce transaction with confluent-kafka, as a
    user grants it (kafka-acls --producer --transactional-id, --consumer
    --group); then each ACL taken away fails with Kafka's error."""
    from confluent_kafka import (
        Consumer,
        KafkaError,
        KafkaException,
        Producer,
        TopicPartition,
    )

    grants = [
        allow(Res.TOPIC, "in", Op.READ),
        allow(Res.TOPIC, "out", Op.WRITE),
        allow(Res.TOPIC, "out", Op.READ),
        allow(Res.TRANSACTIONAL_ID, "etl", Op.WRITE),
        allow(Res.GROUP, "etl-group", Op.READ),
        allow(Res.GROUP, "read-", Op.READ, pattern=Pat.PREFIXED),
        allow(Res.TOPIC, "in", Op.WRITE),
    ]
    broker = acl_broker(grants)
    create(broker, "in", "out")

    def run_once(tag: str):
        """Produce one input record, then consume it in the group and write
        it to out in a transaction with the offsets. Raises KafkaException."""
        seed = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000})
        seed.produce("in", tag.encode())
        assert seed.flush(20) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "etl-group", "enable.auto.commit": False, "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "etl"})
        try:
            producer.init_transactions(20)
            consumer.assign([TopicPartition("in", 0)])
            message = None
            for _ in range(100):
                message = consumer.poll(0.2)
                if message is not None:
                    break
            assert message is not None
            if message.error():
                raise KafkaException(message.error())
            producer.begin_transaction()
            producer.produce("out", message.value())
            producer.send_offsets_to_transaction([TopicPartition("in", 0, message.offset() + 1)], consumer.consumer_group_metadata(), 20)
            producer.commit_transaction(20)
        finally:
            consumer.close()

    run_once("first")
    from tests.helpers import read_values

    assert read_values(broker.bootstrap, "out", partitions=1, expect=1) == [b"first"]
    committed = broker.call(lambda b: b.groups.coordinator.fetch_offsets("etl-group", [("in", 0)], False))
    assert committed[("in", 0)][0].offset >= 1

    expected = {
        allow(Res.TRANSACTIONAL_ID, "etl", Op.WRITE): KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        allow(Res.GROUP, "etl-group", Op.READ): KafkaError.GROUP_AUTHORIZATION_FAILED,
        allow(Res.TOPIC, "in", Op.READ): KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
    from broker.broker import EmbeddedBroker

    data_dir = broker.config.data_dir
    broker.stop()
    for missing, code in expected.items():
        AclStore(data_dir).save([g for g in grants if g != missing])
        with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0, properties={"authorizer.class.name": "acl"}) as broker:
            out_before = log_end(broker, "out")
            with pytest.raises(KafkaException) as raised:
                run_once(f"without {missing.entry.operation.name} on {missing.pattern}")
            assert raised.value.args[0].code() == code, (missing, raised.value.args[0])
            assert log_end(broker, "out") == out_before, "a denied transaction wrote to out"


@pytest.mark.slow
def test_the_acl_benchmark_scenario_runs(monkeypatch):
    """The harness of ``onceflow bench --only ACL`` (not its speed): both
    brokers take the load, the one with 100 ACLs without refusing it."""
    from benchmarks import bench_acl
    from benchmarks.suite import ScenarioSettings

    assert len(bench_acl.bench_acls()) == bench_acl.ACL_COUNT
    monkeypatch.setattr(bench_acl, "ALTERNATIONS", 1)
    metrics = bench_acl.acl_cost_scenario("unused", ScenarioSettings(records=4000))
    assert metrics["records/s with 100 ACLs"].value > 0 and metrics["records/s without an authorizer"].value > 0
    assert 0 < metrics["authorisation per Produce (3 topics) us"].value < metrics["broker work per Produce, no check us"].value


def test_transaction_apis_deny_as_kafka_does_and_change_nothing(acl_broker):
    """AddPartitionsToTxn fails whole when a topic is denied (denied topics
    TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED);
    AddOffsetsToTxn and TxnOffsetCommit need READ on the group; nothing
    reaches the coordinators."""
    broker = acl_broker([allow(Res.TRANSACTIONAL_ID, "tx", Op.WRITE), allow(Res.TOPIC, "ok", Op.WRITE), allow(Res.TOPIC, "ok", Op.READ)])
    create(broker, "ok", "no")
    init = request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "tx", "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1})
    assert init["error_code"] == ErrorCode.NONE
    ids = {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": init["producer_id"], "v3_and_below_producer_epoch": init["producer_epoch"]}
    added = request(broker.port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {**ids, "v3_and_below_topics": [{"name": "ok", "partitions": [0]}, {"name": "no", "partitions": [0]}]})
    codes = {t["name"]: t["results_by_partition"][0]["partition_error_code"] for t in added["results_by_topic_v3_and_below"]}
    assert codes == {"ok": ErrorCode.OPERATION_NOT_ATTEMPTED, "no": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert broker.call(lambda b: b.transactions.coordinator.txns["tx"].partitions) == frozenset()
    offsets = request(broker.port, ApiKey.ADD_OFFSETS_TO_TXN, 3, {"transactional_id": "tx", "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"], "group_id": "g"})
    assert offsets["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert broker.call(lambda b: b.transactions.coordinator.txns["tx"].partitions) == frozenset()
    commit = {"transactional_id": "tx", "group_id": "g", "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"], "generation_id": -1, "member_id": "", "topics": [{"name": "ok", "partitions": [{"partition_index": 0, "committed_offset": 3}]}]}
    assert request(broker.port, ApiKey.TXN_OFFSET_COMMIT, 3, commit)["topics"][0]["partitions"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert request(broker.port, ApiKey.TXN_OFFSET_COMMIT, 3, {**commit, "transactional_id": "other"})["topics"][0]["partitions"][0]["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert broker.call(lambda b: "g" in b.groups.coordinator.groups) is False
    # The batched (v4+) form is for brokers: CLUSTER_ACTION.
    batched = request(broker.port, ApiKey.ADD_PARTITIONS_TO_TXN, 4, {"transactions": [{"transactional_id": "tx", "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"], "verify_only": False, "topics": [{"name": "ok", "partitions": [0]}]}]})
    assert batched["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert broker.call(lambda b: b.transactions.coordinator.txns["tx"].partitions) == frozenset()
    # With only allowed topics the request goes through.
    added = request(broker.port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {**ids, "v3_and_below_topics": [{"name": "ok", "partitions": [0]}]})
    assert added["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"] == ErrorCode.NONE


def test_more_admin_apis_deny_and_change_nothing(acl_broker):
    broker = acl_broker([allow(Res.TOPIC, "t", Op.DESCRIBE)])
    create(broker, "t")
    grow = request(broker.port, ApiKey.CREATE_PARTITIONS, 3, {"topics": [{"name": "t", "count": 3, "assignments": None}], "timeout_ms": 5000, "validate_only": False})
    assert grow["results"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert broker.call(lambda b: b.replicas.topics["t"].partitions) == 1
    alter = request(broker.port, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}]}], "validate_only": False})
    assert alter["responses"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "retention.ms" not in broker.call(lambda b: b.replicas.topics["t"].config)
    request(broker.port, ApiKey.PRODUCE, 9, produce_body("t"))  # denied as well: no WRITE
    assert log_end(broker, "t") == 0
    deleted = request(broker.port, ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": -1}]}], "timeout_ms": 5000})
    assert deleted["topics"][0]["partitions"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    groups = request(broker.port, ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g"]})
    assert groups["results"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
    # DescribeCluster answers anyone, as Kafka does; DESCRIBE on the cluster
    # only decides the authorized operations shown (none here).
    cluster = request(broker.port, ApiKey.DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": True})
    assert cluster["error_code"] == ErrorCode.NONE and cluster["brokers"] and cluster["cluster_authorized_operations"] == 0


def test_our_clients_surface_kafkas_errors_at_once(acl_broker):
    """txn's producer and consumer: a denied topic or group is an
    InvalidConfigurationError carrying Kafka's code, not a retry until the
    delivery timeout."""
    from txn import Consumer, Producer
    from txn.errors import InvalidConfigurationError

    broker = acl_broker([allow(Res.TOPIC, "ok", Op.ALL), allow(Res.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)])
    create(broker, "ok", "no")
    with Producer(bootstrap_servers=broker.bootstrap, delivery_timeout_ms=60000) as producer:
        producer.send("ok", b"v").result(30)
        with pytest.raises(InvalidConfigurationError) as raised:
            producer.send("no", b"v").result(30)
        assert raised.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    with Consumer(bootstrap_servers=broker.bootstrap, group_id="not-mine") as consumer, pytest.raises(InvalidConfigurationError) as raised:
        consumer.subscribe(["ok"])
        consumer.poll(30)
    assert raised.value.code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert log_end(broker, "no") == 0


def test_delete_topics_by_id_does_not_tell_a_name_the_principal_may_not_describe(acl_broker):
    """DeleteTopics v6 by topic id, as Kafka answers it: without DESCRIBE
    the denial carries no name (the id is not secret, the name is); with
    DESCRIBE but not DELETE the name is shown. Neither topic goes."""
    broker = acl_broker([allow(Res.TOPIC, "seen", Op.DESCRIBE)])
    create(broker, "hidden", "seen")
    ids = broker.call(lambda b: {name: info.topic_id for name, info in b.replicas.topics.items()})
    gone = request(broker.port, ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": None, "topic_id": ids["hidden"]}, {"name": None, "topic_id": ids["seen"]}], "timeout_ms": 5000})
    answers = sorted(((t["name"] or ""), t["error_code"]) for t in gone["responses"])
    assert answers == [("", ErrorCode.TOPIC_AUTHORIZATION_FAILED), ("seen", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    assert broker.call(lambda b: {"hidden", "seen"} <= set(b.replicas.topics))



def test_produce_with_a_transactional_id_but_no_transactional_batch_needs_no_write_on_it(acl_broker):
    """Kafka checks WRITE on the transactional id only when the request
    holds transactional records (ProduceRequest.hasTransactionalRecords)."""
    broker = acl_broker([allow(Res.TOPIC, "t", Op.WRITE)])
    create(broker, "t")
    answer = request(broker.port, ApiKey.PRODUCE, 9, produce_body("t", transactional_id="app"))
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE
    assert log_end(broker, "t") == 1
