"""onceflow's admin client: topics, partitions, configs, groups, transactions,
offsets, over the Kafka wire only.

``AsyncAdmin`` (also ``txn.aio.Admin``) is the core and ``Admin`` the
synchronous facade. Each call sends the request where Kafka's admin client
would: topic changes to any broker (one broker here, the controller in a
cluster), group and transaction descriptions to the coordinator of each id,
listings to every broker (merged), markers and offsets to the partition's
leader. A per-item error raises ``KafkaError`` naming the item, unless the
call says which errors it tolerates.
"""

from __future__ import annotations

import asyncio
import collections
import time

import attrs

from protocol.constants import ConfigResourceType, CoordinatorType, IsolationLevel, OffsetSpec
from protocol.errors import ErrorCode, error_name
from protocol.messages import ApiKey
from txn import assignors
from txn.cluster import Cluster
from txn.config import AdminConfig, build
from txn.errors import InvalidConfigurationError, RetriableError, classify
from txn.sync_client import SyncClient, properties_first, rebuild
from txn.types import OffsetAndMetadata, TopicPartition, as_topic_partition

# CreateTopics' "let the broker decide" (replication factor, partition count).
BROKER_DEFAULT = -1
OFFSET_SPECS = {"earliest": OffsetSpec.EARLIEST, "latest": OffsetSpec.LATEST, "max_timestamp": OffsetSpec.MAX_TIMESTAMP}


@attrs.frozen
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@attrs.frozen
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]


@attrs.frozen
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@attrs.frozen
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@attrs.frozen
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[TopicPartition, ...]


@attrs.frozen
class ProducerDescription:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


# The states of a transaction the coordinator has not finished (in Prepare*
# it has decided and is writing the markers), as ListTransactions names them.
OPEN_TRANSACTION_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")

# Why a transaction open in a partition hangs: the one rule of
# ``AsyncAdmin.find_hanging_transactions`` (``hanging_reason``), which
# ``onceflow status`` and ``onceflow transactions find-hanging`` both show.
HANGING_REASONS = {
    "no_open_transaction": "the coordinator has no open transaction of this producer",
    "partition_not_in_transaction": "the producer's open transaction does not include this partition",
    "older_than_timeout": "open longer than its transaction timeout",
}


@attrs.frozen
class HangingTransaction:
    """A transaction open in one partition (DescribeProducers) that hangs
    (``HANGING_REASONS``): it holds the partition's last stable offset back
    until ``abort_transaction`` ends it."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int  # the open transaction's first offset: the LSO cannot pass it
    last_timestamp: int
    reason: str  # a key of HANGING_REASONS


def hanging_reason(transaction: TransactionDescription | None, partition: TopicPartition, now_ms: int) -> str | None:
    """Why a transaction open in ``partition`` hangs, given the open
    transaction the coordinator knows of its producer (None: none), or None
    if it does not hang."""
    if transaction is None:
        return "no_open_transaction"
    if partition not in transaction.partitions:
        return "partition_not_in_transaction"
    if transaction.start_time_ms >= 0 and now_ms - transaction.start_time_ms > transaction.timeout_ms:
        return "older_than_timeout"
    return None


@attrs.frozen
class ListedOffset:
    offset: int
    timestamp: int


class _Sentinel:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


# describe_client_quotas: every entity (the default included), or every user with a name.
EVERY_ENTITY = _Sentinel("EVERY_ENTITY")
ANY_NAME = _Sentinel("ANY_NAME")


@attrs.frozen
class ClientQuotaEntry:
    """One quota entity (KIP-546) and its values: ``entity`` pairs each entity
    type with a name (None: the type's default, e.g. every user)."""

    entity: tuple[tuple[str, str | None], ...]
    values: dict = attrs.field(hash=False)  # key -> value (bytes/s for the byte rates)

    @property
    def user(self) -> str | None:
        return dict(self.entity).get("user")


@attrs.frozen
class TopicListing:
    name: str
    partitions: int
    internal: bool  # the broker says so (Metadata's is_internal), or a name Kafka reserves (``__``)


class AsyncAdmin:
    def __init__(self, bootstrap_servers=None, config: dict | AdminConfig | None = None, **options):
        if bootstrap_servers is not None:
            options["bootstrap_servers"] = bootstrap_servers
        self.config = build(AdminConfig, config, **options)
        self.cluster = Cluster(self.config)

    def __reduce__(self):
        return (rebuild, (type(self), self.config))

    async def __aenter__(self) -> "AsyncAdmin":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    async def _any(self, api_key: int, body: dict, *, max_version: int | None = None) -> dict:
        async for attempt in self.cluster.retrying(self.config.request_timeout_ms / 1000):
            with attempt:
                client = await self.cluster.any_broker()
                version = client.version_for(api_key) if max_version is None else min(client.version_for(api_key), max_version)
                return await client.request(api_key, body, version=version)

    async def _every_broker(self, api_key: int, body: dict) -> list[dict]:
        await self.cluster.refresh([], allow_auto_create=False)
        clients = [await self.cluster.connection(address) for address in self.cluster.brokers.values()]
        return list(await asyncio.gather(*(client.request(api_key, body) for client in clients)))

    # -- topics -------------------------------------------------------------------------------

    async def create_topics(self, topics: dict[str, int], *, replication_factor: int = BROKER_DEFAULT, configs: dict[str, dict[str, str]] | None = None, validate_only: bool = False, exist_ok: bool = False) -> None:
        """Create ``{name: partition count}``; ``configs`` per topic name.

        ``replication_factor`` defaults to -1, the broker's own
        ``default.replication.factor`` (KIP-464; CreateTopics v4+, Kafka
        2.4+), so that a topic made on a cluster is replicated as the
        cluster's operator chose; pair a replication factor above 1 with the
        topic's ``min.insync.replicas`` in ``configs``."""
        body = {
            "topics": [
                {"name": name, "num_partitions": count, "replication_factor": replication_factor, "assignments": [], "configs": [{"name": k, "value": str(v)} for k, v in ((configs or {}).get(name) or {}).items()]}
                for name, count in topics.items()
            ],
            "timeout_ms": self.config.request_timeout_ms,
            "validate_only": validate_only,
        }
        response = await self._any(ApiKey.CREATE_TOPICS, body)
        for result in response["topics"]:
            code = result["error_code"]
            if code == ErrorCode.TOPIC_ALREADY_EXISTS and exist_ok:
                continue
            if code:
                raise classify(code, f"create topic {result['name']}" + (f" ({result['error_message']})" if result.get("error_message") else ""))

    async def delete_topics(self, names: list[str]) -> None:
        response = await self._any(ApiKey.DELETE_TOPICS, {"topic_names": list(names), "timeout_ms": self.config.request_timeout_ms}, max_version=5)  # 6+ names topics by id
        for result in response["responses"]:
            if result["error_code"]:
                raise classify(result["error_code"], f"delete topic {result['name']}")

    async def create_partitions(self, counts: dict[str, int]) -> None:
        """Grow each topic to the given total partition count."""
        body = {"topics": [{"name": t, "count": c, "assignments": None} for t, c in counts.items()], "timeout_ms": self.config.request_timeout_ms, "validate_only": False}
        response = await self._any(ApiKey.CREATE_PARTITIONS, body)
        for result in response["results"]:
            if result["error_code"]:
                raise classify(result["error_code"], f"create partitions of {result['name']}" + (f" ({result['error_message']})" if result.get("error_message") else ""))

    async def list_topics(self) -> dict[str, int]:
        """``{topic: partition count}`` of every topic, internal ones included."""
        body = await self.cluster.refresh(None, allow_auto_create=False)
        return {t["name"]: len(t["partitions"]) for t in body["topics"] if not t["error_code"]}

    async def describe_configs(self, topics: list[str] = (), broker_ids: list[int] = ()) -> dict[str, dict[str, str]]:
        """``{resource name: {config name: value}}`` for topics and brokers."""
        resources = [{"resource_type": ConfigResourceType.TOPIC, "resource_name": t, "configuration_keys": None} for t in topics]
        resources += [{"resource_type": ConfigResourceType.BROKER, "resource_name": str(b), "configuration_keys": None} for b in broker_ids]
        response = await self._any(ApiKey.DESCRIBE_CONFIGS, {"resources": resources, "include_synonyms": False, "include_documentation": False})
        out = {}
        for result in response["results"]:
            if result["error_code"]:
                raise classify(result["error_code"], f"describe configs of {result['resource_name']}")
            out[result["resource_name"]] = {c["name"]: c["value"] for c in result["configs"]}
        return out

    # -- offsets and records ---------------------------------------------------------------------

    async def list_offsets(self, specs: dict, *, isolation_level: str = "read_committed") -> dict[TopicPartition, ListedOffset]:
        """``{partition: "earliest" | "latest" | "max_timestamp" | timestamp_ms}``,
        in one ListOffsets request per leader. "latest" is the last stable
        offset under read_committed, the high watermark under read_uncommitted;
        a timestamp no record reaches answers offset -1. Retriable errors
        (leader moved, not yet known) are retried for the partitions they hit."""
        wanted = {as_topic_partition(p): OFFSET_SPECS[spec] if isinstance(spec, str) else int(spec) for p, spec in specs.items()}
        isolation = IsolationLevel.READ_COMMITTED if isolation_level == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        out: dict[TopicPartition, ListedOffset] = {}
        async for attempt in self.cluster.retrying(self.config.request_timeout_ms / 1000):
            with attempt:
                await self._list_offsets_once({tp: t for tp, t in wanted.items() if tp not in out}, isolation, out)
        return out

    async def _list_offsets_once(self, wanted: dict[TopicPartition, int], isolation: int, out: dict) -> None:
        unknown = sorted({tp.topic for tp in wanted if (tp.topic, tp.partition) not in self.cluster.leaders})
        if unknown:
            await self.cluster.refresh(unknown, allow_auto_create=False)
        by_leader: dict[int | None, list[TopicPartition]] = collections.defaultdict(list)
        for tp in wanted:
            by_leader[self.cluster.leaders.get((tp.topic, tp.partition))].append(tp)
        first_error = None
        for node, partitions in by_leader.items():
            if node is None or node not in self.cluster.brokers:
                first_error = first_error or RetriableError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"list offsets of {', '.join(map(str, partitions))}")
                continue
            topics: dict[str, list] = collections.defaultdict(list)
            for tp in partitions:
                topics[tp.topic].append({"partition_index": tp.partition, "timestamp": wanted[tp], "current_leader_epoch": -1})
            body = {"replica_id": -1, "isolation_level": isolation, "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}
            response = await (await self.cluster.connection(self.cluster.brokers[node])).request(ApiKey.LIST_OFFSETS, body)
            for topic in response["topics"]:
                for answer in topic["partitions"]:
                    tp = TopicPartition(topic["name"], answer["partition_index"])
                    if answer["error_code"]:
                        self.cluster.forget_leader(tp.topic, tp.partition)
                        first_error = first_error or classify(answer["error_code"], f"list offsets of {tp}")
                    else:
                        out[tp] = ListedOffset(answer["offset"], answer["timestamp"])
        if first_error is not None:
            raise first_error

    async def delete_records(self, before: dict) -> dict[TopicPartition, int]:
        """Move each partition's log start offset up to the given offset; the new low watermarks."""
        out = {}
        for partition, offset in before.items():
            tp = as_topic_partition(partition)
            body = {"topics": [{"name": tp.topic, "partitions": [{"partition_index": tp.partition, "offset": offset}]}], "timeout_ms": self.config.request_timeout_ms}
            response = await (await self.cluster.leader(tp.topic, tp.partition)).request(ApiKey.DELETE_RECORDS, body)
            answer = response["topics"][0]["partitions"][0]
            if answer["error_code"]:
                raise classify(answer["error_code"], f"delete records of {tp}")
            out[tp] = answer["low_watermark"]
        return out

    # -- groups ---------------------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupListing]:
        listed = []
        for response in await self._every_broker(ApiKey.LIST_GROUPS, {"states_filter": [], "types_filter": []}):
            if response["error_code"]:
                raise classify(response["error_code"], "list groups")
            listed += [GroupListing(g["group_id"], g["protocol_type"], g.get("group_state") or "") for g in response["groups"]]
        return sorted(listed, key=lambda g: g.group_id)

    async def describe_groups(self, group_ids: list[str]) -> list[GroupDescription]:
        out = []
        for group_id in group_ids:
            response = await self.cluster.coordinator_request(group_id, CoordinatorType.GROUP, ApiKey.DESCRIBE_GROUPS, {"groups": [group_id], "include_authorized_operations": False})
            group = response["groups"][0]
            if group["error_code"]:
                raise classify(group["error_code"], f"describe group {group_id}")
            members = []
            for member in group["members"]:
                assignment: tuple = ()
                if group["protocol_type"] == "consumer" and member["member_assignment"]:
                    assignment = tuple(TopicPartition(t, p) for t, p in assignors.decode_assignment(member["member_assignment"]).partitions)
                members.append(MemberDescription(member["member_id"], member.get("group_instance_id"), member["client_id"], member["client_host"], assignment))
            out.append(GroupDescription(group["group_id"], group["group_state"], group["protocol_type"], group["protocol_data"], tuple(members)))
        return out

    async def list_group_offsets(self, group_id: str, partitions=None) -> dict[TopicPartition, OffsetAndMetadata]:
        topics = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for tp in map(as_topic_partition, partitions):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            topics = [{"name": t, "partition_indexes": p} for t, p in by_topic.items()]
        response = await self.cluster.coordinator_request(group_id, CoordinatorType.GROUP, ApiKey.OFFSET_FETCH, {"group_id": group_id, "topics": topics, "require_stable": False}, max_version=7)
        if response.get("error_code"):
            raise classify(response["error_code"], f"offsets of group {group_id}")
        return {
            TopicPartition(topic["name"], p["partition_index"]): OffsetAndMetadata(p["committed_offset"], p["metadata"] or "")
            for topic in response["topics"]
            for p in topic["partitions"]
            if p["committed_offset"] >= 0
        }

    # -- transactions ---------------------------------------------------------------------------------

    async def list_transactions(self, states: list[str] = (), producer_ids: list[int] = ()) -> list[TransactionListing]:
        listed = []
        for response in await self._every_broker(ApiKey.LIST_TRANSACTIONS, {"state_filters": list(states), "producer_id_filters": list(producer_ids), "duration_filter": -1}):
            if response["error_code"]:
                raise classify(response["error_code"], "list transactions")
            listed += [TransactionListing(t["transactional_id"], t["producer_id"], t["transaction_state"]) for t in response["transaction_states"]]
        return sorted(listed, key=lambda t: t.transactional_id)

    async def describe_transactions(self, transactional_ids: list[str]) -> list[TransactionDescription]:
        out = []
        for transactional_id in transactional_ids:
            response = await self.cluster.coordinator_request(transactional_id, CoordinatorType.TRANSACTION, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]})
            state = response["transaction_states"][0]
            if state["error_code"]:
                raise classify(state["error_code"], f"describe transaction {transactional_id}")
            partitions = tuple(TopicPartition(t["topic"], p) for t in state["topics"] for p in t["partitions"])
            out.append(TransactionDescription(transactional_id, state["transaction_state"], state["producer_id"], state["producer_epoch"], state["transaction_timeout_ms"], state["transaction_start_time_ms"], partitions))
        return out

    async def describe_transactions_by_coordinator(self, transactional_ids) -> dict[str, TransactionDescription | None]:
        """``describe_transactions`` of many ids in one DescribeTransactions
        request per transaction coordinator (ids it does not know map to
        None); a coordinator that moved or failed is asked again id by id."""
        ids = sorted(set(transactional_ids))
        clients = await asyncio.gather(*[self.cluster.coordinator(i, CoordinatorType.TRANSACTION) for i in ids])
        groups: dict[int, tuple[object, list[str]]] = {}
        for transactional_id, client in zip(ids, clients):
            groups.setdefault(id(client), (client, []))[1].append(transactional_id)
        out: dict[str, TransactionDescription | None] = {}

        async def ask(client, names: list[str]) -> None:
            response = await client.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": names})
            for state in response["transaction_states"]:
                name = state["transactional_id"]
                if state["error_code"] == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                    out[name] = None
                elif state["error_code"]:
                    self.cluster.forget_coordinator(name, CoordinatorType.TRANSACTION)
                    out[name] = (await self.describe_transactions([name]))[0]
                else:
                    partitions = tuple(TopicPartition(t["topic"], p) for t in state["topics"] for p in t["partitions"])
                    out[name] = TransactionDescription(name, state["transaction_state"], state["producer_id"], state["producer_epoch"], state["transaction_timeout_ms"], state["transaction_start_time_ms"], partitions)

        await asyncio.gather(*[ask(client, names) for client, names in groups.values()])
        return out

    async def describe_producers(self, partition) -> list[ProducerDescription]:
        """The producers with state in a partition (KIP-664), with the open
        transaction's first offset, or -1."""
        tp = as_topic_partition(partition)
        return (await self.describe_producers_of([tp]))[tp]

    async def describe_producers_of(self, partitions) -> dict[TopicPartition, list[ProducerDescription]]:
        """``describe_producers`` of many partitions, one request per leader
        (as ``kafka-transactions.sh find-hanging`` asks)."""
        by_leader: dict[int, tuple] = {}
        for tp in map(as_topic_partition, partitions):
            client = await self.cluster.leader(tp.topic, tp.partition)
            by_leader.setdefault(id(client), (client, {}))[1].setdefault(tp.topic, []).append(tp.partition)
        out = {}
        for client, topics in by_leader.values():
            response = await client.request(ApiKey.DESCRIBE_PRODUCERS, {"topics": [{"name": t, "partition_indexes": p} for t, p in topics.items()]})
            for topic in response["topics"]:
                for answer in topic["partitions"]:
                    tp = TopicPartition(topic["name"], answer["partition_index"])
                    if answer["error_code"]:
                        raise classify(answer["error_code"], f"describe producers of {tp}")
                    out[tp] = [ProducerDescription(p["producer_id"], p["producer_epoch"], p["last_sequence"], p["last_timestamp"], p["coordinator_epoch"], p["current_txn_start_offset"]) for p in answer["active_producers"]]
        return out

    async def find_hanging_transactions(self, partitions, *, now_ms: int | None = None) -> list[HangingTransaction]:
        """The transactions open in ``partitions`` (DescribeProducers) that
        hang by ``hanging_reason``, compared with the open transactions the
        coordinators know, listed first. A producer that listing does not
        account for is asked about once more, so a transaction begun between
        the two requests is not reported. ``now_ms`` (default: this machine's
        clock) is what a transaction's age is measured against."""
        partitions = sorted(map(as_topic_partition, partitions))
        if not partitions:
            return []
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        known = await self._open_transactions_by_producer()
        described = await self.describe_producers_of(partitions)
        hanging = []
        for tp in partitions:
            for producer in described.get(tp, ()):
                if producer.current_txn_start_offset < 0:
                    continue
                reason = hanging_reason(known.get(producer.producer_id), tp, now_ms)
                if reason in ("no_open_transaction", "partition_not_in_transaction"):
                    again = await self._open_transactions_by_producer([producer.producer_id])
                    reason = hanging_reason(again.get(producer.producer_id), tp, now_ms)
                if reason is not None:
                    hanging.append(HangingTransaction(
                        tp.topic, tp.partition, producer.producer_id, producer.producer_epoch, producer.coordinator_epoch,
                        producer.current_txn_start_offset, producer.last_timestamp, reason,
                    ))
        return hanging

    async def _open_transactions_by_producer(self, producer_ids: list[int] = ()) -> dict[int, TransactionDescription]:
        """``{producer id: description}`` of the transactions in an
        ``OPEN_TRANSACTION_STATES`` state (of ``producer_ids`` only, if given)."""
        listed = await self.list_transactions(states=list(OPEN_TRANSACTION_STATES), producer_ids=list(producer_ids))
        if not listed:
            return {}
        described = await self.describe_transactions_by_coordinator([t.transactional_id for t in listed])
        return {d.producer_id: d for d in described.values() if d is not None and d.state in OPEN_TRANSACTION_STATES}

    async def abort_transaction(self, partition, producer_id: int, producer_epoch: int, coordinator_epoch: int | None = None) -> None:
        """Write an ABORT marker for a hanging transaction in one partition
        (KIP-664), as ``kafka-transactions.sh abort`` does. Without a
        coordinator epoch it is read from DescribeProducers."""
        tp = as_topic_partition(partition)
        if coordinator_epoch is None:
            known = [p for p in await self.describe_producers(tp) if p.producer_id == producer_id]
            coordinator_epoch = known[0].coordinator_epoch if known else 0
        marker = {"producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": False, "topics": [{"name": tp.topic, "partition_indexes": [tp.partition]}], "coordinator_epoch": max(coordinator_epoch, 0)}
        response = await (await self.cluster.leader(tp.topic, tp.partition)).request(ApiKey.WRITE_TXN_MARKERS, {"markers": [marker]})
        code = response["markers"][0]["topics"][0]["partitions"][0]["error_code"]
        if code:
            raise classify(code, f"abort producer {producer_id} in {tp}")

    # -- client quotas (KIP-546) -------------------------------------------------------------

    async def alter_client_quotas(self, entity: dict, changes: dict, *, validate_only: bool = False) -> None:
        """Set (a number) or remove (None) quota values of one entity, as
        ``kafka-configs --alter --add-config/--delete-config`` does:

            admin.alter_client_quotas({"user": "alice"}, {"producer_byte_rate": 1_048_576})
            admin.alter_client_quotas({"user": None}, {"consumer_byte_rate": None})  # the default user's
        """
        parts = [{"entity_type": kind, "entity_name": name} for kind, name in entity.items()]
        ops = [{"key": key, "value": 0.0 if value is None else float(value), "remove": value is None} for key, value in changes.items()]
        response = await self._any(ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [{"entity": parts, "ops": ops}], "validate_only": validate_only})
        for answer in response["entries"]:
            if answer["error_code"]:
                raise InvalidConfigurationError(answer["error_code"], f"alter client quotas of {entity}", message=answer["error_message"] or error_name(answer["error_code"]))

    async def describe_client_quotas(self, user=EVERY_ENTITY, *, strict: bool = False) -> list[ClientQuotaEntry]:
        """The configured quotas: of every entity (the default), of one user
        (``user="alice"``), of the default user (``user=None``), of every
        user with a name (``user=ANY_NAME``). ``strict``: only entities that
        name no other entity type."""
        if user is EVERY_ENTITY:
            components = []
        elif user is ANY_NAME:
            components = [{"entity_type": "user", "match_type": 2, "match": None}]
        elif user is None:
            components = [{"entity_type": "user", "match_type": 1, "match": None}]
        else:
            components = [{"entity_type": "user", "match_type": 0, "match": user}]
        response = await self._any(ApiKey.DESCRIBE_CLIENT_QUOTAS, {"components": components, "strict": strict})
        if response["error_code"]:
            raise InvalidConfigurationError(response["error_code"], "describe client quotas", message=response["error_message"] or error_name(response["error_code"]))
        return [
            ClientQuotaEntry(tuple((part["entity_type"], part["entity_name"]) for part in entry["entity"]), {value["key"]: value["value"] for value in entry["values"]})
            for entry in response["entries"] or []
        ]

    # -- ACLs (CreateAcls, DescribeAcls, DeleteAcls) -------------------------------------------------

    async def create_acls(self, bindings) -> None:
        """Add ``protocol.acls.AclBinding`` values; the first refused one
        raises ``KafkaError`` naming it (the others of the request stay added,
        as in Kafka)."""
        bindings = list(bindings)
        creations = [
            {
                "resource_type": int(b.pattern.resource_type),
                "resource_name": b.pattern.name,
                "resource_pattern_type": int(b.pattern.pattern_type),
                "principal": b.entry.principal,
                "host": b.entry.host,
                "operation": int(b.entry.operation),
                "permission_type": int(b.entry.permission_type),
            }
            for b in bindings
        ]
        response = await self._any(ApiKey.CREATE_ACLS, {"creations": creations})
        for binding, result in zip(bindings, response["results"]):
            if result["error_code"]:
                raise classify(result["error_code"], f"create ACL {binding}" + (f" ({result['error_message']})" if result.get("error_message") else ""))

    async def describe_acls(self, acl_filter=None) -> list:
        """The ACLs matching a ``protocol.acls.AclBindingFilter`` (default: all)."""
        from protocol.acls import MATCH_ALL

        response = await self._any(ApiKey.DESCRIBE_ACLS, _acl_filter_fields(acl_filter or MATCH_ALL))
        if response["error_code"]:
            raise classify(response["error_code"], "describe ACLs" + (f" ({response['error_message']})" if response.get("error_message") else ""))
        return [
            _binding(resource["resource_type"], resource["resource_name"], resource["pattern_type"], acl)
            for resource in response["resources"]
            for acl in resource["acls"]
        ]

    async def delete_acls(self, filters) -> list:
        """Remove every ACL matching any of the ``AclBindingFilter`` values; the ACLs removed."""
        response = await self._any(ApiKey.DELETE_ACLS, {"filters": [_acl_filter_fields(f) for f in filters]})
        removed = []
        for result in response["filter_results"]:
            if result["error_code"]:
                raise classify(result["error_code"], "delete ACLs" + (f" ({result['error_message']})" if result.get("error_message") else ""))
            removed += [_binding(m["resource_type"], m["resource_name"], m["pattern_type"], m) for m in result["matching_acls"]]
        return removed

    # -- SCRAM users (KIP-554) ------------------------------------------------------------------

    async def describe_user_scram_credentials(self, users: list[str] | None = None) -> dict[str, dict[str, int]]:
        """``{user: {mechanism name: iterations}}`` of the named users (every
        SCRAM user when None); a user without credentials raises."""
        body = {"users": None if users is None else [{"name": name} for name in users]}
        response = await self._any(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, body)
        if response["error_code"]:
            raise classify(response["error_code"], f"describe SCRAM users ({response.get('error_message')})")
        described = {}
        for result in response["results"]:
            if result["error_code"]:
                raise classify(result["error_code"], f"describe SCRAM user {result['user']} ({result.get('error_message')})")
            described[result["user"]] = {
                _scram_mechanism(info["mechanism"]).name: info["iterations"] for info in result["credential_infos"]
            }
        return described

    async def upsert_user_scram_credential(self, user: str, password: str, *, mechanism: str = "SCRAM-SHA-256", iterations: int = 4096) -> None:
        """Set ``user``'s password for ``mechanism``, salted here (KIP-554:
        the password never crosses the wire, only the salted form)."""
        import os

        from protocol.scram import MECHANISMS, salted_password

        scram = MECHANISMS.get(mechanism)
        if scram is None:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")
        salt = os.urandom(32)
        upsertion = {
            "name": user,
            "mechanism": scram.kafka_type,
            "iterations": iterations,
            "salt": salt,
            "salted_password": salted_password(scram, password.encode("utf-8"), salt, iterations),
        }
        await self._alter_user_scram_credentials({"deletions": [], "upsertions": [upsertion]})

    async def delete_user_scram_credential(self, user: str, mechanism: str = "SCRAM-SHA-256") -> None:
        from protocol.scram import MECHANISMS

        scram = MECHANISMS.get(mechanism)
        if scram is None:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")
        await self._alter_user_scram_credentials({"deletions": [{"name": user, "mechanism": scram.kafka_type}], "upsertions": []})

    async def _alter_user_scram_credentials(self, body: dict) -> None:
        response = await self._any(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, body)
        for result in response["results"]:
            if result["error_code"]:
                raise classify(result["error_code"], f"alter SCRAM user {result['user']} ({result.get('error_message')})")

    # -- for onceflow status: what a broker serves, and topics with their kind ---------------------

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        """``{api key: (min version, max version)}`` that a broker serves (its
        ApiVersions answer): a tool meant for any Kafka-protocol broker asks
        before it uses an API that some lack (Tansu serves neither
        ListTransactions nor DescribeProducers)."""
        async for attempt in self.cluster.retrying(self.config.request_timeout_ms / 1000):
            with attempt:
                client = await self.cluster.any_broker()
                return dict(client.versions)

    async def topic_listings(self) -> list[TopicListing]:
        """Every topic with its partition count and whether it is internal, by name."""
        body = await self.cluster.refresh(None, allow_auto_create=False)
        listed = [TopicListing(t["name"], len(t["partitions"]), bool(t.get("is_internal")) or t["name"].startswith("__")) for t in body["topics"] if not t["error_code"]]
        return sorted(listed, key=lambda t: t.name)

def _acl_filter_fields(acl_filter) -> dict:
    return {
        "resource_type_filter": int(acl_filter.resource_type),
        "resource_name_filter": acl_filter.name,
        "pattern_type_filter": int(acl_filter.pattern_type),
        "principal_filter": acl_filter.principal,
        "host_filter": acl_filter.host,
        "operation": int(acl_filter.operation),
        "permission_type": int(acl_filter.permission_type),
    }


def _binding(resource_type, name, pattern_type, entry):
    from protocol.acls import AclBinding

    return AclBinding.of(resource_type, name, entry["principal"], entry["operation"], entry["permission_type"], host=entry["host"], pattern_type=pattern_type)


def _scram_mechanism(kafka_type: int):
    from protocol.scram import MECHANISMS_BY_TYPE

    return MECHANISMS_BY_TYPE[kafka_type]




class Admin(SyncClient):
    """The synchronous admin client: every method of ``AsyncAdmin``, blocking."""

    thread_name = "onceflow-admin"
    close_timeout = 30

    def __init__(self, bootstrap_servers=None, config: dict | AdminConfig | None = None, **options):
        bootstrap_servers, config = properties_first(bootstrap_servers, config)
        super().__init__(lambda: AsyncAdmin(bootstrap_servers, config, **options))

    def __getattr__(self, name):
        method = getattr(AsyncAdmin, name, None)
        if method is None or name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def blocking(*args, **kwargs):
            return self._call(getattr(self._async, name)(*args, **kwargs))

        blocking.__doc__ = method.__doc__
        return blocking
