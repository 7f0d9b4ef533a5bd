"""``onceflow transactions`` (on ``txn.Admin``) against a real broker: list,
describe, find-hanging, abort, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from onceflow.cli import main
from protocol.records import encode_batch
from tests.helpers import create_topic, raw_request, read_values
from tests.conftest import REPO


def test_list_describe_find_hanging_and_abort(embedded_broker, capsys):
    bootstrap = embedded_broker.bootstrap

    def onceflow(*args: str) -> tuple[int, str]:
        status = main(["transactions", "--bootstrap-server", bootstrap, *args])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return status, captured.out

    create_topic(bootstrap, "ops", 1)
    init = raw_request(embedded_broker.port, 22, 4, {"transactional_id": "ops-tx", "transaction_timeout_ms": 60000})
    raw_request(embedded_broker.port, 24, 3, {"v3_and_below_transactional_id": "ops-tx", "v3_and_below_producer_id": init["producer_id"], "v3_and_below_producer_epoch": init["producer_epoch"], "v3_and_below_topics": [{"name": "ops", "partitions": [0]}]})

    status, out = onceflow("list")
    assert status == 0 and out.splitlines()[0].split() == ["TransactionalId", "ProducerId", "State"]
    assert out.splitlines()[1].split() == ["ops-tx", str(init["producer_id"]), "Ongoing"]
    status, out = onceflow("describe", "ops-tx")
    assert status == 0 and "State: Ongoing" in out and "Partitions: ops-0" in out and f"ProducerId: {init['producer_id']}" in out
    status, out = onceflow("describe", "missing")
    assert status == 1 and "missing: not found (error 105)" in out
    status, out = onceflow("find-hanging")
    assert status == 0 and out == "no hanging transactions\n"

    # A transaction the coordinator does not know (as an old broker bug or a
    # lost coordinator could leave): written straight into the log.
    hanging = encode_batch([(None, b"stuck", (), 1)], producer_id=4242, producer_epoch=3, base_sequence=0, is_transactional=True)
    embedded_broker.call(lambda broker: broker.replicas.get_log("ops", 0).append(hanging))
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce("ops", value=b"behind", partition=0)
    plain.flush(10)
    assert read_values(bootstrap, "ops", isolation="read_committed", partitions=1) == [], "the hanging transaction holds the LSO"

    status, out = onceflow("find-hanging")
    assert status == 0 and "ops-0 producerId 4242 epoch 3" in out
    assert f"producerId {init['producer_id']} " not in out, "the known ongoing transaction is not listed"
    status, out = onceflow("abort", "--topic", "nowhere", "--partition", "0", "--producer-id", "4242", "--producer-epoch", "3")
    assert status == 1, "an unknown topic is refused, not created"
    status, out = onceflow("abort", "--topic", "ops", "--partition", "0", "--producer-id", "4242", "--producer-epoch", "3")
    assert status == 0 and "wrote an ABORT marker for producer 4242 epoch 3 in ops-0" in out
    assert read_values(bootstrap, "ops", isolation="read_committed", partitions=1, expect=1) == [b"behind"]
    status, out = onceflow("find-hanging")
    assert out == "no hanging transactions\n"

    from txn import Producer

    open_transaction = Producer(bootstrap_servers=bootstrap, transactional_id="aged-tx")
    try:
        open_transaction.init_transactions()
        open_transaction.begin_transaction()
        open_transaction.send("ops", b"open", partition=0)
        open_transaction.flush()
        status, out = onceflow("describe", "aged-tx")
        producer_id = int(out.split("ProducerId: ")[1].split()[0])
        status, out = onceflow("find-hanging")
        assert out == "no hanging transactions\n", f"an ongoing transaction the coordinator knows (producer {producer_id}) is not hanging"
        open_transaction.abort_transaction()
    finally:
        open_transaction.close()


def test_status_and_find_hanging_agree_on_a_transaction_past_its_timeout(tmp_path, capsys):
    """One rule (``txn.Admin.find_hanging_transactions``) for both commands:
    a transaction the coordinator knows, open longer than its own timeout
    (here 1 s, with the coordinator's expiry sweep every 10 minutes), hangs
    for both. (``find-hanging`` used to ask only for transactions older than
    15 minutes and said "no hanging transactions" where ``status`` listed one.)"""
    from broker.broker import EmbeddedBroker
    from txn import Producer

    with EmbeddedBroker(str(tmp_path / "data"), transaction_abort_interval_ms=600_000) as broker:
        create_topic(broker.bootstrap, "slow", 1)
        producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id="slow-tx", transaction_timeout_ms=1000)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("slow", b"late", partition=0)
            producer.flush()
            time.sleep(1.5)

            assert main(["status", "--bootstrap-server", broker.bootstrap, "--json"]) == 0
            [hanging] = json.loads(capsys.readouterr().out)["hanging"]
            assert (hanging["topic"], hanging["partition"], hanging["reason"]) == ("slow", 0, "older_than_timeout")
            assert main(["transactions", "--bootstrap-server", broker.bootstrap, "find-hanging"]) == 0
            assert capsys.readouterr().out == (
                f"slow-0 producerId {hanging['producer_id']} epoch {hanging['producer_epoch']} coordinatorEpoch {hanging['coordinator_epoch']} "
                f"startOffset {hanging['start_offset']}: open longer than its transaction timeout\n"
            )
        finally:
            producer.close()


def test_cli_reports_an_unreachable_broker():
    result = subprocess.run([sys.executable, "-m", "onceflow", "transactions", "--bootstrap-server", "127.0.0.1:1", "list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cannot reach" in result.stderr and "Traceback" not in result.stderr
