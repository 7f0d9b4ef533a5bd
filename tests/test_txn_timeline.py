"""benchmarks.txn_timeline: its frame timing, its arithmetic, and its proxy
in front of a real broker with a real librdkafka producer."""

import struct

import pytest

from benchmarks.txn_timeline import Exchange, TimedFrames, TimelineProxy, point_address_at, timeline, transactions
from protocol.framing import encode_request
from protocol.messages import ApiKey


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_a_request_split_across_reads_is_timed_from_its_first_byte_to_its_last():
    request = encode_request(ApiKey.END_TXN, 3, 7, "client", {"transactional_id": "t", "producer_id": 1, "producer_epoch": 0, "committed": True})
    frames = TimedFrames()
    assert frames.feed(request[:2], 1.0) == []  # not even the size prefix whole
    assert frames.feed(request[2:10], 2.0) == []
    [whole] = frames.feed(request[10:], 3.0)
    assert (whole.first_byte_at, whole.last_byte_at, whole.data) == (1.0, 3.0, bytes(request))


def test_two_frames_in_one_read_come_out_whole_and_in_order_and_the_tail_waits():
    first, second, third = frame(b"a" * 10), frame(b""), frame(b"c" * 5)
    frames = TimedFrames()
    got = frames.feed(first + second + third[:3], 5.0)
    assert [(f.first_byte_at, f.last_byte_at, f.data) for f in got] == [(5.0, 5.0, first), (5.0, 5.0, second)]
    [last] = frames.feed(third[3:], 6.0)
    assert (last.first_byte_at, last.last_byte_at, last.data) == (5.0, 6.0, third), "its first bytes came with the others"


def test_a_frame_size_out_of_range_is_refused_at_once():
    with pytest.raises(ValueError, match="outside 0..100"):
        TimedFrames(max_frame_bytes=100).feed(struct.pack(">i", 101), 0.0)
    with pytest.raises(ValueError, match="outside"):
        TimedFrames().feed(struct.pack(">i", -1), 0.0)


def test_the_broker_address_in_an_answer_is_pointed_at_the_proxy_and_nothing_else_moves():
    answer = frame(b"\x00\x00\x00\x05" + b"\x0a127.0.0.1" + struct.pack(">i", 9092) + struct.pack(">i", 9092))
    pointed = point_address_at(answer, b"127.0.0.1", 9092, 40000)
    assert len(pointed) == len(answer)
    assert pointed == answer.replace(b"127.0.0.1" + struct.pack(">i", 9092), b"127.0.0.1" + struct.pack(">i", 40000))
    assert pointed.endswith(struct.pack(">i", 9092)), "a 9092 that follows no host is left alone"


def exchange(api: int, request_in: float, answered: float, connection: int = 0) -> Exchange:
    """An exchange whose request takes 0.1 to come in and whose answer 0.1 to go out."""
    return Exchange(connection, api, request_in, request_in + 0.1, answered - 0.1, answered)


def test_a_transaction_runs_from_one_endtxn_answer_to_the_next_and_splits_into_broker_and_client_time():
    exchanges = [
        exchange(ApiKey.END_TXN, 0.0, 1.0),  # the end of the set-up: not counted
        exchange(ApiKey.ADD_PARTITIONS_TO_TXN, 3.0, 4.0),  # 2.0 of thinking before it
        exchange(ApiKey.PRODUCE, 4.5, 6.0),
        exchange(ApiKey.METADATA, 5.0, 5.5, connection=1),  # sent while the Produce waits: no thinking
        exchange(ApiKey.END_TXN, 6.5, 8.0),
    ]
    [done] = transactions(exchanges)
    assert done.total == pytest.approx(7.0)
    assert done.idle == pytest.approx(2.0 + 0.5 + 0.5)
    assert done.broker == pytest.approx(0.8 + 1.3 + 1.3)  # the Metadata's 0.3 lies inside the Produce's
    assert [e.api_key for e in done.exchanges] == [ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE, ApiKey.METADATA, ApiKey.END_TXN]
    assert done.think_before == pytest.approx((2.0, 0.5, 0.0, 0.5))
    result = timeline(exchanges)
    assert result.transactions == 1 and result.apis["Produce"].broker_p50_ms == pytest.approx(1300)
    assert result.apis["AddPartitionsToTxn"].think_p50_ms == pytest.approx(2000)


def test_fewer_than_two_endtxn_answers_make_no_timeline():
    with pytest.raises(RuntimeError, match="no two EndTxn answers"):
        timeline([exchange(ApiKey.END_TXN, 0.0, 1.0), exchange(ApiKey.PRODUCE, 2.0, 3.0)])


def test_the_proxy_times_every_request_of_a_librdkafka_transaction_against_a_real_broker(broker_process):
    from benchmarks.suite import ScenarioSettings, transactions_scenario
    from protocol.loop_thread import LoopThread

    broker = broker_process()
    proxy = TimelineProxy(broker.bootstrap)
    thread = LoopThread("test-txn-timeline")
    try:
        thread.serve(proxy.start, proxy.stop)
        transactions_scenario(1)(f"127.0.0.1:{proxy.port}", ScenarioSettings(seconds=0.5))
    finally:
        thread.stop()
    result = timeline(list(proxy.exchanges))
    assert result.transactions >= 3
    # Every transaction's requests came through the proxy (the client was
    # pointed at it), the broker's own address never reached the client.
    for api in ("AddPartitionsToTxn", "Produce", "EndTxn"):
        assert result.apis[api].per_transaction == pytest.approx(1.0), result.apis
        assert 0 < result.apis[api].broker_p50_ms < result.total_p50_ms
    assert 0 < result.broker_p50_ms < result.total_p50_ms
