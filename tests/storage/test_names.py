"""Topic names from users can never escape the data directory (Kafka's
rule of legal names, ``protocol.names``, is tested here too)."""

import pytest

from protocol.names import InvalidTopicError, is_legal_topic_name, validate_topic_name
from storage.names import parse_partition_dir, partition_dir_name


@pytest.mark.parametrize("name", ["orders", "a", "A.b_c-9", "x" * 249, "__consumer_offsets"])
def test_legal_names(name):
    assert validate_topic_name(name) == name
    assert is_legal_topic_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "", ".", "..", "x" * 250, "a/b", "../etc", "..\\x", "a b", "tab\t", "naïve", "a\x00b", "/abs", "semi;colon",
        "orders\n", "\norders", "orders\r", "ｏrders", "a:b", "~", None, 7, b"orders",
    ],
)
def test_illegal_names(name):
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)
    assert not is_legal_topic_name(name)


def test_partition_dir_name_refuses_what_no_topic_is():
    assert partition_dir_name("orders", 3) == "orders-3"
    with pytest.raises(InvalidTopicError):
        partition_dir_name("../../etc", 0)
    with pytest.raises(InvalidTopicError):
        partition_dir_name("..", 0)
    with pytest.raises(ValueError):
        partition_dir_name("orders", -1)
    with pytest.raises(ValueError):
        partition_dir_name("orders", True)


def test_the_broker_removes_at_start_only_the_partition_directories_it_could_have_made(tmp_path):
    """An unowned ``<topic>-<partition>`` directory is an interrupted delete
    and goes; a directory that only looks like one (a leading zero, a space,
    a character no topic has) is someone else's and stays."""
    from broker.broker import EmbeddedBroker

    data = tmp_path / "data"
    for name in ("gone-3", "backup-007", "old topic-1", "notes\u00e9-2"):
        (data / name).mkdir(parents=True)
    with EmbeddedBroker(str(data)):
        pass
    assert sorted(path.name for path in data.iterdir() if not path.name.startswith((".", "__")) and path.is_dir()) == ["backup-007", "notes\u00e9-2", "old topic-1"]


def test_parse_partition_dir():
    assert parse_partition_dir("orders-12") == ("orders", 12)
    assert parse_partition_dir("my-topic-0") == ("my-topic", 0)
    assert parse_partition_dir("orders") is None
    assert parse_partition_dir("__cluster_metadata") is None
    assert parse_partition_dir("orders-012") is None
    assert parse_partition_dir("orders-\u0661\u0662") is None
    assert parse_partition_dir("orders\n-1") is None
