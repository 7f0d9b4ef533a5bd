"""``onceflow transactions list|describe|abort|find-hanging`` (KIP-664), over the wire.

    list           every transactional id, its producer id and state
    describe ID    one id: state, producer id/epoch, timeout, start, partitions
    find-hanging   partitions whose open transaction the coordinator does not
                   know as ongoing (or that is older than --max-age-ms):
                   these hold the last stable offset back forever
    abort          write an ABORT marker for a hanging transaction in one
                   partition (--topic, --partition, --producer-id, --producer-epoch)
"""

from __future__ import annotations

import sys
import time

from txn.wire import BrokerConnection

LIST_TRANSACTIONS, DESCRIBE_TRANSACTIONS, DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS, METADATA = 66, 65, 61, 27, 3


def list_transactions(bootstrap: str, out=sys.stdout) -> int:
    with BrokerConnection(bootstrap) as connection:
        body = connection.request(LIST_TRANSACTIONS, 1, {"state_filters": [], "producer_id_filters": []})
    out.write(f"{'TransactionalId':<40}{'ProducerId':>12}  State\n")
    for state in body["transaction_states"]:
        out.write(f"{state['transactional_id']:<40}{state['producer_id']:>12}  {state['transaction_state']}\n")
    return 0


def describe_transaction(bootstrap: str, transactional_id: str, out=sys.stdout) -> int:
    with BrokerConnection(bootstrap) as connection:
        body = connection.request(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    [state] = body["transaction_states"]
    if state["error_code"]:
        out.write(f"{transactional_id}: not found (error {state['error_code']})\n")
        return 1
    partitions = ", ".join(f"{t['topic']}-{p}" for t in state["topics"] for p in t["partitions"]) or "-"
    out.write(
        f"TransactionalId: {transactional_id}\nState: {state['transaction_state']}\nProducerId: {state['producer_id']}\n"
        f"ProducerEpoch: {state['producer_epoch']}\nTimeoutMs: {state['transaction_timeout_ms']}\n"
        f"StartTimeMs: {state['transaction_start_time_ms']}\nPartitions: {partitions}\n"
    )
    return 0


def find_hanging(bootstrap: str, *, max_age_ms: int = 15 * 60 * 1000, out=sys.stdout) -> int:
    with BrokerConnection(bootstrap) as connection:
        metadata = connection.request(METADATA, 1, {"topics": None})
        topics = [{"name": t["name"], "partition_indexes": [p["partition_index"] for p in t["partitions"]]} for t in metadata["topics"] if not t["name"].startswith("__transaction_state")]
        producers = connection.request(DESCRIBE_PRODUCERS, 0, {"topics": topics})
        listed = connection.request(LIST_TRANSACTIONS, 1, {"state_filters": [], "producer_id_filters": []})
        ongoing = {}
        ids = [s["transactional_id"] for s in listed["transaction_states"]]
        if ids:
            described = connection.request(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ids})
            for state in described["transaction_states"]:
                if state["transaction_state"] == "Ongoing":
                    ongoing[state["producer_id"]] = state
    now = int(time.time() * 1000)
    hanging = 0
    for topic in producers["topics"]:
        for partition in topic["partitions"]:
            for producer in partition["active_producers"]:
                if producer["current_txn_start_offset"] < 0:
                    continue
                known = ongoing.get(producer["producer_id"])
                in_txn = known is not None and any(
                    t["topic"] == topic["name"] and partition["partition_index"] in t["partitions"] for t in known["topics"]
                )
                too_old = known is not None and known["transaction_start_time_ms"] >= 0 and now - known["transaction_start_time_ms"] > max_age_ms
                if not in_txn or too_old:
                    hanging += 1
                    out.write(
                        f"{topic['name']}-{partition['partition_index']} producerId {producer['producer_id']} "
                        f"epoch {producer['producer_epoch']} coordinatorEpoch {producer['coordinator_epoch']} "
                        f"startOffset {producer['current_txn_start_offset']}\n"
                    )
    if not hanging:
        out.write("no hanging transactions\n")
    return 0


def abort_transaction(bootstrap: str, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int = 0, out=sys.stdout) -> int:
    marker = {
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "transaction_result": False,
        "topics": [{"name": topic, "partition_indexes": [partition]}],
        "coordinator_epoch": coordinator_epoch,
    }
    with BrokerConnection(bootstrap) as connection:
        body = connection.request(WRITE_TXN_MARKERS, 1, {"markers": [marker]})
    code = body["markers"][0]["topics"][0]["partitions"][0]["error_code"]
    if code:
        out.write(f"abort of producer {producer_id} in {topic}-{partition} failed: error {code}\n")
        return 1
    out.write(f"wrote an ABORT marker for producer {producer_id} epoch {producer_epoch} in {topic}-{partition}\n")
    return 0
