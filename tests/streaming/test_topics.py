"""streaming.topics without a broker: what an app needs, what is wrong with
what exists, and which topics hold state the topology no longer names
(the broker tests are in test_runner_topics.py)."""

from __future__ import annotations

import pytest

import streaming
from streaming import topics
from streaming.errors import TopicsMismatchError
from txn import ConfigError


def words_app(tmp_path, application_id="words", sink="counts") -> streaming.App:
    app = streaming.App("h:1", application_id, str(tmp_path), on_error="dead-letter")
    app.stream("lines", value_format="str").key_by(lambda word: word).count().to(sink)
    return app


def test_what_an_app_needs_follows_its_sources_partition_counts(tmp_path):
    app = words_app(tmp_path)
    assert topics.needs(app, {"lines": 4}) == [
        topics.Need("words-lines-to-counts-repartition-0", "repartition", 4),
        topics.Need("words-lines-to-counts-count-0-changelog", "changelog", 4, compacted=True),
        topics.Need("words-dead-letters", "dead-letter", 1),
        topics.Need("counts", "sink", 4),
    ]
    with pytest.raises(TopicsMismatchError, match="source topic"):
        topics.needs(app, {})


def test_problems_name_a_wrong_partition_count_and_a_changelog_not_compacted(tmp_path):
    wanted = topics.needs(words_app(tmp_path), {"lines": 4})
    existing = {"lines": 4, "words-lines-to-counts-repartition-0": 2, "words-lines-to-counts-count-0-changelog": 4, "counts": 1}
    assert topics.problems(wanted, existing, {"words-lines-to-counts-count-0-changelog": {"cleanup.policy": "compact,delete"}}) == [
        "repartition topic words-lines-to-counts-repartition-0 has 2 partitions, not its source's 4",
    ], "compact,delete compacts; a sink keeps the partitions it has"
    (problem,) = topics.problems(wanted, {**existing, "words-lines-to-counts-repartition-0": 4}, {"words-lines-to-counts-count-0-changelog": {"cleanup.policy": "delete"}})
    assert "cleanup.policy=delete" in problem


def test_topics_written_by_name_are_declared_created_and_checked_where_a_count_is_given(tmp_path):
    from streaming.testing import TestDriver

    app = streaming.App("h:1", "audit", str(tmp_path))

    @app.processor(source="payments", sink="balances", outputs={"audit": 1, "alerts": None}, value_format="json")
    def track(record, ctx):
        ctx.emit(record.key, record.value)
        ctx.emit(record.key, "seen", topic="audit")
        if record.value["amount"] > 100:
            ctx.emit(record.key, "large", topic="alerts")
        if record.value["amount"] < 0:
            ctx.emit(record.key, "negative", topic="refunds")  # not declared

    assert topics.needs(app, {"payments": 4}) == [topics.Need("audit", "output", 1), topics.Need("alerts", "sink", 4), topics.Need("balances", "sink", 4)]
    wanted = topics.needs(app, {"payments": 4})
    assert topics.problems(wanted, {"payments": 4, "audit": 1, "alerts": 2, "balances": 1}, {}) == [], "a count given is checked, the others keep theirs"
    assert topics.problems(wanted, {"payments": 4, "audit": 3}, {}) == ["output audit has 3 partitions, not the 1 the app declares (outputs=)"]
    driver = TestDriver(app)
    driver.pipe("payments", b"a", {"amount": 500})
    assert driver.read("audit") == [(b"a", "seen")] and driver.read("alerts") == [(b"a", "large")]
    with pytest.raises(streaming.ProcessingError, match="did not declare 'refunds'.*outputs="):
        driver.pipe("payments", b"a", {"amount": -1})
    with pytest.raises(ConfigError, match="partition count"):
        app.processor(source="payments", outputs={"x": 0}, name="bad")
    other = streaming.App("h:1", "twice", str(tmp_path))
    other.processor(source="a", outputs={"shared": 2}, name="one")(lambda record, ctx: None)
    other.processor(source="a", outputs={"shared": 3}, name="two")(lambda record, ctx: None)
    with pytest.raises(TopicsMismatchError, match="shared is declared with 2 and 3"):
        topics.needs(other, {"a": 1})


def test_orphaned_state_is_this_applications_topics_the_topology_does_not_name(tmp_path):
    app = words_app(tmp_path, sink="totals")  # the output was renamed from counts
    existing = [
        "lines", "counts", "words-dead-letters",
        "words-lines-to-counts-count-0-changelog", "words-lines-to-counts-repartition-0",  # what the old name left
        "words-lines-to-totals-count-0-changelog",  # named: not an orphan
        "words-v2-store-changelog",  # another app's, whose group the cluster knows
        "words-notes", "wordsmith-store-changelog", "words--changelog",  # not state of this app's shape
    ]
    orphans = topics.orphaned(app, existing, ["words", "words-v2"])
    assert [orphan.describe() for orphan in orphans] == [
        "store 'lines-to-counts-count-0' (changelog words-lines-to-counts-count-0-changelog)",
        "the records in flight of chain 'lines-to-counts' (repartition topic words-lines-to-counts-repartition-0)",
    ]
    assert topics.orphaned(words_app(tmp_path), existing[:5], ["words"]) == []
    # A changelog-named topic that is not compacted is no store's (the runner compacts every changelog).
    assert topics.compacted_only(orphans, {"words-lines-to-counts-count-0-changelog": {"cleanup.policy": "delete"}}) == orphans[1:]
    assert topics.compacted_only(orphans, {"words-lines-to-counts-count-0-changelog": {"cleanup.policy": "compact,delete"}}) == orphans


def test_a_repartition_topic_name_the_broker_would_refuse_is_refused_when_the_chain_is_declared(tmp_path):
    app = streaming.App("h:1", "a" * 200, str(tmp_path))
    with pytest.raises(ConfigError, match="the repartition topic of a chain from 'lines'.*249"):
        app.stream("lines").key_by(lambda line: line).count(store="short").to("c" * 30)  # the store's changelog name is legal
    assert app.internal_topics == {} and app.processors == []
