"""Attribute clicks to ad impressions with a windowed stream-stream join,
exactly once.

    onceflow topics create impressions --partitions 2      (and clicks, attributed: 2 each)
    onceflow run examples/click_attribution.py --bootstrap-servers 127.0.0.1:9092

Reads ``impressions`` (key: user; value: ``{"ad": ...}``) and ``clicks``
(key: user; value: the page clicked, as text), both keyed by user and with
the same partition count (co-partitioned: the runner checks). Every
impression and click of one user at most 10 s apart (by their timestamps)
is written to ``attributed`` as ``{"ad", "page"}``, once, stamped with the
later of the two. A record up to an hour late still finds its partners
(``grace``); both streams' records are kept in the join's changelogged
store until no partner can come, and committed with the output and the
input offsets.

For ``onceflow chaos --workload streaming --app examples/click_attribution.py``
the module says what to feed and what must come out (``CHAOS_TOPICS``,
``CHAOS_OUTPUT``, ``chaos_input``, ``expected``; see faults.workloads): the
expected pairs are recomputed here from the input alone.
"""

from __future__ import annotations

import random
from datetime import timedelta

import streaming

IMPRESSIONS, CLICKS, OUTPUT = "impressions", "clicks", "attributed"
WITHIN = timedelta(seconds=10)


def build_app(bootstrap_servers: str | None = None, state_dir: str | None = None, **options) -> streaming.App:
    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, **options}
    app = streaming.App(bootstrap_servers=bootstrap_servers, application_id="click-attribution", state_dir=state_dir, **options)
    clicks = app.stream(CLICKS, key_format="str", value_format="str")
    (app.stream(IMPRESSIONS, key_format="str", value_format="json")
        .join(clicks, lambda impression, page: {"ad": impression["ad"], "page": page}, within=WITHIN, grace=timedelta(hours=1), store="impressions-clicks")
        .to(OUTPUT, value_format="json"))
    return app


# Where it runs: onceflow run's --bootstrap-servers and --state-dir, else
# ONCEFLOW_BOOTSTRAP_SERVERS and ONCEFLOW_STATE_DIR (streaming.App).
app = build_app()


# -- what `onceflow chaos --workload streaming` feeds it and expects ----------------------------------

CHAOS_TOPICS = {IMPRESSIONS: 2, CLICKS: 2, OUTPUT: 2}
CHAOS_OUTPUT = OUTPUT


def chaos_input(count: int, seed: int) -> list[list[tuple]]:
    """Two phases of (topic, key, value, timestamp, partition): ``count``
    impressions of 30 users a second apart, about half followed by a click
    up to 15 s later (so some fall outside the window), each topic in
    timestamp order; stamped from now on (a broker's time retention keeps
    recent records)."""
    import time

    rng = random.Random(seed)
    start = int(time.time() * 1000) - 60_000
    impressions, clicks = [], []
    for number in range(count):
        user = f"user-{rng.randrange(30):02d}"
        at = start + number * 1_000
        impressions.append((IMPRESSIONS, user, '{"ad": "ad-%d"}' % number, at, None))
        if rng.random() < 0.5:
            clicks.append((CLICKS, user, f"/page/{number}", at + rng.randrange(0, 15_000), None))
    clicks.sort(key=lambda record: record[3])
    half = len(impressions) // 2
    return [impressions[:half] + [c for c in clicks if c[3] < impressions[half][3]], impressions[half:] + [c for c in clicks if c[3] >= impressions[half][3]]]


def expected(records: list[tuple]) -> list[tuple]:
    """Every (user, {"ad", "page"}) of an impression and a click of one user
    at most 10 s apart, recomputed without the framework."""
    import json

    within = WITHIN // timedelta(milliseconds=1)
    clicks: dict[str, list[tuple[int, str]]] = {}
    for topic, key, value, timestamp, _partition in records:
        if topic == CLICKS:
            clicks.setdefault(key, []).append((timestamp, value))
    return [(key, {"ad": json.loads(value)["ad"], "page": page})
            for topic, key, value, timestamp, _partition in records if topic == IMPRESSIONS
            for at, page in clicks.get(key, ()) if abs(at - timestamp) <= within]


if __name__ == "__main__":
    from streaming.cli import main_of  # onceflow run's options, statuses and messages, for this app

    raise SystemExit(main_of(app))
