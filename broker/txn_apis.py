"""Request handlers of the transaction APIs (KIP-98, KIP-360, KIP-664, KIP-890):
FindCoordinator, InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
WriteTxnMarkers, ListTransactions, DescribeTransactions, DescribeProducers.

Each handler translates between wire dicts and the coordinator's calls; the
decisions live in ``coordinator``. With one broker every coordinator key maps
to this node.
"""

from __future__ import annotations

import logging
import time

from broker.apis import log_or_error
from broker.security.listeners import advertised_address
from coordinator.metadata import TopicPartition
from coordinator.state import STATE_NAMES
from coordinator.txn_log import partition_for
from protocol.constants import CoordinatorType
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"



class TransactionApis:
    def __init__(self, *, transactions, replicas, node_id: int, advertised: tuple[str, int], offsets_partitions: int):
        self.transactions = transactions
        self.coordinator = transactions.coordinator
        self.replicas = replicas
        self.node_id = node_id
        self.advertised = advertised
        self.offsets_partitions = offsets_partitions

    def handlers(self) -> dict:
        return {
            ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
            ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
            ApiKey.ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
            ApiKey.END_TXN: self.handle_end_txn,
            ApiKey.WRITE_TXN_MARKERS: self.handle_write_txn_markers,
            ApiKey.DESCRIBE_PRODUCERS: self.handle_describe_producers,
            ApiKey.DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self.handle_list_transactions,
        }

    # -- FindCoordinator ------------------------------------------------------------

    async def handle_find_coordinator(self, version: int, body: dict, *, session=None) -> dict:
        host, port = advertised_address(self.advertised, session)
        key_type = body.get("key_type", CoordinatorType.GROUP)
        if key_type not in (CoordinatorType.GROUP, CoordinatorType.TRANSACTION):
            error, node, host_out, port_out = ErrorCode.INVALID_REQUEST, -1, "", -1
        else:
            error, node, host_out, port_out = ErrorCode.NONE, self.node_id, host, port
        if version >= 4:
            return {
                "throttle_time_ms": 0,
                "coordinators": [
                    {"key": key, "node_id": node, "host": host_out, "port": port_out, "error_code": error, "error_message": None}
                    for key in body.get("coordinator_keys", [])
                ],
            }
        return {"throttle_time_ms": 0, "error_code": error, "error_message": None, "node_id": node, "host": host_out, "port": port_out}

    # -- InitProducerId -------------------------------------------------------------

    async def handle_init_producer_id(self, version: int, body: dict) -> dict:
        result = await self.coordinator.init_producer_id(
            body.get("transactional_id"),
            body.get("transaction_timeout_ms", 60_000),
            body.get("producer_id", -1),
            body.get("producer_epoch", -1),
        )
        error = result.error
        if error == ErrorCode.PRODUCER_FENCED and version < 4:
            error = ErrorCode.INVALID_PRODUCER_EPOCH  # PRODUCER_FENCED is new in v4 (KIP-588)
        return {"throttle_time_ms": 0, "error_code": error, "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}

    # -- AddPartitionsToTxn ---------------------------------------------------------

    async def _add_partitions(self, transactional_id, producer_id, producer_epoch, topics, version, verify_only=False) -> list[dict]:
        partitions = []
        unknown = []
        for topic in topics:
            for index in topic.get("partitions", []):
                if not self.replicas.has_partition(topic["name"], index):
                    unknown.append((topic["name"], index))
                else:
                    partitions.append(TopicPartition(topic["name"], index))
        if unknown:
            # Kafka fails the whole request: unknown partitions get their error,
            # the rest OPERATION_NOT_ATTEMPTED.
            codes = {(t, p): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for t, p in unknown}
            default = ErrorCode.OPERATION_NOT_ATTEMPTED
        else:
            error = await self.coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions, verify_only=verify_only)
            if error == ErrorCode.PRODUCER_FENCED and version < 4:
                error = ErrorCode.INVALID_PRODUCER_EPOCH
            codes, default = {}, error
        return [
            {
                "name": topic["name"],
                "results_by_partition": [
                    {"partition_index": index, "partition_error_code": codes.get((topic["name"], index), default)}
                    for index in topic.get("partitions", [])
                ],
            }
            for topic in topics
        ]

    async def handle_add_partitions_to_txn(self, version: int, body: dict) -> dict:
        if version <= 3:
            transactional_id = body.get("v3_and_below_transactional_id")
            producer_id, producer_epoch = body.get("v3_and_below_producer_id", -1), body.get("v3_and_below_producer_epoch", -1)
            results = await self._add_partitions(transactional_id, producer_id, producer_epoch, body.get("v3_and_below_topics", []), version)
            if body.get("onceflow_seal") and all(p["partition_error_code"] == ErrorCode.NONE for topic in results for p in topic["results_by_partition"]):
                # onceflow's seal (a tagged field): the partitions are in the
                # transaction; now its data is made durable and recorded.
                sealed = await self.coordinator.seal(transactional_id, producer_id, producer_epoch)
                for topic in results:
                    for partition in topic["results_by_partition"]:
                        partition["partition_error_code"] = sealed
            return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": results}
        transactions = []
        for entry in body.get("transactions", []):
            results = await self._add_partitions(
                entry.get("transactional_id"), entry.get("producer_id", -1), entry.get("producer_epoch", -1), entry.get("topics", []), version, entry.get("verify_only", False)
            )
            transactions.append({"transactional_id": entry.get("transactional_id"), "topic_results": results})
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results_by_transaction": transactions}

    async def handle_add_offsets_to_txn(self, version: int, body: dict) -> dict:
        group_id = body.get("group_id", "")
        partition = TopicPartition(OFFSETS_TOPIC, partition_for(group_id, self.offsets_partitions))
        error = await self.coordinator.add_partitions(body.get("transactional_id"), body.get("producer_id", -1), body.get("producer_epoch", -1), [partition])
        if error == ErrorCode.PRODUCER_FENCED and version < 2:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return {"throttle_time_ms": 0, "error_code": error}

    # -- EndTxn ----------------------------------------------------------------------

    async def handle_end_txn(self, version: int, body: dict) -> dict:
        if version >= 5:
            # KIP-890 part 2: the epoch is bumped at every EndTxn and the answer names it.
            result = await self.coordinator.end_transaction_bumped(
                body.get("transactional_id"), body.get("producer_id", -1), body.get("producer_epoch", -1), body.get("committed", False)
            )
            return {"throttle_time_ms": 0, "error_code": result.error, "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}
        error = await self.coordinator.end_transaction(
            body.get("transactional_id"), body.get("producer_id", -1), body.get("producer_epoch", -1), body.get("committed", False)
        )
        if error == ErrorCode.PRODUCER_FENCED and version < 2:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return {"throttle_time_ms": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1}

    # -- WriteTxnMarkers (for tools and other coordinators) -----------------------------

    async def handle_write_txn_markers(self, version: int, body: dict) -> dict:
        results = []
        for marker in body.get("markers", []):
            topics = []
            for topic in marker.get("topics", []):
                partitions = []
                for index in topic.get("partition_indexes", []):
                    code = ErrorCode.NONE
                    try:
                        await self.transactions.markers.write_requested(
                            topic["name"],
                            index,
                            producer_id=marker["producer_id"],
                            producer_epoch=marker["producer_epoch"],
                            coordinator_epoch=marker.get("coordinator_epoch", 0),
                            commit=bool(marker.get("transaction_result")),
                        )
                    except LookupError:
                        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    except Exception as error:  # producer-state refusals carry Kafka's error name
                        code = getattr(ErrorCode, getattr(error, "error_name", "KAFKA_STORAGE_ERROR"), ErrorCode.KAFKA_STORAGE_ERROR)
                    partitions.append({"partition_index": index, "error_code": code})
                topics.append({"name": topic["name"], "partitions": partitions})
            results.append({"producer_id": marker["producer_id"], "topics": topics})
        return {"markers": results}

    # -- KIP-664 operations ----------------------------------------------------------------

    async def handle_list_transactions(self, version: int, body: dict) -> dict:
        state_filters = body.get("state_filters") or []
        known = set(STATE_NAMES.values())
        unknown = [s for s in state_filters if s not in known]
        pid_filters = set(body.get("producer_id_filters") or [])
        duration = body.get("duration_filter", -1)
        now = int(time.time() * 1000)
        states = []
        for transactional_id, metadata in sorted(self.coordinator.txns.items()):
            name = STATE_NAMES[metadata.state]
            if state_filters and name not in state_filters:
                continue
            if pid_filters and metadata.producer_id not in pid_filters:
                continue
            if duration >= 0 and (metadata.start_ms < 0 or now - metadata.start_ms < duration):
                continue
            states.append({"transactional_id": transactional_id, "producer_id": metadata.producer_id, "transaction_state": name})
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "unknown_state_filters": unknown, "transaction_states": states}

    async def handle_describe_transactions(self, version: int, body: dict) -> dict:
        states = []
        for transactional_id in body.get("transactional_ids", []):
            metadata = self.coordinator.txns.get(transactional_id)
            if metadata is None:
                states.append({"error_code": ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, "transactional_id": transactional_id, "transaction_state": "", "topics": []})
                continue
            by_topic: dict[str, list[int]] = {}
            for partition in metadata.partitions:
                by_topic.setdefault(partition.topic, []).append(partition.partition)
            states.append(
                {
                    "error_code": ErrorCode.NONE,
                    "transactional_id": transactional_id,
                    "transaction_state": STATE_NAMES[metadata.state],
                    "transaction_timeout_ms": metadata.timeout_ms,
                    "transaction_start_time_ms": metadata.start_ms,
                    "producer_id": metadata.producer_id,
                    "producer_epoch": metadata.producer_epoch,
                    "topics": [{"topic": t, "partitions": sorted(p)} for t, p in sorted(by_topic.items())],
                }
            )
        return {"throttle_time_ms": 0, "transaction_states": states}

    async def handle_describe_producers(self, version: int, body: dict) -> dict:
        topics = []
        for topic in body.get("topics", []):
            partitions = []
            for index in topic.get("partition_indexes", []):
                partition_log, error = log_or_error(self.replicas, topic["name"], index)
                if partition_log is None:
                    partitions.append({"partition_index": index, "error_code": error, "error_message": None, "active_producers": []})
                    continue
                producers = [
                    {
                        "producer_id": entry.producer_id,
                        "producer_epoch": entry.producer_epoch,
                        "last_sequence": entry.last_sequence,
                        "last_timestamp": entry.last_timestamp,
                        "coordinator_epoch": entry.coordinator_epoch,
                        "current_txn_start_offset": -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
                    }
                    for entry in partition_log.producer_state.producers.values()
                ]
                partitions.append({"partition_index": index, "error_code": ErrorCode.NONE, "error_message": None, "active_producers": producers})
            topics.append({"name": topic["name"], "partitions": partitions})
        return {"throttle_time_ms": 0, "topics": topics}
