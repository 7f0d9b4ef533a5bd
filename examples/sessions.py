"""Click sessions, bursts and a per-minute tick, exactly once: session and
sliding windows, a stream-time timer and event time taken from the payload,
on onceflow's runner.

    onceflow topics create clicks --partitions 2      (and sessions, 2)
    onceflow run examples/sessions.py --bootstrap-servers 127.0.0.1:9092   (or ONCEFLOW_BOOTSTRAP_SERVERS in the environment)

Reads clicks (key: user; value: ``{"at": event time in ms, "page": ...}``;
the event time is the payload's ``at``, not the record's CreateTime) and
writes to ``sessions``, per user:

- each session of activity (clicks less than 30 s apart), once, when it is
  over (its last click + 30 s of stream time): ``{"kind": "session",
  "start", "end", "clicks"}``;
- each burst (a sliding window of 10 s holding at least two clicks),
  once, when stream time has passed its end: ``{"kind": "burst", "start",
  "end", "clicks"}``;
- every minute of stream time on the partition, a stream-time timer emits
  ``{"kind": "tick", "at", "clicks"}`` for each user who clicked since the
  last tick, and forgets them.

All are exactly once through crashes: the windows, the timer's store and
its next fire time are changelogged and committed with the output and the
input offsets. For ``onceflow chaos --workload streaming --app
examples/sessions.py`` the module says what to feed and what must come out
(``CHAOS_TOPICS``, ``CHAOS_OUTPUT``, ``chaos_input``, ``expected``; see
faults.workloads): the expected output is recomputed here from the input
alone, without the framework.
"""

from __future__ import annotations

import random
from datetime import timedelta

import streaming
from streaming.windows import session, sliding

INPUT, OUTPUT = "clicks", "sessions"
GAP = timedelta(seconds=30)
TICK = timedelta(minutes=1)
BURST = timedelta(seconds=10)


def event_time(record) -> int:
    return record.value["at"]


def build_app(bootstrap_servers: str | None = None, state_dir: str | None = None, **options) -> streaming.App:
    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, **options}
    app = streaming.App(bootstrap_servers=bootstrap_servers, application_id="click-sessions", state_dir=state_dir, **options)
    (app.stream(INPUT, key_format="str", value_format="json", timestamp_extractor=event_time)
        .window(session(GAP))
        .count(store="sessions")
        .map(lambda window: {"kind": "session", "start": window["start"], "end": window["end"], "clicks": window["value"]})
        .to(OUTPUT, key_format="str", value_format="json", name="sessions"))
    (app.stream(INPUT, key_format="str", value_format="json", timestamp_extractor=event_time)
        .window(sliding(BURST))
        .count(store="bursts")
        .filter(lambda window: window["value"] >= 2)
        .map(lambda window: {"kind": "burst", "start": window["start"], "end": window["end"], "clicks": window["value"]})
        .to(OUTPUT, key_format="str", value_format="json", name="bursts"))

    @app.processor(source=INPUT, sink=OUTPUT, stores=["since-tick"], key_format="str", value_format="json", timestamp_extractor=event_time)
    def count_clicks(record, ctx):
        since = ctx.store("since-tick")
        since.put(record.key, since.get(record.key, 0) + 1)

    @app.schedule("count_clicks", every=TICK, kind="stream_time")
    def tick(ctx):
        since = ctx.store("since-tick")
        for user, clicks in list(since.items()):
            ctx.emit(user, {"kind": "tick", "at": ctx.timestamp, "clicks": clicks})
            since.delete(user)

    return app


# Where it runs: onceflow run's --bootstrap-servers and --state-dir, else
# ONCEFLOW_BOOTSTRAP_SERVERS and ONCEFLOW_STATE_DIR (streaming.App).
app = build_app()


# -- what `onceflow chaos --workload streaming` feeds it and expects ----------------------------------

PARTITIONS = 2
START_MS = 1_700_000_000_000
FAR_MS = START_MS + 3_600_000
CHAOS_TOPICS = {INPUT: PARTITIONS, OUTPUT: PARTITIONS}
CHAOS_OUTPUT = OUTPUT


def chaos_input(count: int, seed: int) -> list[list[tuple]]:
    """Two phases of (topic, key, value, timestamp, partition). First
    ``count`` clicks of 20 users over about ten minutes, each user on a
    fixed partition, in event-time order per partition (so none is late);
    then one click per partition an hour later, which ends every session
    and fires the last tick."""
    rng = random.Random(seed)
    users = [f"user-{n:02d}" for n in range(20)]
    at = START_MS
    clicks = []
    for _ in range(count):
        at += rng.choice((50, 200, 1_000, 5_000, 40_000)) // 8
        user = rng.choice(users)
        clicks.append((INPUT, user, _click(at, rng), None, users.index(user) % PARTITIONS))
    closing = [(INPUT, f"closer-{p}", _click(FAR_MS, rng), None, p) for p in range(PARTITIONS)]
    return [clicks, closing]


def _click(at: int, rng: random.Random) -> str:
    return '{"at": %d, "page": "/p/%d"}' % (at, rng.randrange(10))


def expected(records: list[tuple]) -> list[tuple]:
    """Every (key, value) the output must hold, recomputed from the input:
    sessions by sorting each user's click times and cutting at gaps of
    more than 30 s (the closers' sessions never end); ticks by walking each
    partition in order, firing whenever the partition's highest event time
    reaches the next whole minute after the one its first click was in;
    bursts as the windows of 10 s ending at each click, and starting just
    after each click that another follows within 10 s + 1 ms, that hold
    two clicks or more (a partition's clicks come in event-time order, so
    none is late)."""
    import json

    gap_ms, tick_ms = GAP // timedelta(milliseconds=1), TICK // timedelta(milliseconds=1)
    times: dict[str, list[int]] = {}
    by_partition: dict[int, list[tuple[str, int]]] = {}
    for _topic, user, value, _timestamp, partition in records:
        at = json.loads(value)["at"]
        times.setdefault(user, []).append(at)
        by_partition.setdefault(partition, []).append((user, at))
    out = []
    for user, stamps in times.items():
        if user.startswith("closer-"):
            continue
        stamps.sort()
        start = end = stamps[0]
        clicks = 1
        for at in stamps[1:]:
            if at - end > gap_ms:
                out.append((user, {"kind": "session", "start": start, "end": end, "clicks": clicks}))
                start, clicks = at, 0
            end = at
            clicks += 1
        out.append((user, {"kind": "session", "start": start, "end": end, "clicks": clicks}))
        burst_ms = BURST // timedelta(milliseconds=1)
        starts = {t - burst_ms for t in stamps} | {t + 1 for t in stamps if any(t < u <= t + burst_ms + 1 for u in stamps)}
        for start in sorted(starts):
            clicks = sum(1 for t in stamps if start <= t <= start + burst_ms)
            if clicks >= 2:
                out.append((user, {"kind": "burst", "start": start, "end": start + burst_ms, "clicks": clicks}))
    for partition, clicks_in_order in by_partition.items():
        highest = next_tick = None
        since: dict[str, int] = {}
        for user, at in clicks_in_order:
            since[user] = since.get(user, 0) + 1
            if highest is not None and at <= highest:
                continue
            highest = at
            if next_tick is None:
                next_tick = at - at % tick_ms + tick_ms
            elif at >= next_tick:
                fired = at - at % tick_ms
                next_tick = fired + tick_ms
                # The store's key order: the users' names sorted.
                out += [(name, {"kind": "tick", "at": fired, "clicks": n}) for name, n in sorted(since.items())]
                since = {}
    return out


if __name__ == "__main__":
    from streaming.cli import main_of  # onceflow run's options, statuses and messages, for this app

    raise SystemExit(main_of(app))
