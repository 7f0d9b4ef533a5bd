"""Helpers of the runner's tests: the payments workload (input with a history
for the checker, expected outputs and balances), app instances as real
processes running ``examples/payments_pipeline.py`` through ``onceflow run``,
and reading outputs, changelogs and SQLite files back."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import time

from faults.checker import check
from faults.history import HistoryWriter, read_histories
from faults.process import REPO, ClientProcess
from streaming.store import decode_key, decode_value
from tests.helpers import read_all
from txn import Admin, Producer, TopicPartition

APP_ID = "payments-pipeline"
CHANGELOG = f"{APP_ID}-balances-changelog"
BROKER_CONFIG = ("group.min.session.timeout.ms=1000", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")
BALANCES_APP = os.path.join(REPO, "tests", "streaming", "runner_apps", "balances.py")


def payments(records: int, seed: int, accounts: int = 40, start: int = 0) -> list[tuple[str, str]]:
    """(account, "payment-id:account:amount") events."""
    rng = random.Random(seed)
    events = []
    for number in range(start, start + records):
        account = f"acct-{rng.randrange(accounts):03d}"
        events.append((account, f"p{number:07d}:{account}:{rng.choice([-1, 1]) * rng.randrange(1, 5000)}"))
    return events


def expected(events) -> tuple[dict[str, str], dict[str, int]]:
    """(input value -> output value, final balance per account)."""
    balances: dict[str, int] = {}
    outputs = {}
    for account, value in events:
        payment_id, _account, amount = value.split(":")
        balances[account] = balances.get(account, 0) + int(amount)
        outputs[value] = f"{payment_id}:{account}:{balances[account]}"
    return outputs, balances


def create_topics(bootstrap: str, partitions: int = 3) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({"payments": partitions, "balances": partitions})


def send_payments(bootstrap: str, events, history_dir: str | None = None, *, rate: float | None = None) -> None:
    """Write the events (keyed by account) with an idempotent producer; with
    ``history_dir``, record the acknowledged sends for the checker."""
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=5, retry_backoff_ms=50, delivery_timeout_ms=120_000)
    started = time.monotonic()
    futures = []
    for index, (account, value) in enumerate(events):
        if rate:
            pause = started + index / rate - time.monotonic()
            if pause > 0.005:
                time.sleep(pause)
        futures.append((value, producer.send("payments", value.encode(), key=account.encode())))
    producer.flush()
    if history_dir is not None:
        os.makedirs(history_dir, exist_ok=True)
        writer = HistoryWriter(os.path.join(history_dir, f"seeder-{time.monotonic_ns()}.jsonl"), "seeder")
        for value, future in futures:
            metadata = future.result(120)
            writer.event("ok", "send", [["send", f"payments-{metadata.partition}", value, metadata.offset]])
        writer.close()
    producer.close()


def read_into_history(bootstrap: str, topic: str, partitions: int, history_dir: str, *, idle: float = 1.5) -> list:
    """``tests.helpers.read_all`` whose polls go to the history in
    ``history_dir`` as the checker's final read."""
    writer = HistoryWriter(os.path.join(history_dir, "final-reader.jsonl"), "final-reader")

    def record_poll(got) -> None:
        reads: dict[str, list] = {}
        for record in got:
            reads.setdefault(f"{topic}-{record.partition}", []).append([record.offset, record.value.decode()])
        writer.event("ok", "poll", [["poll", reads]])

    try:
        return read_all(bootstrap, topic, partitions, idle=idle, on_poll=record_poll)
    finally:
        writer.close()


def changelog_state(bootstrap: str, partitions: int = 3) -> dict:
    """The store's contents as its changelog says (last value per key)."""
    state = {}
    for record in read_all(bootstrap, CHANGELOG, partitions, idle=1.0):
        key = decode_key(record.key)
        if record.value is None:
            state.pop(key, None)
        else:
            state[key] = decode_value(record.value)
    return state


def changelog_by_partition(bootstrap: str, partitions: int) -> dict[int, dict]:
    """The store's contents per partition as its changelog says."""
    state: dict[int, dict] = {p: {} for p in range(partitions)}
    for record in read_all(bootstrap, CHANGELOG, partitions, idle=1.0):
        if record.value is None:
            state[record.partition].pop(decode_key(record.key), None)
        else:
            state[record.partition][decode_key(record.key)] = decode_value(record.value)
    return state


def check_state(bootstrap: str, partitions: int, balances: dict, state_dirs: list[str]) -> int:
    """The changelog holds the final balances; every SQLite file at its
    changelog's end holds exactly its partition's. Returns how many files were current."""
    by_partition = changelog_by_partition(bootstrap, partitions)
    merged = {k: v for contents in by_partition.values() for k, v in contents.items()}
    assert merged == balances, "the changelog's last values are not the balances the input implies"
    with Admin(bootstrap_servers=bootstrap) as admin:
        ends = {tp.partition: listed.offset for tp, listed in admin.list_offsets({TopicPartition(CHANGELOG, p): "latest" for p in range(partitions)}).items()}
    current = 0
    for state_dir in state_dirs:
        for partition, (offset, contents) in sqlite_state(state_dir).items():
            assert offset <= ends[partition], f"{state_dir} file {partition} at {offset}, ahead of the changelog's end {ends[partition]}"
            if offset >= ends[partition] - 1:  # only the last transaction's marker may follow
                current += 1
                assert contents == by_partition[partition], f"{state_dir} file {partition} is at the end but holds other balances"
    return current


def sqlite_state(state_dir: str, store: str = "balances") -> dict[int, tuple[int, dict]]:
    """partition -> (next_offset, contents) of every SQLite file of a state dir."""
    out = {}
    folder = os.path.join(state_dir, "stores")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not (name.startswith(store + "-") and name.endswith(".sqlite")):
            continue
        partition = int(name[len(store) + 1 : -len(".sqlite")])
        db = sqlite3.connect(os.path.join(folder, name))
        try:
            has_position = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'position'").fetchone() is not None
            row = db.execute("SELECT next_offset FROM position").fetchone() if has_position else None
            if row is None:
                # killed (or read) between creating the file and its first position row: the
                # runner opens such a file as empty at offset 0 (StoreFile._open)
                out[partition] = (0, {})
                continue
            (offset,) = row
            contents = {decode_key(k): decode_value(v) for k, v in db.execute("SELECT key, value FROM entries")}
        finally:
            db.close()
        out[partition] = (offset, contents)
    return out


def app_process(name: str, bootstrap: str, state_dir: str, log_dir: str, *, env: dict | None = None, until_idle: float | None = None, extra: dict | None = None, progress: float = 2.0) -> ClientProcess:
    """An instance of the balances app as a child process (``onceflow run``)."""
    command = [sys.executable, "-m", "onceflow", "run", BALANCES_APP, "--progress-interval", str(progress)]
    if until_idle is not None:
        command += ["--until-idle", str(until_idle)]
    environment = {"PYTHONPATH": REPO, "RUNNER_TEST_BOOTSTRAP": bootstrap, "RUNNER_TEST_STATE_DIR": state_dir, "RUNNER_TEST_OPTIONS": json.dumps(extra or {})}
    environment.update(env or {})
    return ClientProcess(name, command, os.path.join(log_dir, f"{name}.log"), env=environment)


def verdict_of(history_dir: str, outputs: dict[str, str]):
    return check(read_histories(history_dir), input_topic="payments", output_topic="balances", transform=outputs.get)


def log_text(process: ClientProcess) -> str:
    with open(process.log_path, encoding="utf-8", errors="replace") as file:
        return file.read()
