"""The completer (``sink_driver.finish_decided``) tells "no decision
recorded" (the decision topic does not exist yet) from "could not read the
decisions" (here: the broker refuses to describe the topic), against a real
broker with the ACL authorizer; and it counts a decided transaction the
broker is completing at the next epoch (transaction version 2) as one it
committed. No Spark."""

from __future__ import annotations

import pytest

from broker.security.acl_store import AclStore
from broker.security.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from streaming.spark import sink_driver
from streaming.spark.decision import SinkError
from streaming.spark.options import SinkOptions

ANONYMOUS = "User:ANONYMOUS"


@pytest.fixture
def broker(tmp_path):
    """Everything allowed, except any access to the topic ``onceflow.decisions.refused``."""
    from broker.broker import EmbeddedBroker

    data_dir = str(tmp_path)
    every = [(ResourceType.TOPIC, "*"), (ResourceType.GROUP, "*"), (ResourceType.TRANSACTIONAL_ID, "*"), (ResourceType.CLUSTER, "kafka-cluster")]
    acls = [AclBinding.of(resource, name, ANONYMOUS, AclOperation.ALL, AclPermissionType.ALLOW, host="*", pattern_type=PatternType.LITERAL) for resource, name in every]
    acls.append(AclBinding.of(ResourceType.TOPIC, "onceflow.decisions.refused", ANONYMOUS, AclOperation.ALL, AclPermissionType.DENY, host="*"))
    AclStore(data_dir).save(acls)
    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0, properties={"authorizer.class.name": "acl"}) as running:
        yield running


def sink_options(bootstrap: str, prefix: str) -> SinkOptions:
    # The reader's retries give up in 2 s, well within the completer's timeout.
    return SinkOptions.parse({"kafka.bootstrap.servers": bootstrap, "topic": "out", "transactionalIdPrefix": prefix, "kafka.request.timeout.ms": "2000"})


def test_no_decision_topic_is_no_decision_and_an_unreadable_one_is_an_error(broker):
    assert str(sink_driver.finish_decided(sink_options(broker.bootstrap, "fresh"), timeout=20)) == "no decision recorded"
    with pytest.raises(SinkError, match="could not read the decisions at onceflow.decisions.refused-0"):
        sink_driver.finish_decided(sink_options(broker.bootstrap, "refused"), timeout=20)


@pytest.mark.slow
def test_a_decided_transaction_being_committed_at_the_next_epoch_counts_as_committed_now(tmp_path):
    """Transaction version 2 (our producer's and the broker's default): the
    commit's EndTxn writes PrepareCommit at the handle's epoch + 1. Held
    there (the broker cannot complete it until the seam lets go), the
    completer counts it among the transactions it committed, as it does one
    in PrepareCommit at the same epoch under version 1; it missed it before."""
    import asyncio
    import threading

    from broker.broker import EmbeddedBroker, FaultSeams
    from streaming.spark.decision import Decision, SinkTransaction, driver_transactional_id
    from streaming.spark.sink_driver import DecisionLog, on_kept_clients
    from tests.helpers import wait_for
    from txn import Admin, Producer

    held = threading.Event()

    def completion_fails_while_held(name):
        if name == "coordinator.before_complete" and held.is_set():
            raise RuntimeError("held by the test")

    with EmbeddedBroker(str(tmp_path), seams=FaultSeams(crash_point=completion_fails_while_held), group_initial_rebalance_delay_ms=0) as broker:
        options = sink_options(broker.bootstrap, "prepared")
        with Admin(broker.bootstrap) as admin:
            admin.create_topics({"out": 1})
        producer = Producer(broker.bootstrap, transactional_id="prepared-task-0")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("out", b"decided", partition=0)
        producer.flush()
        handle = SinkTransaction("prepared-task-0", producer.producer_id, producer.producer_epoch, ("out-0",), 1)

        async def decide(clients):
            decisions = DecisionLog(options, clients)
            await decisions.ensure()
            writer = clients.decision_writer("query")
            await writer.init_transactions()
            await decisions.write(writer, Decision("query", 0, "run", (handle,)))

        on_kept_clients(options, decide)
        with Admin(broker.bootstrap) as admin:
            wait_for(lambda: admin.describe_transactions([driver_transactional_id("prepared", "query")])[0].state == "CompleteCommit", 10, "the decision's completion")
        held.set()
        producer.commit_transaction()  # answered once PrepareCommit is durable; its completion is held
        with Admin(broker.bootstrap) as admin:
            prepared = admin.describe_transactions(["prepared-task-0"])[0]
        assert (prepared.state, prepared.producer_epoch) == ("PrepareCommit", handle.producer_epoch + 1)
        threading.Timer(3.0, held.clear).start()  # the completer has described it by then; its EndTxn waits for the completion
        finished = sink_driver.finish_decided(options, timeout=30)
        assert finished.decision.batch_id == 0 and finished.committed == (handle,) and not finished.lost
        producer.close()
