"""The sink's driver half: the two-phase commit of ``streaming.spark.decision``
run against the brokers for one microbatch (``DriverCommit``).

``commit(messages, N)``: take the query's decision writer over (fencing any
other driver), read this prefix's latest decision read_committed, plan;
before deciding, verify every handle is open at the epoch its task
reported; write the decision in the writer's transaction (the commit
point; none when no task wrote a row: nothing to decide), commit every
decided handle, then abort this run's leftovers (every run's at a run's
first commit). ``abort(messages, N)`` never undoes a
decision. The commit runner (a long-lived Python worker) keeps its clients
from batch to batch (``DriverClients``, ``on_kept_clients``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import attrs

from protocol.constants import CoordinatorType
from protocol.errors import ErrorCode
from protocol.loop_thread import LoopThread
from protocol.messages import ApiKey
from streaming.spark.checkpoint import read_source_offsets
from streaming.spark.crashpoints import AFTER_ALL_COMMITS, AFTER_COMMIT, AFTER_DECISION, BEFORE_DECISION, no_crash
from streaming.spark.decision import (
    BatchTransactionsNotOpenError,
    Decision,
    DecidedTransactionsLostError,
    DriverFencedError,
    HandleState,
    PrefixInUseError,
    SinkError,
    SinkTransaction,
    all_aborted,
    dead_handles,
    driver_transactional_id,
    leftovers,
    lost_message,
    not_open_message,
    plan_abort,
    plan_commit,
    query_prefix,
    still_to_commit,
)
from streaming.spark.options import DEFAULT_TRANSACTION_TIMEOUT_MS, SinkOptions
from streaming.spark.sink_task import SinkCommitMessage
from txn.admin import AsyncAdmin
from txn.config import ProducerConfig
from txn.consumer import AsyncConsumer
from txn.errors import InvalidProducerEpochError, KafkaError, ProducerFencedError
from txn.producer import AsyncProducer, TransactionHandle, offers_transaction_v2
from txn.types import TopicPartition

log = logging.getLogger(__name__)

OFFSETS_PARTITION = "__consumer_offsets"

_ENSURED_DECISION_TOPICS: set[tuple[str, str]] = set()


class DriverClients:
    """The driver's clients for commits: an admin client, the query's
    transactional decision writer and the read_committed consumer that reads
    the latest decision.

    Spark runs every commit of a query in one long-lived Python worker, so
    ``on_kept_clients`` keeps them from batch to batch: connections stay
    open. The decision writer is initialised again at every commit (which
    fences any other driver of the query), and the latest decision is read
    after that, never remembered: another driver, or a recreated topic,
    shows there."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self.admin = AsyncAdmin(config=options.admin_config())
        self.decision_reader = AsyncConsumer(config=options.consumer_config())
        self.decision_writers: dict[str, AsyncProducer] = {}  # query id -> its transactional decision writer

    def decision_writer(self, query_id: str) -> AsyncProducer:
        writer = self.decision_writers.get(query_id)
        if writer is None:
            name = driver_transactional_id(self.options.transactional_id_prefix, query_id)
            writer = self.decision_writers[query_id] = AsyncProducer(config=self.options.producer_config(transactional_id=name))
        return writer

    async def close(self) -> None:
        try:
            for writer in self.decision_writers.values():
                await writer.close()
            await self.decision_reader.close()
        finally:
            await self.admin.close()


# The commit runner's clients, by connection settings and decision topic,
# on one loop thread of this process; a commit that raises drops them (the
# next one starts afresh).
_KEPT_CLIENTS: dict[tuple[ProducerConfig, str], DriverClients] = {}
_KEPT_CLIENTS_LOCK = threading.Lock()
_driver_loop: LoopThread | None = None
# (query, run) pairs whose first commit in this process cleaned up other runs' leftovers.
_CLEANED_RUNS: set[tuple[str, str]] = set()


def on_kept_clients(options: SinkOptions, work):
    """Run ``work(clients)`` (a coroutine function) on this process's kept
    ``DriverClients`` for ``options`` and return its result."""
    global _driver_loop
    key = (options.producer_config(), options.decision_topic)
    with _KEPT_CLIENTS_LOCK:
        if _driver_loop is None:
            _driver_loop = LoopThread("onceflow-spark-driver")
        clients = _KEPT_CLIENTS.get(key)
        if clients is None:
            clients = _KEPT_CLIENTS[key] = _driver_loop.run(DriverClients, options)
        try:
            return _driver_loop.call(work(clients))
        except BaseException:
            del _KEPT_CLIENTS[key]
            try:
                _driver_loop.call(clients.close(), 30)
            except Exception as error:  # the error being raised is the one that matters
                log.info("closing the driver's clients after a failed commit: %s", error)
            raise


class DecisionLog:
    """The sink's decisions: a one-partition compacted topic keyed by the
    prefix (several prefixes may share a ``decisionTopic``: each reads only
    its own key), written by the query's transactional decision writer and
    read read_committed: a decision exists once its transaction committed."""

    SCAN_BACK = 64  # records read back from the end before scanning the whole partition for this prefix's latest

    def __init__(self, options: SinkOptions, clients: DriverClients):
        self.options = options
        self.clients = clients
        self.topic = options.decision_topic
        self.partition = TopicPartition(self.topic, 0)
        self.key = options.transactional_id_prefix.encode()

    async def ensure(self) -> None:
        key = (self.options.bootstrap_servers, self.topic)
        if key in _ENSURED_DECISION_TOPICS:
            return  # Spark reuses the Python worker that commits: once per process
        configs = {"cleanup.policy": "compact"}
        if self.options.decision_topic_min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(self.options.decision_topic_min_insync_replicas)
        await self.clients.admin.create_topics(
            {self.topic: 1}, replication_factor=self.options.decision_topic_replication_factor, configs={self.topic: configs}, exist_ok=True
        )
        _ENSURED_DECISION_TOPICS.add(key)

    async def topic_missing(self) -> bool:
        """Whether the broker says the decision topic does not exist (not
        created, never auto-created); any other answer, a refusal included,
        is False."""
        body = await self.clients.admin.cluster.refresh([self.topic], allow_auto_create=False)
        return any(t["name"] == self.topic and t["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION for t in body["topics"])

    async def latest(self) -> Decision | None:
        """This prefix's last committed decision (or None when it has none)."""
        consumer, tp = self.clients.decision_reader, self.partition
        ends, starts = await asyncio.gather(consumer.end_offsets([tp]), consumer.beginning_offsets([tp]))
        end, start = ends[tp], starts[tp]  # end: the last stable offset (read_committed)
        if end <= start:
            return None
        found = await self._last_of_mine(max(start, end - self.SCAN_BACK), end)
        if found is None and end - self.SCAN_BACK > start:
            found = await self._last_of_mine(start, end)
        return None if found is None else Decision.from_bytes(found)

    async def _last_of_mine(self, first: int, end: int) -> bytes | None:
        consumer, tp = self.clients.decision_reader, self.partition
        if tp not in consumer.assignment():
            consumer.assign([tp])
        consumer.seek(tp, first)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        mine = None
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise SinkError(f"could not read the decisions at {self.topic}-0 up to offset {end}")
            for record in await consumer.poll(1.0):
                if record.offset < end and record.key == self.key:
                    mine = record.value
        return mine

    async def write(self, writer: AsyncProducer, decision: Decision) -> None:
        """Durable and visible when this returns: the decision writer's
        transaction committed (acks=all)."""
        try:
            writer.begin_transaction()
            await writer.send(self.topic, decision.to_bytes(), key=self.key, partition=0)
            await writer.commit_transaction()
        except KafkaError as error:  # fenced shows as such, or inside an abortable error of the send
            if isinstance(error, (ProducerFencedError, InvalidProducerEpochError)) or await self._taken_over(writer):
                raise fenced(decision.query_id, error) from error
            raise

    async def _taken_over(self, writer: AsyncProducer) -> bool:
        """Whether another instance holds the decision writer's id now."""
        try:
            now = (await self.clients.admin.describe_transactions([writer.transactional_id]))[0]
        except (KafkaError, OSError):
            return False
        return (now.producer_id, now.producer_epoch) != (writer.producer_id, writer.producer_epoch)


@attrs.frozen
class Finished:
    """What the completer found and did: the latest decision (None when
    there is none), the transactions it committed now, and those it could
    not commit (with what the broker said)."""

    decision: Decision | None
    committed: tuple[SinkTransaction, ...]
    lost: tuple[tuple[SinkTransaction, str], ...]

    def __str__(self) -> str:
        if self.decision is None:
            return "no decision recorded"
        text = f"batch {self.decision.batch_id} of query {self.decision.query_id}: {len(self.committed)} of {len(self.decision.transactions)} decided transactions committed now"
        if self.lost:
            text += f"; {len(self.lost)} could not be: " + "; ".join(f"{t.transactional_id}: {why}" for t, why in self.lost)
        return text


def finish_decided(options: SinkOptions, timeout: float = 30.0) -> Finished:
    """``DriverCommit.finish_latest`` from synchronous code (the command
    line, the writer at query start), on this process's driver loop."""
    return on_kept_clients(options, lambda clients: asyncio.wait_for(DriverCommit(options, no_crash, clients).finish_latest(), timeout))


def fenced(query_id: str, error: BaseException) -> DriverFencedError:
    return DriverFencedError(
        f"another driver took over query {query_id}'s decisions ({error}): a second driver runs the same checkpoint "
        f"(a stale one after a network partition, or one started twice); this one stops without deciding"
    )


class DriverCommit:
    """commit(messages, N) and abort(messages, N) of one microbatch, on the
    given clients (or its own, closed at the end)."""

    def __init__(self, options: SinkOptions, crash_point=no_crash, clients: DriverClients | None = None):
        self.options = options
        self.crash_point = crash_point
        self.clients = clients

    async def commit(self, messages: list[SinkCommitMessage], batch_id: int) -> None:
        if not messages:
            return
        async with self._clients() as clients:
            await self._commit(clients, messages, batch_id)

    async def abort(self, messages: list[SinkCommitMessage], batch_id: int) -> None:
        async with self._clients() as clients:
            await self._abort_batch(clients, messages, batch_id)

    @contextlib.asynccontextmanager
    async def _clients(self):
        if self.clients is not None:
            yield self.clients
            return
        clients = self.clients = DriverClients(self.options)
        try:
            yield clients
        finally:
            self.clients = None
            await clients.close()

    async def _take_over(self, clients: DriverClients, query_id: str) -> AsyncProducer:
        """Initialise the query's decision writer: any other driver is fenced
        from here on, and a decision write of its still in flight is aborted
        (or, if it was already being committed, completed) before we read."""
        writer = clients.decision_writer(query_id)
        try:
            await writer.init_transactions()
        except (ProducerFencedError, InvalidProducerEpochError) as error:
            raise fenced(query_id, error) from error
        return writer

    async def _states(self, transactions) -> dict[str, HandleState]:
        described = await self.clients.admin.describe_transactions_by_coordinator([t.transactional_id for t in transactions])
        return {name: HandleState("Unknown") if d is None else HandleState(d.state, d.producer_id, d.producer_epoch) for name, d in described.items()}

    async def _commit(self, clients: DriverClients, messages: list[SinkCommitMessage], batch_id: int) -> None:
        query_id, run_id = messages[0].task.query_id, messages[0].task.run_id
        transactions = [m.transaction for m in messages if m.transaction is not None]
        decisions = DecisionLog(self.options, clients)
        await decisions.ensure()
        writer = await self._take_over(clients, query_id)
        latest = await decisions.latest()
        try:
            plan = plan_commit(latest, query_id, batch_id, run_id, transactions)
        except PrefixInUseError:
            await self._abort_each(transactions)
            raise
        decided = plan.commit
        decision = plan.decide
        if plan.reason == "recommit" and transactions and all_aborted(decided, await self._states(decided)):
            # Every decided transaction of this batch is verified aborted, none committed: the re-run recomputed the whole batch.
            log.warning("batch %s: its decided transactions were all aborted (none committed); deciding the re-run's instead", batch_id)
            decision = Decision(query_id, batch_id, run_id, tuple(transactions))
        if decision is not None and self.options.commit_offsets_to_group:
            decision = await self._with_offsets_transaction(decision)
        if decision is not None and not decision.transactions:
            # Nothing to decide: no task wrote a row. A re-run of this batch
            # with rows decides them then; the latest decision stays the one
            # a recommit or the completer needs.
            decision = None
        if decision is not None:
            await self._verify_open(decision, batch_id)
            decided = decision.transactions
            self.crash_point(BEFORE_DECISION)
            await decisions.write(writer, decision)
            self.crash_point(AFTER_DECISION)
        lost = await self._commit_each(decided, batch_id)
        first_of_run = (query_id, run_id) not in _CLEANED_RUNS
        await self._abort_leftovers(clients.admin, query_id, None if first_of_run else run_id, messages, decided)
        _CLEANED_RUNS.add((query_id, run_id))
        if lost:
            raise DecidedTransactionsLostError(lost_message(batch_id, [t for t, _ in lost], len(decided) - len(lost), len(decided), "; ".join(f"{t.transactional_id}: {why}" for t, why in lost)))
        self.crash_point(AFTER_ALL_COMMITS)

    async def commit_job(self, messages: list[SinkCommitMessage]) -> None:
        """A batch write without ``txnAppId``: no replay can name the job
        again, so no decision is kept. Every handle is verified open, then
        committed; what the job's failed task attempts left is aborted."""
        if not messages:
            return
        async with self._clients() as clients:
            task = messages[0].task
            transactions = tuple(m.transaction for m in messages if m.transaction is not None)
            decision = Decision(task.query_id, task.batch_id, task.run_id, transactions)
            await self._verify_open(decision, task.batch_id)
            lost = await self._commit_each(transactions, task.batch_id)
            await self._abort_leftovers(clients.admin, task.query_id, task.run_id, messages, transactions)
            if lost:
                raise DecidedTransactionsLostError(lost_message(task.batch_id, [t for t, _ in lost], len(transactions) - len(lost), len(transactions), "; ".join(f"{t.transactional_id}: {why}" for t, why in lost)))

    async def abort_job(self, job_id: str, messages: list[SinkCommitMessage]) -> None:
        """A failed batch write: abort the handles Spark passes, and every
        other open transaction of the job (a task Spark cancelled while it
        wrote hands nothing back)."""
        async with self._clients() as clients:
            await self._abort_each(m.transaction for m in messages if m.transaction is not None)
            await self._abort_leftovers(clients.admin, job_id, job_id, messages, ())

    async def finish_latest(self) -> "Finished":
        """Commit the decided transactions of this prefix's latest decision
        that are still open, without Spark (the completer). Safe beside a
        live or restarting driver: it never takes the decision writer over
        (a live driver is not fenced), reads only committed decisions, and
        commits only what a decision names, which the driver would commit
        too; a transaction the broker aborted stays for the driver to judge
        (re-decide, or the loud failure). No decision topic means nothing
        was decided; any other failure to read it raises ``SinkError``
        (never "no decision recorded")."""
        async with self._clients() as clients:
            decisions = DecisionLog(self.options, clients)
            try:
                latest = await decisions.latest()
            except KafkaError as error:
                if await decisions.topic_missing():
                    log.info("finish decided: no decision topic %s yet, so nothing was ever decided", decisions.topic)
                    return Finished(None, (), ())
                raise SinkError(f"could not read the decisions at {decisions.topic}-0: {error}") from error
            if latest is None:
                return Finished(None, (), ())
            states = await self._states(latest.transactions)
            open_now = still_to_commit(latest.transactions, states, await self._transaction_v2(latest.transactions))
            lost = await self._commit_each(open_now, latest.batch_id)
            return Finished(latest, tuple(t for t in open_now if t not in {x for x, _ in lost}), tuple(lost))

    async def _transaction_v2(self, transactions) -> bool:
        """Whether the handles' transactions end with an epoch bump: as the
        resumed producer that commits them judges it (its configured
        transaction version, the coordinator's finalized one)."""
        if not transactions:
            return False
        name = transactions[0].transactional_id
        coordinator = await self.clients.admin.cluster.coordinator(name, CoordinatorType.TRANSACTION)
        return self.options.producer_config(transactional_id=name).transaction_version >= 2 and offers_transaction_v2(coordinator)

    async def _verify_open(self, decision: Decision, batch_id: int) -> None:
        """Right before the decision: every handle must be open with the
        producer id and epoch its task reported. If one is not (the broker
        aborted it on its timeout, a fence, anything), abort the rest and
        decide nothing: the batch can still be re-run whole."""
        states = await self._states(decision.transactions)
        dead = dead_handles(decision.transactions, states)
        if not dead:
            return
        dead_names = {t.transactional_id for t, _ in dead}
        await self._abort_each(t for t in decision.transactions if t.transactional_id not in dead_names)
        timeout_ms = int(self.options.kafka_params.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        raise BatchTransactionsNotOpenError(not_open_message(batch_id, dead, len(decision.transactions), timeout_ms))

    async def _abort_batch(self, clients: DriverClients, messages: list[SinkCommitMessage], batch_id: int) -> None:
        """Never undoes a decision: finish a decided batch, abort the rest.
        The decision writer is initialised first, so a decision write of
        this batch whose outcome was unknown is settled before the read."""
        transactions = [m.transaction for m in messages if m.transaction is not None]
        query_id = messages[0].task.query_id if messages else ""
        try:
            if query_id:
                await self._take_over(clients, query_id)
            latest = await DecisionLog(self.options, clients).latest()
        except (KafkaError, SinkError, OSError) as error:
            log.warning("abort of batch %s: decisions unreadable (%s); leaving its transactions to the next commit's cleanup", batch_id, error)
            return
        plan = plan_abort(latest, query_id, batch_id, transactions)
        if plan.finish:
            lost = await self._commit_each(plan.finish, batch_id)
            for transaction, why in lost:
                log.error("abort of decided batch %s: %s could not be committed (%s)", batch_id, transaction.transactional_id, why)
        await self._abort_each(plan.abort)

    async def _commit_each(self, transactions, batch_id: int) -> list[tuple[SinkTransaction, str]]:
        """Commit every decided transaction; returns those that cannot commit
        any more (aborted by a timeout), with what the broker said.

        The first and the second are committed alone, then all the rest at
        once (EndTxn requests side by side over the admin client's
        connections, one per coordinator, whose addresses ``_verify_open``
        found already): three round trips for any number of handles, and a
        crash right after the first or the second commit still finds
        exactly one or two committed (the crash points' "k of n"; from the
        third on, at least k)."""
        transactions = list(transactions)
        lost: list[tuple[SinkTransaction, str]] = []
        errors: list[BaseException] = []
        for group in (transactions[:1], transactions[1:2], transactions[2:]):
            results = await asyncio.gather(*(self._commit_one(t) for t in group), return_exceptions=True)
            for transaction, result in zip(group, results):
                if isinstance(result, BaseException):
                    errors.append(result)
                elif result is not None:
                    lost.append((transaction, result))
            if errors:
                raise errors[0]
        return lost

    async def _commit_one(self, transaction: SinkTransaction) -> str | None:
        """Commit one decided transaction: None, or why it cannot be any more."""
        producer = self._resumed(transaction.handle)
        why = None
        try:
            await producer.commit_transaction()
        except KafkaError as error:
            if isinstance(error, (ProducerFencedError, InvalidProducerEpochError)) or getattr(error, "code", None) in _LOST_CODES:
                why = f"{error} ({await self._describe(transaction.transactional_id)})"
            else:
                raise
        self.crash_point(AFTER_COMMIT)
        return why

    def _resumed(self, handle: TransactionHandle) -> AsyncProducer:
        """A producer bound to ``handle`` on the kept clients' connections."""
        return AsyncProducer.resume(handle, cluster=self.clients.admin.cluster, config=self.options.producer_config(transactional_id=handle.transactional_id))

    async def _describe(self, name: str) -> str:
        try:
            state = (await self.clients.admin.describe_transactions([name]))[0]
            return f"now {state.state} at producer {state.producer_id} epoch {state.producer_epoch}"
        except Exception as error:  # only for the message
            return f"state unknown: {error}"

    async def _abort_each(self, transactions) -> None:
        """Abort them all at once (as ``_commit_each`` commits)."""
        results = await asyncio.gather(*(self._abort(t.handle) for t in transactions), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _abort(self, handle: TransactionHandle) -> None:
        try:
            await self._resumed(handle).abort_transaction()
        except KafkaError as error:  # finished or fenced by someone else: nothing of ours is open there
            log.info("abort of %s: %s", handle.transactional_id, error)

    async def _abort_leftovers(self, admin: AsyncAdmin, query_id: str, run_id: str | None, messages: list[SinkCommitMessage], decided) -> None:
        """Abort this run's open transactions (``run_id`` None: every run's
        of this query, at a run's first commit): failed attempts, the re-run
        of a batch decided earlier, zombie task attempts, a crashed run's.
        Called after every decided transaction is committed, so none of them
        is open; later commits touch only their own run's ids, so a stale
        second driver cannot abort the live one's batch."""
        if not await lists_transactions(admin):
            await self._abort_known_leftovers(messages, decided)
            return
        listed = await admin.list_transactions(states=["Ongoing"])
        names = leftovers([t.transactional_id for t in listed], self.options.transactional_id_prefix, query_id, run_id=run_id)
        if not names:
            return
        described = await admin.describe_transactions(names)
        await self._abort_each(SinkTransaction(s.transactional_id, s.producer_id, s.producer_epoch, (), 0) for s in described if s.state == "Ongoing")

    async def _abort_known_leftovers(self, messages: list[SinkCommitMessage], decided) -> None:
        """For a broker without ListTransactions (Kafka before 3.0, Tansu):
        abort the undecided transactions the messages name. A failed task
        attempt aborts its own transaction as it fails; one whose process
        died, and a crashed run's, cannot be found this way (their ids carry
        Spark's task attempt id): they end at their timeout and hold the
        LSO until then."""
        decided_names = {t.transactional_id for t in decided}
        await self._abort_each(m.transaction for m in messages if m.transaction is not None and m.transaction.transactional_id not in decided_names)

    async def _with_offsets_transaction(self, decision: Decision) -> Decision:
        """Add a transaction carrying the source's end offsets of this batch
        to the consumer group, decided with the data."""
        offsets = read_source_offsets(self.options.checkpoint_location, decision.batch_id)
        name = f"{query_prefix(self.options.transactional_id_prefix, decision.query_id)}{decision.run_id.replace('-', '')[:8]}-{decision.batch_id}-offsets"
        producer = AsyncProducer(config=self.options.producer_config(transactional_id=name))
        try:
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.send_offsets_to_transaction(offsets, self.options.commit_offsets_to_group)
            handle = producer.transaction_handle()
        finally:
            await producer.cluster.abandon()  # its transaction stays open: the decision carries it
        carried = SinkTransaction(handle.transactional_id, handle.producer_id, handle.producer_epoch, (OFFSETS_PARTITION,), 0)
        as_json = {f"{tp[0]}-{tp[1]}": offset for tp, offset in offsets.items()}
        return attrs.evolve(decision, transactions=decision.transactions + (carried,), offsets=as_json)


async def lists_transactions(admin: AsyncAdmin) -> bool:
    """Whether the broker serves ListTransactions (KIP-664, Kafka 3.0)."""
    broker = await admin.cluster.any_broker()
    return ApiKey.LIST_TRANSACTIONS in broker.versions


# What a re-commit of a transaction the broker aborted (it timed out) gets back.
_LOST_CODES = {ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED}


