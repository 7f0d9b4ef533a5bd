"""broker.security.quotas without a socket: the sampled rate, the throttle
time it gives, the configuration and its store, the two APIs' semantics."""

import asyncio
import json

import pytest

from broker.security.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    ClientQuotas,
    QuotaApis,
    QuotaConfig,
    QuotaError,
    QuotaStore,
    RateMeter,
)
from protocol.errors import ErrorCode


def test_a_first_burst_is_measured_over_the_whole_window():
    meter = RateMeter(window_seconds=1.0, samples=11)
    meter.record(10_000, now=100.0)
    # Ten windows at least, not the burst's own instant.
    assert meter.window_length(100.0) == pytest.approx(10.0)
    assert meter.rate(100.0) == pytest.approx(1_000)


def test_the_rate_follows_a_steady_flow_and_old_samples_expire():
    meter = RateMeter(window_seconds=1.0, samples=3)
    for tick in range(20):
        meter.record(500, now=float(tick))
    assert meter.rate(19.5) == pytest.approx(1500 / 2.5)
    assert meter.rate(100.0) == 0.0


def test_throttle_time_brings_the_rate_back_to_the_bound():
    meter = RateMeter(window_seconds=1.0, samples=2)
    meter.record(3000, now=0.0)
    throttle = meter.throttle_seconds(1000, now=0.0)
    # 3000 bytes over a 1 s window is 3x the bound: 2 s more makes it 1000/s.
    assert throttle == pytest.approx(2.0)
    assert 3000 / (meter.window_length(0.0) + throttle) == pytest.approx(1000)
    assert meter.throttle_seconds(5000, now=0.0) == 0.0


def test_own_quota_wins_over_the_default_and_unlisted_users_are_not_metered(tmp_path):
    quotas = ClientQuotas(QuotaStore(str(tmp_path)), window_seconds=1.0, samples=2)
    quotas.apply(QuotaConfig().altered(None, {PRODUCER_BYTE_RATE: 1000}).altered("alice", {PRODUCER_BYTE_RATE: 100_000}))
    assert quotas.config.for_user("bob", PRODUCER_BYTE_RATE) == 1000
    assert quotas.config.for_user("alice", PRODUCER_BYTE_RATE) == 100_000
    assert quotas.config.for_user("alice", CONSUMER_BYTE_RATE) is None
    assert quotas.record(PRODUCER_BYTE_RATE, "bob", 5000, now=0.0) > 0
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", 5000, now=0.0) == 0
    assert quotas.record(CONSUMER_BYTE_RATE, "bob", 10**9, now=0.0) == 0  # no fetch quota at all
    # A throttle never exceeds the whole window (Kafka's cap).
    assert quotas.record(PRODUCER_BYTE_RATE, "bob", 10**9, now=0.0) == 2000


def test_the_store_round_trips_and_a_damaged_file_is_a_clear_error(tmp_path):
    store = QuotaStore(str(tmp_path))
    config = QuotaConfig().altered(None, {CONSUMER_BYTE_RATE: 2048}).altered("alice", {PRODUCER_BYTE_RATE: 1024.5})
    store.save(config)
    assert QuotaStore(str(tmp_path)).load() == config
    assert json.loads((tmp_path / "client-quotas.json").read_text())["version"] == 1
    (tmp_path / "client-quotas.json").write_text("{not json")
    with pytest.raises(QuotaError, match="damaged"):
        store.load()


@pytest.mark.parametrize("changes, complaint", [({"request_percentage": 50}, "not a quota onceflow enforces"), ({PRODUCER_BYTE_RATE: 0}, "positive"), ({PRODUCER_BYTE_RATE: float("nan")}, "positive")])
def test_bad_values_are_refused(changes, complaint):
    with pytest.raises(QuotaError, match=complaint):
        QuotaConfig().altered("alice", changes)


def alter(apis, entries, validate_only=False):
    return asyncio.run(apis.handle_alter(1, {"entries": entries, "validate_only": validate_only}))


def describe(apis, components, strict=False):
    return asyncio.run(apis.handle_describe(1, {"components": components, "strict": strict}))


def user(name):
    return [{"entity_type": "user", "entity_name": name}]


def op(key, value=0.0, remove=False):
    return {"key": key, "value": value, "remove": remove}


def test_alter_then_describe_with_each_match_type(tmp_path):
    apis = QuotaApis(ClientQuotas(QuotaStore(str(tmp_path))))
    answer = alter(apis, [
        {"entity": user("alice"), "ops": [op(PRODUCER_BYTE_RATE, 1024), op(CONSUMER_BYTE_RATE, 2048)]},
        {"entity": user(None), "ops": [op(PRODUCER_BYTE_RATE, 512)]},
        {"entity": [{"entity_type": "client-id", "entity_name": "c"}], "ops": [op(PRODUCER_BYTE_RATE, 1)]},
        {"entity": user("bob"), "ops": [op("io_thread_units", 1)]},
    ])
    codes = [entry["error_code"] for entry in answer["entries"]]
    assert codes == [0, 0, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST]
    assert "user quotas only" in answer["entries"][2]["error_message"]
    everything = describe(apis, [])
    assert [(e["entity"][0]["entity_name"], {v["key"]: v["value"] for v in e["values"]}) for e in everything["entries"]] == [
        (None, {PRODUCER_BYTE_RATE: 512.0}),
        ("alice", {CONSUMER_BYTE_RATE: 2048.0, PRODUCER_BYTE_RATE: 1024.0}),
    ]
    exact = describe(apis, [{"entity_type": "user", "match_type": 0, "match": "alice"}])["entries"]
    assert [e["entity"][0]["entity_name"] for e in exact] == ["alice"]
    default = describe(apis, [{"entity_type": "user", "match_type": 1, "match": None}])["entries"]
    assert [e["entity"][0]["entity_name"] for e in default] == [None]
    specified = describe(apis, [{"entity_type": "user", "match_type": 2, "match": None}], strict=True)["entries"]
    assert [e["entity"][0]["entity_name"] for e in specified] == ["alice"]
    assert describe(apis, [{"entity_type": "client-id", "match_type": 2, "match": None}])["entries"] == []
    assert describe(apis, [{"entity_type": "planet", "match_type": 2, "match": None}])["error_code"] == ErrorCode.INVALID_REQUEST


def test_validate_only_and_removal_and_durability(tmp_path):
    apis = QuotaApis(ClientQuotas(QuotaStore(str(tmp_path))))
    alter(apis, [{"entity": user("alice"), "ops": [op(PRODUCER_BYTE_RATE, 1024)]}], validate_only=True)
    assert describe(apis, [])["entries"] == []
    assert not (tmp_path / "client-quotas.json").exists()
    alter(apis, [{"entity": user("alice"), "ops": [op(PRODUCER_BYTE_RATE, 1024), op(CONSUMER_BYTE_RATE, 10)]}])
    alter(apis, [{"entity": user("alice"), "ops": [op(CONSUMER_BYTE_RATE, remove=True)]}])
    reloaded = QuotaApis(ClientQuotas(QuotaStore(str(tmp_path))))  # as after a restart
    assert describe(reloaded, [])["entries"] == [{"entity": user("alice"), "values": [{"key": PRODUCER_BYTE_RATE, "value": 1024.0}]}]
    alter(reloaded, [{"entity": user("alice"), "ops": [op(PRODUCER_BYTE_RATE, remove=True)]}])
    assert describe(QuotaApis(ClientQuotas(QuotaStore(str(tmp_path)))), [])["entries"] == []


def test_the_layer_holds_a_throttled_users_requests_on_every_connection_and_no_one_elses(tmp_path):
    """Six 250-byte produces of alice over two connections at once against
    1000 B/s (a 1 s window, so 1000 bytes pass at once): the fifth takes her
    over and is answered with 250 ms to back off, so the sixth, on the other
    connection, is served only 250 ms later (and told to back off too);
    bob's produce meanwhile is served at once."""
    import time

    from broker.security.quotas import QuotaLayer
    from broker.security.session import KafkaPrincipal, Session
    from protocol.framing import DecodedRequest
    from protocol.messages import ApiKey

    quotas = ClientQuotas(QuotaStore(str(tmp_path)), window_seconds=1.0, samples=2)
    quotas.apply(QuotaConfig().altered("alice", {PRODUCER_BYTE_RATE: 1000}))
    served = []

    async def inner(request, session):
        served.append((session.principal.name, time.monotonic()))
        return {"throttle_time_ms": 0, "responses": []}

    layer = QuotaLayer(inner, quotas, clock=time.monotonic)
    produce = DecodedRequest(ApiKey.PRODUCE, 9, 1, "c", {"topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * 250}]}]}, True)
    alice = [Session(principal=KafkaPrincipal("User", "alice"), client_host=f"10.0.0.{n}") for n in (1, 2)]
    bob = Session(principal=KafkaPrincipal("User", "bob"))

    async def scenario():
        started = time.monotonic()
        answers = await asyncio.gather(*(layer(produce, alice[i % 2]) for i in range(6)), layer(produce, bob))
        return started, answers

    started, answers = asyncio.run(scenario())
    alice_times = [at - started for name, at in served if name == "alice"]
    bob_time = next(at - started for name, at in served if name == "bob")
    assert len(alice_times) == 6
    assert sorted(alice_times)[4] < 0.1 and 0.2 <= max(alice_times) <= 1.0, alice_times
    assert bob_time < 0.1
    throttles = sorted(a["throttle_time_ms"] for a in answers[:6])
    assert throttles[:4] == [0, 0, 0, 0] and all(150 <= t <= 300 for t in throttles[4:]), throttles
    assert answers[6]["throttle_time_ms"] == 0


def test_a_quota_change_the_disk_refuses_is_answered_with_an_error_and_changes_nothing(tmp_path, monkeypatch):
    from broker.security import quotas as quotas_module

    apis = QuotaApis(ClientQuotas(QuotaStore(str(tmp_path))))

    def full_disk(path, data, **_options):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quotas_module, "replace_file", full_disk)
    answer = alter(apis, [{"entity": user("alice"), "ops": [op(PRODUCER_BYTE_RATE, 1024)]}])
    assert answer["entries"][0]["error_code"] == ErrorCode.UNKNOWN_SERVER_ERROR and "No space left" in answer["entries"][0]["error_message"]
    assert apis.quotas.config == QuotaConfig()


def test_a_throttled_users_pipelined_produces_are_served_in_the_order_they_arrived(tmp_path):
    """Thirty produces of alice read ahead from one connection (200 bytes
    each against 1000 B/s) all wait out throttles in the layer: they must
    reach the log in the order they were sent, one by one. Served in any
    other order, a pipelining producer's records are reordered in the
    partition (an idempotent one is refused with OUT_OF_ORDER_SEQUENCE), and
    the answers, written in request order, pile up behind the first
    request's until it happens to win."""
    import time

    from broker.security.quotas import QuotaLayer
    from broker.security.session import KafkaPrincipal, Session
    from protocol.framing import DecodedRequest
    from protocol.messages import ApiKey

    quotas = ClientQuotas(QuotaStore(str(tmp_path)), window_seconds=0.05, samples=2)
    quotas.apply(QuotaConfig().altered("alice", {PRODUCER_BYTE_RATE: 8000}))
    served = []

    async def inner(request, session):
        served.append(request.correlation_id)
        await asyncio.sleep(0)
        return {"throttle_time_ms": 0, "responses": []}

    layer = QuotaLayer(inner, quotas, clock=time.monotonic)
    alice = Session(principal=KafkaPrincipal("User", "alice"))

    def produce(n):
        return DecodedRequest(ApiKey.PRODUCE, 9, n, "c", {"topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * 200}]}]}, True)

    async def scenario():
        return await asyncio.gather(*(layer(produce(n), alice) for n in range(30)))

    answers = asyncio.run(scenario())
    assert served == list(range(30))
    assert sum(1 for answer in answers if answer["throttle_time_ms"] > 0) >= 10
    assert layer._gates == {}, "a user's gate outlived its last request"
