"""Request handlers: one method per Kafka API, each turning a decoded request
body into a response body (plain dicts, snake_case field names as in
``protocol.messages``).

This is where Kafka's semantics live for the broker: which error code a
client gets for what, how a Produce is validated and made durable, how a
Fetch long-polls and respects its byte limits. Handlers never touch sockets
(``broker.server`` does) and never parse records beyond batch headers.
"""

from __future__ import annotations

import logging
import time
import uuid

from broker.replica import (
    InvalidConfigError,
    InvalidPartitionsError,
    ReplicaManager,
    TopicExistsError,
    UnknownTopicError,
)
from protocol.constants import ConfigResourceType, IsolationLevel, OffsetSpec
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import CorruptRecordError, iter_batches
from storage.log import RecordTooLargeError
from storage.names import InvalidTopicError
from storage.producer_state import ProducerStateError

log = logging.getLogger(__name__)

# api key -> (lowest version, highest version) we serve. Produce starts at 3
# and Fetch at 4 because older versions carry the pre-v2 message formats,
# which onceflow does not store.
SUPPORTED_APIS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 11),
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
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
}

# DescribeConfigs config sources
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class KafkaApis:
    """Dispatches decoded requests to handlers."""

    def __init__(
        self,
        *,
        config,
        replicas: ReplicaManager,
        cluster_id: str,
        advertised: tuple[str, int],
        log_config_defaults: dict,
        extra_handlers: dict | None = None,
        partition_in_transaction=None,
    ):
        self.config = config
        self.replicas = replicas
        self.cluster_id = cluster_id
        self.advertised = advertised
        # Kafka names and default values of every topic setting, for DescribeConfigs.
        self.log_config_defaults = log_config_defaults
        self._handlers = {
            ApiKey.PRODUCE: self.handle_produce,
            ApiKey.FETCH: self.handle_fetch,
            ApiKey.LIST_OFFSETS: self.handle_list_offsets,
            ApiKey.METADATA: self.handle_metadata,
            ApiKey.API_VERSIONS: self.handle_api_versions,
            ApiKey.CREATE_TOPICS: self.handle_create_topics,
            ApiKey.DELETE_TOPICS: self.handle_delete_topics,
            ApiKey.DELETE_RECORDS: self.handle_delete_records,
            ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
            ApiKey.ALTER_CONFIGS: self.handle_alter_configs,
            ApiKey.CREATE_PARTITIONS: self.handle_create_partitions,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.handle_incremental_alter_configs,
            ApiKey.DESCRIBE_CLUSTER: self.handle_describe_cluster,
        }
        self._handlers.update(extra_handlers or {})
        # KIP-890 part 1: (producer id, epoch, topic, partition) -> the error
        # code for a transactional batch there (NONE: allowed).
        self.partition_in_transaction = partition_in_transaction

    async def dispatch(self, request) -> dict | None:
        handler = self._handlers.get(request.api_key)
        if handler is None:  # framing only lets through what SUPPORTED_APIS lists
            raise RuntimeError(f"no handler for api key {request.api_key}")
        return await handler(request.api_version, request.body)

    # -- ApiVersions --------------------------------------------------------

    def api_versions_body(self, error_code: int = ErrorCode.NONE) -> dict:
        return {
            "error_code": int(error_code),
            "api_keys": [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(SUPPORTED_APIS.items())
            ],
            "throttle_time_ms": 0,
        }

    async def handle_api_versions(self, version: int, body: dict) -> dict:
        return self.api_versions_body()

    # -- Metadata -------------------------------------------------------------

    async def handle_metadata(self, version: int, body: dict) -> dict:
        requested = body.get("topics")
        host, port = self.advertised
        node_id = self.config.node_id
        if requested is None or (version == 0 and not requested):
            names = [name for name in self.replicas.topics]
            allow_create = False
        else:
            names = []
            for entry in requested:
                name = entry.get("name")
                if name is None and entry.get("topic_id"):
                    info = self.replicas.topics_by_id.get(_as_uuid(entry["topic_id"]))
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
                    from storage.names import validate_topic_name

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
        for topic_data in body.get("topic_data", []):
            name = topic_data.get("name")
            partitions = []
            for partition_data in topic_data.get("partition_data", []):
                result = self._append(name, partition_data.get("index", -1), partition_data.get("records"), acks)
                partitions.append(result)
                if "_durable" in result:
                    durable_waits.append(result)
            responses.append({"name": name, "partition_responses": partitions})
        # Every partition's append is done (in request order, on the loop);
        # acks=all then waits until each is on disk per the durability setting.
        for result in durable_waits:
            waiter = result.pop("_durable")
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

    def _append(self, topic: str, partition: int, records, acks: int) -> dict:
        result = {"index": partition, "error_code": ErrorCode.NONE, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}
        if acks not in (-1, 0, 1):
            result["error_code"] = ErrorCode.INVALID_REQUIRED_ACKS
            return result
        partition_log = self.replicas.get_log(topic, partition)
        if partition_log is None:
            result["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
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
            appended = partition_log.append(data)
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
        if acks == -1 or appended.duplicate:
            # A duplicate is answered like the original: once that is durable.
            result["_durable"] = partition_log.wait_durable(appended.last_offset)
        if not appended.duplicate:
            self._after_append(topic, partition, partition_log, appended)
        return result

    def _after_append(self, topic, partition, partition_log, appended) -> None:
        # Wake fetchers when the data becomes visible (after its fsync for
        # "group" durability; at once otherwise).
        waiter = partition_log.wait_durable(appended.last_offset)
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
                info = self.replicas.topics_by_id.get(_as_uuid(topic.get("topic_id")))
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
                partition_log = self.replicas.get_log(name, index) if name is not None else None
                if partition_log is None:
                    answer["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    partitions.append(answer)
                    continue
                keys.append((name, index))
                high_watermark = partition_log.high_watermark
                last_stable = partition_log.last_stable_offset if hasattr(partition_log, "last_stable_offset") else high_watermark
                answer["high_watermark"] = high_watermark
                answer["last_stable_offset"] = last_stable
                answer["log_start_offset"] = partition_log.log_start_offset
                fetch_offset = request_partition.get("fetch_offset", 0)
                if fetch_offset < partition_log.log_start_offset or fetch_offset > high_watermark:
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
                if isolation == IsolationLevel.READ_COMMITTED and hasattr(partition_log, "aborted_transactions"):
                    answer["aborted_transactions"] = partition_log.aborted_transactions(fetch_offset, limit)
                elif isolation == IsolationLevel.READ_COMMITTED:
                    answer["aborted_transactions"] = []
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
                partition_log = self.replicas.get_log(name, index)
                if partition_log is None:
                    answer["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
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
        if isolation == IsolationLevel.READ_COMMITTED and hasattr(partition_log, "last_stable_offset"):
            end = partition_log.last_stable_offset
        else:
            end = high_watermark
        if timestamp == OffsetSpec.LATEST or timestamp == OffsetSpec.LATEST_TIERED:
            return (-1, end)
        if timestamp in (OffsetSpec.EARLIEST, OffsetSpec.EARLIEST_LOCAL):
            return (-1, partition_log.log_start_offset)
        if timestamp == OffsetSpec.MAX_TIMESTAMP:
            found = partition_log.max_timestamp_offset() if hasattr(partition_log, "max_timestamp_offset") else None
            return found
        found = partition_log.offset_for_timestamp(timestamp)
        if found is None:
            return None
        found_offset, found_timestamp = found
        if found_offset >= end:
            return None
        return (found_timestamp, found_offset)

    # -- topic administration ---------------------------------------------------

    async def handle_create_topics(self, version: int, body: dict) -> dict:
        validate_only = body.get("validate_only", False)
        results = []
        for topic in body.get("topics", []):
            name = topic.get("name")
            result = {"name": name, "error_code": ErrorCode.NONE, "error_message": None, "num_partitions": -1, "replication_factor": -1, "configs": None}
            partitions = topic.get("num_partitions", -1)
            replication = topic.get("replication_factor", -1)
            if topic.get("assignments"):
                partitions = len(topic["assignments"])
            if partitions == -1:
                partitions = self.config.num_partitions
            if replication not in (-1, 1):
                result["error_code"] = ErrorCode.INVALID_REPLICATION_FACTOR
                result["error_message"] = f"replication factor {replication} is larger than the 1 available broker"
                results.append(result)
                continue
            config = {entry["name"]: entry["value"] for entry in topic.get("configs", []) if entry.get("value") is not None}
            try:
                info = self.replicas.create_topic(name, partitions, config, validate_only=validate_only)
            except InvalidTopicError as error:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_TOPIC_EXCEPTION, str(error)
            except TopicExistsError as error:
                result["error_code"], result["error_message"] = ErrorCode.TOPIC_ALREADY_EXISTS, str(error)
            except InvalidPartitionsError as error:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_PARTITIONS, str(error)
            except InvalidConfigError as error:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_CONFIG, str(error)
            else:
                result["topic_id"] = info.topic_id
                result["num_partitions"] = info.partitions
                result["replication_factor"] = 1
                result["configs"] = [
                    {"name": key, "value": str(value), "read_only": False, "config_source": SOURCE_DYNAMIC_TOPIC if key in info.config else SOURCE_DEFAULT, "is_sensitive": False}
                    for key, value in sorted(self._topic_config_values(info).items())
                ]
            results.append(result)
        return {"throttle_time_ms": 0, "topics": results}

    async def handle_delete_topics(self, version: int, body: dict) -> dict:
        targets = []
        if version >= 6:
            for entry in body.get("topics", []):
                name = entry.get("name")
                topic_id = entry.get("topic_id")
                if name is None and topic_id is not None:
                    info = self.replicas.topics_by_id.get(_as_uuid(topic_id))
                    name = info.name if info else None
                targets.append((name, topic_id))
        else:
            targets = [(name, None) for name in body.get("topic_names", [])]
        responses = []
        for name, topic_id in targets:
            result = {"name": name, "error_code": ErrorCode.NONE, "error_message": None}
            if version >= 6:
                result["topic_id"] = topic_id
            if name is None:
                result["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID
            else:
                try:
                    info = self.replicas.delete_topic(name)
                    if version >= 6:
                        result["topic_id"] = info.topic_id
                except UnknownTopicError as error:
                    result["error_code"], result["error_message"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(error)
            responses.append(result)
        return {"throttle_time_ms": 0, "responses": responses}

    async def handle_create_partitions(self, version: int, body: dict) -> dict:
        results = []
        for topic in body.get("topics", []):
            name = topic.get("name")
            result = {"name": name, "error_code": ErrorCode.NONE, "error_message": None}
            try:
                self.replicas.create_partitions(name, topic.get("count", 0), validate_only=body.get("validate_only", False))
            except UnknownTopicError as error:
                result["error_code"], result["error_message"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(error)
            except InvalidPartitionsError as error:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_PARTITIONS, str(error)
            results.append(result)
        return {"throttle_time_ms": 0, "results": results}

    async def handle_delete_records(self, version: int, body: dict) -> dict:
        topics = []
        for topic in body.get("topics", []):
            name = topic.get("name")
            partitions = []
            for entry in topic.get("partitions", []):
                index = entry.get("partition_index", -1)
                answer = {"partition_index": index, "low_watermark": -1, "error_code": ErrorCode.NONE}
                partition_log = self.replicas.get_log(name, index)
                if partition_log is None:
                    answer["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    offset = entry.get("offset", -1)
                    if offset == -1:
                        offset = partition_log.high_watermark
                    if offset < 0 or offset > partition_log.high_watermark:
                        answer["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
                    else:
                        try:
                            partition_log.delete_records_before(offset)
                            answer["low_watermark"] = partition_log.log_start_offset
                        except Exception as error:
                            log.error("DeleteRecords on %s-%d failed: %s", name, index, error)
                            answer["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
                partitions.append(answer)
            topics.append({"name": name, "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}

    # -- configuration ------------------------------------------------------------

    def _topic_config_values(self, info) -> dict:
        values = {key: str(value) for key, value in self.log_config_defaults.items()}
        values.update({key: str(value) for key, value in self.replicas.log_defaults.items()})
        values.update(info.config)
        return values

    async def handle_describe_configs(self, version: int, body: dict) -> dict:
        results = []
        for resource in body.get("resources", []):
            resource_type = resource.get("resource_type")
            name = resource.get("resource_name")
            wanted = resource.get("configuration_keys")
            result = {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": resource_type, "resource_name": name, "configs": []}
            if resource_type == ConfigResourceType.TOPIC:
                info = self.replicas.topics.get(name)
                if info is None:
                    result["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    result["error_message"] = f"topic '{name}' does not exist"
                else:
                    for key, value in sorted(self._topic_config_values(info).items()):
                        if wanted is not None and key not in wanted:
                            continue
                        if key in info.config:
                            source = SOURCE_DYNAMIC_TOPIC
                        elif key in self.replicas.log_defaults:
                            source = SOURCE_STATIC_BROKER
                        else:
                            source = SOURCE_DEFAULT
                        result["configs"].append(
                            {"name": key, "value": value, "read_only": False, "is_default": source == SOURCE_DEFAULT, "config_source": source, "is_sensitive": False, "synonyms": []}
                        )
            elif resource_type == ConfigResourceType.BROKER:
                broker_values = {
                    "node.id": str(self.config.node_id),
                    "auto.create.topics.enable": str(self.config.auto_create_topics).lower(),
                    "num.partitions": str(self.config.num_partitions),
                    "socket.request.max.bytes": str(self.config.socket_request_max_bytes),
                    "message.max.bytes": str(self.config.message_max_bytes),
                }
                for key, value in sorted(broker_values.items()):
                    if wanted is not None and key not in wanted:
                        continue
                    result["configs"].append(
                        {"name": key, "value": value, "read_only": True, "is_default": False, "config_source": SOURCE_STATIC_BROKER, "is_sensitive": False, "synonyms": []}
                    )
            else:
                result["error_code"] = ErrorCode.INVALID_REQUEST
                result["error_message"] = f"resource type {resource_type} is not supported"
            results.append(result)
        return {"throttle_time_ms": 0, "results": results}

    async def handle_alter_configs(self, version: int, body: dict) -> dict:
        responses = []
        for resource in body.get("resources", []):
            name = resource.get("resource_name")
            answer = {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": resource.get("resource_type"), "resource_name": name}
            if resource.get("resource_type") != ConfigResourceType.TOPIC:
                answer["error_code"] = ErrorCode.INVALID_REQUEST
                answer["error_message"] = "only topic configuration can be altered"
            else:
                config = {entry["name"]: entry["value"] for entry in resource.get("configs", []) if entry.get("value") is not None}
                answer.update(self._alter(name, config, body.get("validate_only", False)))
            responses.append(answer)
        return {"throttle_time_ms": 0, "responses": responses}

    async def handle_incremental_alter_configs(self, version: int, body: dict) -> dict:
        responses = []
        for resource in body.get("resources", []):
            name = resource.get("resource_name")
            answer = {"error_code": ErrorCode.NONE, "error_message": None, "resource_type": resource.get("resource_type"), "resource_name": name}
            info = self.replicas.topics.get(name)
            if resource.get("resource_type") != ConfigResourceType.TOPIC:
                answer["error_code"] = ErrorCode.INVALID_REQUEST
                answer["error_message"] = "only topic configuration can be altered"
            elif info is None:
                answer["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                answer["error_message"] = f"topic '{name}' does not exist"
            else:
                config = dict(info.config)
                for entry in resource.get("configs", []):
                    operation = entry.get("config_operation", 0)
                    if operation == 0:  # SET
                        config[entry["name"]] = entry.get("value")
                    elif operation == 1:  # DELETE
                        config.pop(entry["name"], None)
                    else:  # APPEND / SUBTRACT apply to list settings, which we have none of
                        answer["error_code"] = ErrorCode.INVALID_CONFIG
                        answer["error_message"] = f"operation {operation} is not supported for {entry['name']}"
                if answer["error_code"] == ErrorCode.NONE:
                    answer.update(self._alter(name, {k: v for k, v in config.items() if v is not None}, body.get("validate_only", False), replace=True))
            responses.append(answer)
        return {"throttle_time_ms": 0, "responses": responses}

    def _alter(self, name: str, config: dict, validate_only: bool, replace: bool = True) -> dict:
        if name not in self.replicas.topics:
            return {"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "error_message": f"topic '{name}' does not exist"}
        try:
            if validate_only:
                self.replicas._validate_config({**self.replicas.log_defaults, **config})
            else:
                self.replicas.alter_topic_config(name, config)
        except (InvalidConfigError, ValueError) as error:
            return {"error_code": ErrorCode.INVALID_CONFIG, "error_message": str(error)}
        return {}

    async def handle_describe_cluster(self, version: int, body: dict) -> dict:
        host, port = self.advertised
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "endpoint_type": 1,
            "cluster_id": self.cluster_id,
            "controller_id": self.config.node_id,
            "brokers": [{"broker_id": self.config.node_id, "host": host, "port": port, "rack": None}],
        }


def _as_uuid(value) -> uuid.UUID | None:
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
