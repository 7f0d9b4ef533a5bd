"""Topic names from users can never escape the data directory (Kafka's
rule of legal names, ``protocol.names``, is tested here too)."""

import pytest

from protocol.names import InvalidTopicError, is_legal_topic_name, validate_topic_name
from storage.names import parse_partition_dir, partition_dir_name, partition_path


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


def test_partition_path_stays_inside(tmp_path):
    assert partition_path(str(tmp_path), "orders", 3) == str(tmp_path.resolve() / "orders-3")
    with pytest.raises(InvalidTopicError):
        partition_path(str(tmp_path), "../../etc", 0)
    with pytest.raises(ValueError):
        partition_dir_name("orders", -1)
    with pytest.raises(ValueError):
        partition_dir_name("orders", True)
    with pytest.raises(InvalidTopicError):
        partition_path(str(tmp_path), "..", 0)


def test_a_symlinked_partition_dir_pointing_outside_is_refused(tmp_path):
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    (data / "orders-0").symlink_to(outside)
    with pytest.raises(InvalidTopicError, match="outside"):
        partition_path(str(data), "orders", 0)


def test_parse_partition_dir():
    assert parse_partition_dir("orders-12") == ("orders", 12)
    assert parse_partition_dir("my-topic-0") == ("my-topic", 0)
    assert parse_partition_dir("orders") is None
    assert parse_partition_dir("__cluster_metadata") is None
    assert parse_partition_dir("orders-012") is None
    assert parse_partition_dir("orders-\u0661\u0662") is None
    assert parse_partition_dir("orders\n-1") is None
