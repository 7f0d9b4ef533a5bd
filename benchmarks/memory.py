"""The broker's resident memory while a volume of data flows through it: is
it bounded, or does it grow with the bytes moved?

    .venv/bin/python -m benchmarks.memory [--gib 1.0] [--partitions 64] [--idle-connections 1000] [--json FILE] [--png FILE]

Steps, against ``onceflow broker`` started as a child process on a fresh
temporary data directory (``faults.process.BrokerProcess``):

1. create a topic with ``--partitions`` partitions (confluent_kafka.admin);
2. open ``--idle-connections`` TCP connections, each answered one
   ApiVersions request so that it is a real Kafka connection, and leave them
   open (RLIMIT_NOFILE's soft limit is raised to the hard one first; when
   even that is too low, as many as fit, and the report says so);
3. produce ``--gib`` GiB of 1 KiB values with confluent-kafka (acks=all),
   the partitions taking turns of 128 records (128 KiB) so that every one
   gets the same share, then consume all of it back (read_committed).

A sampler thread reads the broker's ``/proc/PID/status`` (VmRSS, VmHWM and
its split into RssAnon and RssFile) every ``--interval`` seconds, and each
phase records the RSS every 128 MiB it moves. The report: RSS after start,
after the idle connections, after every 128 MiB produced and consumed, at
the end, and after the idle connections are closed; the peak (VmHWM) of each
phase (reset at its start through ``/proc/PID/clear_refs``) and of the run;
MB/s of both phases. ``--png`` plots RSS over the bytes moved (matplotlib,
when importable). ``measure_memory(...)`` returns it as a frozen
``MemoryReport`` for other modules.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import tempfile
import threading
import time
import uuid

import attrs

from faults.process import BrokerProcess
from protocol import framing
from protocol.messages import ApiKey

KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB
VALUE_BYTES = KIB
CHECKPOINT_BYTES = 128 * MIB
RECORDS_PER_TURN = 128  # consecutive records to one partition before the next takes over
# Descriptors the broker needs besides the idle connections: a .log per
# partition (ours and __consumer_offsets'), clients' connections, files it opens.
FD_RESERVE = 512
API_VERSIONS_VERSION = 3


# ---------------------------------------------------------------------- reading /proc


@attrs.frozen
class ProcessMemory:
    """One reading of /proc/PID/status, in bytes."""

    rss: int  # VmRSS
    peak_rss: int  # VmHWM: the highest VmRSS so far
    anonymous: int  # RssAnon: heap, Python objects, buffers
    file_backed: int  # RssFile: mapped files and shared libraries

    @classmethod
    def of(cls, pid: int) -> "ProcessMemory":
        fields = {}
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _colon, rest = line.partition(":")
                if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    fields[name] = int(rest.split()[0]) * KIB  # the kernel reports kB
        return cls(fields["VmRSS"], fields["VmHWM"], fields.get("RssAnon", 0), fields.get("RssFile", 0))


@attrs.frozen
class MemorySample:
    """The broker's memory at one moment of a phase."""

    seconds: float  # since the measurement began
    phase: str
    bytes_moved: int  # by this phase so far
    memory: ProcessMemory


@attrs.frozen
class Checkpoint:
    """The reading taken when a phase first had ``boundary`` bytes behind it."""

    boundary: int
    sample: MemorySample


@attrs.frozen
class PhasePeak:
    """VmHWM over one phase: the peak is reset when the phase begins (when
    the kernel lets us: ``reset`` False means it is the peak since start)."""

    phase: str
    peak_rss: int
    reset: bool


def reset_peak_rss(pid: int) -> bool:
    """Set VmHWM back to the current RSS (``echo 5 > /proc/PID/clear_refs``, Linux 4.0+)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


class MemorySampler:
    """A thread that samples the broker's memory every ``interval`` seconds
    and knows the phase running and what it has moved; the phase reports its
    progress with ``advance()``, which also takes a reading at every
    CHECKPOINT_BYTES boundary it crosses."""

    def __init__(self, pid: int, interval: float):
        self.pid = pid
        self.interval = interval
        self.phase = "start"
        self.bytes_moved = 0
        self.samples: list[MemorySample] = []
        self.checkpoints: list[Checkpoint] = []
        self.peaks: list[PhasePeak] = []
        self._next_boundary = CHECKPOINT_BYTES
        self._peak_was_reset = False
        self._lock = threading.Lock()
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def mark(self) -> MemorySample:
        with self._lock:
            sample = MemorySample(time.monotonic() - self.began, self.phase, self.bytes_moved, ProcessMemory.of(self.pid))
            self.samples.append(sample)
        return sample

    def begin_phase(self, phase: str) -> None:
        with self._lock:
            self.phase, self.bytes_moved = phase, 0
            self._next_boundary = CHECKPOINT_BYTES
        self._peak_was_reset = reset_peak_rss(self.pid)
        self.mark()

    def advance(self, bytes_moved: int) -> None:
        self.bytes_moved = bytes_moved
        while bytes_moved >= self._next_boundary:
            self.checkpoints.append(Checkpoint(self._next_boundary, self.mark()))
            self._next_boundary += CHECKPOINT_BYTES

    def end_phase(self) -> PhasePeak:
        peak = PhasePeak(self.phase, self.mark().memory.peak_rss, self._peak_was_reset)
        self.peaks.append(peak)
        return peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.mark()
            except (FileNotFoundError, ProcessLookupError):
                return  # the broker is gone

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------- idle connections


@attrs.define(eq=False)
class IdleConnections:
    """Open connections the broker holds state for; ``close()`` ends them."""

    sockets: list
    requested: int
    opened: int
    note: str | None  # why fewer than requested were opened

    def close(self) -> None:
        for connection in self.sockets:
            connection.close()


def raise_open_file_limit(wanted: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit to ``wanted``, or as far as the hard
    limit lets it (children inherit it: start the broker after this).
    Returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft != resource.RLIM_INFINITY and target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def api_versions_round_trip(connection: socket.socket, client: framing.ClientConnection) -> None:
    """Send one ApiVersions request and read its answer (error code 0)."""
    _correlation, request = client.send_request(
        ApiKey.API_VERSIONS, API_VERSIONS_VERSION, {"client_software_name": "onceflow-memory-bench", "client_software_version": "1"}
    )
    connection.sendall(request)
    while True:
        data = connection.recv(64 * KIB)
        if not data:
            raise ConnectionError("the broker closed an idle connection during ApiVersions")
        client.receive_data(data)
        response = client.next_response()
        if response is not None:
            if response.body["error_code"] != 0:
                raise RuntimeError(f"ApiVersions answered error {response.body['error_code']}")
            return


def open_idle_connections(port: int, count: int, *, fd_limit: int, speak_kafka: bool = True) -> IdleConnections:
    """Up to ``count`` connections to 127.0.0.1:``port``, each (with
    ``speak_kafka``) done one ApiVersions round trip, so that the broker
    accepted it and set up its per-connection state. Each is connected and
    answered before the next, which also keeps the listen backlog short."""
    allowed = max(0, fd_limit - FD_RESERVE)
    note = None
    if allowed < count:
        note = f"RLIMIT_NOFILE allows {fd_limit} descriptors; opened {allowed} idle connections, not {count}"
    opened = []
    for _ in range(min(count, allowed)):
        connection = socket.create_connection(("127.0.0.1", port), timeout=30)
        if speak_kafka:
            api_versions_round_trip(connection, framing.ClientConnection(client_id="idle"))
        opened.append(connection)
    return IdleConnections(opened, count, len(opened), note)


# ---------------------------------------------------------------------- produce and consume


def create_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"memory-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


@attrs.frozen
class PhaseResult:
    phase: str
    records: int
    bytes_moved: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_moved / self.seconds / 1e6


def produce(bootstrap: str, topic: str, partitions: int, total_bytes: int, sampler: MemorySampler, *, batch_bytes: int = MIB) -> PhaseResult:
    """``total_bytes`` of VALUE_BYTES values, acks=all, the partitions taking
    turns, in record batches of at most ``batch_bytes``; the bytes acknowledged so far are those handed over minus those
    librdkafka still holds (queued, in flight or awaiting their report)."""
    from confluent_kafka import Producer

    errors = []

    def on_error_delivery(error, _message):
        if error is not None:
            errors.append(error)

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": False,
        "linger.ms": 5,
        "batch.size": batch_bytes,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 256 * KIB,  # 256 MiB in librdkafka's queue at most
        "delivery.report.only.error": True,
    })
    value = os.urandom(VALUE_BYTES)
    records = total_bytes // VALUE_BYTES
    sampler.begin_phase("produce")
    handed_over = 0
    start = time.perf_counter()
    while handed_over < records:
        for _ in range(min(1000, records - handed_over)):
            partition = handed_over // RECORDS_PER_TURN % partitions
            while True:
                try:
                    producer.produce(topic, value, partition=partition, on_delivery=on_error_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            handed_over += 1
        producer.poll(0)
        sampler.advance((handed_over - len(producer)) * VALUE_BYTES)
    while len(producer):
        producer.poll(0.05)
        sampler.advance((handed_over - len(producer)) * VALUE_BYTES)
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} records were not delivered; the first: {errors[0]}")
    sampler.advance(records * VALUE_BYTES)
    return PhaseResult("produce", records, records * VALUE_BYTES, elapsed)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "memory-bench-offsets", "enable.auto.commit": False})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1] for partition in range(partitions)]
    finally:
        consumer.close()


def consume(bootstrap: str, topic: str, partitions: int, records: int, sampler: MemorySampler, timeout: float = 600) -> PhaseResult:
    """Every record from the beginning of every partition, read_committed,
    with librdkafka's default fetch sizes (fetch.max.bytes 50 MiB,
    max.partition.fetch.bytes 1 MiB)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"memory-bench-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(partitions)])
    sampler.begin_phase("consume")
    seen = 0
    bytes_seen = 0
    start = time.perf_counter()
    deadline = start + timeout
    try:
        while seen < records:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"consumed {seen} of {records} records in {timeout} s")
            for message in consumer.consume(min(10_000, records - seen), 1.0):
                if message.error() is not None:
                    continue
                seen += 1
                bytes_seen += len(message)
            sampler.advance(bytes_seen)
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return PhaseResult("consume", seen, bytes_seen, elapsed)


# ---------------------------------------------------------------------- the whole run


@attrs.frozen
class MemoryReport:
    requested_bytes: int
    partitions: int
    batch_bytes: int  # the producer's batch.size
    idle_connections: int
    idle_connections_note: str | None
    after_start: ProcessMemory  # the broker up, the topic created
    after_idle_connections: ProcessMemory
    after_produce: ProcessMemory  # a second after the last acknowledgement
    final: ProcessMemory  # a second after consuming, the consumer closed
    after_closing_idle_connections: ProcessMemory
    produce: PhaseResult
    consume: PhaseResult
    produce_peak: PhasePeak
    consume_peak: PhasePeak
    records_per_partition_min: int
    records_per_partition_max: int
    checkpoints: list  # Checkpoint at every 128 MiB of each phase
    samples: list  # every MemorySample, in time order

    @property
    def peak_rss(self) -> int:
        """VmHWM over the whole run (the highest reading, phase peaks included)."""
        return max(sample.memory.peak_rss for sample in self.samples)

    def as_dict(self) -> dict:
        result = attrs.asdict(self)
        result["peak_rss"] = self.peak_rss
        for phase in ("produce", "consume"):
            result[phase]["mb_per_s"] = round(getattr(self, phase).mb_per_s, 1)
        return result


def measure_memory(
    *,
    total_bytes: int = GIB,
    partitions: int = 64,
    idle_connections: int = 1000,
    speak_kafka: bool = True,
    interval: float = 0.5,
    broker_config: tuple[str, ...] = (),
    broker_environment: dict | None = None,
    batch_bytes: int = MIB,
    work_dir: str | None = None,
) -> MemoryReport:
    """Start a broker on a fresh directory, run the steps of this module's
    docstring against it, stop it, remove the directory."""
    fd_limit = raise_open_file_limit(idle_connections + FD_RESERVE)
    scratch = tempfile.mkdtemp(prefix="onceflow-memory-", dir=work_dir or os.environ.get("BENCH_DIR"))
    broker = BrokerProcess(os.path.join(scratch, "data"), *broker_config, env=broker_environment, log_path=os.path.join(scratch, "broker.log"))
    try:
        broker.start()
        with MemorySampler(broker.process.pid, interval) as sampler:
            topic = create_topic(broker.bootstrap, partitions)
            after_start = sampler.mark().memory
            sampler.begin_phase("idle connections")
            idle = open_idle_connections(broker.port, idle_connections, fd_limit=fd_limit, speak_kafka=speak_kafka)
            try:
                time.sleep(1.0)  # let the broker finish setting them up
                after_idle = sampler.mark().memory
                produced = produce(broker.bootstrap, topic, partitions, total_bytes, sampler, batch_bytes=batch_bytes)
                produce_peak = sampler.end_phase()
                sampler.begin_phase("after produce")
                time.sleep(1.0)
                after_produce = sampler.mark().memory
                spread = end_offsets(broker.bootstrap, topic, partitions)
                if sum(spread) != produced.records:
                    raise RuntimeError(f"the partitions hold {sum(spread)} records, {produced.records} were acknowledged")
                consumed = consume(broker.bootstrap, topic, partitions, produced.records, sampler)
                consume_peak = sampler.end_phase()
                sampler.begin_phase("after consume")
                time.sleep(1.0)
                final = sampler.mark().memory
            finally:
                idle.close()
            sampler.begin_phase("idle connections closed")
            time.sleep(1.0)
            after_closing = sampler.mark().memory
        return MemoryReport(
            requested_bytes=total_bytes,
            partitions=partitions,
            batch_bytes=batch_bytes,
            idle_connections=idle.opened,
            idle_connections_note=idle.note,
            after_start=after_start,
            after_idle_connections=after_idle,
            after_produce=after_produce,
            final=final,
            after_closing_idle_connections=after_closing,
            produce=produced,
            consume=consumed,
            produce_peak=produce_peak,
            consume_peak=consume_peak,
            records_per_partition_min=min(spread),
            records_per_partition_max=max(spread),
            checkpoints=list(sampler.checkpoints),
            samples=sorted(sampler.samples, key=lambda sample: sample.seconds),
        )
    finally:
        if broker.alive:
            broker.terminate()
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------------- output


def _mib(count: int) -> str:
    return f"{count / MIB:,.1f}"


def print_report(report: MemoryReport) -> None:
    print(
        f"{_mib(report.requested_bytes)} MiB of {VALUE_BYTES} B values through {report.partitions} partitions "
        f"({report.records_per_partition_min:,}..{report.records_per_partition_max:,} records each), "
        f"{report.idle_connections} idle connections, producer batch.size {report.batch_bytes:,}"
    )
    if report.idle_connections_note:
        print(f"  note: {report.idle_connections_note}")
    print(f"{'moment':<36}{'RSS MiB':>10}{'anon MiB':>10}{'file MiB':>10}{'VmHWM MiB':>11}")
    rows = [("after start (topic created)", report.after_start), (f"after {report.idle_connections} idle connections", report.after_idle_connections)]
    for phase, after in (("produce", ("after produce (+1 s)", report.after_produce)), ("consume", ("after consume (+1 s)", report.final))):
        rows += [(f"{phase}d {checkpoint.boundary // MIB} MiB", checkpoint.sample.memory) for checkpoint in report.checkpoints if checkpoint.sample.phase == phase]
        rows.append(after)
    rows.append(("after closing idle connections", report.after_closing_idle_connections))
    for name, memory in rows:
        print(f"{name:<36}{_mib(memory.rss):>10}{_mib(memory.anonymous):>10}{_mib(memory.file_backed):>10}{_mib(memory.peak_rss):>11}")
    for peak in (report.produce_peak, report.consume_peak):
        since = "" if peak.reset else " (since start: VmHWM could not be reset)"
        print(f"peak RSS while {peak.phase}: {_mib(peak.peak_rss)} MiB{since}")
    print(f"peak RSS over the run (VmHWM): {_mib(report.peak_rss)} MiB")
    for phase in (report.produce, report.consume):
        print(f"{phase.phase}: {phase.records:,} records, {_mib(phase.bytes_moved)} MiB in {phase.seconds:.1f} s = {phase.mb_per_s:.1f} MB/s")


def plot(report: MemoryReport, path: str) -> bool:
    """RSS over bytes moved (produce, then consume) as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        return False
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    offsets = {"produce": 0, "consume": report.produce.bytes_moved}
    for phase in ("produce", "consume"):
        samples = [sample for sample in report.samples if sample.phase == phase]
        moved = [(offsets[phase] + sample.bytes_moved) / MIB for sample in samples]
        axes.plot(moved, [sample.memory.rss / MIB for sample in samples], marker=".", label=f"RSS while {phase}")
        axes.plot(moved, [sample.memory.peak_rss / MIB for sample in samples], linestyle=":", label=f"VmHWM while {phase}")
    axes.axhline(report.after_idle_connections.rss / MIB, color="grey", linestyle="--", label="RSS before any data")
    axes.set_xlabel("MiB moved (produced, then consumed)")
    axes.set_ylabel("broker memory, MiB")
    axes.set_title(f"onceflow broker: {report.partitions} partitions, {report.idle_connections} idle connections, batch.size {report.batch_bytes:,}")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB to produce and consume (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--idle-connections", type=int, default=1000)
    parser.add_argument("--batch-bytes", type=int, default=MIB, help="the producer's batch.size (default %(default)s; small batches mean many index entries)")
    parser.add_argument("--bare-connections", action="store_true", help="leave the idle connections silent (no ApiVersions)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="broker setting, repeatable")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment variable for the broker process (e.g. MALLOC_ARENA_MAX=2), repeatable")
    parser.add_argument("--json", default=None, help="write the report (with every sample) to this file")
    parser.add_argument("--png", default=None, help="plot RSS over bytes moved to this file (needs matplotlib)")
    args = parser.parse_args()
    report = measure_memory(
        total_bytes=int(args.gib * GIB) // VALUE_BYTES * VALUE_BYTES,
        partitions=args.partitions,
        idle_connections=args.idle_connections,
        speak_kafka=not args.bare_connections,
        interval=args.interval,
        broker_config=("group.initial.rebalance.delay.ms=0", *args.config),
        broker_environment=dict(item.split("=", 1) for item in args.env),
        batch_bytes=args.batch_bytes,
    )
    print_report(report)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report.as_dict(), file, indent=1)
    if args.png and not plot(report, args.png):
        print("matplotlib is not importable: no plot")


if __name__ == "__main__":
    main()
