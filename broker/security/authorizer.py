"""Authorisation of every request, as Kafka's broker does it: a dispatcher
that wraps the broker's and lets through only what the connection's
principal may do.

``RULES`` is the one table: API key -> the rule that checks a request of
that API. A rule reads the decoded body, asks the ``AclAuthorizer`` about
each resource the request touches (Kafka's "Operations and Resources on
Protocols" table), and returns None when the request may go as it is
(the hot path of Produce), else a ``Verdict``: the body to hand to the
handlers (the request minus what was denied; None when nothing is left to
do) and a ``finish`` that builds the answer from the handlers' response
(adding the denied items with Kafka's error, or filtering what the
principal may not see). A denied item never reaches a handler, so a denied
request changes nothing: no record appended, no transaction state, no
offsets, no epoch bumped.

Errors are Kafka's: TOPIC_AUTHORIZATION_FAILED per topic partition (the
other topics of the request proceed), GROUP_, TRANSACTIONAL_ID_ and
CLUSTER_AUTHORIZATION_FAILED for the whole request where Kafka fails it
whole. Listings (Metadata without topics, ListGroups, ListTransactions,
OffsetFetch of all topics) hide what may not be described instead of
failing.

An API without a rule is refused with the connection closed (never let
through): a test checks that every API the broker serves has one.
SaslHandshake, SaslAuthenticate and ApiVersions are answered to anyone, as
in Kafka (they come before authentication).

The broker composes this dispatcher only when an authorizer is configured
(``authorizer.class.name``; see ``broker.config``): without one nothing is
checked and nothing here runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from broker.security.acls import CLUSTER_NAME, AclAuthorizer
from broker.security.acls import AclOperation as Op
from broker.security.acls import ResourceType as Res
from broker.security.session import Session
from protocol.constants import ConfigResourceType, CoordinatorType
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import ATTRIBUTES_OFFSET, TRANSACTIONAL_MASK

log = logging.getLogger(__name__)

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
NO_AUTHORIZED_OPERATIONS = -2147483648  # the schema's default: "not requested"


def _same(response):
    return response


@attrs.frozen
class Verdict:
    """``body``: what the handlers get (None: do not call them);
    ``finish``: the handlers' response (None if not called) -> the answer."""

    body: dict | None
    finish: Callable = _same


def answer(response) -> Verdict:
    """Answer ``response`` without calling the handlers."""
    return Verdict(None, lambda _: response)


class Check:
    """One request's questions to the authorizer: who asks, and about what.
    A plain slotted class, not attrs: one is made per request on the
    produce path, where attrs' generated __init__ costs more."""

    __slots__ = ("authorizer", "host", "principal", "topics")

    def __init__(self, authorizer: AclAuthorizer, session: Session, topics):
        self.authorizer = authorizer
        self.principal = str(session.principal)
        self.host = session.client_host
        self.topics = topics  # broker.security.authorizer.TopicView

    def allowed(self, operation: Op, resource_type: Res, name) -> bool:
        if name is None:
            return False
        return self.authorizer.authorize(self.principal, self.host, operation, resource_type, name)

    def topic(self, operation: Op, name) -> bool:
        return self.allowed(operation, Res.TOPIC, name)

    def group(self, operation: Op, name) -> bool:
        return self.allowed(operation, Res.GROUP, name)

    def transactional_id(self, operation: Op, name) -> bool:
        return self.allowed(operation, Res.TRANSACTIONAL_ID, name)

    def cluster(self, operation: Op) -> bool:
        return self.allowed(operation, Res.CLUSTER, CLUSTER_NAME)

    def any_topic(self, operation: Op) -> bool:
        return self.authorizer.authorize_any(self.principal, self.host, operation, Res.TOPIC)

    def operations(self, resource_type: Res, name: str) -> int:
        return self.authorizer.authorized_operations(self.principal, self.host, resource_type, name)


@attrs.frozen
class TopicView:
    """What the rules need to know of the topics: names by id (Fetch v13+,
    Metadata by id), whether a name exists, and whether Metadata may
    auto-create (which then needs CREATE)."""

    replicas: object  # broker.replica.ReplicaManager: .topics, .topics_by_id
    auto_create: bool

    @property
    def topics(self) -> dict:
        return self.replicas.topics

    def name_for_id(self, topic_id):
        from broker.apis import as_uuid

        info = self.replicas.topics_by_id.get(as_uuid(topic_id))
        return info.name if info else None


# -- helpers: split a request's topics into allowed and denied -------------------------------------


def split(items, allowed: Callable[[dict], bool]):
    kept, denied = [], []
    for item in items:
        (kept if allowed(item) else denied).append(item)
    return kept, denied


def without_denied(body: dict, request_key: str, kept: list, denied_entries: list, response_key: str, empty_response, *, also: Callable[[dict], None] | None = None) -> Verdict:
    """The common shape of a partial denial: the handlers get the request
    with only ``kept`` under ``request_key``, and the answer lists their
    results then ``denied_entries`` under ``response_key``. With nothing
    kept the handlers are not called: the answer is ``empty_response``
    (a dict, or None for a request that is not answered) plus the denials.
    ``also`` changes every answer first (filters what may not be seen)."""
    if not denied_entries and also is None:
        return Verdict(body)

    def finish(response):
        if response is None:
            return None
        if also is not None:
            also(response)
        if denied_entries:
            response[response_key] = list(response.get(response_key) or []) + denied_entries
        return response

    if not denied_entries:
        return Verdict(body, finish)
    if not kept:
        return answer(finish(empty_response))
    return Verdict({**body, request_key: kept}, finish)


def _partition_index(partition: dict) -> int:
    return partition.get("partition_index", -1)


def _no_topics(body: dict, version: int) -> dict:
    return {"throttle_time_ms": 0, "topics": []}


def topic_partitions_rule(
    *,
    operation: Op,
    denied_partition: Callable[[int, int], dict],
    topics_key: str = "topics",
    name_key: str = "name",
    partitions_key: str = "partitions",
    response_topics_key: str = "topics",
    response_partitions_key: str = "partitions",
    index_of: Callable = _partition_index,
    empty_response: Callable[[dict, int], dict | None] = _no_topics,
):
    """A rule for APIs whose request is topics -> partitions and whose
    denial is per partition (Produce, ListOffsets, DeleteRecords, ...); the
    defaults are the common field names."""

    def rule(check: Check, version: int, body: dict) -> Verdict:
        topics = body.get(topics_key) or []
        kept, denied = split(topics, lambda topic: check.topic(operation, topic.get(name_key)))
        denied_entries = [{name_key: topic.get(name_key), response_partitions_key: [denied_partition(index_of(p), version) for p in topic.get(partitions_key) or []]} for topic in denied]
        return without_denied(body, topics_key, kept, denied_entries, response_topics_key, empty_response(body, version) if not kept else None)

    return rule


def all_or_nothing(error_response: Callable[[dict, int, int], dict], error: int, allowed: Callable[[Check, dict], bool]):
    """A rule that lets the request through or fails all of it with ``error``."""

    def rule(check: Check, version: int, body: dict) -> Verdict:
        if allowed(check, body):
            return Verdict(body)
        return answer(error_response(body, version, error))

    return rule


def anyone(check: Check, version: int, body: dict) -> Verdict:
    return Verdict(body)


# -- Produce -------------------------------------------------------------------------------------------


def _produce_partition(index, error):
    return {"index": index, "error_code": error, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}


def produce(check: Check, version: int, body: dict) -> Verdict | None:
    topics = body.get("topic_data") or []
    transactional_id = body.get("transactional_id")
    # The hot path, in one pass and without a closure per topic: every topic
    # writable (and no transactional batch) lets the request through. As
    # Kafka's hasTransactionalRecords, a partition's first batch says
    # whether it is transactional; the id alone asks for nothing.
    authorize, principal, host = check.authorizer.authorize, check.principal, check.host
    all_writable = True
    transactional = False
    for topic in topics:
        if all_writable and not authorize(principal, host, Op.WRITE, Res.TOPIC, topic.get("name")):
            all_writable = False
        if not transactional:
            for partition in topic.get("partition_data") or ():
                records = partition.get("records")
                if records and len(records) > ATTRIBUTES_OFFSET + 1 and records[ATTRIBUTES_OFFSET + 1] & TRANSACTIONAL_MASK:
                    transactional = True
                    break
    # Kafka: transactional records need WRITE on their transactional id, or nothing is written.
    if transactional and not check.transactional_id(Op.WRITE, transactional_id):
        if body.get("acks", 1) == 0:
            return answer(None)
        return answer({"throttle_time_ms": 0, "responses": [{"name": t.get("name"), "partition_responses": [_produce_partition(p.get("index", -1), TXN_DENIED) for p in t.get("partition_data") or []]} for t in topics]})
    if all_writable:
        return None
    return _produce_topics(check, version, body)


_produce_topics = topic_partitions_rule(
    operation=Op.WRITE,
    denied_partition=lambda index, version: _produce_partition(index, TOPIC_DENIED),
    topics_key="topic_data",
    partitions_key="partition_data",
    response_topics_key="responses",
    response_partitions_key="partition_responses",
    index_of=lambda p: p.get("index", -1),
    empty_response=lambda body, version: None if body.get("acks", 1) == 0 else {"throttle_time_ms": 0, "responses": []},
)


# -- Fetch ----------------------------------------------------------------------------------------------


def _fetch_partition(index, version):
    return {"partition_index": index, "error_code": TOPIC_DENIED, "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}


def fetch(check: Check, version: int, body: dict) -> Verdict | None:
    replica_id = body.get("replica_state", {}).get("replica_id", -1) if version >= 15 else body.get("replica_id", -1)
    if replica_id >= 0 and not check.cluster(Op.CLUSTER_ACTION):
        # A follower's fetch: Kafka fails every partition.
        return answer(_fetch_empty(body, version, [(t, TOPIC_DENIED) for t in body.get("topics") or []]))
    topics = body.get("topics") or []
    by_id = version >= 13
    # An unknown topic id is the handler's UNKNOWN_TOPIC_ID, not a denial.
    names = [check.topics.name_for_id(t.get("topic_id")) if by_id else t.get("topic") for t in topics]
    allowed = [(by_id and name is None) or check.topic(Op.READ, name) for name in names]
    if all(allowed):  # the hot path of every consumer: as it is
        return None
    kept = [t for t, ok in zip(topics, allowed) if ok]
    denied = [t for t, ok in zip(topics, allowed) if not ok]
    denied_entries = _fetch_empty(body, version, [(t, TOPIC_DENIED) for t in denied])["responses"]
    # Nothing left to read: answered at once instead of long-polling on nothing.
    return without_denied(body, "topics", kept, denied_entries, "responses", _fetch_empty(body, version, []))


def _fetch_empty(body, version, topics_and_errors):
    responses = []
    for topic, error in topics_and_errors:
        entry = {"partitions": [{**_fetch_partition(p.get("partition", -1), version), "error_code": error} for p in topic.get("partitions") or []]}
        if version >= 13:
            entry["topic_id"] = topic.get("topic_id")
        else:
            entry["topic"] = topic.get("topic")
        responses.append(entry)
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "session_id": 0, "responses": responses}


# -- ListOffsets, DeleteRecords, DescribeProducers ----------------------------------------------------------


list_offsets = topic_partitions_rule(
    operation=Op.DESCRIBE,
    denied_partition=lambda index, version: {"partition_index": index, "error_code": TOPIC_DENIED, "timestamp": -1, "offset": -1, "leader_epoch": -1, "old_style_offsets": []},
)

delete_records = topic_partitions_rule(
    operation=Op.DELETE,
    denied_partition=lambda index, version: {"partition_index": index, "low_watermark": -1, "error_code": TOPIC_DENIED},
)

describe_producers = topic_partitions_rule(
    operation=Op.READ,
    denied_partition=lambda index, version: {"partition_index": index, "error_code": TOPIC_DENIED, "error_message": None, "active_producers": []},
    partitions_key="partition_indexes",
    index_of=lambda index: index,
)


# -- Metadata -----------------------------------------------------------------------------------------------


def metadata(check: Check, version: int, body: dict) -> Verdict:
    requested = body.get("topics")
    with_operations = version >= 8 and body.get("include_topic_authorized_operations", False)
    cluster_operations = 8 <= version <= 10 and body.get("include_cluster_authorized_operations", False)

    def decorate(response):
        if with_operations:
            for topic in response.get("topics") or []:
                if topic.get("error_code") == ErrorCode.NONE and topic.get("name"):
                    topic["topic_authorized_operations"] = check.operations(Res.TOPIC, topic["name"])
        if cluster_operations:
            response["cluster_authorized_operations"] = check.operations(Res.CLUSTER, CLUSTER_NAME) if check.cluster(Op.DESCRIBE) else 0
        return response

    if requested is None or (version == 0 and not requested):
        # Every topic: hide those the principal may not describe.
        def hide(response):
            response["topics"] = [t for t in response.get("topics") or [] if check.topic(Op.DESCRIBE, t.get("name"))]
            return decorate(response)

        return Verdict(body, hide)
    auto_create = check.topics.auto_create and (body.get("allow_auto_topic_creation", True) if version >= 4 else True)
    kept, denied = [], []
    for entry in requested:
        name = entry.get("name")
        if name is None and entry.get("topic_id"):
            name = check.topics.name_for_id(entry["topic_id"])
            if name is None:
                kept.append(entry)  # the handler's UNKNOWN_TOPIC_ID
                continue
        if not check.topic(Op.DESCRIBE, name):
            denied.append((entry, name))
        elif name not in check.topics.topics and auto_create and not (check.cluster(Op.CREATE) or check.topic(Op.CREATE, name)):
            # Auto-creation needs CREATE (on the cluster or the topic).
            denied.append((entry, name))
        else:
            kept.append(entry)
    if not denied:
        return Verdict(body, decorate)
    denied_entries = [{"error_code": TOPIC_DENIED, "name": entry.get("name"), "topic_id": entry.get("topic_id"), "is_internal": False, "partitions": []} for entry, _name in denied]

    def finish(response):
        topics = list(response.get("topics") or []) if kept else []
        response["topics"] = topics + denied_entries
        return decorate(response)

    # With nothing left, ask for no topics (v0 has no way to: it lists all,
    # without creating any, and finish drops them).
    return Verdict({**body, "topics": kept}, finish)


# -- admin: topics and configs -------------------------------------------------------------------------------


def create_topics(check: Check, version: int, body: dict) -> Verdict:
    if check.cluster(Op.CREATE):
        kept, denied = body.get("topics") or [], []
    else:
        kept, denied = split(body.get("topics") or [], lambda t: check.topic(Op.CREATE, t.get("name")))
    denied_entries = [{"name": t.get("name"), "error_code": TOPIC_DENIED, "error_message": "not authorized to create this topic", "num_partitions": -1, "replication_factor": -1, "configs": None} for t in denied]

    def hide_configs(response):
        for topic in response.get("topics") or []:
            # The created topic's configs are shown only with DESCRIBE_CONFIGS (as Kafka does).
            if topic.get("error_code") == ErrorCode.NONE and version >= 5 and not check.topic(Op.DESCRIBE_CONFIGS, topic.get("name")):
                topic["configs"] = None
                topic["topic_config_error_code"] = TOPIC_DENIED

    return without_denied(body, "topics", kept, denied_entries, "topics", {"throttle_time_ms": 0, "topics": []}, also=hide_configs)


def delete_topics(check: Check, version: int, body: dict) -> Verdict:
    if version >= 6:
        def name_of(entry):
            return entry.get("name") if entry.get("name") is not None else check.topics.name_for_id(entry.get("topic_id"))

        def shown_name(entry):
            # Asked by id: the name is told only to who may describe the
            # topic (Kafka: the id is not secret, the name is).
            if entry.get("name") is not None or check.topic(Op.DESCRIBE, name_of(entry)):
                return name_of(entry)
            return None

        kept, denied = split(body.get("topics") or [], lambda e: name_of(e) is None or check.topic(Op.DELETE, name_of(e)))
        denied_entries = [{"name": shown_name(e), "topic_id": e.get("topic_id"), "error_code": TOPIC_DENIED, "error_message": None} for e in denied]
        key = "topics"
    else:
        kept, denied = split(body.get("topic_names") or [], lambda name: check.topic(Op.DELETE, name))
        denied_entries = [{"name": name, "error_code": TOPIC_DENIED, "error_message": None} for name in denied]
        key = "topic_names"
    return without_denied(body, key, kept, denied_entries, "responses", {"throttle_time_ms": 0, "responses": []})


def create_partitions(check: Check, version: int, body: dict) -> Verdict:
    kept, denied = split(body.get("topics") or [], lambda t: check.topic(Op.ALTER, t.get("name")))
    denied_entries = [{"name": t.get("name"), "error_code": TOPIC_DENIED, "error_message": None} for t in denied]
    return without_denied(body, "topics", kept, denied_entries, "results", {"throttle_time_ms": 0, "results": []})


def _config_resource_allowed(check: Check, operation: Op, resource: dict):
    """None if allowed, else the error (topic configs need the operation on the
    topic, broker configs on the cluster)."""
    kind = resource.get("resource_type")
    if kind == ConfigResourceType.TOPIC:
        return None if check.topic(operation, resource.get("resource_name")) else TOPIC_DENIED
    if kind in (ConfigResourceType.BROKER, 8):  # 8: BROKER_LOGGER
        return None if check.cluster(operation) else CLUSTER_DENIED
    return None  # the handler refuses unknown resource types itself


def configs_rule(operation: Op, response_key: str, denied_entry):
    def rule(check: Check, version: int, body: dict) -> Verdict:
        kept, denied = [], []
        for resource in body.get("resources") or []:
            error = _config_resource_allowed(check, operation, resource)
            (kept.append(resource) if error is None else denied.append((resource, error)))
        denied_entries = [denied_entry(resource, error) for resource, error in denied]
        return without_denied(body, "resources", kept, denied_entries, response_key, {"throttle_time_ms": 0, response_key: []})

    return rule


describe_configs = configs_rule(
    Op.DESCRIBE_CONFIGS,
    "results",
    lambda r, error: {"error_code": error, "error_message": None, "resource_type": r.get("resource_type"), "resource_name": r.get("resource_name"), "configs": []},
)
alter_configs = configs_rule(
    Op.ALTER_CONFIGS,
    "responses",
    lambda r, error: {"error_code": error, "error_message": None, "resource_type": r.get("resource_type"), "resource_name": r.get("resource_name")},
)


def describe_cluster(check: Check, version: int, body: dict) -> Verdict:
    """Kafka answers DescribeCluster to anyone (like Metadata's broker list);
    DESCRIBE on the cluster only decides whether the authorized operations
    asked for are shown."""
    if not body.get("include_cluster_authorized_operations"):
        return Verdict(body)

    def finish(response):
        response["cluster_authorized_operations"] = check.operations(Res.CLUSTER, CLUSTER_NAME) if check.cluster(Op.DESCRIBE) else 0
        return response

    return Verdict(body, finish)


# -- coordinators: FindCoordinator -----------------------------------------------------------------------------


def _coordinator_allowed(check: Check, key_type: int, key: str):
    if key_type == CoordinatorType.TRANSACTION:
        return None if check.transactional_id(Op.DESCRIBE, key) else TXN_DENIED
    if key_type == CoordinatorType.GROUP:
        return None if check.group(Op.DESCRIBE, key) else GROUP_DENIED
    return None  # the handler answers INVALID_REQUEST


def find_coordinator(check: Check, version: int, body: dict) -> Verdict:
    key_type = body.get("key_type", CoordinatorType.GROUP)
    if version < 4:
        error = _coordinator_allowed(check, key_type, body.get("key", ""))
        if error is None:
            return Verdict(body)
        return answer({"throttle_time_ms": 0, "error_code": error, "error_message": None, "node_id": -1, "host": "", "port": -1})
    kept, denied = [], []
    for key in body.get("coordinator_keys") or []:
        error = _coordinator_allowed(check, key_type, key)
        (kept.append(key) if error is None else denied.append((key, error)))
    denied_entries = [{"key": key, "node_id": -1, "host": "", "port": -1, "error_code": error, "error_message": None} for key, error in denied]
    return without_denied(body, "coordinator_keys", kept, denied_entries, "coordinators", {"throttle_time_ms": 0, "coordinators": []})


# -- transactions ------------------------------------------------------------------------------------------------


def init_producer_id(check: Check, version: int, body: dict) -> Verdict:
    transactional_id = body.get("transactional_id")
    if transactional_id is not None:
        allowed, error = check.transactional_id(Op.WRITE, transactional_id), TXN_DENIED
    else:
        # An idempotent producer: IDEMPOTENT_WRITE on the cluster, or (KIP-679) WRITE on some topic.
        allowed, error = check.cluster(Op.IDEMPOTENT_WRITE) or check.any_topic(Op.WRITE), CLUSTER_DENIED
    if allowed:
        return Verdict(body)
    return answer({"throttle_time_ms": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1})


def _add_partitions_results(topics, code_of):
    return [
        {"name": topic.get("name"), "results_by_partition": [{"partition_index": index, "partition_error_code": code_of(topic.get("name"))} for index in topic.get("partitions") or []]}
        for topic in topics
    ]


def add_partitions_to_txn(check: Check, version: int, body: dict) -> Verdict:
    if version >= 4:
        # The batched form is broker-to-broker (KIP-890): CLUSTER_ACTION.
        if check.cluster(Op.CLUSTER_ACTION):
            return Verdict(body)
        return answer({"throttle_time_ms": 0, "error_code": CLUSTER_DENIED, "results_by_transaction": []})
    topics = body.get("v3_and_below_topics") or []
    if not check.transactional_id(Op.WRITE, body.get("v3_and_below_transactional_id")):
        return answer({"throttle_time_ms": 0, "results_by_topic_v3_and_below": _add_partitions_results(topics, lambda name: TXN_DENIED)})
    denied = {t.get("name") for t in topics if not check.topic(Op.WRITE, t.get("name"))}
    if not denied:
        return Verdict(body)

    # Kafka fails the whole request: denied topics, unknown ones, and the rest not attempted.
    def code_of(name):
        if name in denied:
            return TOPIC_DENIED
        if name not in check.topics.topics:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.OPERATION_NOT_ATTEMPTED

    return answer({"throttle_time_ms": 0, "results_by_topic_v3_and_below": _add_partitions_results(topics, code_of)})


def add_offsets_to_txn(check: Check, version: int, body: dict) -> Verdict:
    if not check.transactional_id(Op.WRITE, body.get("transactional_id")):
        return answer({"throttle_time_ms": 0, "error_code": TXN_DENIED})
    if not check.group(Op.READ, body.get("group_id")):
        return answer({"throttle_time_ms": 0, "error_code": GROUP_DENIED})
    return Verdict(body)


end_txn = all_or_nothing(
    lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1},
    TXN_DENIED,
    lambda check, body: check.transactional_id(Op.WRITE, body.get("transactional_id")),
)


def write_txn_markers(check: Check, version: int, body: dict) -> Verdict:
    # A tool's abort of a hanging transaction (KIP-664) needs ALTER on the
    # cluster since KIP-1037 (Kafka 3.8); brokers' own markers CLUSTER_ACTION.
    if check.cluster(Op.ALTER) or check.cluster(Op.CLUSTER_ACTION):
        return Verdict(body)
    return answer(
        {
            "markers": [
                {
                    "producer_id": marker.get("producer_id", -1),
                    "topics": [{"name": t.get("name"), "partitions": [{"partition_index": i, "error_code": CLUSTER_DENIED} for i in t.get("partition_indexes") or []]} for t in marker.get("topics") or []],
                }
                for marker in body.get("markers") or []
            ]
        }
    )


def _commit_partitions(topics, error):
    return [{"name": t.get("name"), "partitions": [{"partition_index": p.get("partition_index", -1), "error_code": error} for p in t.get("partitions") or []]} for t in topics]


def _offset_commit_topics(check: Check, body: dict, empty: dict) -> Verdict:
    """READ on each topic: the denied ones TOPIC_AUTHORIZATION_FAILED, the rest proceed."""
    kept, denied = split(body.get("topics") or [], lambda t: check.topic(Op.READ, t.get("name")))
    return without_denied(body, "topics", kept, _commit_partitions(denied, TOPIC_DENIED), "topics", dict(empty))


def txn_offset_commit(check: Check, version: int, body: dict) -> Verdict:
    topics = body.get("topics") or []
    if not check.transactional_id(Op.WRITE, body.get("transactional_id")):
        return answer({"throttle_time_ms": 0, "topics": _commit_partitions(topics, TXN_DENIED)})
    if not check.group(Op.READ, body.get("group_id")):
        return answer({"throttle_time_ms": 0, "topics": _commit_partitions(topics, GROUP_DENIED)})
    return _offset_commit_topics(check, body, {"throttle_time_ms": 0, "topics": []})


def list_transactions(check: Check, version: int, body: dict) -> Verdict:
    def hide(response):
        response["transaction_states"] = [t for t in response.get("transaction_states") or [] if check.transactional_id(Op.DESCRIBE, t.get("transactional_id"))]
        return response

    return Verdict(body, hide)


def describe_transactions(check: Check, version: int, body: dict) -> Verdict:
    kept, denied = split(body.get("transactional_ids") or [], lambda t: check.transactional_id(Op.DESCRIBE, t))
    denied_entries = [{"error_code": TXN_DENIED, "transactional_id": t, "transaction_state": "", "topics": []} for t in denied]

    def hide_topics(response):
        for state in response.get("transaction_states") or []:
            # Only the topics the principal may describe (as Kafka does).
            state["topics"] = [t for t in state.get("topics") or [] if check.topic(Op.DESCRIBE, t.get("topic"))]

    return without_denied(body, "transactional_ids", kept, denied_entries, "transaction_states", {"throttle_time_ms": 0, "transaction_states": []}, also=hide_topics)


# -- groups ------------------------------------------------------------------------------------------------------


def _read_group(error_response):
    return all_or_nothing(error_response, GROUP_DENIED, lambda check, body: check.group(Op.READ, body.get("group_id")))


join_group = _read_group(
    lambda body, version, error: {
        "throttle_time_ms": 0,
        "error_code": error,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None if version >= 7 else "",
        "leader": "",
        "member_id": body.get("member_id", ""),
        "members": [],
    }
)
sync_group = _read_group(lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "protocol_type": None, "protocol_name": None, "assignment": b""})
heartbeat = _read_group(lambda body, version, error: {"throttle_time_ms": 0, "error_code": error})
leave_group = _read_group(lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "members": []})


def offset_commit(check: Check, version: int, body: dict) -> Verdict:
    if not check.group(Op.READ, body.get("group_id")):
        return answer({"throttle_time_ms": 0, "topics": _commit_partitions(body.get("topics") or [], GROUP_DENIED)})
    return _offset_commit_topics(check, body, {"throttle_time_ms": 0, "topics": []})


def offset_delete(check: Check, version: int, body: dict) -> Verdict:
    if not check.group(Op.DELETE, body.get("group_id")):
        return answer({"throttle_time_ms": 0, "error_code": GROUP_DENIED, "topics": []})
    return _offset_commit_topics(check, body, {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "topics": []})


def _fetched_partition(index, error):
    return {"partition_index": index, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "", "error_code": error}


def _offset_fetch_group(check: Check, topics):
    """(topics to ask the handler, finish for that group's topic list):
    named topics without DESCRIBE answer TOPIC_AUTHORIZATION_FAILED, and of
    all topics (None) those hidden."""
    if topics is None:
        return None, lambda fetched: [t for t in fetched if check.topic(Op.DESCRIBE, t.get("name"))]
    kept, denied = split(topics, lambda t: check.topic(Op.DESCRIBE, t.get("name")))
    denied_entries = [{"name": t.get("name"), "partitions": [_fetched_partition(i, TOPIC_DENIED) for i in t.get("partition_indexes") or []]} for t in denied]
    return kept, lambda fetched: list(fetched) + denied_entries


def offset_fetch(check: Check, version: int, body: dict) -> Verdict:
    if version < 8:
        if not check.group(Op.DESCRIBE, body.get("group_id")):
            if version >= 2:
                return answer({"throttle_time_ms": 0, "error_code": GROUP_DENIED, "topics": []})
            # v0-1 have no top-level error: every partition asked for carries it.
            return answer({"topics": [{"name": t.get("name"), "partitions": [_fetched_partition(i, GROUP_DENIED) for i in t.get("partition_indexes") or []]} for t in body.get("topics") or []]})
        topics, finish_topics = _offset_fetch_group(check, body.get("topics"))

        def finish(response):
            response["topics"] = finish_topics(response.get("topics") or [])
            return response

        return Verdict({**body, "topics": topics}, finish)
    asked, denied_groups, finishers = [], [], {}
    for group in body.get("groups") or []:
        group_id = group.get("group_id")
        if not check.group(Op.DESCRIBE, group_id):
            denied_groups.append({"group_id": group_id, "topics": [], "error_code": GROUP_DENIED})
            continue
        topics, finishers[group_id] = _offset_fetch_group(check, group.get("topics"))
        asked.append({**group, "topics": topics})

    def finish(response):
        groups = list(response.get("groups") or []) if asked else []
        for group in groups:
            group["topics"] = finishers[group["group_id"]](group.get("topics") or [])
        response["groups"] = groups + denied_groups
        return response

    if not asked:
        return answer(finish({"throttle_time_ms": 0, "groups": []}))
    return Verdict({**body, "groups": asked}, finish)


def describe_groups(check: Check, version: int, body: dict) -> Verdict:
    kept, denied = split(body.get("groups") or [], lambda g: check.group(Op.DESCRIBE, g))
    denied_entries = [
        {"error_code": GROUP_DENIED, "group_id": g, "group_state": "", "protocol_type": "", "protocol_data": "", "members": [], "authorized_operations": NO_AUTHORIZED_OPERATIONS}
        for g in denied
    ]
    with_operations = version >= 3 and body.get("include_authorized_operations", False)

    def add_operations(response):
        for group in response.get("groups") or []:
            group["authorized_operations"] = check.operations(Res.GROUP, group.get("group_id"))

    return without_denied(body, "groups", kept, denied_entries, "groups", {"throttle_time_ms": 0, "groups": []}, also=add_operations if with_operations else None)


def list_groups(check: Check, version: int, body: dict) -> Verdict:
    if check.cluster(Op.DESCRIBE):
        return Verdict(body)

    def hide(response):
        response["groups"] = [g for g in response.get("groups") or [] if check.group(Op.DESCRIBE, g.get("group_id"))]
        return response

    return Verdict(body, hide)


def delete_groups(check: Check, version: int, body: dict) -> Verdict:
    kept, denied = split(body.get("groups_names") or [], lambda g: check.group(Op.DELETE, g))
    denied_entries = [{"group_id": g, "error_code": GROUP_DENIED} for g in denied]
    return without_denied(body, "groups_names", kept, denied_entries, "results", {"throttle_time_ms": 0, "results": []})


# -- ACLs, quotas, credentials: cluster operations --------------------------------------------------------------


def _cluster(operation: Op, error_response):
    return all_or_nothing(error_response, CLUSTER_DENIED, lambda check, body: check.cluster(operation))


create_acls = _cluster(Op.ALTER, lambda body, version, error: {"throttle_time_ms": 0, "results": [{"error_code": error, "error_message": None} for _ in body.get("creations") or []]})
describe_acls = _cluster(Op.DESCRIBE, lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "error_message": None, "resources": []})
delete_acls = _cluster(Op.ALTER, lambda body, version, error: {"throttle_time_ms": 0, "filter_results": [{"error_code": error, "error_message": None, "matching_acls": []} for _ in body.get("filters") or []]})
describe_client_quotas = _cluster(Op.DESCRIBE_CONFIGS, lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "error_message": None, "entries": None})
alter_client_quotas = _cluster(
    Op.ALTER_CONFIGS,
    lambda body, version, error: {"throttle_time_ms": 0, "entries": [{"error_code": error, "error_message": None, "entity": [{"entity_type": e.get("entity_type"), "entity_name": e.get("entity_name")} for e in entry.get("entity") or []]} for entry in body.get("entries") or []]},
)
describe_user_scram_credentials = _cluster(Op.DESCRIBE, lambda body, version, error: {"throttle_time_ms": 0, "error_code": error, "error_message": None, "results": []})
alter_user_scram_credentials = _cluster(
    Op.ALTER,
    lambda body, version, error: {
        "throttle_time_ms": 0,
        "results": [{"user": entry.get("name"), "error_code": error, "error_message": None} for entry in list(body.get("deletions") or []) + list(body.get("upsertions") or [])],
    },
)


RULES: dict[int, Callable[[Check, int, dict], Verdict | None]] = {
    ApiKey.PRODUCE: produce,
    ApiKey.FETCH: fetch,
    ApiKey.LIST_OFFSETS: list_offsets,
    ApiKey.METADATA: metadata,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.FIND_COORDINATOR: find_coordinator,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.SYNC_GROUP: sync_group,
    ApiKey.DESCRIBE_GROUPS: describe_groups,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.SASL_HANDSHAKE: anyone,
    ApiKey.API_VERSIONS: anyone,
    ApiKey.CREATE_TOPICS: create_topics,
    ApiKey.DELETE_TOPICS: delete_topics,
    ApiKey.DELETE_RECORDS: delete_records,
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: add_offsets_to_txn,
    ApiKey.END_TXN: end_txn,
    ApiKey.WRITE_TXN_MARKERS: write_txn_markers,
    ApiKey.TXN_OFFSET_COMMIT: txn_offset_commit,
    ApiKey.DESCRIBE_ACLS: describe_acls,
    ApiKey.CREATE_ACLS: create_acls,
    ApiKey.DELETE_ACLS: delete_acls,
    ApiKey.DESCRIBE_CONFIGS: describe_configs,
    ApiKey.ALTER_CONFIGS: alter_configs,
    ApiKey.SASL_AUTHENTICATE: anyone,
    ApiKey.CREATE_PARTITIONS: create_partitions,
    ApiKey.DELETE_GROUPS: delete_groups,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: alter_configs,
    ApiKey.OFFSET_DELETE: offset_delete,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: describe_client_quotas,
    ApiKey.ALTER_CLIENT_QUOTAS: alter_client_quotas,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: alter_user_scram_credentials,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster,
    ApiKey.DESCRIBE_PRODUCERS: describe_producers,
    ApiKey.DESCRIBE_TRANSACTIONS: describe_transactions,
    ApiKey.LIST_TRANSACTIONS: list_transactions,
}


class UnauthorisableRequest(Exception):
    """An API without a rule: refused (the server closes the connection)."""


@attrs.define(eq=False)
class AuthorizingDispatch:
    """The broker's dispatcher behind an authorisation check: ``await
    dispatch(request, session)`` as ``broker.server`` calls it."""

    inner: Callable
    authorizer: AclAuthorizer
    topics: TopicView

    async def __call__(self, request, session: Session):
        if self.authorizer.is_super_user(str(session.principal)):
            return await self.inner(request, session)
        rule = RULES.get(request.api_key)
        if rule is None:
            raise UnauthorisableRequest(f"no authorisation rule for api key {request.api_key}")
        verdict = rule(Check(self.authorizer, session, self.topics), request.api_version, request.body)
        if verdict is None:  # allowed as it is
            return await self.inner(request, session)
        if verdict.body is None:
            return verdict.finish(None)
        if verdict.body is not request.body:
            request = attrs.evolve(request, body=verdict.body)
        response = await self.inner(request, session)
        if response is None:
            return None
        return verdict.finish(response)
