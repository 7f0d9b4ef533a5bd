"""The internal topics the runner creates (changelogs, repartition topics,
dead letters) carry the app's replication settings: by default the broker's
``default.replication.factor`` (-1 on the wire), with ``min.insync.replicas``
when the app sets it; a factor the cluster cannot give stops the app with
the broker's reason."""

from __future__ import annotations

import pytest

import streaming
from txn import Admin, ConfigError, KafkaError


def counting_app(bootstrap: str, state_dir: str, **settings) -> streaming.App:
    """A repartition topic, a changelog and a dead-letter topic to create."""
    app = streaming.App(bootstrap, "topics", state_dir, on_error="dead-letter", session_timeout_ms=3000, heartbeat_interval_ms=300, **settings)
    app.stream("words", value_format="str").key_by(lambda word: word).count().to("counts")
    return app


@pytest.fixture
def recording_broker(tmp_path, monkeypatch):
    """An embedded broker that keeps every CreateTopics request it answers:
    (topic, replication factor, configs)."""
    from broker.admin_apis import AdminApis
    from broker.broker import EmbeddedBroker

    asked = []
    handle = AdminApis.handle_create_topics

    async def recording(self, version, body):
        asked.extend((topic["name"], topic["replication_factor"], {c["name"]: c["value"] for c in topic["configs"]}) for topic in body["topics"])
        return await handle(self, version, body)

    monkeypatch.setattr(AdminApis, "handle_create_topics", recording)
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1000) as broker:
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topics({"words": 2, "counts": 2})
        del asked[:]
        broker.asked = asked
        yield broker


def test_internal_topics_get_the_brokers_replication_factor_and_min_insync_replicas(recording_broker, tmp_path):
    app = counting_app(recording_broker.bootstrap, str(tmp_path / "state"), min_insync_replicas=2)
    app.run(until_idle=0.5)
    repartition, changelog = "topics-words-to-counts-repartition-0", "topics-words-to-counts-count-0-changelog"
    by_topic = {topic: (factor, configs) for topic, factor, configs in recording_broker.asked}
    assert set(by_topic) == {repartition, changelog, "topics-dead-letters"}
    assert by_topic[repartition] == (-1, {"min.insync.replicas": "2"})
    assert by_topic[changelog] == (-1, {"cleanup.policy": "compact", "min.insync.replicas": "2"})
    assert by_topic["topics-dead-letters"] == (-1, {"min.insync.replicas": "2"})
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        assert set(by_topic) <= set(admin.list_topics()), "the broker created them all"


def test_a_replication_factor_the_cluster_cannot_give_stops_the_app_with_the_brokers_reason(recording_broker, tmp_path):
    app = counting_app(recording_broker.bootstrap, str(tmp_path / "state"), replication_factor=3)
    with pytest.raises(KafkaError, match=r"create topic topics-words-to-counts-repartition-0 \(replication factor 3 is larger than the 1 available broker\)"):
        app.run(until_idle=0.5)
    assert [(topic, factor) for topic, factor, _configs in recording_broker.asked] == [("topics-words-to-counts-repartition-0", 3)]


def test_replication_settings_are_checked(tmp_path):
    for settings, message in (
        ({"replication_factor": 0}, "replication_factor is -1"),
        ({"replication_factor": "3"}, "replication_factor is -1"),
        ({"min_insync_replicas": 0}, "min_insync_replicas is at least 1"),
        ({"replication_factor": 2, "min_insync_replicas": 3}, "would refuse every write"),
    ):
        with pytest.raises(ConfigError, match=message):
            streaming.App("h:1", "a", str(tmp_path), **settings)
    assert streaming.App("h:1", "a", str(tmp_path), replication_factor=3, min_insync_replicas=2).internal_topic_config(**{"cleanup.policy": "compact"}) == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
