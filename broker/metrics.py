"""The broker's Prometheus metrics (``onceflow broker --metrics HOST:PORT``).

``BrokerMetrics`` owns one ``prometheus_client.CollectorRegistry`` per broker
(never the process's global one: tests run several brokers in one process)
and two kinds of metric:

- counted where things happen: requests per API and version, their error
  codes and latency (``MeasuredDispatch``, a layer around the broker's
  dispatcher), the requests that waited for an fsync (``broker.client_rounds``), bytes in and out per topic, transaction outcomes (each
  CompleteCommit/CompleteAbort once durable in ``__transaction_state``),
  fsync time and group-commit round size (storage's ``FlushObserver`` seam:
  storage hands over plain numbers and never imports this), connections
  opened;
- read at scrape time by ``BrokerStateCollector`` from the broker's own state,
  never opening a partition (``broker.replica`` opens them when first used):
  per-partition offsets (log start, high watermark, last stable, log end) of
  the open partitions and of those created since start (zeros), internal
  topics' only once written to,
  open transactions and the age of the oldest (per partition and per
  ``__transaction_state`` partition), producer ids, transactional ids by
  state, groups by state, their members, committed offsets and lag, the
  index budget, connections per listener (authenticated or not).

Plus the process's own (``process_resident_memory_bytes`` and the rest of
``prometheus_client``'s ``ProcessCollector``).

Everything here runs on the broker's event loop: the hooks are called there,
and the endpoint (``protocol.metrics_http``) renders there, so a scrape reads
the broker's state between two steps of the loop. Names follow Prometheus'
conventions: ``onceflow_`` prefix, base units (seconds, bytes), ``_total``
on counters; labels are bounded by what the broker holds (APIs, versions,
error codes, topics, partitions, groups, listeners), never by request
contents such as client ids.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import attrs
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker import client_rounds
from broker.security.session import ANONYMOUS, Session
from coordinator.state import STATE_NAMES, TxnState
from coordinator.txn_log import partition_for
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.metrics_http import MetricsEndpoint, MetricsListenError

REQUEST_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FSYNC_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ROUND_BYTES_BUCKETS = tuple(float(256 * 4**n) for n in range(10))  # 256 B .. 64 MiB
ROUND_APPENDS_BUCKETS = tuple(float(2**n) for n in range(11))  # 1 .. 1024
OPEN_TXN_STATES = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


# Kafka's request names (its RequestMetrics use them: Produce, EndTxn, ...).
API_NAMES = {int(key): _camel(key.name) for key in ApiKey}
ERROR_NAMES = {int(code): code.name for code in ErrorCode}


class BrokerMetrics:
    """One broker's registry: the counters and histograms its parts update
    through the hooks below, and (after ``watch``) the gauges read from it."""

    def __init__(self) -> None:
        # A ``_created`` series beside every counter and histogram child would
        # double what Prometheus stores for nothing a dashboard uses (the
        # setting is the library's, process-wide).
        disable_created_metrics()
        registry = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("onceflow_requests_total", "Requests answered, by API and version", ["api", "version"], registry=registry)
        self.request_errors = Counter(
            "onceflow_request_errors_total",
            "Error codes in responses (top level and per partition), by API and error; a handler that failed counts as UNKNOWN_SERVER_ERROR",
            ["api", "error"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "onceflow_request_duration_seconds", "Time from a request's dispatch to its response body, by API and version",
            ["api", "version"], buckets=REQUEST_SECONDS_BUCKETS, registry=registry,
        )
        self.requests_waited_fsync = Counter(
            "onceflow_requests_waited_fsync_total",
            "Requests whose answer waited for an fsync (a round on the client's path: broker.client_rounds), by API",
            ["api"], registry=registry,
        )
        self.bytes_in = Counter("onceflow_topic_bytes_in_total", "Record batch bytes appended by Produce requests, by topic", ["topic"], registry=registry)
        self.bytes_out = Counter("onceflow_topic_bytes_out_total", "Record batch bytes sent in Fetch responses, by topic", ["topic"], registry=registry)
        self.transactions = Counter(
            "onceflow_transactions_total", "Transactions finished (CompleteCommit or CompleteAbort appended to __transaction_state), by outcome",
            ["outcome"], registry=registry,
        )
        self.fsync_seconds = Histogram("onceflow_log_fsync_duration_seconds", "Time of one fsync round of a partition log", buckets=FSYNC_SECONDS_BUCKETS, registry=registry)
        self.round_bytes = Histogram("onceflow_log_flush_round_bytes", "Bytes made durable by one fsync round (group commit)", buckets=ROUND_BYTES_BUCKETS, registry=registry)
        self.round_appends = Histogram("onceflow_log_flush_round_appends", "Appends made durable by one fsync round (group commit)", buckets=ROUND_APPENDS_BUCKETS, registry=registry)
        self.connections_opened = Counter("onceflow_connections_opened_total", "Connections accepted, by listener", ["listener"], registry=registry)
        # (listener, authenticated) -> open connections, kept by the server's callbacks.
        self.connections: dict[tuple[str, bool], int] = {}
        # What rendering the metrics costs the loop (up to the previous scrape).
        self.scrapes = 0
        self.scrape_seconds = 0.0
        self._transaction_outcomes = {
            TxnState.COMPLETE_COMMIT: self.transactions.labels(outcome="commit"),
            TxnState.COMPLETE_ABORT: self.transactions.labels(outcome="abort"),
        }
        ProcessCollector(registry=registry)

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_LATEST

    def render(self) -> bytes:
        """The exposition text of every metric (call on the broker's loop)."""
        started = time.perf_counter()
        body = generate_latest(self.registry)
        self.scrapes += 1
        self.scrape_seconds += time.perf_counter() - started
        return body

    def watch(self, broker) -> None:
        """Read ``broker``'s state at every scrape from now on."""
        self.registry.register(BrokerStateCollector(broker, self))

    async def serve(self, host: str, port: int) -> MetricsEndpoint:
        """Start serving ``/metrics`` on ``host:port`` (this loop); MetricsListenError if it cannot bind."""
        endpoint = MetricsEndpoint(self.render, host=host, port=port, content_type=self.content_type)
        await endpoint.start()
        return endpoint

    # -- hooks the broker's parts call -----------------------------------------------

    def flushed(self, seconds: float, round_bytes: int, round_appends: int) -> None:
        """storage's ``FlushObserver``: one fsync round of some partition log."""
        self.fsync_seconds.observe(seconds)
        self.round_bytes.observe(round_bytes)
        self.round_appends.observe(round_appends)

    def transaction_state_written(self, metadata) -> None:
        """``__transaction_state`` holds ``metadata`` now (a Complete once appended, any other once durable)."""
        outcome = self._transaction_outcomes.get(metadata.state)
        if outcome is not None:
            outcome.inc()

    def connection_opened(self, session: Session) -> Callable[[Session | None], None]:
        """``broker.server``'s ``on_connection``: count the connection under
        its session until the server reports another session (it
        authenticated) or None (it closed)."""
        self.connections_opened.labels(listener=session.listener).inc()
        current = [self._connection_key(session)]
        self._count_connection(current[0], 1)

        def update(new: Session | None) -> None:
            self._count_connection(current[0], -1)
            if new is not None:
                current[0] = self._connection_key(new)
                self._count_connection(current[0], 1)

        return update

    @staticmethod
    def _connection_key(session: Session) -> tuple[str, bool]:
        return session.listener, session.principal != ANONYMOUS

    def _count_connection(self, key: tuple[str, bool], change: int) -> None:
        count = self.connections.get(key, 0) + change
        if count:
            self.connections[key] = count
        else:
            self.connections.pop(key, None)


class MeasuredDispatch:
    """The broker's dispatcher with its requests counted and timed: one layer
    of its own (authorisation and quotas wrap the dispatcher the same way,
    each in its own class), called by ``broker.server`` with the request and
    its connection's session."""

    def __init__(self, dispatch, metrics: BrokerMetrics, topic_names_by_id: Callable[[], dict]):
        self._dispatch = dispatch
        self._metrics = metrics
        # The broker's topics by id: Fetch v13+ names topics by id, and an
        # unanswered Produce (acks=0) counts only partitions that exist.
        self._topic_names_by_id = topic_names_by_id
        # (api key, version) -> (count child, latency child, api name): labels() is
        # a dictionary lookup under a lock, done once per pair instead of per request.
        self._children: dict[tuple[int, int], tuple] = {}
        self._errors: dict[tuple[str, int], object] = {}
        self._bytes_in: dict[str, object] = {}
        self._bytes_out: dict[str, object] = {}

    async def __call__(self, request, session):
        key = (request.api_key, request.api_version)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = self._labels(*key)
        count, latency, api = children
        started = time.perf_counter()
        wait, token = client_rounds.measure()
        try:
            response = await self._dispatch(request, session)
        except asyncio.CancelledError:
            raise
        except Exception:
            count.inc()
            self._error(api, ErrorCode.UNKNOWN_SERVER_ERROR)
            raise
        finally:
            client_rounds.finish(token)
        latency.observe(time.perf_counter() - started)
        count.inc()
        if wait.waited:
            self._metrics.requests_waited_fsync.labels(api=api).inc()
        if response is None:  # Produce with acks=0
            if request.api_key == ApiKey.PRODUCE:
                self._count_produced_unanswered(request.body)
            return response
        if request.api_key == ApiKey.PRODUCE:
            self._count_produced(request.body, response)
            codes = produce_error_codes(response)
        elif request.api_key == ApiKey.FETCH:
            self._count_fetched(response)
            codes = fetch_error_codes(response)
        else:
            codes = error_codes(response)
        for code in codes:
            self._error(api, code)
        return response

    def _labels(self, api_key: int, version: int) -> tuple:
        api = API_NAMES.get(api_key, str(api_key))
        metrics = self._metrics
        return metrics.requests.labels(api=api, version=str(version)), metrics.request_seconds.labels(api=api, version=str(version)), api

    def _error(self, api: str, code: int) -> None:
        child = self._errors.get((api, code))
        if child is None:
            child = self._errors[(api, code)] = self._metrics.request_errors.labels(api=api, error=ERROR_NAMES.get(code, str(code)))
        child.inc()

    def _count_produced(self, body: dict, response: dict) -> None:
        """Bytes in, as Kafka's BytesInPerSec counts them: the batches of
        the partitions the answer says were appended. A refused partition
        (unknown topic, denied, out of sequence) adds nothing, so a topic
        label is always a topic the broker holds, never a name a client
        made up."""
        appended = {
            (topic.get("name"), partition.get("index"))
            for topic in response.get("responses") or ()
            for partition in topic.get("partition_responses") or ()
            if not partition.get("error_code")
        }
        for topic_data in body.get("topic_data") or ():
            name = topic_data.get("name")
            size = sum(len(p.get("records") or b"") for p in topic_data.get("partition_data") or () if (name, p.get("index")) in appended)
            if size:
                self._topic_child(self._bytes_in, self._metrics.bytes_in, name).inc(size)

    def _count_produced_unanswered(self, body: dict) -> None:
        """acks=0: no answer says what was appended; count the partitions
        that exist (what is sent to one that does not is dropped)."""
        partitions_of = {info.name: info.partitions for info in self._topic_names_by_id().values()}
        for topic_data in body.get("topic_data") or ():
            name = topic_data.get("name")
            count = partitions_of.get(name, 0)
            size = sum(len(p.get("records") or b"") for p in topic_data.get("partition_data") or () if 0 <= p.get("index", -1) < count)
            if size:
                self._topic_child(self._bytes_in, self._metrics.bytes_in, name).inc(size)

    def _count_fetched(self, response: dict) -> None:
        names = None
        for topic in response.get("responses") or ():
            size = sum(len(p.get("records") or b"") for p in topic.get("partitions") or ())
            if not size:
                continue
            name = topic.get("topic")
            if name is None and topic.get("topic_id") is not None:
                names = names if names is not None else self._topic_names_by_id()
                info = names.get(_as_uuid(topic["topic_id"]))
                name = info.name if info is not None else None
            if name is not None:
                self._topic_child(self._bytes_out, self._metrics.bytes_out, name).inc(size)

    @staticmethod
    def _topic_child(cache: dict, counter: Counter, topic: str):
        child = cache.get(topic)
        if child is None:
            child = cache[topic] = counter.labels(topic=topic)
        return child


def _as_uuid(value):
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(bytes=value) if isinstance(value, (bytes, bytearray)) else uuid.UUID(str(value))
    except ValueError:
        return None


def error_codes(body):
    """Every non-zero ``error_code`` in a response body, at any depth (the
    top level's and each topic's or partition's, as Kafka counts them)."""
    stack = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            code = item.get("error_code")
            if code:
                yield code
            for value in item.values():
                if isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(item, list):
            for value in item:
                if isinstance(value, (dict, list)):
                    stack.append(value)


def produce_error_codes(response: dict) -> list[int]:
    """``error_codes`` of a Produce response, by its known shape (the hot path)."""
    return [
        partition.get("error_code")
        for topic in response.get("responses") or ()
        for partition in topic.get("partition_responses") or ()
        if partition.get("error_code")
    ]


def fetch_error_codes(response: dict) -> list[int]:
    """``error_codes`` of a Fetch response, by its known shape."""
    codes = [response["error_code"]] if response.get("error_code") else []
    for topic in response.get("responses") or ():
        for partition in topic.get("partitions") or ():
            if partition.get("error_code"):
                codes.append(partition["error_code"])
    return codes


@attrs.define(eq=False)
class BrokerStateCollector:
    """Gauges read from the broker's state at scrape time (on its loop)."""

    broker: object  # broker.broker.Broker
    metrics: BrokerMetrics

    def collect(self):
        broker = self.broker
        replicas = broker.replicas
        now_ms = broker.clock.wall_ms()
        yield from self._partitions(replicas, broker.transactions, now_ms)
        yield from self._coordinator(broker.transactions, now_ms)
        yield from self._groups(broker.groups, replicas)
        yield from self._index_budget(broker.index_budget)
        connections = GaugeMetricFamily("onceflow_connections", "Open client connections, by listener and whether they authenticated", labels=["listener", "authenticated"])
        for (listener, authenticated), count in sorted(self.metrics.connections.items()):
            connections.add_metric([listener, "true" if authenticated else "false"], count)
        yield connections
        yield CounterMetricFamily("onceflow_metrics_scrapes", "Scrapes of this endpoint rendered (before this one)", value=self.metrics.scrapes)
        yield CounterMetricFamily("onceflow_metrics_scrape_seconds", "Time the broker's loop spent rendering them", value=self.metrics.scrape_seconds)

    def _partitions(self, replicas, transactions, now_ms: int):
        labels = ["topic", "partition"]
        end = GaugeMetricFamily("onceflow_partition_log_end_offset", "Next offset to be assigned (LEO)", labels=labels)
        high = GaugeMetricFamily("onceflow_partition_high_watermark", "End of the durable data: what read_uncommitted consumers see", labels=labels)
        stable = GaugeMetricFamily("onceflow_partition_last_stable_offset", "First offset of the oldest open transaction, or the high watermark (read_committed consumers stop here)", labels=labels)
        start = GaugeMetricFamily("onceflow_partition_log_start_offset", "First offset still in the log", labels=labels)
        size = GaugeMetricFamily("onceflow_partition_size_bytes", "Bytes of the partition's segments", labels=labels)
        open_txns = GaugeMetricFamily("onceflow_partition_open_transactions", "Transactions with data in the partition and no marker yet", labels=labels)
        oldest = GaugeMetricFamily("onceflow_partition_oldest_open_transaction_age_seconds", "Age of the oldest transaction open on the partition, by the coordinator's clock", labels=labels)
        producers = 0
        if replicas is not None:
            started = _open_transaction_starts(transactions)
            internal = {name for name, info in replicas.topics.items() if info.internal}
            for (topic, partition), partition_log in list(replicas.logs.items()):
                if topic in internal and partition_log.log_end_offset == 0:
                    # Most of the 50 + 50 internal partitions are never written
                    # to; their series would be most of a scrape's cost.
                    continue
                values = [topic, str(partition)]
                end.add_metric(values, partition_log.log_end_offset)
                high.add_metric(values, partition_log.high_watermark)
                stable.add_metric(values, partition_log.last_stable_offset)
                start.add_metric(values, partition_log.log_start_offset)
                size.add_metric(values, partition_log.size_bytes)
                state = partition_log.producer_state
                open_txns.add_metric(values, len(state.ongoing))
                producers += len(state.producers)
                first = started.get((topic, partition))
                if first is not None:
                    oldest.add_metric(values, max(0, now_ms - first) / 1000.0)
            # Partitions open when first used (broker.replica): those created
            # since start and unused are empty, known without opening them;
            # others not yet opened since start are not reported until they
            # are used (internal ones only once written to, as above).
            for topic, partition in replicas.created_unopened():
                if topic not in internal:
                    values = [topic, str(partition)]
                    for family in (end, high, stable, start, size, open_txns):
                        family.add_metric(values, 0)
        yield from (end, high, stable, start, size, open_txns, oldest)
        yield GaugeMetricFamily("onceflow_producer_ids", "Producer ids whose state the partitions keep (for duplicate detection), summed over partitions", value=producers)

    def _coordinator(self, transactions, now_ms: int):
        labels = ["coordinator_partition"]
        open_txns = GaugeMetricFamily("onceflow_transaction_coordinator_open_transactions", "Open transactions (Ongoing or being completed), by __transaction_state partition", labels=labels)
        oldest = GaugeMetricFamily("onceflow_transaction_coordinator_oldest_open_transaction_age_seconds", "Age of the oldest open transaction, by __transaction_state partition", labels=labels)
        by_state = GaugeMetricFamily("onceflow_transactional_ids", "Transactional ids the coordinator holds, by state (Kafka's names: Ongoing, PrepareCommit, ...)", labels=["state"])
        if transactions is not None:
            partitions = transactions.partitions
            counts: dict[int, int] = {}
            firsts: dict[int, int] = {}
            states: dict[str, int] = {}
            for transactional_id, metadata in list(transactions.coordinator.txns.items()):
                state_name = STATE_NAMES[metadata.state]
                states[state_name] = states.get(state_name, 0) + 1
                if metadata.state in OPEN_TXN_STATES:
                    partition = partition_for(transactional_id, partitions)
                    counts[partition] = counts.get(partition, 0) + 1
                    if metadata.start_ms >= 0:
                        firsts[partition] = min(firsts.get(partition, metadata.start_ms), metadata.start_ms)
            for partition in range(partitions):
                open_txns.add_metric([str(partition)], counts.get(partition, 0))
            for partition, first in sorted(firsts.items()):
                oldest.add_metric([str(partition)], max(0, now_ms - first) / 1000.0)
            for state_name in STATE_NAMES.values():
                by_state.add_metric([state_name], states.get(state_name, 0))
        yield from (open_txns, oldest, by_state)

    def _groups(self, groups, replicas):
        members = GaugeMetricFamily("onceflow_group_members", "Members of a consumer group", labels=["group"])
        state = GaugeMetricFamily("onceflow_group_state", "A consumer group's state (1 for the state it is in)", labels=["group", "state"])
        generation = GaugeMetricFamily("onceflow_group_generation", "A consumer group's generation", labels=["group"])
        by_state = GaugeMetricFamily("onceflow_groups", "Consumer groups, by state", labels=["state"])
        committed = GaugeMetricFamily("onceflow_group_committed_offset", "A group's committed offset of a partition", labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily("onceflow_group_lag", "High watermark minus the group's committed offset", labels=["group", "topic", "partition"])
        if groups is not None:
            counts: dict[str, int] = {}
            for group_id, group in list(groups.coordinator.groups.items()):
                state_name = group.state.value
                counts[state_name] = counts.get(state_name, 0) + 1
                members.add_metric([group_id], len(group.members))
                state.add_metric([group_id, state_name], 1)
                generation.add_metric([group_id], group.generation)
                for (topic, partition), offset in list(group.offsets.items()):
                    values = [group_id, topic, str(partition)]
                    committed.add_metric(values, offset.offset)
                    # Only an open log: a scrape must not open (and maybe recover) partitions.
                    partition_log = replicas.logs.get((topic, partition)) if replicas is not None else None
                    if partition_log is not None:
                        lag.add_metric(values, max(0, partition_log.high_watermark - offset.offset))
            for name, count in sorted(counts.items()):
                by_state.add_metric([name], count)
        yield from (members, state, generation, by_state, committed, lag)

    def _index_budget(self, budget):
        yield GaugeMetricFamily("onceflow_index_budget_entries", "Offset and time index entries held in memory", value=budget.entries)
        yield GaugeMetricFamily("onceflow_index_budget_max_entries", "The index budget: entries the broker keeps in memory at most", value=budget.max_entries)
        yield GaugeMetricFamily("onceflow_index_budget_loaded_indexes", "Index files held in memory", value=len(budget.held()))


def _open_transaction_starts(transactions) -> dict[tuple[str, int], int]:
    """(topic, partition) -> start time (ms) of the oldest open transaction on
    it, from the coordinator's metadata."""
    starts: dict[tuple[str, int], int] = {}
    if transactions is None:
        return starts
    for metadata in list(transactions.coordinator.txns.values()):
        if metadata.state not in OPEN_TXN_STATES or metadata.start_ms < 0:
            continue
        for partition in metadata.partitions:
            key = (partition.topic, partition.partition)
            starts[key] = min(starts.get(key, metadata.start_ms), metadata.start_ms)
    return starts


__all__ = ["BrokerMetrics", "BrokerStateCollector", "MeasuredDispatch", "MetricsListenError", "error_codes"]
