"""The source's options, checked without Spark: Spark's names, its
precedence rules and its error messages, ``kafka.*`` mapped onto our clients."""

from __future__ import annotations

import pytest

from streaming.spark import options as opts
from txn.types import TopicPartition

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def parse(streaming=True, **given):
    return opts.parse_source_options({**BASE, **given}, streaming=streaming)


def error(streaming=True, base=BASE, **given) -> str:
    with pytest.raises(opts.OptionError) as raised:
        opts.parse_source_options({**base, **given}, streaming=streaming)
    return str(raised.value)


def test_defaults_follow_spark_except_isolation():
    parsed = parse()
    assert parsed.starting == opts.Latest()
    assert parse(streaming=False).starting == opts.Earliest()
    assert parsed.ending == opts.Latest()
    assert parsed.isolation_level == "read_committed"
    assert parsed.fail_on_data_loss is True and parsed.include_headers is False
    assert parsed.max_trigger_delay_ms == 15 * 60_000
    assert parsed.consumer.auto_offset_reset == "none"
    assert parsed.admin.bootstrap_servers == ("127.0.0.1:9092",)


def test_option_names_are_case_insensitive_and_kafka_params_reach_the_consumer():
    parsed = opts.parse_source_options(
        {"KAFKA.BOOTSTRAP.SERVERS": "h:1,h:2", "Subscribe": "a, b", "kafka.isolation.level": "read_uncommitted", "kafka.max.poll.records": "7",
         "kafka.client.id": "me", "kafka.security.protocol": "PLAINTEXT", "includeHeaders": "TRUE", "maxTriggerDelay": "30s"},
        streaming=True,
    )
    assert parsed.subscription == opts.Subscription("subscribe", topics=("a", "b"))
    assert parsed.consumer.bootstrap_servers == ("h:1", "h:2")
    assert parsed.isolation_level == "read_uncommitted"
    assert parsed.consumer.max_poll_records == 7 and parsed.consumer.client_id == "me" and parsed.admin.client_id == "me"
    assert parsed.include_headers is True and parsed.max_trigger_delay_ms == 30_000


def test_security_settings_reach_the_consumer_and_the_admin_as_spark_users_write_them():
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="pw";'
    parsed = opts.parse_source_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
         "kafka.sasl.jaas.config": jaas, "kafka.ssl.truststore.location": "/ca.pem", "kafka.ssl.truststore.type": "PEM"},
        streaming=True,
    )
    for config in (parsed.consumer, parsed.admin):
        assert config.security.security_protocol == "SASL_SSL" and config.security.sasl_mechanism == "SCRAM-SHA-512"
        assert config.security.sasl_username == "alice" and config.security.ssl_cafile == "/ca.pem"
    assert "pw" not in repr(parsed)


def test_subscription_is_exactly_one_of_three():
    assert "One of the following options must be specified for Kafka source: subscribe, subscribePattern, assign" in error(base={"kafka.bootstrap.servers": "h:1"})
    assert "Only one of the following options can be specified" in error(subscribePattern="t.*")
    assert error(base={"kafka.bootstrap.servers": "h:1"}, assign="[0]") == "No topicpartitions to assign as specified value for option 'assign' is '[0]'"
    assert error(subscribe=" , ") == "No topics to subscribe to as specified value for option 'subscribe' is ' , '"
    assert error(base={"kafka.bootstrap.servers": "h:1"}, subscribePattern=" ") == "Pattern to subscribe is empty as specified value for option 'subscribePattern' is ' '"
    assert "not a valid (Python) regular expression" in error(base={"kafka.bootstrap.servers": "h:1"}, subscribePattern="(")
    assigned = opts.parse_source_options({"kafka.bootstrap.servers": "h:1", "assign": '{"a":[0,2],"b":[1]}'}, streaming=True).subscription
    assert assigned.partitions == (TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1))
    assert error(base={"kafka.bootstrap.servers": "h:1"}, assign='{"a":"0"}') == (
        'option \'assign\' must be JSON naming each topic\'s partitions, e.g. {"topicA":[0,1],"topicB":[0,1]}; got \'{"a":"0"}\'')
    pattern = opts.parse_source_options({"kafka.bootstrap.servers": "h:1", "subscribePattern": "pay.*"}, streaming=True).subscription
    assert pattern.matches("payments") and not pattern.matches("xpayments")


def test_forbidden_and_missing_kafka_params():
    assert error(base={"subscribe": "t"}) == "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer"
    assert error(**{"kafka.auto.offset.reset": "earliest"}).startswith("Kafka option 'auto.offset.reset' is not supported. Instead set the source option 'startingOffsets'")
    assert "are deserialized as byte arrays" in error(**{"kafka.key.deserializer": "x"})
    assert "values are deserialized as byte arrays" in error(**{"kafka.value.deserializer": "x"})
    assert error(**{"kafka.enable.auto.commit": "true"}) == "Kafka option 'enable.auto.commit' is not supported"
    assert error(**{"kafka.interceptor.classes": "x"}) == "Kafka option 'interceptor.classes' is not supported"
    unknown = error(**{"kafka.sasl.kerberos.service.name": "kafka", "kafka.no.such.thing": "x"})
    assert "kafka.no.such.thing, kafka.sasl.kerberos.service.name not supported by onceflow's ConsumerConfig" in unknown
    assert "security_protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, not 'TLS'" in error(**{"kafka.security.protocol": "TLS"})
    assert "invalid Kafka option" in error(**{"kafka.isolation.level": "serializable"})
    with pytest.raises(opts.OptionError, match="serialized with ByteArraySerializer"):
        opts.reject_forbidden_sink_params(opts.kafka_params({"kafka.value.serializer": "x"}))


def test_stream_and_batch_only_options():
    assert error(endingOffsets="latest") == "ending offset not valid in streaming queries"
    assert error(endingOffsetsByTimestamp='{"t":{"0":1}}') == "ending timestamp not valid in streaming queries"
    assert error(streaming=False, startingOffsets="latest") == "starting offset can't be latest for batch queries on Kafka"
    assert error(streaming=False, startingOffsets='{"t":{"0":-1}}') == "startingOffsets for t-0 can't be latest for batch queries on Kafka"
    assert error(streaming=False, endingOffsets="earliest") == "ending offset can't be earliest for batch queries on Kafka"
    assert error(streaming=False, endingOffsets='{"t":{"0":-2}}') == "ending offset for t-0 can't be earliest for batch queries on Kafka"
    assert "start and end partitions differ" in error(streaming=False, startingOffsets='{"t":{"0":1}}', endingOffsets='{"t":{"1":5}}')
    assert "starting offset 9 is greater than the ending offset 5 for t-0" in error(streaming=False, startingOffsets='{"t":{"0":9}}', endingOffsets='{"t":{"0":5}}')
    batch = parse(streaming=False, startingOffsets='{"t":{"0":-2,"1":3}}', endingOffsets='{"t":{"0":-1,"1":9}}')
    assert batch.starting == opts.SpecificOffsets({TopicPartition("t", 0): -2, TopicPartition("t", 1): 3})
    assert batch.ending == opts.SpecificOffsets({TopicPartition("t", 0): -1, TopicPartition("t", 1): 9})


def test_starting_precedence_timestamp_then_by_timestamp_then_offsets():
    both = {"startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"t":{"0":5}}'}
    assert parse(**both).starting == opts.SpecificTimestamps({TopicPartition("t", 0): 5}, "error")
    assert parse(startingTimestamp="17", startingOffsetsByTimestampStrategy="LATEST", **both).starting == opts.GlobalTimestamp(17, "latest")
    assert error(startingTimestamp="soon") == "option 'startingTimestamp' must be a timestamp in ms (a single long value); got 'soon'"
    assert "must be 'error' or 'latest'" in error(startingTimestamp="1", startingOffsetsByTimestampStrategy="closest")
    accepted = "'earliest', 'latest' or JSON offsets per partition (-2 earliest, -1 latest), e.g. {\"topicA\":{\"0\":23,\"1\":-1},\"topicB\":{\"0\":-2}}"
    assert error(startingOffsets='{"t":[0]}') == f"option 'startingOffsets' must be {accepted}; got '{{\"t\":[0]}}'"
    assert error(startingOffsets="earliestt") == f"option 'startingOffsets' must be {accepted}; got 'earliestt'"  # issue 35: the option is named
    assert error(streaming=False, endingOffsets="soon") == f"option 'endingOffsets' must be {accepted}; got 'soon'"
    assert error(startingOffsetsByTimestamp="soon").startswith("option 'startingOffsetsByTimestamp' must be JSON timestamps (ms) per partition, e.g. ")


def test_rate_limits():
    assert error(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="5") == "The value of minOffsetPerTrigger(10) is higher than the maxOffsetsPerTrigger(5)."
    assert error(maxOffsetsPerTrigger="0") == "maxOffsetsPerTrigger must be positive"
    assert error(maxOffsetsPerTrigger="lots") == "maxOffsetsPerTrigger must be a whole number, not 'lots'"
    assert error(minPartitions="0") == "minPartitions must be positive"
    assert "maxTriggerDelay must be a duration" in error(maxTriggerDelay="soon")
    assert parse(maxTriggerDelay="250").max_trigger_delay_ms == 250
    assert parse(maxTriggerDelay="2h").max_trigger_delay_ms == 7_200_000
    assert "failOnDataLoss must be true or false" in error(failOnDataLoss="maybe")


def test_offsets_json_round_trip():
    offsets = {TopicPartition("b", 1): 5, TopicPartition("a", 0): 2, TopicPartition("b", 0): 0}
    as_json = opts.offsets_to_json(offsets)
    assert as_json == {"a": {"0": 2}, "b": {"0": 0, "1": 5}}
    import json

    assert opts.offsets_from_json(json.loads(json.dumps(as_json))) == offsets


def test_java_client_tuning_options_are_accepted_with_one_warning(caplog, monkeypatch):
    """A job ported from format("kafka") keeps its Java client knobs: they
    mean nothing here, so they are dropped with one warning naming them."""
    monkeypatch.setattr(opts, "_warned_ignored", set())
    caplog.set_level("WARNING", logger="streaming.spark.options")
    java = {"kafka.retries": "5", "kafka.max.block.ms": "1000", "kafka.metric.reporters": "x", "kafka.group.id": "g"}
    parse(**java)
    parse(**java)
    warnings = [r.getMessage() for r in caplog.records if "mean nothing to onceflow" in r.getMessage()]
    assert len(warnings) == 1 and all(name in warnings[0] for name in java)


def test_retry_options_are_checked_not_left_to_fail_later():
    assert error(**{"fetchOffset.numRetries": "-1"}) == "fetchOffset.numRetries must be 0 or more, not -1"
    assert error(**{"fetchOffset.retryIntervalMs": "-5"}) == "fetchOffset.retryIntervalMs must be 0 or more, not -5"
