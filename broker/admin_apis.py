"""The admin plane's request handlers: CreateTopics, DeleteTopics,
CreatePartitions, DeleteRecords, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs and DescribeCluster.

``AdminApis.handlers()`` maps their API keys to handlers that turn a decoded
request body into a response body, as ``broker.apis`` does for the data
plane; the broker composes them into ``KafkaApis``. One broker is the whole
cluster and its controller, so topic changes apply here, to the
``ReplicaManager``, at once.
"""

from __future__ import annotations

import logging

from broker.apis import as_uuid, log_or_error
from broker.security.listeners import advertised_address
from broker.replica import (
    InternalTopicError,
    InvalidConfigError,
    InvalidPartitionsError,
    ReplicaManager,
    TopicExistsError,
    UnknownTopicError,
)
from protocol.constants import ConfigResourceType
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.names import InvalidTopicError

log = logging.getLogger(__name__)

# DescribeConfigs config sources
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class AdminApis:
    def __init__(self, *, config, replicas: ReplicaManager, cluster_id: str, advertised: tuple[str, int], log_config_defaults: dict):
        self.config = config
        self.replicas = replicas
        self.cluster_id = cluster_id
        self.advertised = advertised
        # Kafka names and default values of every topic setting, for DescribeConfigs.
        self.log_config_defaults = log_config_defaults

    def handlers(self) -> dict:
        return {
            ApiKey.CREATE_TOPICS: self.handle_create_topics,
            ApiKey.DELETE_TOPICS: self.handle_delete_topics,
            ApiKey.DELETE_RECORDS: self.handle_delete_records,
            ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
            ApiKey.ALTER_CONFIGS: self.handle_alter_configs,
            ApiKey.CREATE_PARTITIONS: self.handle_create_partitions,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.handle_incremental_alter_configs,
            ApiKey.DESCRIBE_CLUSTER: self.handle_describe_cluster,
        }

    # -- topic administration ---------------------------------------------------

    async def handle_create_topics(self, version: int, body: dict) -> dict:
        validate_only = body.get("validate_only", False)
        results = []
        specs = []  # (result, name, partitions, config): registered together below
        for topic in body.get("topics", []):
            name = topic.get("name")
            result = {"name": name, "error_code": ErrorCode.NONE, "error_message": None, "num_partitions": -1, "replication_factor": -1, "configs": None}
            results.append(result)
            partitions = topic.get("num_partitions", -1)
            replication = topic.get("replication_factor", -1)
            if topic.get("assignments"):
                partitions = len(topic["assignments"])
            if partitions == -1:
                partitions = self.config.num_partitions
            if replication not in (-1, 1):
                result["error_code"] = ErrorCode.INVALID_REPLICATION_FACTOR
                result["error_message"] = f"replication factor {replication} is larger than the 1 available broker"
                continue
            config = {entry["name"]: entry["value"] for entry in topic.get("configs", []) if entry.get("value") is not None}
            specs.append((result, name, partitions, config))
        # One registry write and one directory fsync for the whole request.
        created = self.replicas.create_topics([spec[1:] for spec in specs], validate_only=validate_only)
        for (result, _name, _partitions, _config), outcome in zip(specs, created):
            if isinstance(outcome, InvalidTopicError):
                result["error_code"], result["error_message"] = ErrorCode.INVALID_TOPIC_EXCEPTION, str(outcome)
            elif isinstance(outcome, TopicExistsError):
                result["error_code"], result["error_message"] = ErrorCode.TOPIC_ALREADY_EXISTS, str(outcome)
            elif isinstance(outcome, InvalidPartitionsError):
                result["error_code"], result["error_message"] = ErrorCode.INVALID_PARTITIONS, str(outcome)
            elif isinstance(outcome, InvalidConfigError):
                result["error_code"], result["error_message"] = ErrorCode.INVALID_CONFIG, str(outcome)
            else:
                info = outcome
                result["topic_id"] = info.topic_id
                result["num_partitions"] = info.partitions
                result["replication_factor"] = 1
                result["configs"] = [
                    {"name": key, "value": str(value), "read_only": False, "config_source": SOURCE_DYNAMIC_TOPIC if key in info.config else SOURCE_DEFAULT, "is_sensitive": False}
                    for key, value in sorted(self._topic_config_values(info).items())
                ]
        return {"throttle_time_ms": 0, "topics": results}

    async def handle_delete_topics(self, version: int, body: dict) -> dict:
        targets = []
        if version >= 6:
            for entry in body.get("topics", []):
                name = entry.get("name")
                topic_id = entry.get("topic_id")
                if name is None and topic_id is not None:
                    info = self.replicas.topics_by_id.get(as_uuid(topic_id))
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
                    info = await self.replicas.delete_topic(name)
                    if version >= 6:
                        result["topic_id"] = info.topic_id
                except UnknownTopicError as error:
                    result["error_code"], result["error_message"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(error)
                except InternalTopicError as error:
                    result["error_code"], result["error_message"] = ErrorCode.INVALID_TOPIC_EXCEPTION, str(error)
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
            except InternalTopicError as error:
                result["error_code"], result["error_message"] = ErrorCode.INVALID_TOPIC_EXCEPTION, str(error)
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
                partition_log, answer["error_code"] = log_or_error(self.replicas, name, index)
                info = self.replicas.topics.get(name)
                if partition_log is not None and info is not None and info.internal:
                    answer["error_code"] = ErrorCode.INVALID_TOPIC_EXCEPTION  # Kafka: "Cannot delete records of internal topic"
                elif partition_log is not None:
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
                self.replicas.validate_config({**self.replicas.log_defaults, **config})
            else:
                self.replicas.alter_topic_config(name, config)
        except (InvalidConfigError, ValueError) as error:
            return {"error_code": ErrorCode.INVALID_CONFIG, "error_message": str(error)}
        return {}

    async def handle_describe_cluster(self, version: int, body: dict, *, session=None) -> dict:
        host, port = advertised_address(self.advertised, session)
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "endpoint_type": 1,
            "cluster_id": self.cluster_id,
            "controller_id": self.config.node_id,
            "brokers": [{"broker_id": self.config.node_id, "host": host, "port": port, "rack": None}],
        }
