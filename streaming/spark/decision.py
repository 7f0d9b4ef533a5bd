"""The exactly-once sink's commit protocol, without I/O: what the driver
decides for a microbatch, given the last decision it finds durable.

Executors each leave one open Kafka transaction per Spark partition and hand
its names back (``SinkTransaction``). The driver's ``commit(messages, N)``
then runs two-phase commit with a *decision record* as its log:

1. read the latest decision of this sink (``Decision``, one per prefix);
2. ``plan_commit`` says what to do: decide batch N with the handles at hand
   (write the record first, it is the commit point), or, when N was decided
   before a crash, re-commit the decided handles instead of the new ones;
3. commit every decided handle (a re-commit answers NONE);
4. abort the leftovers: every open transaction of this query that is not
   decided (``leftovers``): failed task attempts, the re-run's transactions
   of a batch decided earlier, a crashed run's transactions.

The batch is taken whole or not at all, so nothing depends on Spark giving
a partition the same rows when it re-runs a batch (SPARK-28650).

| latest decision found | batch N | what happens |
| --- | --- | --- |
| none, or an older batch of this query | decide | every new handle verified open (``dead_handles``), then write (query, N, new handles), commit them; with no handle at all (no task wrote a row) the driver writes nothing |
| batch N of this query | recommit | commit the decided handles; the new ones are leftovers |
| batch N, every decided handle verified aborted, none committed | redecide | the re-run recomputed the whole batch: decide its handles instead |
| a later batch of this query | done | N was committed before the later one was decided; nothing to commit |
| another query's | refuse | ``PrefixInUseError``: two queries must not share a prefix |

``abort(messages, N)`` (Spark calls it when a task failed, and after a
commit that raised) never undoes a decision: ``plan_abort`` finishes a
decided batch and aborts only undecided handles, and aborts nothing when
the latest decision is another query's.

Transactional ids (``transactional_id``) are unique to the run, batch,
stage attempt, partition and task attempt, so a task attempt Spark gave up
on (a lost executor, a speculative loser, a task of a failed stage attempt)
can only ever fence its own transaction, never one handed to the driver.
The driver writes decisions through a transactional producer of the query's
own (``driver_transactional_id``), initialised at every commit, so a second
driver on the same checkpoint fences the first and an in-doubt decision
write of a fenced driver can never commit.
"""

from __future__ import annotations

import json

import attrs

from txn.producer import TransactionHandle

DECISION_FORMAT = 1


class SinkError(Exception):
    """The sink cannot go on; the message says why and what to do."""


class PrefixInUseError(SinkError):
    pass


class DecidedTransactionsLostError(SinkError):
    pass


class BatchTransactionsNotOpenError(SinkError):
    """Some of a batch's transactions were no longer open when the driver
    came to decide: nothing was decided, the rest were aborted; a restart
    re-runs the batch."""


class DriverFencedError(SinkError):
    """Another driver took over this query's decisions (a second driver on
    the same checkpoint): this one stops."""


@attrs.frozen
class SinkTransaction:
    """One task's open transaction, as the task hands it to the driver."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[str, ...] = ()  # "topic-partition" written in it
    records: int = 0

    @property
    def handle(self) -> TransactionHandle:
        return TransactionHandle(self.transactional_id, self.producer_id, self.producer_epoch)

    def to_json(self) -> dict:
        return {"id": self.transactional_id, "pid": self.producer_id, "epoch": self.producer_epoch, "partitions": list(self.partitions), "records": self.records}

    @classmethod
    def from_json(cls, data: dict) -> "SinkTransaction":
        return cls(data["id"], int(data["pid"]), int(data["epoch"]), tuple(data.get("partitions", ())), int(data.get("records", 0)))


@attrs.frozen
class Decision:
    """The durable record that batch ``batch_id`` of ``query_id`` commits
    exactly ``transactions``. Written before the first commit."""

    query_id: str
    batch_id: int
    run_id: str
    transactions: tuple[SinkTransaction, ...]
    offsets: dict | None = attrs.field(default=None, eq=False)  # the source's end offsets, when committed to a group

    def to_bytes(self) -> bytes:
        body = {"format": DECISION_FORMAT, "query": self.query_id, "batch": self.batch_id, "run": self.run_id, "transactions": [t.to_json() for t in self.transactions]}
        if self.offsets is not None:
            body["offsets"] = self.offsets
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Decision":
        body = json.loads(data)
        if body.get("format") != DECISION_FORMAT:
            raise SinkError(f"decision record of unknown format {body.get('format')!r}: written by a newer onceflow?")
        return cls(body["query"], int(body["batch"]), body["run"], tuple(SinkTransaction.from_json(t) for t in body["transactions"]), body.get("offsets"))


@attrs.frozen
class HandleState:
    """What the transaction coordinator says of one handle's id now
    (DescribeTransactions), or ``state`` "Unknown" when it knows no such id."""

    state: str
    producer_id: int = -1
    producer_epoch: int = -1


OPEN_STATES = ("Ongoing",)
COMMITTING_STATES = ("PrepareCommit", "CompleteCommit")
ABORTED_STATES = ("PrepareAbort", "CompleteAbort")


def dead_handles(transactions, states: dict) -> list[tuple[SinkTransaction, str]]:
    """The handles that are not open with the producer id and epoch the task
    reported (``states``: transactional id -> ``HandleState``), with why."""
    dead = []
    for transaction in transactions:
        now = states.get(transaction.transactional_id, HandleState("Unknown"))
        if now.state not in OPEN_STATES or (now.producer_id, now.producer_epoch) != (transaction.producer_id, transaction.producer_epoch):
            dead.append((transaction, f"{now.state} at producer {now.producer_id} epoch {now.producer_epoch}, handed over at producer {transaction.producer_id} epoch {transaction.producer_epoch}"))
    return dead


def all_aborted(transactions, states: dict) -> bool:
    """Whether every decided transaction is verified aborted (none can have
    committed): the same producer, at the handle's epoch or a later one, in
    an abort state. An id the coordinator no longer knows cannot tell."""
    for transaction in transactions:
        now = states.get(transaction.transactional_id, HandleState("Unknown"))
        if now.producer_id != transaction.producer_id:
            return False
        if now.state in ABORTED_STATES and now.producer_epoch >= transaction.producer_epoch:
            continue
        return False
    return bool(transactions)


def still_to_commit(transactions, states: dict, transaction_v2: bool) -> tuple[SinkTransaction, ...]:
    """The decided transactions the completer commits now: those still open
    at the producer id and epoch their task reported, or already being
    committed (PrepareCommit, which the commit's EndTxn settles). With
    transaction version 2 (KIP-890 part 2) the EndTxn that decides a commit
    writes PrepareCommit at the next epoch, so a handle of epoch e shows
    there at e + 1; with version 1 the epoch stays, and e + 1 would be a
    later transaction of another producer of that id."""
    pending = []
    for transaction in transactions:
        now = states.get(transaction.transactional_id, HandleState("Unknown"))
        if now.producer_id != transaction.producer_id:
            continue
        if now.state in OPEN_STATES and now.producer_epoch == transaction.producer_epoch:
            pending.append(transaction)
        elif now.state == "PrepareCommit" and now.producer_epoch == transaction.producer_epoch + (1 if transaction_v2 else 0):
            pending.append(transaction)
    return tuple(pending)


def not_open_message(batch_id: int, dead: list[tuple[SinkTransaction, str]], total: int, timeout_ms: int) -> str:
    return (
        f"batch {batch_id}: {len(dead)} of its {total} transactions were no longer open when the driver came to decide "
        f"({'; '.join(f'{t.transactional_id}: {why}' for t, why in dead)}). Nothing was decided and the batch's other "
        f"transactions were aborted; restarting the query re-runs the batch. A transaction the broker aborted on its timeout "
        f"means the batch took longer than kafka.transaction.timeout.ms ({timeout_ms} ms): raise it, or set maxOffsetsPerTrigger "
        f"to make batches smaller."
    )


@attrs.frozen
class CommitPlan:
    decide: Decision | None  # the record to write first, or None when nothing new is decided
    commit: tuple[SinkTransaction, ...]  # decided transactions to commit (again)
    reason: str


@attrs.frozen
class AbortPlan:
    finish: tuple[SinkTransaction, ...]  # decided: commit, never abort
    abort: tuple[SinkTransaction, ...]


def plan_commit(latest: Decision | None, query_id: str, batch_id: int, run_id: str, transactions, offsets: dict | None = None) -> CommitPlan:
    """What ``commit(messages, batch_id)`` does, given the latest decision."""
    transactions = tuple(transactions)
    if latest is not None and latest.query_id != query_id:
        raise PrefixInUseError(
            f"transactionalIdPrefix is in use by query {latest.query_id} (its batch {latest.batch_id} is the last decided), "
            f"and this is query {query_id}: give every query (every checkpoint) its own transactionalIdPrefix"
        )
    if latest is None or latest.batch_id < batch_id:
        return CommitPlan(Decision(query_id, batch_id, run_id, transactions, offsets), transactions, "decide")
    if latest.batch_id == batch_id:
        return CommitPlan(None, latest.transactions, "recommit")
    return CommitPlan(None, (), "done")


def plan_abort(latest: Decision | None, query_id: str, batch_id: int, transactions) -> AbortPlan:
    """What ``abort(messages, batch_id)`` does: a decided batch is finished,
    whatever Spark thinks; only undecided transactions are aborted. When the
    latest decision is another query's, nothing is aborted (this driver
    cannot tell what is decided; the next commit refuses the prefix)."""
    transactions = tuple(transactions)
    if latest is not None and latest.query_id != query_id:
        return AbortPlan((), ())
    if latest is not None and latest.batch_id == batch_id:
        decided = {t.transactional_id for t in latest.transactions}
        return AbortPlan(latest.transactions, tuple(t for t in transactions if t.transactional_id not in decided))
    return AbortPlan((), transactions)


def query_prefix(prefix: str, query_id: str) -> str:
    """Every transactional id of one query starts with this, so the cleanup
    of one query never touches another's transactions."""
    return f"{prefix}-{query_id.replace('-', '')[:12]}-"


def run_prefix(prefix: str, query_id: str, run_id: str) -> str:
    """Every transactional id of one run of a query starts with this."""
    return f"{query_prefix(prefix, query_id)}{run_id.replace('-', '')[:8]}-"


def transactional_id(prefix: str, query_id: str, run_id: str, batch_id: int, partition: int, attempt: int = 0, task_attempt_id: int = -1) -> str:
    """A task's transactional id, unique to its run, batch, partition and
    task attempt: no task attempt, however late (a lost executor's, a
    speculative loser, a task of a failed stage attempt still running),
    shares an id with a transaction handed to the driver, so its
    InitProducerId can only fence itself. The attempt is Spark's
    ``taskAttemptId`` (unique to every task attempt of the application,
    across stage attempts, which PySpark's TaskContext does not number),
    else the attempt number. Re-committing an earlier run's handle stays
    idempotent (the run id changes per start). The broker keeps one id per
    task and batch until ``transactional.id.expiration.ms``."""
    name = f"{run_prefix(prefix, query_id, run_id)}{batch_id}-{partition}"
    if task_attempt_id >= 0:
        return f"{name}-t{task_attempt_id}"
    return name if attempt == 0 else f"{name}-a{attempt}"


def driver_transactional_id(prefix: str, query_id: str) -> str:
    """The id of the query's decision writer: one per query, so whichever
    driver initialised it last holds it and any other is fenced."""
    return f"{query_prefix(prefix, query_id)}driver"


def leftovers(open_transactional_ids, prefix: str, query_id: str, keep=(), run_id: str | None = None) -> list[str]:
    """The open transactions of this query to abort: everything with the
    query's prefix (only ``run_id``'s, when given) except ``keep`` and the
    driver's own decision writer."""
    mine = run_prefix(prefix, query_id, run_id) if run_id is not None else query_prefix(prefix, query_id)
    kept = set(keep) | {driver_transactional_id(prefix, query_id)}
    return sorted(t for t in open_transactional_ids if t.startswith(mine) and t not in kept)


def lost_message(batch_id: int, lost: list[SinkTransaction], committed: int, total: int, detail: str) -> str:
    records = sum(t.records for t in lost)
    partitions = sorted({p for t in lost for p in t.partitions})
    return (
        f"batch {batch_id} was decided but {len(lost)} of its {total} transactions can no longer be committed "
        f"({committed} committed): {records} records written to {', '.join(partitions) or 'no partition'} are lost "
        f"(transactions {', '.join(t.transactional_id for t in lost)}; {detail}). The transaction timed out before the driver "
        f"came back: kafka.transaction.timeout.ms must exceed a batch's duration plus the longest restart. "
        f"The query cannot restart from this checkpoint without losing these records."
    )
