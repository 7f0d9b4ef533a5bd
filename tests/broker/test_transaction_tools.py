"""``onceflow transactions`` over the wire: list, describe, find-hanging, abort."""

from __future__ import annotations

import io

from broker import txn_tools
from protocol.records import encode_batch
from tests.helpers import create_topic, raw_request, read_values


def test_list_describe_find_hanging_and_abort(embedded_broker):
    bootstrap = embedded_broker.bootstrap
    create_topic(bootstrap, "ops", 1)
    init = raw_request(embedded_broker.port, 22, 4, {"transactional_id": "ops-tx", "transaction_timeout_ms": 60000})
    raw_request(embedded_broker.port, 24, 3, {"v3_and_below_transactional_id": "ops-tx", "v3_and_below_producer_id": init["producer_id"], "v3_and_below_producer_epoch": init["producer_epoch"], "v3_and_below_topics": [{"name": "ops", "partitions": [0]}]})

    out = io.StringIO()
    assert txn_tools.list_transactions(bootstrap, out=out) == 0
    assert "ops-tx" in out.getvalue() and "Ongoing" in out.getvalue()
    out = io.StringIO()
    assert txn_tools.describe_transaction(bootstrap, "ops-tx", out=out) == 0
    assert "State: Ongoing" in out.getvalue() and "Partitions: ops-0" in out.getvalue()
    assert txn_tools.describe_transaction(bootstrap, "missing", out=io.StringIO()) == 1

    # A transaction the coordinator does not know (as an old broker bug or a
    # lost coordinator could leave): written straight into the log.
    hanging = encode_batch([(None, b"stuck", (), 1)], producer_id=4242, producer_epoch=3, base_sequence=0, is_transactional=True)
    embedded_broker.call(lambda broker: broker.replicas.get_log("ops", 0).append(hanging))
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce("ops", value=b"behind", partition=0)
    plain.flush(10)
    assert read_values(bootstrap, "ops", isolation="read_committed", partitions=1) == [], "the hanging transaction holds the LSO"

    out = io.StringIO()
    txn_tools.find_hanging(bootstrap, out=out)
    assert "ops-0 producerId 4242 epoch 3" in out.getvalue()
    out = io.StringIO()
    assert txn_tools.abort_transaction(bootstrap, "ops", 0, 4242, 3, out=out) == 0
    assert read_values(bootstrap, "ops", isolation="read_committed", partitions=1, expect=1) == [b"behind"]
    out = io.StringIO()
    txn_tools.find_hanging(bootstrap, out=out)
    assert "no hanging transactions" in out.getvalue()


def test_cli_reports_an_unreachable_broker():
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run([sys.executable, "-m", "broker.cli", "transactions", "--bootstrap-server", "127.0.0.1:1", "list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cannot reach" in result.stderr
