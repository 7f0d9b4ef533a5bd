"""Consumer groups with the three real clients over real sockets: members share
partitions, a member leaves and another dies (SIGKILL, no more heartbeats),
partitions move, every record is consumed, committed offsets survive a broker
restart; and a copier that lost its partitions cannot commit offsets for them."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import time

import pytest

from protocol.messages import ApiKey
from tests.helpers import create_topic, raw_request, wait_for
from tests.conftest import REPO

MEMBER_SCRIPT = r'''
import sys, time, signal
client, bootstrap, topic, group = sys.argv[1:5]
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
def report(partition, offset, value):
    print(f"{partition} {offset} {value.decode()}", flush=True)
if client == "confluent-kafka":
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 2000, "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range"})
    c.subscribe([topic])
    while not stop:
        for m in c.consume(100, 0.2):
            if m.error() is None:
                report(m.partition(), m.offset(), m.value())
                c.commit(m, asynchronous=False)
    c.close()
elif client == "kafka-python":
    from kafka import KafkaConsumer
    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                      session_timeout_ms=2000, heartbeat_interval_ms=300)
    while not stop:
        batches = c.poll(200)
        for tp, messages in batches.items():
            for m in messages:
                report(m.partition, m.offset, m.value)
        if batches:
            c.commit()
    c.close()
else:
    import asyncio
    from aiokafka import AIOKafkaConsumer
    async def run():
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=2000, heartbeat_interval_ms=300)
        await c.start()
        while not stop:
            batches = await c.getmany(timeout_ms=200)
            for tp, messages in batches.items():
                for m in messages:
                    report(m.partition, m.offset, m.value)
            if batches:
                await c.commit()
        await c.stop()
    asyncio.run(run())
print("closed", flush=True)
'''

CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka"]


class Member:
    def __init__(self, client, bootstrap, topic, group, log_path):
        self.log = open(log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-c", MEMBER_SCRIPT, client, bootstrap, topic, group], cwd=REPO, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.seen: list[tuple[int, int, str]] = []
        import threading

        def pump():
            for line in self.process.stdout:
                parts = line.split()
                if len(parts) == 3:
                    self.seen.append((int(parts[0]), int(parts[1]), parts[2]))

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()


def produce(bootstrap, topic, start, count):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, key=b"%d" % i, value=b"%d" % i)
    producer.flush(30)


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_three_members_share_six_partitions_through_leave_and_death(client, broker_process, tmp_path):
    # A short initial delay lets all three members join the first generation.
    broker = broker_process("group.min.session.timeout.ms=1000", "group.initial.rebalance.delay.ms=1500")
    topic, group = "shared", f"group-{client}"
    create_topic(broker.bootstrap, topic, 6)
    members = [Member(client, broker.bootstrap, topic, group, tmp_path / f"m{i}.log") for i in range(3)]
    try:
        produce(broker.bootstrap, topic, 0, 600)
        wait_for(lambda: len({v for m in members for _, _, v in m.seen}) >= 600, 60, "the first 600 records")
        busy = [m for m in members if m.seen]
        assert len(busy) == 3, "the six partitions are shared by the three members"
        owners = {}
        for index, member in enumerate(members):
            for partition, _, _ in member.seen:
                owners.setdefault(partition, set()).add(index)
        assert all(len(o) == 1 for o in owners.values()), f"one owner per partition in the first generation: {owners}"
        members[0].process.send_signal(signal.SIGTERM)  # leaves the group
        members[0].process.wait(30)
        members[1].process.send_signal(signal.SIGKILL)  # dies: no leave, no heartbeats
        members[1].process.wait(30)
        produce(broker.bootstrap, topic, 600, 600)
        wait_for(lambda: {str(i) for i in range(600, 1200)} <= {v for _, _, v in members[2].seen}, 60, "the survivor to take over every partition")
        assert {p for p, _, v in members[2].seen if int(v) >= 600} == set(range(6))
        consumed = {v for m in members for _, _, v in m.seen}
        assert consumed == {str(i) for i in range(1200)}, "every record was consumed"
        members[2].process.send_signal(signal.SIGTERM)
        members[2].process.wait(30)
    finally:
        for member in members:
            if member.process.poll() is None:
                member.process.kill()
    # Committed offsets survive a broker restart.
    committed_before = raw_request(broker.port, ApiKey.OFFSET_FETCH, 6, {"group_id": group, "topics": None})
    broker.restart(clean=False)
    committed_after = raw_request(broker.port, ApiKey.OFFSET_FETCH, 6, {"group_id": group, "topics": None})
    assert committed_after == committed_before
    total = sum(p["committed_offset"] for t in committed_after["topics"] for p in t["partitions"])
    assert total == 1200, "every consumed record's offset is committed"


def test_a_member_of_an_old_generation_cannot_commit_offsets(embedded_broker):
    """KIP-447: the transactional commit of a copier whose partitions moved in a
    rebalance (its generation is old) is refused."""
    port = embedded_broker.port
    create_topic(embedded_broker.bootstrap, "fenced-in", 1)

    def join(member_id=""):
        return raw_request(port, ApiKey.JOIN_GROUP, 5, {"group_id": "copy", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000, "member_id": member_id, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]})

    first = join()
    assert first["error_code"] == 79  # MEMBER_ID_REQUIRED
    joined = join(first["member_id"])
    old_generation, member = joined["generation_id"], joined["member_id"]
    raw_request(port, ApiKey.SYNC_GROUP, 3, {"group_id": "copy", "generation_id": old_generation, "member_id": member, "assignments": [{"member_id": member, "assignment": b""}]})
    # A second member joins: a rebalance moves the group to a new generation.
    second = join()
    import threading

    results = {}
    newcomer = threading.Thread(target=lambda: results.__setitem__("b", join(second["member_id"])))
    newcomer.start()

    def group_state():
        return raw_request(port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["copy"], "include_authorized_operations": False})["groups"][0]["group_state"]

    wait_for(lambda: group_state() == "PreparingRebalance", 30, "the newcomer's JoinGroup to start a rebalance")
    heartbeat = raw_request(port, ApiKey.HEARTBEAT, 3, {"group_id": "copy", "generation_id": old_generation, "member_id": member})
    assert heartbeat["error_code"] == 27  # REBALANCE_IN_PROGRESS: time to rejoin
    results["a"] = join(member)
    newcomer.join(30)
    assert results["a"]["generation_id"] == results["b"]["generation_id"] == old_generation + 1
    init = raw_request(port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "zombie-copier", "transaction_timeout_ms": 60000})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    added = raw_request(port, ApiKey.ADD_OFFSETS_TO_TXN, 3, {"transactional_id": "zombie-copier", "producer_id": pid, "producer_epoch": epoch, "group_id": "copy"})
    assert added["error_code"] == 0

    def txn_commit(generation):
        body = {"transactional_id": "zombie-copier", "group_id": "copy", "producer_id": pid, "producer_epoch": epoch, "generation_id": generation, "member_id": member, "group_instance_id": None,
                "topics": [{"name": "fenced-in", "partitions": [{"partition_index": 0, "committed_offset": 42, "committed_metadata": ""}]}]}
        return raw_request(port, ApiKey.TXN_OFFSET_COMMIT, 3, body)["topics"][0]["partitions"][0]["error_code"]

    assert txn_commit(old_generation) == 22  # ILLEGAL_GENERATION
    assert txn_commit(old_generation + 1) == 0


def test_admin_lists_describes_and_deletes_groups(embedded_broker):
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = embedded_broker.bootstrap
    create_topic(bootstrap, "admin-groups", 2)
    produce(bootstrap, "admin-groups", 0, 10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "admin-g", "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 6000})
    consumer.subscribe(["admin-groups"])
    seen = 0
    deadline = time.monotonic() + 20
    while seen < 10 and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(10, 0.5) if m.error() is None)
    consumer.commit(asynchronous=False)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups(["admin-g"])["admin-g"].result(10)
    assert described.state.name == "STABLE" and len(described.members) == 1
    listed = admin.list_consumer_groups().result(10)
    assert "admin-g" in {g.group_id for g in listed.valid}
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("admin-g")])["admin-g"].result(10)
    assert sum(tp.offset for tp in offsets.topic_partitions) == 10
    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups(["admin-g"])["admin-g"].result(10)
    assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    consumer.close()
    admin.delete_consumer_groups(["admin-g"])["admin-g"].result(10)
    after = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 6, {"group_id": "admin-g", "topics": None})
    assert after["topics"] == []


def test_a_failed_assignment_write_leaves_the_group_as_it_was(tmp_path):
    """The leader's SyncGroup when the disk under ``__consumer_offsets``
    refuses the write (the broker's DiskIO seam): the member hears
    COORDINATOR_NOT_AVAILABLE and the group stays as it was, waiting for an
    assignment, with none applied."""
    from broker.broker import EmbeddedBroker, FaultSeams
    from tests.helpers import FullDiskUnderOffsets

    disk = FullDiskUnderOffsets()
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0, seams=FaultSeams(disk_io=disk)) as broker:

        def join(member_id=""):
            body = {"group_id": "full-disk", "session_timeout_ms": 30000, "rebalance_timeout_ms": 30000, "member_id": member_id, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
            return raw_request(broker.port, ApiKey.JOIN_GROUP, 5, body)

        def described():
            return raw_request(broker.port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["full-disk"], "include_authorized_operations": False})["groups"][0]

        joined = join(join()["member_id"])
        assert joined["error_code"] == 0 and joined["leader"] == joined["member_id"]
        before = described()
        assert before["group_state"] == "CompletingRebalance"
        disk.full.set()
        sync = {"group_id": "full-disk", "generation_id": joined["generation_id"], "member_id": joined["member_id"], "assignments": [{"member_id": joined["member_id"], "assignment": b"mine"}]}
        answer = raw_request(broker.port, ApiKey.SYNC_GROUP, 3, sync)
        assert answer["error_code"] == 15 and answer["assignment"] == b""  # COORDINATOR_NOT_AVAILABLE
        after = described()
        assert after == before, "no assignment or state of an unwritten record is applied"
        assert after["members"][0]["member_assignment"] == b""


class InFlight:
    """One request sent on a connection of its own, its answer read later
    (``answer``), or the connection dropped first as a killed process's is
    (``vanish``: closed, or reset)."""

    def __init__(self, port: int, api_key: int, version: int, body: dict):
        import socket

        from protocol.framing import ClientConnection

        self.connection = ClientConnection(client_id="in-flight")
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        _correlation_id, frame = self.connection.send_request(api_key, version, body)
        self.sock.sendall(frame)

    def answer(self) -> dict:
        with self.sock:
            while (response := self.connection.next_response()) is None:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("closed without an answer")
                self.connection.receive_data(data)
            return response.body

    def vanish(self, *, reset: bool) -> None:
        import socket
        import struct

        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


@pytest.mark.parametrize("vanishing", ["closed", "reset"])
def test_a_round_whose_leader_died_in_it_is_led_by_a_member_still_there(embedded_broker, vanishing):
    """A cooperative leader gives a partition up and rejoins for the
    follow-up round, then dies with its JoinGroup in flight. The round must
    not wait for its restart (or its session): it completes when the others
    rejoin, led by one of them, whose assignment makes the group Stable.
    Before, a closed connection left the dead member leading (nobody sent
    the assignment) and a reset one withdrew its join (the round waited)."""
    port = embedded_broker.port

    def join(instance, member_id=""):
        return {"group_id": "handoff", "session_timeout_ms": 30000, "rebalance_timeout_ms": 30000, "member_id": member_id, "group_instance_id": instance,
                "protocol_type": "consumer", "protocols": [{"name": "cooperative-sticky", "metadata": b""}]}

    def sync(answer, assignments=()):
        return {"group_id": "handoff", "generation_id": answer["generation_id"], "member_id": answer["member_id"], "group_instance_id": None,
                "assignments": [{"member_id": m, "assignment": a} for m, a in assignments]}

    def state():
        return raw_request(port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["handoff"], "include_authorized_operations": False})["groups"][0]["group_state"]

    first = raw_request(port, ApiKey.JOIN_GROUP, 5, join("a"))
    a = first["member_id"]
    raw_request(port, ApiKey.SYNC_GROUP, 3, sync(first, [(a, b"p0,p1")]))
    newcomer = InFlight(port, ApiKey.JOIN_GROUP, 5, join("b"))
    wait_for(lambda: state() == "PreparingRebalance", 10, "b's JoinGroup to start a round")
    leading = raw_request(port, ApiKey.JOIN_GROUP, 5, join("a", a))
    joined = newcomer.answer()
    b = joined["member_id"]
    assert leading["leader"] == a and joined["generation_id"] == leading["generation_id"]
    raw_request(port, ApiKey.SYNC_GROUP, 3, sync(leading, [(a, b"p1"), (b, b"")]))  # p0 is given up first
    assert raw_request(port, ApiKey.SYNC_GROUP, 3, sync(joined))["error_code"] == 0 and state() == "Stable"
    # a rejoins, so that p0 can go to b, and dies meanwhile.
    follow_up = InFlight(port, ApiKey.JOIN_GROUP, 5, join("a", a))
    wait_for(lambda: state() == "PreparingRebalance", 10, "a's follow-up JoinGroup to start a round")
    follow_up.vanish(reset=vanishing == "reset")
    time.sleep(0.3)  # the broker sees the connection go
    assert raw_request(port, ApiKey.HEARTBEAT, 3, {"group_id": "handoff", "generation_id": joined["generation_id"], "member_id": b})["error_code"] == 27
    rejoined = raw_request(port, ApiKey.JOIN_GROUP, 5, join("b", b))
    assert rejoined["error_code"] == 0 and rejoined["generation_id"] == joined["generation_id"] + 1
    assert rejoined["leader"] == b and {m["member_id"] for m in rejoined["members"]} == {a, b}, "b leads: a is gone"
    synced = raw_request(port, ApiKey.SYNC_GROUP, 3, sync(rejoined, [(a, b"p1"), (b, b"p0")]))
    assert (synced["error_code"], synced["assignment"]) == (0, b"p0") and state() == "Stable"


def test_a_static_member_killed_mid_cooperative_handover_comes_back_to_a_rebalance(embedded_broker):
    """KIP-429 + KIP-345: a cooperative round leaves a moving partition owned by
    nobody until its old owner, having revoked it, rejoins. If that owner is
    killed first and its new process rejoins as the same static member, the
    broker must not hand the stored assignments back (nobody would ever rejoin
    and the partition would stay orphaned): it rebalances. With every partition
    owned, a static restart still keeps the generation (no rebalance)."""
    from txn.assignors import Assignment, Subscription, encode_assignment, encode_subscription

    port = embedded_broker.port
    create_topic(embedded_broker.bootstrap, "handover", 2)
    subscription = encode_subscription(Subscription(topics=("handover",)))

    def join(instance, member_id=""):
        return raw_request(port, ApiKey.JOIN_GROUP, 5, {"group_id": "hand", "session_timeout_ms": 30000, "rebalance_timeout_ms": 30000, "member_id": member_id,
                                                        "group_instance_id": instance, "protocol_type": "consumer",
                                                        "protocols": [{"name": "cooperative-sticky", "metadata": subscription}]})

    def sync(joined, instance, assignments=None):
        body = {"group_id": "hand", "generation_id": joined["generation_id"], "member_id": joined["member_id"], "group_instance_id": instance,
                "assignments": [{"member_id": m, "assignment": encode_assignment(Assignment(partitions=p))} for m, p in (assignments or {}).items()]}
        answer = raw_request(port, ApiKey.SYNC_GROUP, 3, body)
        assert answer["error_code"] == 0, answer
        return answer

    def group_state():
        return raw_request(port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["hand"], "include_authorized_operations": False})["groups"][0]["group_state"]

    def joined_together(*joins):
        with concurrent.futures.ThreadPoolExecutor(len(joins)) as pool:
            return [future.result(30) for future in [pool.submit(j) for j in joins]]

    a1 = join("a")
    sync(a1, "a", {a1["member_id"]: [("handover", 0), ("handover", 1)]})
    # b joins; a rejoins; the cooperative round hands handover-1 to nobody while a still has it.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        b_joining = pool.submit(join, "b")
        wait_for(lambda: group_state() == "PreparingRebalance", 30, "b's JoinGroup to start a rebalance")
        a2 = join("a", a1["member_id"])
        b2 = b_joining.result(30)
    assert a2["generation_id"] == b2["generation_id"] == a1["generation_id"] + 1
    instance_of = {a2["member_id"]: "a", b2["member_id"]: "b"}
    leader, follower = (a2, b2) if a2["members"] else (b2, a2)
    # The follower is the one left holding handover-0 (a leader's restart rebalances anyway:
    # JoinGroup v5 cannot be told to skip the assignment).
    sync(leader, instance_of[leader["member_id"]], {follower["member_id"]: [("handover", 0)], leader["member_id"]: []})
    sync(follower, instance_of[follower["member_id"]])
    assert group_state() == "Stable"
    # The follower revoked handover-1 and is SIGKILLed before its follow-up JoinGroup; its new process comes back.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        back = pool.submit(join, instance_of[follower["member_id"]])
        wait_for(lambda: group_state() == "PreparingRebalance", 10, "the restarted static member's JoinGroup to start a rebalance (handover-1 is owned by nobody)")
        leader3 = join(instance_of[leader["member_id"]], leader["member_id"])
        follower3 = back.result(30)
    assert leader3["generation_id"] == follower3["generation_id"] == a2["generation_id"] + 1
    instance_of.update({leader3["member_id"]: instance_of[leader["member_id"]], follower3["member_id"]: instance_of[follower["member_id"]]})
    leader, follower = (leader3, follower3) if leader3["members"] else (follower3, leader3)
    sync(leader, instance_of[leader["member_id"]], {follower["member_id"]: [("handover", 0)], leader["member_id"]: [("handover", 1)]})
    assert sync(follower, instance_of[follower["member_id"]])["assignment"]
    # Every partition owned now: the follower's static restart gets its generation and assignment back, no rebalance.
    back = join(instance_of[follower["member_id"]])
    assert back["generation_id"] == leader3["generation_id"] and group_state() == "Stable"
    assert sync(back, instance_of[follower["member_id"]])["assignment"] == encode_assignment(Assignment(partitions=[("handover", 0)]))
