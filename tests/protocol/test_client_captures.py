"""Request bytes captured from the real clients (tests/protocol/captures/,
recorded by capture.py there) decode to the fields the clients meant."""

from __future__ import annotations

import os

import pytest

from protocol.framing import ServerConnection
from protocol.records import decode_batch

CAPTURES = os.path.join(os.path.dirname(__file__), "captures")
FILES = sorted(name for name in os.listdir(CAPTURES) if name.endswith(".bin"))
CLIENT_IDS = {"confluent": ("rdkafka", "capture-confluent"), "kafka-python": ("capture-kafka-python",), "aiokafka": ("capture-aiokafka",)}


def decode(name):
    with open(os.path.join(CAPTURES, name), "rb") as file:
        data = file.read()
    connection = ServerConnection()
    connection.receive_data(data)
    request = connection.next_request()
    assert connection.next_request() is None and connection.buffered_bytes == 0
    return request


def test_every_client_is_captured():
    for client in CLIENT_IDS:
        apis = {name.split("-v")[0][len(client) + 1 :] for name in FILES if name.startswith(client + "-")}
        assert {"ApiVersions", "Metadata", "Produce", "Fetch", "CreateTopics"} <= apis, client


@pytest.mark.parametrize("name", FILES)
def test_capture_decodes(name):
    client = next(c for c in CLIENT_IDS if name.startswith(c + "-"))
    api_name, version = name[len(client) + 1 : -len(".bin")].rsplit("-v", 1)
    request = decode(name)
    assert request.api_name == api_name
    assert request.api_version == int(version)
    assert request.client_id.startswith(CLIENT_IDS[client]) or request.client_id in CLIENT_IDS[client]
    body = request.body
    topic = f"capture-{client}"
    if api_name == "Produce":
        [topic_data] = body["topic_data"]
        assert topic_data["name"] == topic
        [partition] = topic_data["partition_data"]
        assert partition["index"] == 0
        batch = decode_batch(bytes(partition["records"]))
        [record] = batch.records
        assert (record.key, record.value) == (b"k", b"v")
        assert [(h.key, h.value) for h in record.headers] == [("h", b"1")]
    elif api_name == "Fetch":
        [fetch_topic] = body["topics"]
        if request.api_version <= 12:
            assert fetch_topic["topic"] == topic
        else:
            assert fetch_topic["topic_id"].int != 0
        assert fetch_topic["partitions"][0]["partition"] == 0
    elif api_name == "CreateTopics":
        assert [t["name"] for t in body["topics"]] == [topic]
        assert body["topics"][0]["num_partitions"] == 1
    elif api_name == "ApiVersions" and request.api_version >= 3:
        assert body["client_software_name"]
