"""Request dispatch and the data plane's handlers: ApiVersions, Metadata,
Produce, Fetch and ListOffsets, each turning a decoded request body into a
response body (plain dicts, snake_case field names as in
``protocol.messages``). ``KafkaApis`` also dispatches the handlers of the
other API groups the broker composes in: ``broker.admin_apis`` (topics,
configs, DeleteRecords, DescribeCluster), ``broker.txn_apis`` and
``broker.groups``; ``SUPPORTED_APIS`` lists the versions of all of them.

This is where Kafka's semantics live for the broker: which error code a
client gets for what, how a Produce is validated and made durable, how a
Fetch long-polls and respects its byte limits. Handlers never touch sockets
(``broker.server`` does) and never parse records beyond batch headers.
"""

from __future__ import annotations

import inspect
import contextvars
import logging
import time
import uuid
from collections.abc import Callable

from broker.replica import (
    PartitionUnavailableError,
    ReplicaManager,
    TopicExistsError,
)
from broker.client_rounds import note_durability_wait
from broker.security.listeners import advertised_address
from protocol.constants import IsolationLevel, OffsetSpec
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import CorruptRecordError, iter_batches
from storage.log import RecordTooLargeError
from protocol.names import InvalidTopicError
from storage.producer_state import ProducerStateError

log = logging.getLogger(__name__)


def log_or_error(replicas: ReplicaManager, topic: str | None, partition: int) -> tuple[object | None, ErrorCode]:
    """(the partition's log, NONE), or (None, the error code to answer for
    it): UNKNOWN_TOPIC_OR_PARTITION, or KAFKA_STORAGE_ERROR when its log
    could not be opened (a disk error, too many open files, a damaged file)."""
    if topic is None:
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    try:
        partition_log = replicas.get_log(topic, partition)
    except PartitionUnavailableError:
        return None, ErrorCode.KAFKA_STORAGE_ERROR
    if partition_log is None:
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return partition_log, ErrorCode.NONE

# api key -> (lowest version, highest version) we serve. Produce starts at 3
# and Fetch at 4 because older versions carry the pre-v2 message formats,
# which onceflow does not store.
SUPPORTED_APIS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (0, 10),
    ApiKey.METADATA: (0, 12),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.DELETE_TOPICS: (0, 6),
    ApiKey.DELETE_RECORDS: (0, 2),
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.WRITE_TXN_MARKERS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.OFFSET_COMMIT: (0, 9),
    ApiKey.OFFSET_FETCH: (0, 9),
    ApiKey.JOIN_GROUP: (0, 9),
    ApiKey.HEARTBEAT: (0, 4),
    ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_ACLS: (0, 3),
    ApiKey.CREATE_ACLS: (0, 3),
    ApiKey.DELETE_ACLS: (0, 3),
}

# The versions that mean KIP-890 part 2 (a Produce or TxnOffsetCommit that
# adds its partition, an EndTxn that bumps the epoch): offered only while the
# ``transaction.version`` feature is finalized at 2, as Kafka does.
TRANSACTION_VERSION_2_APIS: dict[ApiKey, int] = {ApiKey.PRODUCE: 12, ApiKey.TXN_OFFSET_COMMIT: 5, ApiKey.END_TXN: 5}
TRANSACTION_VERSION_FEATURE = "transaction.version"


def advertised_versions(transaction_version: int) -> dict[ApiKey, tuple[int, int]]:
    """SUPPORTED_APIS as ApiVersions offers them at this transaction version."""
    if transaction_version >= 2:
        return dict(SUPPORTED_APIS)
    return {key: (low, min(high, TRANSACTION_VERSION_2_APIS[key] - 1) if key in TRANSACTION_VERSION_2_APIS else high) for key, (low, high) in SUPPORTED_APIS.items()}


# Who sent the request being handled: its header's client id and its
# connection's host, as Kafka shows them ("/127.0.0.1"). Set by dispatch for
# the request's own task; the group coordinator records them per member for
# DescribeGroups (onceflow status, kafka-consumer-groups).
REQUEST_ORIGIN: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("request_origin", default=("", ""))


def _never() -> bool:
    return False


# Whether the peer of the request being handled is gone (its connection
# closed or reset) while the request is still in flight: the group
# coordinator does not make a member whose JoinGroup nobody waits for any
# more its round's leader. Set by dispatch for the request's own task.
REQUEST_CONNECTION_GONE: contextvars.ContextVar[Callable[[], bool]] = contextvars.ContextVar("request_connection_gone", default=_never)


class KafkaApis:
    """Dispatches decoded requests to handlers: its own (the data plane) and
    those the broker composes in (``extra_handlers``: admin, transactions,
    groups)."""

    def __init__(
        self,
        *,
        config,
        replicas: ReplicaManager,
        cluster_id: str,
        advertised: tuple[str, int],
        extra_handlers: dict | None = None,
        partition_in_transaction=None,
        answers_once_appended=None,
        add_to_transaction=None,
    ):
        self.config = config
        self.replicas = replicas
        self.cluster_id = cluster_id
        self.advertised = advertised
        self._handlers = {
            ApiKey.PRODUCE: self.handle_produce,
            ApiKey.FETCH: self.handle_fetch,
            ApiKey.LIST_OFFSETS: self.handle_list_offsets,
            ApiKey.METADATA: self.handle_metadata,
            ApiKey.API_VERSIONS: self.handle_api_versions,
            ApiKey.SASL_HANDSHAKE: self.handle_sasl_outside_sasl,
            ApiKey.SASL_AUTHENTICATE: self.handle_sasl_outside_sasl,
        }
        self._handlers.update(extra_handlers or {})
        # Handlers whose answer depends on who asks or on which listener (a
        # keyword-only ``session`` parameter) get the request's session.
        self._wants_session = {
            key for key, handler in self._handlers.items() if "session" in inspect.signature(handler).parameters
        }
        # KIP-890 part 1: (producer id, epoch, topic, partition) -> the error
        # code for a transactional batch there (NONE: allowed).
        self.partition_in_transaction = partition_in_transaction
        # ``transaction.durable.at.end``: whether a producer's transactional
        # Produce is answered once appended (not once its transaction is sealed).
        self.answers_once_appended = answers_once_appended
        # KIP-890 part 2 (Produce v12): (transactional id, producer id, epoch,
        # [(topic, partition)]) -> the error code of adding them to its
        # transaction (NONE: added, or already in it).
        self.add_to_transaction = add_to_transaction

    async def dispatch(self, request, session=None) -> dict | None:
        """Answer one request. ``session`` (``broker.security.session``) is the
        identity of the connection it came on; authorisation and quotas wrap
        this dispatcher and use it, the handlers below do not."""
        handler = self._handlers.get(request.api_key)
        if handler is None:  # framing only lets through what SUPPORTED_APIS lists
            raise RuntimeError(f"no handler for api key {request.api_key}")
        REQUEST_ORIGIN.set((request.client_id or "", f"/{session.client_host}" if session is not None else ""))
        REQUEST_CONNECTION_GONE.set(session.connection_gone if session is not None else _never)
        if request.api_key in self._wants_session:
            return await handler(request.api_version, request.body, session=session)
        return await handler(request.api_version, request.body)

    async def handle_sasl_outside_sasl(self, version: int, body: dict) -> dict:
        """SaslHandshake or SaslAuthenticate that reached the dispatcher: the
        connection is on a listener without SASL (a SASL listener's
        ``SaslServer`` answers these itself). Kafka answers ILLEGAL_SASL_STATE."""
        return {
            "error_code": ErrorCode.ILLEGAL_SASL_STATE,
            "mechanisms": [],
            "error_message": "this listener does not use SASL",
            "auth_bytes": b"",
            "session_lifetime_ms": 0,
        }

    # -- ApiVersions --------------------------------------------------------

    def api_versions_body(self, error_code: int = ErrorCode.NONE, version: int = 0) -> dict:
        """ApiVersions' answer to a request of ``version``, features as Kafka
        (KIP-584, KAFKA-17492) sends them: a supported feature whose range
        starts at 0 only from v4 (clients before v4 may fail to parse it),
        and a feature finalized at level 0 not at all (0 means off)."""
        level = self.config.transaction_version
        supported = [(TRANSACTION_VERSION_FEATURE, 0, 2)]
        return {
            "error_code": int(error_code),
            "api_keys": [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(advertised_versions(level).items())
            ],
            "throttle_time_ms": 0,
            "supported_features": [{"name": name, "min_version": low, "max_version": high} for name, low, high in supported if low > 0 or version >= 4],
            "finalized_features_epoch": 1,
            "finalized_features": [{"name": TRANSACTION_VERSION_FEATURE, "max_version_level": level, "min_version_level": level}] if level > 0 else [],
        }

    async def handle_api_versions(self, version: int, body: dict) -> dict:
        return self.api_versions_body(version=version)

    # -- Metadata -------------------------------------------------------------

    async def handle_metadata(self, version: int, body: dict, *, session=None) -> dict:
        requested = body.get("topics")
        host, port = advertised_address(self.advertised, session)
        node_id = self.config.node_id
        if requested is None or (version == 0 and not requested):
            names = [name for name in self.replicas.topics]
            allow_create = False
        else:
            names = []
            for entry in requested:
                name = entry.get("name")
                if name is None and entry.get("topic_id"):
                    info = self.replicas.topics_by_id.get(as_uuid(entry["topic_id"]))
                    name = info.name if info else None
                names.append(name)
            allow_create = body.get("allow_auto_topic_creation", True) if version >= 4 else True
        topics = []
        for name in names:
            if name is None:
                topics.append({"error_code": ErrorCode.UNKNOWN_TOPIC_ID, "name": None, "partitions": []})
                continue
            info = self.replicas.topics.get(name)
            if info is None and allow_create and self.config.auto_create_topics:
                try:
                    info = self.replicas.create_topic(name, self.config.num_partitions)
                except InvalidTopicError:
                    topics.append({"error_code": ErrorCode.INVALID_TOPIC_EXCEPTION, "name": name, "partitions": []})
                    continue
                except TopicExistsError:
                    info = self.replicas.topics.get(name)
            if info is None:
                try:
                    from protocol.names import validate_topic_name

                    validate_topic_name(name)
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                except InvalidTopicError:
                    code = ErrorCode.INVALID_TOPIC_EXCEPTION
                topics.append({"error_code": code, "name": name, "partitions": []})
                continue
            topics.append(
                {
                    "error_code": ErrorCode.NONE,
                    "name": info.name,
                    "topic_id": info.topic_id,
                    "is_internal": info.internal,
                    "partitions": [
                        {
                            "error_code": ErrorCode.NONE,
                            "partition_index": partition,
                            "leader_id": node_id,
                            "leader_epoch": 0,
                            "replica_nodes": [node_id],
                            "isr_nodes": [node_id],
                            "offline_replicas": [],
                        }
                        for partition in range(info.partitions)
                    ],
                }
            )
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": node_id, "host": host, "port": port, "rack": None}],
            "cluster_id": self.cluster_id,
            "controller_id": node_id,
            "topics": topics,
        }

    # -- Produce --------------------------------------------------------------

    async def handle_produce(self, version: int, body: dict) -> dict | None:
        acks = body.get("acks", 1)
        responses = []
        durable_waits = []
        refused = {}
        if version >= 12 and self.add_to_transaction is not None:
            refused = await self._add_to_transaction(body)
        for topic_data in body.get("topic_data", []):
            name = topic_data.get("name")
            partitions = []
            for partition_data in topic_data.get("partition_data", []):
                index = partition_data.get("index", -1)
                if (name, index) in refused:
                    code, message = refused[(name, index)]
                    partitions.append({"index": index, "error_code": code, "error_message": message, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1})
                    continue
                result = self._append(name, index, partition_data.get("records"), acks)
                partitions.append(result)
                if "_durable" in result:
                    durable_waits.append(result)
            responses.append({"name": name, "partition_responses": partitions})
        # Every partition's append is done (in request order, on the loop);
        # acks=all then waits until each is on disk per the durability setting.
        for result in durable_waits:
            waiter = result.pop("_durable")
            note_durability_wait(waiter)
            try:
                await waiter
            except Exception as error:
                log.error("append to %s was not made durable: %s", result.get("_where"), error)
                result["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
                result["error_message"] = f"the write was not made durable: {error}"
                result["base_offset"] = -1
        for topic in responses:
            for result in topic["partition_responses"]:
                result.pop("_where", None)
                result.pop("_durable", None)
        if acks == 0:
            return None
        return {"responses": responses, "throttle_time_ms": 0}

    async def _add_to_transaction(self, body: dict) -> dict[tuple[str, int], tuple[ErrorCode, str]]:
        """KIP-890 part 2: a transactional Produce v12 adds its partitions to
        its producer's transaction before it appends (the client sent no
        AddPartitionsToTxn), all of one request in one change. Returns the
        partitions refused, with the error code and message to answer them."""
        wanted = []
        producer = None
        for topic_data in body.get("topic_data", []):
            for partition_data in topic_data.get("partition_data", []):
                header = _first_header(partition_data.get("records"))
                if header is not None and header.is_transactional and header.producer_id >= 0:
                    wanted.append((topic_data.get("name"), partition_data.get("index", -1)))
                    producer = producer or (header.producer_id, header.producer_epoch)
        if not wanted:
            return {}
        transactional_id = body.get("transactional_id")
        if not transactional_id:
            error, message = ErrorCode.INVALID_TXN_STATE, "a transactional batch needs the request's transactional id"
        else:
            error = await self.add_to_transaction(transactional_id, producer[0], producer[1], wanted)
            if error == ErrorCode.PRODUCER_FENCED:
                error = ErrorCode.INVALID_PRODUCER_EPOCH  # as a Produce names a stale epoch
            message = f"could not add the partitions to the transaction of {transactional_id}: {error.name}" if error else None
        return {} if error == ErrorCode.NONE else {partition: (error, message) for partition in wanted}

    def _append(self, topic: str, partition: int, records, acks: int) -> dict:
        result = {"index": partition, "error_code": ErrorCode.NONE, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}
        if acks not in (-1, 0, 1):
            result["error_code"] = ErrorCode.INVALID_REQUIRED_ACKS
            return result
        try:
            partition_log = self.replicas.get_log(topic, partition)
        except PartitionUnavailableError as error:
            result["error_code"], result["error_message"] = ErrorCode.KAFKA_STORAGE_ERROR, str(error)
            return result
        if partition_log is None:
            result["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return result
        info = self.replicas.topics.get(topic)
        if info is not None and info.internal:
            # __consumer_offsets and __transaction_state are written by the
            # coordinators alone: a client's record there would be read back
            # as coordinator state at the next load (Kafka refuses it the same way).
            result["error_code"] = ErrorCode.INVALID_TOPIC_EXCEPTION
            result["error_message"] = f"cannot append to internal topic {topic}"
            return result
        if not records:
            result["error_code"] = ErrorCode.CORRUPT_MESSAGE
            result["error_message"] = "the request has no record batches for this partition"
            return result
        data = records if isinstance(records, (bytes, bytearray, memoryview)) else bytes(records)
        try:
            for _position, header in iter_batches(data, verify_crc=False):
                if header.size > self.max_message_bytes(topic):
                    result["error_code"] = ErrorCode.MESSAGE_TOO_LARGE
                    result["error_message"] = f"batch of {header.size} bytes exceeds max.message.bytes"
                    return result
                if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
                    result["error_code"] = ErrorCode.INVALID_RECORD
                    result["error_message"] = (
                        f"batch declares {header.record_count} records but last offset delta {header.last_offset_delta}"
                    )
                    return result
                if header.is_control:
                    result["error_code"] = ErrorCode.INVALID_RECORD
                    result["error_message"] = "clients may not produce control batches"
                    return result
        except CorruptRecordError as error:
            result["error_code"] = ErrorCode.CORRUPT_MESSAGE
            result["error_message"] = str(error)
            return result
        if header.is_transactional and header.producer_id >= 0 and self.partition_in_transaction is not None:
            # Every batch of one request has the same producer (Kafka checks that too).
            verdict = self.partition_in_transaction(header.producer_id, header.producer_epoch, topic, partition)
            if verdict != ErrorCode.NONE:
                result["error_code"] = verdict
                result["error_message"] = (
                    f"{topic}-{partition} is not part of an ongoing transaction of producer "
                    f"{header.producer_id} epoch {header.producer_epoch} (AddPartitionsToTxn first)"
                )
                return result
        try:
            durable_at_end = header.is_transactional and self.config.transaction_durable_at_end and (
                self.answers_once_appended is None or self.answers_once_appended(header.producer_id))
            # ``transaction.durable.at.end``: no fsync round asked for now;
            # EndTxn(commit) asks for one, shared with its decision.
            appended = partition_log.append(data, flush=not durable_at_end)
        except ProducerStateError as error:
            result["error_code"] = ErrorCode[error.error_name]
            result["error_message"] = str(error)
            return result
        except RecordTooLargeError as error:
            result["error_code"] = ErrorCode.MESSAGE_TOO_LARGE
            result["error_message"] = str(error)
            return result
        except CorruptRecordError as error:
            result["error_code"] = ErrorCode.CORRUPT_MESSAGE
            result["error_message"] = str(error)
            return result
        except Exception as error:  # storage refuses (failed disk, full disk): never acknowledge
            log.error("append to %s-%d failed: %s", topic, partition, error)
            result["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
            result["error_message"] = str(error)
            return result
        result["base_offset"] = appended.first_offset
        result["log_start_offset"] = partition_log.log_start_offset
        result["_where"] = f"{topic}-{partition}"
        if durable_at_end:
            pass  # answered once appended: EndTxn(commit) makes it durable in its decision's round
        elif acks == -1 or appended.duplicate:
            # A duplicate is answered like the original: once that is durable.
            # Only its own data: the AddPartitionsToTxn record of a
            # transactional batch is made durable by EndTxn's round (the
            # same log); a power cut that takes it back and keeps this
            # batch ends the producer's transaction at start
            # (``TransactionManager.end_unknown_transactions``).
            result["_durable"] = partition_log.wait_durable(appended.last_offset)
        if not appended.duplicate:
            self._after_append(topic, partition, partition_log, appended, ask=not durable_at_end)
        return result

    def _after_append(self, topic, partition, partition_log, appended, *, ask: bool = True) -> None:
        # Wake fetchers when the data becomes visible (after its fsync for
        # "group" durability; at once otherwise).
        waiter = partition_log.wait_durable(appended.last_offset, ask=ask)
        if waiter.done():
            self.replicas.notify_appended(topic, partition)
        else:
            waiter.add_done_callback(lambda _f: self.replicas.notify_appended(topic, partition))

    def max_message_bytes(self, topic: str) -> int:
        info = self.replicas.topics.get(topic)
        value = (info.config if info else {}).get("max.message.bytes") or self.replicas.log_defaults.get("max.message.bytes")
        return int(value) if value else self.config.message_max_bytes

    # -- Fetch ----------------------------------------------------------------

    async def handle_fetch(self, version: int, body: dict) -> dict:
        deadline = time.monotonic() + max(0, body.get("max_wait_ms", 0)) / 1000.0
        min_bytes = max(0, body.get("min_bytes", 0))
        while True:
            response, total_bytes, keys = self._read_fetch(version, body)
            remaining = deadline - time.monotonic()
            if total_bytes >= min_bytes or remaining <= 0 or response.get("error_code"):
                return response
            await self.replicas.wait_for_data(keys, remaining)

    def _read_fetch(self, version: int, body: dict):
        isolation = body.get("isolation_level", IsolationLevel.READ_UNCOMMITTED)
        max_bytes = body.get("max_bytes", self.config.fetch_max_bytes)
        if max_bytes <= 0:
            max_bytes = self.config.fetch_max_bytes
        max_bytes = min(max_bytes, self.config.fetch_max_bytes)
        remaining = max_bytes
        total = 0
        keys = []
        responses = []
        for topic in body.get("topics", []):
            if version >= 13:
                info = self.replicas.topics_by_id.get(as_uuid(topic.get("topic_id")))
                name = info.name if info else None
            else:
                name = topic.get("topic")
            partitions = []
            for request_partition in topic.get("partitions", []):
                index = request_partition.get("partition", -1)
                answer = {
                    "partition_index": index,
                    "error_code": ErrorCode.NONE,
                    "high_watermark": -1,
                    "last_stable_offset": -1,
                    "log_start_offset": -1,
                    "aborted_transactions": None,
                    "preferred_read_replica": -1,
                    "records": b"",
                }
                try:
                    partition_log = self.replicas.get_log(name, index) if name is not None else None
                except PartitionUnavailableError:
                    answer["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
                    partitions.append(answer)
                    continue
                if partition_log is None:
                    answer["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    partitions.append(answer)
                    continue
                keys.append((name, index))
                high_watermark = partition_log.high_watermark
                last_stable = partition_log.last_stable_offset
                answer["high_watermark"] = high_watermark
                answer["last_stable_offset"] = last_stable
                answer["log_start_offset"] = partition_log.log_start_offset
                fetch_offset = request_partition.get("fetch_offset", 0)
                # Out of range only outside the log: between the high watermark
                # and the log end (appended, not yet durable: an acks=0/1
                # producer already knows those offsets) the answer is empty, as
                # Kafka's is, and data comes once the high watermark passes it.
                if fetch_offset < partition_log.log_start_offset or fetch_offset > partition_log.log_end_offset:
                    answer["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
                    partitions.append(answer)
                    continue
                limit = last_stable if isolation == IsolationLevel.READ_COMMITTED else high_watermark
                partition_max = max(0, request_partition.get("partition_max_bytes", max_bytes))
                budget = min(partition_max, remaining)
                if fetch_offset < limit and (budget > 0 or total == 0):
                    # The first batch of the response may exceed the limits, so
                    # a batch larger than max_bytes can never block a consumer.
                    data = partition_log.read(fetch_offset, max(budget, 1), max_offset=limit, min_one_batch=(total == 0))
                    answer["records"] = data
                    total += len(data)
                    remaining -= len(data)
                if isolation == IsolationLevel.READ_COMMITTED:
                    answer["aborted_transactions"] = partition_log.aborted_transactions(fetch_offset, limit)
                partitions.append(answer)
            entry = {"partitions": partitions}
            if version >= 13:
                entry["topic_id"] = topic.get("topic_id")
            else:
                entry["topic"] = name
            responses.append(entry)
        response = {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "session_id": 0, "responses": responses}
        return response, total, keys

    # -- ListOffsets ------------------------------------------------------------

    async def handle_list_offsets(self, version: int, body: dict) -> dict:
        isolation = body.get("isolation_level", IsolationLevel.READ_UNCOMMITTED)
        topics = []
        for topic in body.get("topics", []):
            name = topic.get("name")
            partitions = []
            for request_partition in topic.get("partitions", []):
                index = request_partition.get("partition_index", -1)
                answer = {"partition_index": index, "error_code": ErrorCode.NONE, "timestamp": -1, "offset": -1, "leader_epoch": -1}
                partition_log, answer["error_code"] = log_or_error(self.replicas, name, index)
                if partition_log is None:
                    if version == 0:
                        answer["old_style_offsets"] = []
                    partitions.append(answer)
                    continue
                timestamp = request_partition.get("timestamp", OffsetSpec.LATEST)
                found = self._offset_for(partition_log, timestamp, isolation)
                if found is None:
                    answer["timestamp"], answer["offset"] = -1, -1
                else:
                    answer["timestamp"], answer["offset"] = found
                    answer["leader_epoch"] = 0
                if version == 0:
                    answer["old_style_offsets"] = [] if found is None else [found[1]]
                partitions.append(answer)
            topics.append({"name": name, "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    def _offset_for(self, partition_log, timestamp: int, isolation: int):
        high_watermark = partition_log.high_watermark
        end = partition_log.last_stable_offset if isolation == IsolationLevel.READ_COMMITTED else high_watermark
        if timestamp == OffsetSpec.LATEST or timestamp == OffsetSpec.LATEST_TIERED:
            return (-1, end)
        if timestamp in (OffsetSpec.EARLIEST, OffsetSpec.EARLIEST_LOCAL):
            return (-1, partition_log.log_start_offset)
        if timestamp == OffsetSpec.MAX_TIMESTAMP:
            return partition_log.max_timestamp_offset()
        found = partition_log.offset_for_timestamp(timestamp)
        if found is None:
            return None
        found_offset, found_timestamp = found
        if found_offset >= end:
            return None
        return (found_timestamp, found_offset)


def _first_header(records):
    """The first batch header of a partition's records, or None (missing or
    unreadable records: ``_append`` answers those)."""
    if not records:
        return None
    data = records if isinstance(records, (bytes, bytearray, memoryview)) else bytes(records)
    try:
        for _position, header in iter_batches(data, verify_crc=False):
            return header
    except CorruptRecordError:
        return None
    return None


def as_uuid(value) -> uuid.UUID | None:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return uuid.UUID(bytes=bytes(value))
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
