"""Word count over event-time tumbling windows, exactly once, with
onceflow's dataflow layer.

    onceflow topics create lines --partitions 2      (or any Kafka admin tool)
    onceflow run examples/word_count.py --bootstrap-servers 127.0.0.1:9092   (or ONCEFLOW_BOOTSTRAP_SERVERS in the environment)
    python examples/word_count.py --bootstrap-servers 127.0.0.1:9092 [--state-dir ./state/word-count]

Reads lines of text from ``lines`` (any key; the record's timestamp is the
event time), splits them into lower-case words, and counts each word per
one-minute window. A window's count is written to ``word-counts`` (key: the
word; value: ``{"word", "start", "end", "count"}`` with times in epoch ms)
once, when the window closes: when the highest event time seen on the
partition passes the window's end plus 10 s of grace. Lines up to 10 s late
are still counted; later ones are dropped and counted in the
``late_records_dropped`` metric. Counting by word means re-keying by word,
so the words go through an internal repartition topic
(``word-count-lines-to-word-counts-repartition-0``), written and read by
this same exactly-once app. Kill it at any moment: every window's count
comes out once, and right.

For ``onceflow chaos --workload streaming --app examples/word_count.py``
the module also says what input to feed it and what output that must give
(``CHAOS_TOPICS``, ``CHAOS_OUTPUT``, ``chaos_input``, ``expected``; see faults.workloads).
"""

from __future__ import annotations

import random
import re
from datetime import timedelta

import streaming
from streaming.windows import tumbling

WINDOW = timedelta(minutes=1)
GRACE = timedelta(seconds=10)
INPUT, OUTPUT = "lines", "word-counts"
WORD = re.compile(r"[a-z']+")


def words(line: str) -> list[str]:
    return WORD.findall(line.lower())


def as_output(word: str, window: dict) -> dict:
    return {"word": word, "start": window["start"], "end": window["end"], "count": window["value"]}


def build_app(bootstrap_servers: str | None = None, state_dir: str | None = None, **options) -> streaming.App:
    # Static membership (the runner's default) gives a restarted instance its
    # partitions back at once; a short session lets the others take over
    # quickly from one that died for good.
    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, **options}
    app = streaming.App(bootstrap_servers=bootstrap_servers, application_id="word-count", state_dir=state_dir, **options)
    (app.stream(INPUT, value_format="str")
        .flat_map(words)
        .key_by(lambda word: word)
        .window(tumbling(WINDOW), grace=GRACE)
        .count(store="word-counts")
        .map(as_output, with_key=True)
        .to(OUTPUT, key_format="str", value_format="json"))
    return app


# Where it runs: onceflow run's --bootstrap-servers and --state-dir, else
# ONCEFLOW_BOOTSTRAP_SERVERS and ONCEFLOW_STATE_DIR (streaming.App).
app = build_app()


# -- what `onceflow chaos --workload streaming` feeds it and expects ----------------------------------

VOCABULARY = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "exactly", "once")
BOUNDARY_MS = 1_700_000_040_000  # a window boundary: the lines straddle it, so two windows per word
FAR_MS = BOUNDARY_MS + 3_600_000


CHAOS_TOPICS = {INPUT: 2, OUTPUT: 2}
CHAOS_OUTPUT = OUTPUT


def chaos_input(count: int, seed: int) -> list[list[tuple]]:
    """Two phases of (topic, key, value, timestamp ms, partition). First ``count``
    lines whose event times span 8 s (less than the grace, so however the
    two partitions interleave no line is late and no window closes early);
    then, once those are processed, one line per partition far in the
    future: stream time passes every window's end + grace, so all close."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        text = " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 6)))
        lines.append((INPUT, None, text, BOUNDARY_MS - 4_000 + rng.randint(0, 8_000), None))
    # Forty distinct words, so some land on every partition of the repartition topic.
    ticks = " ".join(f"tick{a}{b}" for a in "abcde" for b in "abcdefgh")
    closing = [(INPUT, None, ticks, FAR_MS, partition) for partition in range(CHAOS_TOPICS[INPUT])]
    return [lines, closing]


def expected(records: list[tuple]) -> list[tuple]:
    """(key, value) of every output record: each (word, window) of the first
    phase's lines once, with its count (the far-future words' windows stay
    open, so they give nothing)."""
    window_ms = WINDOW // timedelta(milliseconds=1)
    counts: dict[tuple[str, int], int] = {}
    for _topic, _key, text, timestamp, _partition in records:
        if timestamp >= FAR_MS:
            continue
        start = timestamp - timestamp % window_ms
        for word in words(text):
            counts[(word, start)] = counts.get((word, start), 0) + 1
    return [(word, {"word": word, "start": start, "end": start + window_ms, "count": n}) for (word, start), n in counts.items()]


if __name__ == "__main__":
    from streaming.cli import main_of  # onceflow run's options, statuses and messages, for this app

    raise SystemExit(main_of(app))
