"""How long each fault of a chaos run stopped the pipeline: a pure function
over the run's history (committed outputs and faults at known times, in
seconds since the run started), no I/O.

Definitions (the report, verdict.json and the README use these words):

- **committed output**: records that became visible to a read_committed
  reader, at the moment their transaction committed (the copier's ``ok txn``
  event, a send's acknowledgement, a watcher seeing them).
- **level** before a fault at ``t``: the median of the committed records in
  each whole 1 s window of the 5 s before it, ``[t-5, t-4) ... [t-1, t)``
  (fewer windows when the run is younger than 5 s). A median, so one slow
  second does not set it. When it is 0 (the pipeline was already stalled,
  by the fault before, or had not started), the level is the median over
  every whole 1 s window of the run instead: what a steady input makes it
  produce.
- **rate back** (``rate_back_s``): from the fault to the start ``s`` of the
  first 1 s window ``[s, s+1]`` holding at least 80 % of the level
  (``RETURN_FRACTION``) and at least one record, where ``s`` is the fault's
  moment or a committed output after it. A fault that changed nothing has 0.
- **first output** (``first_output_s``): from the fault to the first
  committed output after it, by anyone.
- **cleared**: when the fault stopped acting: the restarted broker listening
  (after recovering its logs), a paused process continued, the proxy's delay
  lifted, the killed client's process started again. ``first_after_clear_s``
  is from then to the first committed output by the victim (the restarted
  client instance's, for a client fault, when outputs say who committed
  them; anyone's for a broker or network fault, or when they do not). These are what the targets are stated in (README: "Availability").
- **stall**: a stretch with no committed output, between two outputs (or the
  last output and the end of the faulted run). ``stall_outside_faults`` is
  the longest part of any stall while no fault was in progress (outside
  every ``[at, cleared]``): what the pipeline loses on its own.
- **per instance** (a client fault on a group of instances whose committed
  input positions are sampled per partition, the streaming workload's):
  a fault's **window** is ``[at, next)``: from the fault's moment to the
  next fault's moment (of any kind), or to the end of the faulted run for
  the last one. ``survivors_stall_s`` is the longest stretch in which no
  partition the victim did not hold advanced while one of them had input
  waiting (its end beyond its committed offset), clipped to the fault's
  window: only the part of a stretch at or after ``at`` and before
  ``next`` counts, so a stall that the fault before caused (the previous
  victim's recovery) or the next fault's outage is not charged to this
  one. It is what the fault cost the others (a workload fed in phases may
  leave them nothing to do while the victim is away, which is not a
  stall); ``victim_back_s`` is from the
  fault cleared (the victim started again) to the first advance of a
  partition it held, beyond where they stood once it was dead.
- **in flight**: at the fault, input was arriving (records acknowledged
  into the input within ``ARRIVING_WINDOW`` = 1 s either side of it, or
  sent before it and acknowledged after it: a record held up by the fault
  before this one, the broker still recovering) or waiting (more
  acknowledged than the workload had consumed and committed).
  A pipeline that keeps up has almost nothing waiting at any instant, so
  arriving counts too; a fault on an idle workload (its input all fed and
  consumed, or not begun) proves nothing, and the harness reports it as
  ``idle-fault``.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence

import attrs

LEVEL_SECONDS = 5  # whole 1 s windows before the fault whose median is the level
RATE_WINDOW = 1.0
RETURN_FRACTION = 0.8
ARRIVING_WINDOW = 1.0  # input acknowledged this close to a fault means the fault hit a live stream


@attrs.frozen
class FaultEvent:
    at: float  # seconds since the run started, when the fault was applied
    kind: str  # kill-broker, kill-client, proxy-cut, torn-tail, ...
    detail: str = ""
    cleared: float | None = None  # when it stopped acting (None: at once)
    victim: str = ""  # the process hit (a client fault's), "" for the broker or the network
    victim_partitions: tuple = ()  # the input partitions the victim held at the fault, when known ("topic-N")

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen
class Output:
    """Records that became committed at one moment, and who committed them."""

    at: float
    records: int
    process: str = ""  # "copier-0/4242": name/pid; a restart is a new pid


@attrs.frozen
class Recovery:
    at: float
    kind: str
    victim: str
    cleared: float
    level: float  # records/s
    first_output_s: float | None  # None: nothing was committed after it
    first_after_clear_s: float | None
    rate_back_s: float | None
    in_flight: bool | None  # None: the input is unknown

    def to_json(self) -> dict:
        return {key: (round(value, 3) if isinstance(value, float) else value) for key, value in attrs.asdict(self).items()}


@attrs.frozen
class KindSummary:
    kind: str
    count: int
    median_first_output_s: float | None
    worst_first_output_s: float | None
    median_after_clear_s: float | None
    worst_after_clear_s: float | None
    median_rate_back_s: float | None
    worst_rate_back_s: float | None
    never: int  # faults after which nothing was committed (worst is then None)

    def to_json(self) -> dict:
        return {key: (round(value, 3) if isinstance(value, float) else value) for key, value in attrs.asdict(self).items()}


@attrs.frozen
class Stall:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "seconds": round(self.seconds, 3)}


@attrs.frozen
class Availability:
    recoveries: tuple[Recovery, ...]
    kinds: tuple[KindSummary, ...]
    longest_stall: Stall | None
    longest_stall_outside_faults: Stall | None
    faults_in_flight: int
    faults_idle: int

    def to_json(self) -> dict:
        return {
            "definitions": {"level": f"median committed records/s over the whole 1 s windows of the {LEVEL_SECONDS} s before the fault",
                            "rate_back_s": f"fault -> first 1 s window at >= {RETURN_FRACTION:.0%} of the level",
                            "first_output_s": "fault -> first committed output",
                            "first_after_clear_s": "fault cleared (broker ready, process resumed or restarted) -> first committed output (the victim's, for a client fault)"},
            "faults_in_flight": self.faults_in_flight,
            "faults_idle": self.faults_idle,
            "longest_stall": self.longest_stall.to_json() if self.longest_stall else None,
            "longest_stall_outside_faults": self.longest_stall_outside_faults.to_json() if self.longest_stall_outside_faults else None,
            "per_kind": {summary.kind: summary.to_json() for summary in self.kinds},
            "per_fault": [recovery.to_json() for recovery in self.recoveries],
        }

    def lines(self) -> list[str]:
        """The summary's availability table."""
        def seconds(value):
            return "never" if value is None else f"{value:.1f} s"

        lines = [f"availability: {self.faults_in_flight} of {len(self.recoveries)} faults hit while records were in flight"
                 + (f" ({self.faults_idle} on an idle workload)" if self.faults_idle else "")]
        if self.kinds:
            lines.append(f"  {'fault':<20}{'n':>3}  {'first output':>19}  {'after cleared':>19}  {'rate back (80%)':>19}")
            lines.append(f"  {'':<20}{'':>3}  {'median':>9} {'worst':>9}  {'median':>9} {'worst':>9}  {'median':>9} {'worst':>9}")
        for summary in self.kinds:
            lines.append(f"  {summary.kind:<20}{summary.count:>3}  {seconds(summary.median_first_output_s):>9} {seconds(summary.worst_first_output_s):>9}"
                         f"  {seconds(summary.median_after_clear_s):>9} {seconds(summary.worst_after_clear_s):>9}"
                         f"  {seconds(summary.median_rate_back_s):>9} {seconds(summary.worst_rate_back_s):>9}")
        if self.longest_stall:
            lines.append(f"  longest stretch with no committed output: {self.longest_stall.seconds:.1f} s "
                         f"(t={self.longest_stall.start:.1f}..{self.longest_stall.end:.1f} s)")
        if self.longest_stall_outside_faults:
            lines.append(f"  longest of it while no fault was in progress: {self.longest_stall_outside_faults.seconds:.1f} s "
                         f"(t={self.longest_stall_outside_faults.start:.1f}..{self.longest_stall_outside_faults.end:.1f} s)")
        return lines


@attrs.frozen
class InstanceRecovery:
    """A client fault seen per partition (see "per instance" above)."""

    at: float
    kind: str
    victim: str
    cleared: float
    victim_partitions: tuple
    survivors_stall_s: float | None  # None: every partition was the victim's
    victim_back_s: float | None  # None: none of its partitions advanced again in the run
    restore_s: float | None = None  # the victim's store restore after the restart, as its log says

    def to_json(self) -> dict:
        return {key: (round(value, 3) if isinstance(value, float) else value) for key, value in attrs.asdict(self).items()}


@attrs.frozen
class PartitionSample:
    """A group's input partitions at one moment: committed offsets and ends."""

    at: float  # when it was asked for
    committed: Mapping[str, int]  # {"topic-N": committed offset}
    ends: Mapping[str, int]  # {"topic-N": end offset}


def instance_recoveries(samples: Sequence[PartitionSample], faults: Sequence[FaultEvent], *, end: float) -> list[InstanceRecovery]:
    """Per client fault that names its victim's partitions: the survivors'
    longest stall and the victim's time back."""
    samples = sorted(samples, key=lambda sample: sample.at)
    ordered = sorted(faults, key=lambda f: f.at)
    out = []
    for index, fault in enumerate(ordered):
        if not fault.victim_partitions:
            continue
        cleared = fault.at if fault.cleared is None else max(fault.at, fault.cleared)
        held = set(fault.victim_partitions)
        others = {partition for sample in samples for partition in sample.committed} - held
        window_end = ordered[index + 1].at if index + 1 < len(ordered) else end
        survivors_stall = None
        if others:
            clipped = [min(stop, window_end) - max(start, fault.at) for start, stop in _stalls(samples, others)]
            survivors_stall = max((seconds for seconds in clipped if seconds > 0), default=0.0)
        victim_back = None
        baseline = next((sample.committed for sample in samples if sample.at > cleared), None)
        if baseline is not None:
            dead_at = sum(baseline.get(partition, 0) for partition in held)
            victim_back = next((sample.at - cleared for sample in samples
                                if sample.at > cleared and sum(sample.committed.get(partition, 0) for partition in held) > dead_at), None)
        out.append(InstanceRecovery(fault.at, fault.kind, fault.victim, cleared, tuple(sorted(held)), survivors_stall, victim_back))
    return out


def _stalls(samples: Sequence[PartitionSample], partitions: set[str]) -> list[tuple[float, float]]:
    """(start, end) of each stretch in which ``partitions`` had input
    waiting and none of them advanced: from the last advance (or the first
    sample with input waiting) to the next advance (or the first sample with
    none waiting, or the last sample)."""
    stretches, since, last = [], None, None
    for sample in samples:
        total = sum(sample.committed.get(partition, 0) for partition in partitions)
        waiting = any(sample.ends.get(partition, 0) > sample.committed.get(partition, 0) for partition in partitions)
        advanced = last is not None and total > last
        last = total if last is None else max(last, total)
        if since is not None and (advanced or not waiting):
            stretches.append((since, sample.at))
            since = None
        if waiting and since is None:
            since = sample.at
    if since is not None and samples:
        stretches.append((since, samples[-1].at))
    return stretches


class _Series:
    """Committed outputs in time order, with prefix sums for window counts."""

    def __init__(self, outputs: Sequence[Output]):
        ordered = sorted((o for o in outputs if o.records > 0), key=lambda o: o.at)
        self.outputs = ordered
        self.times = [o.at for o in ordered]
        self.prefix = [0]
        for output in ordered:
            self.prefix.append(self.prefix[-1] + output.records)

    def count(self, start: float, end: float, *, closed: bool = False) -> int:
        """Records committed in [start, end) (or [start, end] if closed)."""
        low = bisect.bisect_left(self.times, start)
        high = bisect.bisect_right(self.times, end) if closed else bisect.bisect_left(self.times, end)
        return self.prefix[max(low, high)] - self.prefix[low]

    def first_after(self, at: float, *, process_prefix: str = "") -> float | None:
        for index in range(bisect.bisect_right(self.times, at), len(self.times)):
            if not process_prefix or self.outputs[index].process.startswith(process_prefix):
                return self.times[index]
        return None


def _level(series: _Series, at: float, start: float, run_level: float) -> float:
    windows = [series.count(at - k - 1, at - k) for k in range(LEVEL_SECONDS) if at - k - 1 >= start]
    level = statistics.median(windows) if windows else 0.0
    return float(level) if level > 0 else run_level


def _rate_back(series: _Series, at: float, level: float) -> float | None:
    """The first s >= at whose window [s, s+1] holds RETURN_FRACTION of the
    level, s being the fault itself or an output (so the rate is back no
    earlier than output is)."""
    wanted = max(1e-9, RETURN_FRACTION * level)
    candidates = [at] + [t for t in series.times if t > at]
    for start in candidates:
        found = series.count(start, start + RATE_WINDOW, closed=True)
        if found >= wanted and found > 0:
            return start - at
    return None


def _cumulative(events: Sequence[tuple[float, int]], at: float) -> int:
    return sum(count for when, count in events if when <= at)


def _subtract(stall: Stall, busy: list[tuple[float, float]]) -> list[Stall]:
    """The parts of a stall outside every busy interval."""
    pieces = [stall]
    for low, high in busy:
        next_pieces = []
        for piece in pieces:
            if high <= piece.start or low >= piece.end:
                next_pieces.append(piece)
                continue
            if low > piece.start:
                next_pieces.append(Stall(piece.start, low))
            if high < piece.end:
                next_pieces.append(Stall(high, piece.end))
        pieces = next_pieces
    return pieces


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(outputs: Sequence[Output], faults: Sequence[FaultEvent], *, start: float, end: float,
            inputs: Sequence[tuple[float, int]] | None = None, consumed: Sequence[tuple[float, int]] | None = None,
            sending: Sequence[tuple[float, float]] = ()) -> Availability:
    """The availability of one run. ``outputs``: committed output over the
    whole run (after ``end`` too: the last fault's recovery may come in the
    drain); ``start``..``end``: the faulted run, where stalls are measured;
    ``inputs``/``consumed``: (time, records) acknowledged into the input and
    consumed-and-committed by the workload, for "in flight" (None: unknown);
    ``sending``: (sent, acknowledged) times of input records, when known."""
    series = _Series(outputs)
    attributed = any(output.process for output in outputs)  # a watcher's outputs do not say whose they are
    whole = [series.count(second, second + 1) for second in range(int(start), int(end)) if second + 1 <= end]
    run_level = float(statistics.median(whole)) if whole else 0.0
    recoveries = []
    for fault in sorted(faults, key=lambda f: f.at):
        cleared = fault.at if fault.cleared is None else max(fault.at, fault.cleared)
        first = series.first_after(fault.at)
        after_clear = series.first_after(cleared, process_prefix=f"{fault.victim}/" if fault.victim and attributed else "")
        level = _level(series, fault.at, start, run_level)
        in_flight = None
        if inputs is not None and consumed is not None:
            arriving = (any(abs(when - fault.at) <= ARRIVING_WINDOW for when, count in inputs if count > 0)
                        or any(sent <= fault.at < acknowledged for sent, acknowledged in sending))
            in_flight = arriving or _cumulative(inputs, fault.at) > _cumulative(consumed, fault.at)
        recoveries.append(Recovery(
            at=fault.at, kind=fault.kind, victim=fault.victim, cleared=cleared, level=level,
            first_output_s=None if first is None else first - fault.at,
            first_after_clear_s=None if after_clear is None else after_clear - cleared,
            rate_back_s=_rate_back(series, fault.at, level) if level > 0 else None,
            in_flight=in_flight,
        ))
    kinds = []
    for kind in sorted({r.kind for r in recoveries}):
        mine = [r for r in recoveries if r.kind == kind]

        def column(name, mine=mine):
            values = [getattr(r, name) for r in mine]
            known = [v for v in values if v is not None]
            return _median(known), (max(known) if known and len(known) == len(values) else None)

        first_median, first_worst = column("first_output_s")
        clear_median, clear_worst = column("first_after_clear_s")
        back_median, back_worst = column("rate_back_s")
        kinds.append(KindSummary(kind, len(mine), first_median, first_worst, clear_median, clear_worst, back_median, back_worst,
                                 never=sum(1 for r in mine if r.first_output_s is None)))
    stalls = []
    in_run = [t for t in series.times if start <= t <= end]
    if not in_run and end > start:
        stalls.append(Stall(start, end))
    for earlier, later in zip(in_run, in_run[1:] + [end]):
        if later > earlier:
            stalls.append(Stall(earlier, later))
    busy = sorted((r.at, r.cleared) for r in recoveries)
    outside = [piece for stall in stalls for piece in _subtract(stall, busy)]
    return Availability(
        recoveries=tuple(recoveries),
        kinds=tuple(kinds),
        longest_stall=max(stalls, key=lambda s: s.seconds, default=None),
        longest_stall_outside_faults=max(outside, key=lambda s: s.seconds, default=None),
        faults_in_flight=sum(1 for r in recoveries if r.in_flight),
        faults_idle=sum(1 for r in recoveries if r.in_flight is False),
    )
