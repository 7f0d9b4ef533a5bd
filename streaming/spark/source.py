"""The ``onceflow`` source: Spark's Kafka source (schema, offsets, options)
read through our ``txn`` clients, committed records only by default.

Where the work happens:

- Driver (one long-lived Python worker per query holds the stream reader):
  ``OffsetPlanner`` lists the partitions the subscription names and their
  offsets (ListOffsets, one request per leader). Each microbatch ends at the
  last stable offset of every partition under read_committed (the high
  watermark under read_uncommitted), capped by ``maxOffsetsPerTrigger``
  (split over partitions in proportion to their backlog, as Spark's Kafka
  source does) or held back by ``minOffsetsPerTrigger`` until
  ``maxTriggerDelay`` has passed since the last batch; Trigger.AvailableNow
  snapshots the ends once and stops there.
- Executors: ``read_range`` reads one ``OffsetRange`` with a read_committed
  consumer (assigned, no group) whose fetches are decoded straight into
  Arrow columns (``Consumer.poll_columns``), and hands Spark record batches
  of ``to_arrow_schema`` of the Kafka schema built from those columns
  (``SparkColumns``), with no Python object per record. Aborted records and
  control batches never become rows; the offsets they occupy are simply absent.

Offsets are Spark's JSON: ``{"topic": {"partition": next offset to read}}``.
A new query's start keeps Spark's markers (-1 latest, -2 earliest) until
batch 0 is planned, so it is the same at each of Spark's calls and after a
restart before the first commit (``OnceflowStreamReader.initialOffset``).
Everything here pickles: connections are opened lazily, where they are used.

A range is re-read identically only below the last stable offset, which is
why read_committed is the default (Spark's Kafka source reads
read_uncommitted unless told otherwise).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Iterator

import attrs
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from protocol.errors import ErrorCode
from protocol.retry import Backoff, retry_blocking, spark_offset_requests
from streaming.spark import options as opts
from streaming.spark.options import EARLIEST, LATEST, OptionError, SourceOptions
from txn.errors import CLIENT_FAILURES, FatalError, RecordBatchTooLargeError
from txn.types import TopicPartition

log = logging.getLogger(__name__)

ARROW_BATCH_ROWS = 32_768
DATA_LOSS_HINT = (
    'Some data may have been lost because they are not available in Kafka any more; either the data was aged out by Kafka or the topic '
    'may have been deleted before all the data in the topic was processed. If you don\'t want your streaming query to fail on such '
    'cases, set the source option "failOnDataLoss" to "false".'
)


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, DeleteRecords, a deleted topic)."""


def kafka_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's Kafka source (every field nullable)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def check_schema(schema: StructType, source: SourceOptions) -> None:
    """Spark's Kafka source refuses any schema but its own."""
    if schema != kafka_schema(source.include_headers):
        raise OptionError("Kafka source has a fixed schema and cannot be set with a custom one")


@attrs.frozen
class OffsetRange(InputPartition):
    """One Spark task: offsets [from_offset, until_offset) of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None) -> list[OffsetRange]:
    """Split big ranges so there are at least ``min_partitions`` tasks (in
    proportion to size) and none longer than ``max_records`` offsets."""
    total = sum(r.size for r in ranges)
    out = []
    for whole in ranges:
        pieces = 1
        if min_partitions and len(ranges) < min_partitions and total > 0:
            pieces = max(1, round(whole.size * min_partitions / total))
        if max_records:
            pieces = max(pieces, -(-whole.size // max_records))
        pieces = min(pieces, max(whole.size, 1))
        step, extra = divmod(whole.size, pieces)
        start = whole.from_offset
        for index in range(pieces):
            end = start + step + (1 if index < extra else 0)
            out.append(OffsetRange(whole.topic, whole.partition, start, end))
            start = end
    return out


def rate_limit(start: dict[TopicPartition, int], latest: dict[TopicPartition, int], max_offsets: int) -> dict[TopicPartition, int]:
    """Spread ``max_offsets`` over the partitions in proportion to their
    backlog; a partition whose share is below one offset still gets one, so
    no partition starves."""
    sizes = {tp: max(0, end - start[tp]) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= max_offsets:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        share = max_offsets * sizes[tp] / total
        allowed = -int(-share // 1) if share < 1 else int(share)
        out[tp] = min(end, start[tp] + allowed)
    return out


# -- the executor side ---------------------------------------------------------------------------


FETCHES_AHEAD = 2  # fetched and converted while Spark takes the batches before them


def read_range(source: SourceOptions, offset_range: OffsetRange, schema: StructType) -> Iterator:
    """Yield ``pyarrow.RecordBatch``es of the visible records in the range.

    The consumer hands out each fetch as columns (``Consumer.poll_columns``,
    decoded by ``protocol.columnar`` with no Python object per record);
    ``SparkColumns`` turns them into Spark's Kafka schema, also without
    Python per row. A thread of the task fetches and converts up to
    ``FETCHES_AHEAD`` fetches ahead of Spark, so the broker serves the next
    fetch while Spark takes the batches of this one; its errors reach
    Spark here, in order."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from streaming.spark.worker import prepare_worker_process

    prepare_worker_process()  # freed frames kept for the next fetch; imports out of the collector's walks
    columns = SparkColumns(to_arrow_schema(schema, timezone="UTC"), offset_range.topic_partition, source.include_headers)
    handed: queue.Queue = queue.Queue(maxsize=FETCHES_AHEAD)
    stop = threading.Event()

    def hand(item) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fetch_ahead() -> None:
        try:
            with contextlib.closing(fetched_columns(source, offset_range)) as fetches:
                for fetched in fetches:
                    if not hand(list(columns.spark_batches(fetched))):
                        return  # Spark stopped reading
            hand(_END_OF_RANGE)
        except BaseException as error:  # handed to Spark's thread, which raises it
            hand(error)

    fetcher = threading.Thread(target=fetch_ahead, name=f"onceflow-source-{offset_range.topic_partition}", daemon=True)
    fetcher.start()
    try:
        while True:
            item = handed.get()
            if item is _END_OF_RANGE:
                return
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()
        fetcher.join()


_END_OF_RANGE = object()


def fetched_columns(source: SourceOptions, offset_range: OffsetRange) -> Iterator:
    """The visible records of the range, one ``FETCHED_SCHEMA`` record batch
    per fetch, through a consumer of its own. (The synchronous consumer,
    whose asyncio core runs on its own thread, measured no slower than the
    asyncio consumer driven on a private loop from this thread: 46-51k
    against 33-42k rows/s of one partition in three alternating runs on a
    loaded machine, when both decoded records one by one.)"""
    from txn import Consumer

    tp = offset_range.topic_partition
    until = offset_range.until_offset
    consumer = Consumer(config=source.consumer)
    try:
        consumer.assign([tp])
        consumer.seek(tp, offset_range.from_offset)
        position = offset_range.from_offset
        last_progress = time.monotonic()
        while position < until:
            try:
                fetched = consumer.poll_columns(min(1.0, source.poll_timeout_ms / 1000)).get(tp)
            except RecordBatchTooLargeError as error:
                raise OptionError(f"{error} (on the onceflow source: the option kafka.max.partition.fetch.bytes)") from None
            except FatalError as error:
                if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                earliest = consumer.beginning_offsets([tp])[tp]
                report_data_loss(source, f"Cannot fetch offset {position} of {tp}: the earliest offset available is now {earliest}")
                if earliest >= until or position >= earliest:
                    break  # the rest of the range is gone, or the log now ends below it (topic recreated): skip it
                position = earliest
                consumer.seek(tp, position)
                continue
            if fetched is not None:
                yield SparkColumns.before(fetched, until)
            now_at = consumer.position(tp)
            if fetched is not None or now_at > position:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > source.poll_timeout_ms / 1000:
                raise TimeoutError(stalled_message(source, tp, position, until))
            position = now_at
    finally:
        consumer.close()


class SparkColumns:
    """One partition's fetched columns (``protocol.columnar.FETCHED_SCHEMA``)
    as record batches of Spark's Kafka schema (``arrow_schema``), at most
    ``ARROW_BATCH_ROWS`` rows each, with no Python per row: key, value,
    offset and timestampType are the fetched arrays; topic and partition
    slices of constant arrays built once; the timestamp the fetched
    milliseconds times 1000, viewed as Spark's timestamp type; headers the
    fetched lists, null where a record has none (as Spark's Kafka source)."""

    def __init__(self, arrow_schema, tp: TopicPartition, include_headers: bool):
        import numpy as np
        import pyarrow as pa

        self.schema = arrow_schema
        self.include_headers = include_headers
        topic = tp.topic.encode("utf-8")
        rows = ARROW_BATCH_ROWS
        self._topic = pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * len(topic)), pa.py_buffer(topic * rows)])
        self._partition = pa.array(np.full(rows, tp.partition, dtype=np.int32))
        self._timestamp_type = arrow_schema.field("timestamp").type
        self._headers_type = arrow_schema.field("headers").type if include_headers else None

    @staticmethod
    def before(fetched, until: int):
        """The rows of ``fetched`` whose offsets are below ``until`` (offsets ascend)."""
        import numpy as np

        offsets = fetched.column("offset")
        if len(offsets) == 0 or offsets[-1].as_py() < until:
            return fetched
        return fetched.slice(0, int(np.searchsorted(offsets.to_numpy(), until)))

    def spark_batches(self, fetched) -> Iterator:
        for start in range(0, fetched.num_rows, ARROW_BATCH_ROWS):
            yield self.spark_batch(fetched.slice(start, ARROW_BATCH_ROWS))

    def spark_batch(self, fetched):
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = fetched.num_rows
        arrays = [
            fetched.column("key"),
            fetched.column("value"),
            self._topic.slice(0, rows),
            self._partition.slice(0, rows),
            fetched.column("offset"),
            pc.multiply(fetched.column("timestamp"), 1000).view(self._timestamp_type),
            fetched.column("timestamp_type"),
        ]
        if self.include_headers:
            arrays.append(self._spark_headers(fetched.column("headers")))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _spark_headers(self, headers):
        """``list<struct<key, value>>`` of Spark's schema: null for a record without headers."""
        import pyarrow as pa
        import pyarrow.compute as pc

        entry_type = self._headers_type.value_type
        pairs = headers.values
        entries = pa.StructArray.from_arrays([pairs.field("key"), pairs.field("value")], fields=list(entry_type))
        none = pc.equal(pc.list_value_length(headers), 0)
        return pa.ListArray.from_arrays(headers.offsets, entries, type=self._headers_type, mask=none)


def stalled_message(source: SourceOptions, tp: TopicPartition, position: int, until: int) -> str:
    """Why a range read made no progress for kafkaConsumer.pollTimeoutMs: most
    often a batch read whose endingOffsets lie beyond the last stable offset."""
    from txn import Admin

    message = f"Cannot fetch records in [{position}, {until}) of {tp} within kafkaConsumer.pollTimeoutMs={source.poll_timeout_ms}"
    try:
        with Admin(config=source.admin) as admin:
            end, why = explain_end(admin, tp, source.isolation_level)
    except CLIENT_FAILURES as error:
        return f"{message} (the end of {tp} could not be listed: {error})"
    if end is not None and position >= end:
        return f"{message}: the range ends at {until}, beyond {why}. End the read at or below that offset (-1 is latest in endingOffsets)"
    return f"{message} (reads of it stop at {why})"


def report_data_loss(source: SourceOptions, message: str, hint: str = DATA_LOSS_HINT) -> None:
    if source.fail_on_data_loss:
        raise DataLossError(f"{message}. {hint}")
    log.warning("%s. Some data may have been lost; failOnDataLoss is false, so the query goes on.", message)


# -- the driver side -----------------------------------------------------------------------------


class OffsetPlanner:
    """The driver's view of the subscribed partitions and their offsets,
    through one lazily opened admin client (dropped when pickled)."""

    def __init__(self, source: SourceOptions):
        self.source = source
        self._admin = None

    def __getstate__(self):
        return {"source": self.source, "_admin": None}

    @property
    def admin(self):
        if self._admin is None:
            from txn import Admin

            self._admin = Admin(config=self.source.admin)
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            try:
                admin.close()
            except CLIENT_FAILURES as error:  # a broken connection is being dropped anyway
                log.info("closing the offset client: %s", error)

    def _retrying(self, call):
        """Spark's fetchOffset.numRetries / fetchOffset.retryIntervalMs
        (``protocol.retry.spark_offset_requests``): a failed offset or
        metadata request is tried again on a new connection."""
        retries = self.source.fetch_offset_num_retries

        def reconnecting(error: BaseException, backoff: Backoff) -> None:
            log.warning("offset request failed (%s); retry %d of %d", error, backoff.tries, retries)
            self.close()

        return retry_blocking(lambda: call(self.admin), spark_offset_requests(retries, self.source.fetch_offset_retry_interval_ms),
                              retriable=lambda error: isinstance(error, CLIENT_FAILURES), on_failure=reconnecting)

    def partitions(self) -> list[TopicPartition]:
        subscription = self.source.subscription
        if subscription.kind == "assign":
            return sorted(subscription.partitions)
        topics = self._retrying(lambda admin: admin.list_topics())
        return sorted(
            TopicPartition(topic, p)
            for topic, count in topics.items()
            if subscription.matches(topic) and not (subscription.kind == "subscribepattern" and topic.startswith("__"))
            for p in range(count)
        )

    def offsets(self, specs: dict[TopicPartition, object]) -> dict[TopicPartition, int]:
        """``{tp: "earliest" | "latest" | timestamp}`` -> offsets (-1: no record at the timestamp)."""
        if not specs:
            return {}
        listed = self._retrying(lambda admin: admin.list_offsets(specs, isolation_level=self.source.isolation_level))
        return {tp: listed[tp].offset for tp in specs}

    def latest(self, partitions) -> dict[TopicPartition, int]:
        return self.offsets({tp: "latest" for tp in partitions})

    def earliest(self, partitions) -> dict[TopicPartition, int]:
        return self.offsets({tp: "earliest" for tp in partitions})

    def resolve(self, limit: opts.OffsetLimit, partitions: list[TopicPartition], *, starting: bool) -> dict[TopicPartition, int]:
        """Concrete offsets for a starting or ending option."""
        return self.resolve_markers(self.marked(limit, partitions, starting=starting))

    def marked(self, limit: opts.OffsetLimit, partitions: list[TopicPartition], *, starting: bool) -> dict[TopicPartition, int]:
        """Offsets for a starting or ending option with Spark's markers left
        in (-2 earliest, -1 latest): timestamps are looked up, and a partition
        no record reaches is -1 under the ``latest`` strategy."""
        if isinstance(limit, opts.Earliest):
            return {tp: EARLIEST for tp in partitions}
        if isinstance(limit, opts.Latest):
            return {tp: LATEST for tp in partitions}
        if isinstance(limit, opts.SpecificOffsets):
            named = "startingOffsets" if starting else "endingOffsets"
            _check_all_named(named, limit.offsets, partitions, "Use -1 for latest, -2 for earliest.")
            return dict(limit.offsets)
        if isinstance(limit, opts.GlobalTimestamp):
            timestamps = {tp: limit.timestamp for tp in partitions}
        else:
            _check_all_named("startingOffsetsByTimestamp" if starting else "endingOffsetsByTimestamp", limit.timestamps, partitions, "")
            timestamps = dict(limit.timestamps)
        found = self.offsets(timestamps)
        unmatched = [tp for tp, offset in found.items() if offset < 0]
        if unmatched and starting and limit.on_no_match == "error":
            tp = unmatched[0]
            raise OptionError(
                f"No offset matched from request of topic-partition {tp} and timestamp {timestamps[tp]}. "
                "Set startingOffsetsByTimestampStrategy to 'latest' to start from the latest offset instead."
            )
        return {tp: LATEST if offset < 0 else offset for tp, offset in found.items()}

    def resolve_markers(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """``offsets`` with -2 and -1 replaced by each partition's earliest and latest offset now."""
        wanted = {tp: "earliest" if offset == EARLIEST else "latest" for tp, offset in offsets.items() if offset in (EARLIEST, LATEST)}
        found = self.offsets(wanted)
        return {tp: found.get(tp, offset) for tp, offset in offsets.items()}

    def explain_end(self, tp: TopicPartition) -> tuple[int | None, str]:
        """Where and why reads of ``tp`` end now (``explain_end``)."""
        return explain_end(self.admin, tp, self.source.isolation_level)


def explain_end(admin, tp: TopicPartition, isolation_level: str) -> tuple[int | None, str]:
    """Where reads of ``tp`` end now (None if that cannot be listed) and a
    phrase saying why, to finish "... is beyond ": the last stable offset
    and the open transaction holding it there (its producer id from
    DescribeProducers, its transactional id from ListTransactions), or the
    high watermark under read_uncommitted. Best effort: it explains an error,
    so what it cannot find out it says, and never raises."""
    try:
        ends = {level: admin.list_offsets({tp: "latest"}, isolation_level=level)[tp].offset for level in ("read_committed", "read_uncommitted")}
    except CLIENT_FAILURES as error:
        return None, f"the end of {tp}, which could not be listed ({error})"
    stable, high_watermark = ends["read_committed"], ends["read_uncommitted"]
    if isolation_level != "read_committed":
        return high_watermark, f"the end of {tp} (its high watermark), {high_watermark}"
    if stable >= high_watermark:
        return stable, f"the last stable offset of {tp}, {stable}, which is the end of the partition (no transaction is open there)"
    holder = "an open transaction"
    try:
        open_here = [p for p in admin.describe_producers(tp) if p.current_txn_start_offset == stable]
        if open_here:
            producer_id = open_here[0].producer_id
            holder += f" of producer id {producer_id}"
            named = [t.transactional_id for t in admin.list_transactions(producer_ids=[producer_id])]
            if named:
                holder += f" (transactional id {named[0]!r})"
    except CLIENT_FAILURES as error:
        log.info("could not find the transaction holding the last stable offset of %s: %s", tp, error)
    return stable, (
        f"the last stable offset of {tp}, {stable} (its high watermark is {high_watermark}): {holder} begins there and holds it, "
        "and read_committed reads stop at the last stable offset until that transaction commits or aborts (the broker aborts "
        "it after its transaction.timeout.ms)"
    )


def _check_all_named(option: str, named: dict, partitions: list[TopicPartition], hint: str) -> None:
    if set(named) != set(partitions):
        raise OptionError(
            f"If {option} contains specific offsets, you must specify all TopicPartitions. {hint} "
            f"Specified: {', '.join(map(str, sorted(named)))} Assigned: {', '.join(map(str, sorted(partitions)))}"
        )


class OnceflowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The microbatch reader (driver) whose ``read`` runs on executors."""

    def __init__(self, source: SourceOptions, schema: StructType):
        check_schema(schema, source)
        self.source = source
        self.schema = schema
        self.planner = OffsetPlanner(source)
        self._last_trigger = time.monotonic()  # minOffsetsPerTrigger waits at most maxTriggerDelay from here
        self._available_now: dict[TopicPartition, int] | None = None
        self._latest_seen: dict[TopicPartition, int] | None = None
        self._initial: dict | None = None

    def initialOffset(self) -> dict:
        """Where a new query starts, the same at every call: Spark asks to
        plan batch 0, again to run it, and again after a restart before
        ``commits/0`` (the checkpoint keeps only batch 0's end, and a Python
        source cannot see the checkpoint to write its start there, as Spark's
        Kafka source does). So ``latest`` and ``earliest`` stay Spark's
        markers (-1, -2) here, resolved by ``latestOffset`` when batch 0 is
        planned: a latest partition's batch 0 ends where it starts, so batch 0
        is empty there and the start is batch 0's end, which ``offsets/0``
        keeps. Timestamps are looked up once per run (a partition with no
        match under the ``latest`` strategy is -1)."""
        if self._initial is None:
            marked = self.planner.marked(self.source.starting, self.planner.partitions(), starting=True)
            self._initial = opts.offsets_to_json(marked)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.source.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.source.max_offsets_per_trigger)
        if self.source.min_offsets_per_trigger is not None:
            return ReadMinRows(self.source.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.planner.latest(self.planner.partitions())

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest_seen is None else opts.offsets_to_json(self._latest_seen)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = opts.offsets_from_json(start)
        if self._available_now is not None:
            latest = dict(self._available_now)
        else:
            latest = self.planner.latest(self.planner.partitions())
        self._latest_seen = latest
        gone = sorted(set(begin) - set(latest))
        if gone:
            report_data_loss(self.source, f"Partitions {', '.join(map(str, gone))} are gone (deleted topic?)")
        marked = any(offset in (EARLIEST, LATEST) for offset in begin.values())
        for tp, offset in begin.items():
            if offset == LATEST and tp in latest:
                begin[tp] = latest[tp]  # batch 0 is empty here and ends at the start it fixes
        new = [tp for tp in latest if begin.get(tp, EARLIEST) == EARLIEST]  # earliest, or appeared since the last batch
        begin.update(self.planner.earliest(new))
        starting = start == self._initial
        for tp, end in latest.items():
            if end < begin[tp]:
                if starting:
                    report_data_loss(
                        self.source,
                        f"The starting offset {begin[tp]} of {tp} is beyond {self.planner.explain_end(tp)[1]}",
                        "Start at or below that offset (-1 is latest in startingOffsets), or set the source option \"failOnDataLoss\" to \"false\" to start there instead.",
                    )
                else:
                    report_data_loss(self.source, f"The offset of {tp} went back from {begin[tp]} to {end}")
                begin[tp] = end
        end = latest
        if not isinstance(limit, ReadAllAvailable):
            if self._available_now is None and self._should_wait(begin, latest):
                return opts.offsets_to_json({tp: begin[tp] for tp in latest}) if marked else start  # batch 0 ends where it starts, never at a marker
            max_offsets = limit.max_rows if isinstance(limit, ReadMaxRows) else self.source.max_offsets_per_trigger
            if max_offsets is not None:
                end = rate_limit(begin, latest, max_offsets)
        if end != opts.offsets_from_json(start):
            self._last_trigger = time.monotonic()
        return opts.offsets_to_json(end)

    def _should_wait(self, begin: dict, latest: dict) -> bool:
        """minOffsetsPerTrigger: wait for that many new offsets, but no longer
        than maxTriggerDelay since the last batch that moved the offsets (or
        since the query started). Spark's Kafka source restarts its delay
        at every trigger it lets through, empty or not, so there a few records
        arriving after a quiet spell may wait anywhere up to the delay; here
        they go at once if the delay has passed since data last moved."""
        if self.source.min_offsets_per_trigger is None:
            return False
        if (time.monotonic() - self._last_trigger) * 1000 >= self.source.max_trigger_delay_ms:
            return False
        return sum(latest[tp] - begin[tp] for tp in latest) < self.source.min_offsets_per_trigger

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        until = opts.offsets_from_json(end)
        begin = {}
        for tp, offset in opts.offsets_from_json(start).items():
            if offset == LATEST and tp in until:
                begin[tp] = until[tp]  # batch 0 of a latest start is empty: latestOffset ended it at its start
            elif offset not in (EARLIEST, LATEST):
                begin[tp] = offset  # (earliest is left out, so plan_ranges starts at the earliest offset now)
        return plan_ranges(self.planner, self.source, begin, until)

    def read(self, partition: OffsetRange) -> Iterator:
        return read_range(self.source, partition, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets (as with Spark's Kafka source)."""

    def stop(self) -> None:
        self.planner.close()


def plan_ranges(planner: OffsetPlanner, source: SourceOptions, begin: dict, end: dict) -> list[OffsetRange]:
    """The tasks of one batch; [] when nothing is to be read (Spark replans
    an empty range on restart, so this must not need the broker then)."""
    wanted = {tp: until for tp, until in end.items() if begin.get(tp, 0) < until or tp not in begin}
    if not wanted:
        return []
    earliest = planner.earliest(list(wanted))
    ranges = []
    for tp, until in sorted(wanted.items()):
        first = begin.get(tp)
        if first is None:
            first = earliest[tp]  # a partition that appeared after the batch began starts at its earliest offset
        if first < earliest[tp]:
            report_data_loss(source, f"Cannot fetch offset {first} of {tp}: the earliest offset available is {earliest[tp]}")
            first = earliest[tp]
        if first < until:
            ranges.append(OffsetRange(tp.topic, tp.partition, first, until))
    return split_ranges(ranges, source.min_partitions, source.max_records_per_partition)


class OnceflowBatchReader(DataSourceReader):
    """``spark.read``: the offsets from ``startingOffsets`` to ``endingOffsets``
    (or their timestamp forms), fixed when the query is planned."""

    def __init__(self, source: SourceOptions, schema: StructType):
        check_schema(schema, source)
        self.source = source
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        planner = OffsetPlanner(self.source)
        try:
            partitions = planner.partitions()
            begin = planner.resolve(self.source.starting, partitions, starting=True)
            end = planner.resolve(self.source.ending, partitions, starting=False)
            for tp in partitions:
                if begin[tp] > end[tp]:
                    raise OptionError(f"The starting offset {begin[tp]} of {tp} is after its ending offset {end[tp]}")
            return list(plan_ranges(planner, self.source, begin, end))
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark's stand-in when there is nothing to read
        return read_range(self.source, partition, self.schema)
