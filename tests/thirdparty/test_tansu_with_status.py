"""``onceflow status`` against Tansu, over the wire only: a broker we did
not write shows its topics (end offset and LSO, an open transaction holding
the LSO), its group with committed offsets and lag; the sections whose APIs
Tansu does not serve (ListTransactions, DescribeTransactions,
DescribeProducers) are left out with the reason, not an error."""

from __future__ import annotations

import json
import time

from onceflow.cli import main
from tests.thirdparty.conftest import (
    GROUP_HEARTBEAT_INTERVAL_MS,
    GROUP_SESSION_TIMEOUT_MS,
)
from txn import Consumer, Producer, TopicPartition
from txn.types import OffsetAndMetadata


def test_status_shows_offsets_lso_group_lag_and_what_tansu_lacks(tansu_broker, tansu_topic, capsys):
    topic = tansu_topic(partitions=2)
    bootstrap = tansu_broker.bootstrap
    plain = Producer(bootstrap_servers=bootstrap)
    for i in range(5):  # one record per batch: Tansu's end offset is wrong after a batch of several (README)
        plain.send(topic, b"r%d" % i, partition=0)
        plain.flush()
    plain.close()
    open_transaction = Producer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-tx")
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=f"{topic}-group", client_id="tansu-worker",
                        session_timeout_ms=GROUP_SESSION_TIMEOUT_MS, heartbeat_interval_ms=GROUP_HEARTBEAT_INTERVAL_MS)
    try:
        open_transaction.init_transactions()
        open_transaction.begin_transaction()
        open_transaction.send(topic, b"open", partition=1)
        open_transaction.flush()
        consumer.subscribe([topic])
        seen, deadline = [], time.monotonic() + 60
        while len(seen) < 5 and time.monotonic() < deadline:
            seen += consumer.poll(0.5)
        assert len(seen) == 5, "the group's consumer reads partition 0"
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "")})

        code = main(["status", "--bootstrap-server", bootstrap, "--json", "--topic", topic, "--group", f"{topic}-group"])
        captured = capsys.readouterr()
        assert code == 0 and "Traceback" not in captured.err, captured.err
        document = json.loads(captured.out)
        assert document["topics"] == [{"name": topic, "internal": False, "partitions": [
            {"partition": 0, "log_start_offset": 0, "high_watermark": 5, "last_stable_offset": 5},
            {"partition": 1, "log_start_offset": 0, "high_watermark": 1, "last_stable_offset": 0},
        ]}]
        [group] = document["groups"]
        assert group["group_id"] == f"{topic}-group" and group["state"] == "Stable" and len(group["members"]) == 1
        assert group["offsets"][0] | {"member_id": None} == {"topic": topic, "partition": 0, "committed_offset": 3, "high_watermark": 5, "last_stable_offset": 5, "lag": 2, "lag_uncommitted": 2, "member_id": None}
        assert group["lag"] == 2
        assert document["transactions"] is None and document["hanging"] is None
        assert document["unavailable"] == [
            {"section": "transactions", "reason": "the broker does not serve ListTransactions, DescribeTransactions"},
            {"section": "hanging", "reason": "needs the transactions section"},
        ]

        code = main(["status", "--bootstrap-server", bootstrap, "--topic", topic])
        text = capsys.readouterr().out
        assert code == 0
        assert [topic, "1", "0", "1", "0", "1"] in [line.split() for line in text.splitlines()]
        assert "(transactions: not shown, the broker does not serve ListTransactions, DescribeTransactions)" in text
        open_transaction.abort_transaction()
    finally:
        consumer.close()
        open_transaction.close()
