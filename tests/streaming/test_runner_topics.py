"""The internal topics the runner creates (changelogs, repartition topics,
dead letters) and the sinks carry the app's replication settings: by
default the broker's ``default.replication.factor`` (-1 on the wire), with
``min.insync.replicas`` when the app sets it; a factor the cluster cannot
give stops the app with the broker's reason. Topics already there are
checked against what the app needs (streaming.topics), state the topology
no longer names stops the app, and the repartition topics are purged up to
what is committed."""

from __future__ import annotations

import json

import pytest

import streaming
from streaming.errors import TopicsMismatchError
from streaming.windows import tumbling
from tests.helpers import read_values
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
    assert {factor for _topic, factor, _configs in recording_broker.asked} == {3}
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        assert {t for t in admin.list_topics() if not t.startswith("__")} == {"words", "counts"}, "nothing was created"


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


def test_sinks_and_outputs_missing_at_start_are_created_like_their_source_not_left_to_auto_creation(recording_broker, tmp_path):
    app = streaming.App(recording_broker.bootstrap, "sinks", str(tmp_path / "state"), session_timeout_ms=3000, heartbeat_interval_ms=300)
    (app.stream("words", value_format="str").window(tumbling(1_000), on_late="late-words").count().to("per-second"))
    app.processor(source="words", outputs=["audit"], name="audit")(lambda record, ctx: ctx.emit(record.key, record.value, topic="audit"))
    app.run(until_idle=0.5)
    by_topic = {topic: (factor, configs) for topic, factor, configs in recording_broker.asked}
    assert by_topic["per-second"] == (-1, {}) and by_topic["late-words"] == (-1, {}) and by_topic["audit"] == (-1, {})
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        topics = admin.list_topics()
    assert topics["per-second"] == topics["late-words"] == topics["audit"] == 2, "partitioned like the source, not by the broker's num.partitions"
    # An output whose partition count the app needs is checked when it is there.
    strict = streaming.App(recording_broker.bootstrap, "strict", str(tmp_path / "strict"), session_timeout_ms=3000, heartbeat_interval_ms=300)
    strict.processor(source="words", outputs={"audit": 3}, name="audit")(lambda record, ctx: None)
    with pytest.raises(TopicsMismatchError, match="output audit has 2 partitions, not the 3 the app declares"):
        strict.run(until_idle=0.5)


def test_internal_topics_already_there_are_checked_and_a_misfit_stops_the_app_creating_nothing(recording_broker, tmp_path):
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        admin.create_topics({"topics-words-to-counts-count-0-changelog": 2}, configs={"topics-words-to-counts-count-0-changelog": {"cleanup.policy": "delete"}})
    with pytest.raises(TopicsMismatchError, match="changelog topics-words-to-counts-count-0-changelog has cleanup.policy=delete"):
        counting_app(recording_broker.bootstrap, str(tmp_path / "state")).run(until_idle=0.5)
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        admin.delete_topics(["topics-words-to-counts-count-0-changelog"])
        admin.create_topics({"topics-words-to-counts-repartition-0": 3})
    with pytest.raises(TopicsMismatchError, match="repartition topic topics-words-to-counts-repartition-0 has 3 partitions, not its source's 2"):
        counting_app(recording_broker.bootstrap, str(tmp_path / "state")).run(until_idle=0.5)
    assert [topic for topic, _factor, _configs in recording_broker.asked] == ["topics-words-to-counts-count-0-changelog", "topics-words-to-counts-repartition-0"], "only the test's own"


def words_app(bootstrap: str, state_dir: str, sink: str, **options) -> streaming.App:
    app = streaming.App(bootstrap, "renamed", state_dir, instance_id="only", session_timeout_ms=3000, heartbeat_interval_ms=300, **options)
    app.stream("words", value_format="str").key_by(lambda word: word).count().to(sink, key_format="str", value_format="json", **({"name": "words-to-counts"} if sink != "counts" else {}))
    return app


def test_a_renamed_output_that_would_orphan_state_stops_the_app_naming_it_and_the_old_name_keeps_it(recording_broker, tmp_path):
    from txn import Producer

    def produce(*words):
        with Producer(bootstrap_servers=recording_broker.bootstrap) as producer:
            for word in words:
                producer.send("words", key=word.encode(), value=word.encode())

    produce("ann", "ann")
    words_app(recording_broker.bootstrap, str(tmp_path / "state"), "counts").run(until_idle=0.5)
    assert sorted(json.loads(v) for v in read_values(recording_broker.bootstrap, "counts", partitions=2, idle=0.5)) == [1, 2]
    renamed = streaming.App(recording_broker.bootstrap, "renamed", str(tmp_path / "state"), instance_id="only", session_timeout_ms=3000, heartbeat_interval_ms=300)
    renamed.stream("words", value_format="str").key_by(lambda word: word).count().to("totals", key_format="str", value_format="json")
    with pytest.raises(TopicsMismatchError) as stopped:
        renamed.run(until_idle=0.5)
    message = str(stopped.value)
    assert "store 'words-to-counts-count-0' (changelog renamed-words-to-counts-count-0-changelog)" in message
    assert "repartition topic renamed-words-to-counts-repartition-0" in message and "name=" in message
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        assert "totals" not in admin.list_topics() and "renamed-words-to-totals-count-0-changelog" not in admin.list_topics(), "nothing created"
    # The chain named as before: its store and repartition topic are the old ones, and the count goes on.
    produce("ann")
    words_app(recording_broker.bootstrap, str(tmp_path / "state"), "totals").run(until_idle=0.5)
    assert [json.loads(v) for v in read_values(recording_broker.bootstrap, "totals", partitions=2, idle=0.5)] == [3]


def test_repartition_topics_are_purged_up_to_the_committed_offsets(recording_broker, tmp_path):
    from txn import Producer
    from txn.types import TopicPartition

    with Producer(bootstrap_servers=recording_broker.bootstrap) as producer:
        for n in range(200):
            producer.send("words", key=b"k%d" % n, value=b"w%d" % (n % 7))
    app = words_app(recording_broker.bootstrap, str(tmp_path / "state"), "counts", repartition_purge_interval_ms=100)
    app.run(until_idle=1.0)
    repartition = [TopicPartition("renamed-words-to-counts-repartition-0", p) for p in range(2)]
    with Admin(bootstrap_servers=recording_broker.bootstrap) as admin:
        starts = admin.list_offsets({tp: "earliest" for tp in repartition})
        ends = admin.list_offsets({tp: "latest" for tp in repartition})
        committed = admin.list_group_offsets("renamed", repartition)
    assert sum(ends[tp].offset for tp in repartition) > 200, "every word went through it, with the commit markers"
    for tp in repartition:
        assert 0 < starts[tp].offset <= committed[tp].offset, (tp, starts[tp], committed[tp])
