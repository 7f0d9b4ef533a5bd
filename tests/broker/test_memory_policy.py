"""The broker process reuses the memory of its MiB-sized buffers
(``protocol.allocator``, set by ``onceflow broker`` at start): a stream of
Produce requests of about a MiB each does not fault new pages in for each
request's frame, and its fetches for each response."""

from __future__ import annotations

import platform
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import create_topic, raw_fetch, raw_request

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")

TOPIC = "memory-policy"
PARTITIONS = 4
CONNECTIONS = 5
PAGE = 4096


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def produce(port: int, value: bytes, counts: list[int]) -> None:
    """One Produce request: a batch of ``counts[p]`` records to each partition p."""
    data = [{"index": index, "records": encode_batch([(None, value, (), 1_000)] * count)} for index, count in enumerate(counts)]
    answer = raw_request(port, ApiKey.PRODUCE, 8, {"transactional_id": None, "acks": 1, "timeout_ms": 10_000, "topic_data": [{"name": TOPIC, "partition_data": data}]})
    assert all(p["error_code"] == 0 for p in answer["responses"][0]["partition_responses"]), answer


def fetch_all(port: int, offsets: list[int]) -> None:
    answer = raw_fetch(port, TOPIC, offsets)
    assert all(p["error_code"] == 0 for p in answer["responses"][0]["partitions"]), answer


def test_requests_of_a_few_mib_do_not_fault_in_new_memory_each(broker_process):
    broker = broker_process()
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    rng = random.Random(3)
    value = b"m" * 1000
    # Records of 1 kB, 200-1000 to each partition: requests of 0.8-4 MB.
    requests = [[rng.randrange(200, 1000) for _ in range(PARTITIONS)] for _ in range(60)]
    for counts in requests[:10]:  # the heap grows to its working size
        produce(broker.port, value, counts)
    offsets = [sum(counts[index] for counts in requests[:10]) for index in range(PARTITIONS)]
    before = minor_faults(broker.process.pid)
    for first in range(10, len(requests), CONNECTIONS):  # requests of several connections at once, then fetches of them
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            list(pool.map(lambda counts: produce(broker.port, value, counts), requests[first : first + CONNECTIONS]))
            list(pool.map(lambda at: fetch_all(broker.port, at), [offsets] * CONNECTIONS))
        for counts in requests[first : first + CONNECTIONS]:
            offsets = [offset + count for offset, count in zip(offsets, counts)]
    faulted = minor_faults(broker.process.pid) - before
    moved_pages = 2 * sum(map(sum, requests[10:])) * len(value) // PAGE  # produced, and about as much fetched
    assert faulted < moved_pages / 20, f"{faulted} page faults for {moved_pages} pages of requests and responses"
