"""The completer (``sink_driver.finish_decided``) tells "no decision
recorded" (the decision topic does not exist yet) from "could not read the
decisions" (here: the broker refuses to describe the topic), against a real
broker with the ACL authorizer. No Spark."""

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
