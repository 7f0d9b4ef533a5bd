"""Kafka's configuration text, read one way by the broker's settings, the
clients' options and the commands' ``--command-config``."""

import pytest

from broker.config import BrokerConfig
from protocol.properties import parse_bool, parse_properties
from txn.config import ConsumerConfig, build
from txn.errors import ConfigError


@pytest.mark.parametrize("text, value", [("true", True), ("FALSE", False), (" True ", True), (True, True), (False, False)])
def test_booleans_as_kafka_reads_them(text, value):
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["yes", "1", "on", "", "t", 1, None])
def test_other_spellings_are_refused_everywhere(text):
    with pytest.raises(ValueError, match="auto.create.topics.enable must be true or false"):
        parse_bool(text, "auto.create.topics.enable")
    with pytest.raises(ValueError, match="must be true or false"):
        BrokerConfig.from_properties({"auto.create.topics.enable": text})
    with pytest.raises(ConfigError, match="expected true or false"):
        build(ConsumerConfig, {"bootstrap_servers": "localhost:9092", "enable_auto_commit": text, "group_id": "g"})


def test_the_clients_and_the_broker_read_the_same_spelling():
    assert BrokerConfig.from_properties({"auto.create.topics.enable": " FALSE"}).auto_create_topics is False
    assert build(ConsumerConfig, {"bootstrap_servers": "localhost:9092", "enable_auto_commit": "True", "group_id": "g"}).enable_auto_commit is True


def test_a_properties_file():
    text = "# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-256\nsasl.jaas.config=a=b; c:d\n"
    assert parse_properties(text) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": "a=b; c:d"}


def test_a_line_without_a_separator_names_its_number():
    with pytest.raises(ValueError, match="line 2: expected key=value"):
        parse_properties("a=1\njust-a-key\n")
    with pytest.raises(ValueError, match="client.properties:2: expected key=value"):
        parse_properties("a=1\njust-a-key\n", source="client.properties")
