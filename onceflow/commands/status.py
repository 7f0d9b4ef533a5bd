"""``onceflow status``: one screen of what a pipeline's operator asks first,
over the Kafka wire only (``txn.Admin``), so it works against any
Kafka-protocol broker:

- topics and partitions: log start offset, end offset (high watermark) and
  last stable offset (ListOffsets read_committed answers the LSO; below the
  high watermark it means a transaction is open there);
- consumer groups: state, protocol, members (client id, host, assigned
  partitions) and lag per partition. Lag is counted to the last stable
  offset (``lag``: what a read_committed consumer, as every transactional
  pipeline runs, has left to read) and, beside it, to the high watermark
  (``lag_uncommitted``: what a read_uncommitted one has left);
- open transactions (ListTransactions, DescribeTransactions): transactional
  id, producer id and epoch, state, age, timeout, partitions;
- hanging-transaction candidates: ``txn.Admin.find_hanging_transactions``,
  the rule ``onceflow transactions find-hanging`` shows too (a transaction
  open in a partition that the coordinator does not know as open there, or
  open longer than its transaction timeout). Either holds the partition's
  LSO back; ``onceflow transactions abort`` ends it. Only partitions whose
  LSO is below their end are asked (no other can hold an open transaction).

A broker that lacks an API (Tansu has no ListTransactions nor
DescribeProducers) leaves that section out, saying why (``unavailable``).

``gather()`` returns the whole screen as attrs values (no printing);
``render_text()`` and ``render_json()`` print it. ``--watch [SECONDS]``
redraws until Ctrl-C; ``--json`` prints one JSON document (one per line
under ``--watch``), its keys listed in the README. A failure is one line on
stderr with the client commands' exit status (``onceflow.client_commands``:
2 for an unreachable broker, 1 for a refused request).
"""

from __future__ import annotations

import json
import sys
import time

import attrs

from onceflow.client_commands import (
    CommandError,
    add_bootstrap_option,
    client_options,
    reporting_errors,
)
from txn.admin import HANGING_REASONS, OPEN_TRANSACTION_STATES, HangingTransaction, MemberDescription
from txn.types import TopicPartition

DEFAULT_WATCH_SECONDS = 2.0
TRANSACTION_STATE_TOPIC = "__transaction_state"  # DescribeProducers has nothing to say of it


# -- the screen as values ------------------------------------------------------------------------


@attrs.frozen
class PartitionStatus:
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


@attrs.frozen
class TopicStatus:
    name: str
    internal: bool
    partitions: tuple[PartitionStatus, ...]


@attrs.frozen
class PartitionLag:
    topic: str
    partition: int
    committed_offset: int | None  # None: assigned, nothing committed yet
    high_watermark: int | None  # None: the partition is gone
    last_stable_offset: int | None
    lag: int | None  # last_stable_offset - committed_offset, at least 0
    lag_uncommitted: int | None  # high_watermark - committed_offset, at least 0
    member_id: str | None  # who has it assigned now


@attrs.frozen
class GroupStatus:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]  # txn.admin's, assignment sorted
    offsets: tuple[PartitionLag, ...]
    lag: int  # the sum over partitions with a committed offset


@attrs.frozen
class TransactionStatus:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int
    age_ms: int | None  # since start_time_ms, by this machine's clock; None if not started
    partitions: tuple[TopicPartition, ...]


@attrs.frozen
class Unavailable:
    section: str
    reason: str


@attrs.frozen
class ClusterStatus:
    bootstrap_server: str
    time_ms: int
    topics: tuple[TopicStatus, ...]
    groups: tuple[GroupStatus, ...] | None
    transactions: tuple[TransactionStatus, ...] | None
    transactional_id_states: dict[str, int] | None  # every transactional id's state, counted
    hanging: tuple[HangingTransaction, ...] | None
    unavailable: tuple[Unavailable, ...]


# -- gathering ------------------------------------------------------------------------------------


def gather(admin, *, bootstrap_server: str = "", topics=(), groups=(), include_internal: bool = False, now_ms: int | None = None) -> ClusterStatus:
    """Ask the cluster (through ``admin``, a ``txn.Admin``) for everything the
    screen shows. ``topics`` / ``groups`` narrow it to those (an unknown topic
    raises ``CommandError``); internal topics show only if asked for."""
    from protocol.messages import APIS, ApiKey

    served = admin.api_versions()
    unavailable: list[Unavailable] = []

    def serves(section: str, *api_keys: int) -> bool:
        missing = [APIS[key].name for key in api_keys if key not in served]
        if missing:
            unavailable.append(Unavailable(section, f"the broker does not serve {', '.join(missing)}"))
        return not missing

    listings = {listing.name: listing for listing in admin.topic_listings()}
    unknown = [topic for topic in topics if topic not in listings]
    if unknown:
        raise CommandError(f"unknown topic{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
    shown_topics = sorted(topics) if topics else [name for name, listing in listings.items() if include_internal or not listing.internal]

    group_descriptions, committed = [], {}
    if serves("groups", ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS, ApiKey.OFFSET_FETCH):
        group_ids = list(groups) if groups else [listing.group_id for listing in admin.list_groups()]
        group_descriptions = admin.describe_groups(group_ids) if group_ids else []
        # Every partition named, not "all" (a null topic list): some brokers
        # (Tansu) answer "all" with a null array, which the protocol forbids.
        named = [(name, p) for name, listing in listings.items() if include_internal or not listing.internal or name in topics for p in range(listing.partitions)]
        committed = {group_id: admin.list_group_offsets(group_id, named) if named else {} for group_id in group_ids}

    # One ListOffsets per leader and isolation for every partition shown anywhere.
    wanted = {TopicPartition(name, p) for name in shown_topics for p in range(listings[name].partitions)}
    for group in group_descriptions:
        wanted |= {tp for member in group.members for tp in member.assignment if tp.topic in listings}
        wanted |= {tp for tp in committed[group.group_id] if tp.topic in listings}
    if topics:
        wanted = {tp for tp in wanted if tp.topic in topics}
    offsets = _offsets(admin, sorted(wanted))

    topic_status = tuple(
        TopicStatus(name, listings[name].internal, tuple(PartitionStatus(p, *offsets[TopicPartition(name, p)]) for p in range(listings[name].partitions)))
        for name in shown_topics
    )
    group_status = None
    if not any(u.section == "groups" for u in unavailable):
        group_status = tuple(_group_status(group, committed[group.group_id], offsets, topics) for group in group_descriptions)

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    transactions = states = hanging = None
    if serves("transactions", ApiKey.LIST_TRANSACTIONS, ApiKey.DESCRIBE_TRANSACTIONS):
        listed = admin.list_transactions()
        states = {}
        for listing in listed:
            states[listing.state] = states.get(listing.state, 0) + 1
        transactions = _open_transactions(admin, [t.transactional_id for t in listed if t.state in OPEN_TRANSACTION_STATES], now_ms)
        if topics:
            transactions = tuple(t for t in transactions if not t.partitions or any(p.topic in topics for p in t.partitions))
        if serves("hanging", ApiKey.DESCRIBE_PRODUCERS):
            # Only a partition whose LSO is below its end has a transaction
            # open in it: DescribeProducers goes to those alone.
            scanned = [TopicPartition(name, p) for name in (topics or listings) if name != TRANSACTION_STATE_TOPIC for p in range(listings[name].partitions)]
            offsets.update(_offsets(admin, [tp for tp in scanned if tp not in offsets]))
            unstable = [tp for tp in scanned if offsets[tp][2] < offsets[tp][1]]
            hanging = tuple(admin.find_hanging_transactions(unstable, now_ms=now_ms))
    elif not any(u.section == "hanging" for u in unavailable):
        unavailable.append(Unavailable("hanging", "needs the transactions section"))
    return ClusterStatus(bootstrap_server, now_ms, topic_status, group_status, transactions, states, hanging, tuple(unavailable))


def _offsets(admin, partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int, int]]:
    """``{partition: (log start, high watermark, last stable offset)}``."""
    if not partitions:
        return {}
    earliest = admin.list_offsets({tp: "earliest" for tp in partitions}, isolation_level="read_uncommitted")
    high = admin.list_offsets({tp: "latest" for tp in partitions}, isolation_level="read_uncommitted")
    stable = admin.list_offsets({tp: "latest" for tp in partitions}, isolation_level="read_committed")
    return {tp: (earliest[tp].offset, high[tp].offset, stable[tp].offset) for tp in partitions}


def _group_status(group, committed: dict, offsets: dict, topics) -> GroupStatus:
    owner = {tp: member.member_id for member in group.members for tp in member.assignment}
    rows = set(owner) | set(committed)
    if topics:
        rows = {ref for ref in rows if ref.topic in topics}
    lags = []
    for ref in sorted(rows):
        found = committed.get(ref)
        committed_offset = found.offset if found is not None else None
        _start, high, stable = offsets.get(ref, (None, None, None))
        # Never below 0: an offset committed past the LSO (by a
        # read_uncommitted consumer) leaves nothing to read there, and a
        # negative row would hide other partitions' lag in the group's total.
        lag = max(0, stable - committed_offset) if committed_offset is not None and stable is not None else None
        lag_uncommitted = max(0, high - committed_offset) if committed_offset is not None and high is not None else None
        lags.append(PartitionLag(ref.topic, ref.partition, committed_offset, high, stable, lag, lag_uncommitted, owner.get(ref)))
    members = tuple(attrs.evolve(member, assignment=tuple(sorted(member.assignment))) for member in group.members)
    return GroupStatus(group.group_id, group.state, group.protocol_type, group.protocol, members, tuple(lags), sum(row.lag for row in lags if row.lag is not None))


def _open_transactions(admin, transactional_ids: list[str], now_ms: int) -> tuple[TransactionStatus, ...]:
    from protocol.errors import ErrorCode
    from txn.errors import KafkaError

    found = []
    for transactional_id in transactional_ids:
        try:
            [description] = admin.describe_transactions([transactional_id])
        except KafkaError as error:
            if error.code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                continue  # expired between the listing and now
            raise
        if description.state not in OPEN_TRANSACTION_STATES:
            continue  # completed between the listing and now
        found.append(_transaction_status(description, now_ms))
    return tuple(found)


def _transaction_status(description, now_ms: int) -> TransactionStatus:
    return TransactionStatus(
        description.transactional_id, description.producer_id, description.producer_epoch, description.state, description.timeout_ms,
        description.start_time_ms, now_ms - description.start_time_ms if description.start_time_ms >= 0 else None,
        tuple(sorted(description.partitions)),
    )


# -- rendering ------------------------------------------------------------------------------------


def as_document(status: ClusterStatus) -> dict:
    """The JSON document: attrs field names as keys, in field order."""
    return attrs.asdict(status)


def render_json(status: ClusterStatus, *, one_line: bool = False) -> str:
    return json.dumps(as_document(status), indent=None if one_line else 2) + "\n"


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _table(header: tuple[str, ...], rows: list[tuple], indent: str = "") -> list[str]:
    cells = [tuple("-" if value is None else str(value) for value in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [indent + "  ".join(value.ljust(widths[i]) for i, value in enumerate(row)).rstrip() for row in cells]


def render_text(status: ClusterStatus) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(status.time_ms / 1000))
    lines = [f"onceflow status of {status.bootstrap_server} at {stamp}", ""]

    lines.append(f"TOPICS ({len(status.topics)})  END = high watermark; LSO = last stable offset (read_committed reads stop there; below END: a transaction is open)")
    rows = [(topic.name, p.partition, p.log_start_offset, p.high_watermark, p.last_stable_offset, p.high_watermark - p.last_stable_offset or "") for topic in status.topics for p in topic.partitions]
    lines += _table(("TOPIC", "PARTITION", "LOG-START", "END", "LSO", "UNSTABLE"), rows, "  ") if rows else ["  none"]
    lines.append("")

    if status.groups is not None:
        lines.append(f"GROUPS ({len(status.groups)})  LAG = LSO - committed (what a read_committed consumer has left); LAG-UNCOMMITTED = END - committed")
        if not status.groups:
            lines.append("  none")
        for group in status.groups:
            protocol = f"{group.protocol_type}/{group.protocol}" if group.protocol else group.protocol_type or "-"
            lines.append(f"  {group.group_id}  state {group.state}  protocol {protocol}  members {len(group.members)}  lag {group.lag}")
            if group.members:
                lines += _table(("MEMBER-ID", "CLIENT-ID", "HOST", "PARTITIONS"), [(m.member_id, m.client_id, m.host, ",".join(map(str, m.assignment)) or "-") for m in group.members], "    ")
            if group.offsets:
                lines += _table(
                    ("TOPIC", "PARTITION", "COMMITTED", "LSO", "END", "LAG", "LAG-UNCOMMITTED", "MEMBER-ID"),
                    [(o.topic, o.partition, o.committed_offset, o.last_stable_offset, o.high_watermark, o.lag, o.lag_uncommitted, o.member_id) for o in group.offsets],
                    "    ",
                )
        lines.append("")

    if status.transactions is not None:
        counted = ", ".join(f"{count} {state}" for state, count in sorted(status.transactional_id_states.items())) or "none"
        lines.append(f"OPEN TRANSACTIONS ({len(status.transactions)})  transactional ids by state: {counted}")
        rows = [(t.transactional_id, t.producer_id, t.producer_epoch, t.state, _duration(t.age_ms), _duration(t.timeout_ms), ",".join(map(str, t.partitions)) or "-") for t in status.transactions]
        lines += _table(("TRANSACTIONAL-ID", "PRODUCER-ID", "EPOCH", "STATE", "AGE", "TIMEOUT", "PARTITIONS"), rows, "  ") if rows else ["  none"]
        lines.append("")

    if status.hanging is not None:
        lines.append(f"HANGING TRANSACTION CANDIDATES ({len(status.hanging)})  (onceflow transactions abort ends one)")
        rows = [(f"{h.topic}-{h.partition}", h.producer_id, h.producer_epoch, h.coordinator_epoch, h.start_offset, HANGING_REASONS[h.reason]) for h in status.hanging]
        lines += _table(("PARTITION", "PRODUCER-ID", "EPOCH", "COORDINATOR-EPOCH", "START-OFFSET", "WHY"), rows, "  ") if rows else ["  none"]
        lines.append("")

    for missing in status.unavailable:
        lines.append(f"({missing.section}: not shown, {missing.reason})")
    return "\n".join(lines).rstrip("\n") + "\n"


# -- the command ------------------------------------------------------------------------------------


def _watch_seconds(text: str) -> float:
    import argparse

    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--watch wants seconds, not {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError("--watch wants a positive number of seconds")
    return seconds


def add_arguments(parser) -> None:
    add_bootstrap_option(parser)  # and the security options every client command takes
    parser.add_argument("--watch", nargs="?", type=_watch_seconds, const=DEFAULT_WATCH_SECONDS, default=None, metavar="SECONDS", help=f"redraw every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C")
    parser.add_argument("--json", action="store_true", help="print one JSON document (one per line under --watch) for scripts")
    parser.add_argument("--group", action="append", default=[], metavar="G", help="show only this group (repeatable)")
    parser.add_argument("--topic", action="append", default=[], metavar="T", help="show only this topic, in every section (repeatable)")
    parser.add_argument("--include-internal", action="store_true", help="also list __consumer_offsets and __transaction_state")


def run(args) -> int:
    """Draw once (or, with ``--watch``, until Ctrl-C, which exits 0); a
    failure before the first screen is one line and the client commands'
    exit status (``reporting_errors``: 2 unreachable, 1 refused)."""
    from txn import Admin
    from txn.errors import TRANSIENT_ERRORS, KafkaError

    out = sys.stdout
    clear = args.watch is not None and not args.json and out.isatty()

    def draw(admin) -> None:
        status = gather(admin, bootstrap_server=args.bootstrap_server, topics=args.topic, groups=args.group, include_internal=args.include_internal)
        text = render_json(status, one_line=args.watch is not None) if args.json else render_text(status)
        if clear:
            out.write("\x1b[H\x1b[2J")
        out.write(text)
        out.flush()

    def watch(admin) -> int:
        try:
            while True:
                time.sleep(args.watch)
                if not clear and not args.json:
                    out.write("\n")
                try:
                    draw(admin)
                except (*TRANSIENT_ERRORS, KafkaError, CommandError) as error:
                    # Keep watching: the broker may come back.
                    print(f"onceflow status: {error} (retrying every {args.watch:g}s)", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            return 0  # Ctrl-C is how --watch ends

    def status() -> int:
        with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
            draw(admin)
            return watch(admin) if args.watch is not None else 0

    return reporting_errors("status", args, status)
