"""The report folder a chaos run leaves behind.

    report/
        history.jsonl     every event of every workload process, merged by time
        faults.jsonl      every fault the schedule applied or cleared
        verdict.json      the checker's verdict (anomalies with examples, counts)
                          and the run's availability (``faults.availability``)
        summary.txt       the same, readable, plus the run's settings
        timeline.png      committed (acknowledged) records per second, faults
                          marked, each with its outage (fault to first output)
                          shaded and the moment its rate was back; the
                          longest stretch with no output hatched

The PNG needs matplotlib (a dependency of the plain install); where it is
missing the report says so in summary.txt and everything else is written.
"""

from __future__ import annotations

import json
import os
from collections import Counter

from faults.availability import Availability, FaultEvent

__all__ = ["FaultEvent", "write_report", "write_series_png", "write_timeline_png"]


def write_jsonl(path: str, items) -> None:
    with open(path, "w") as file:
        for item in items:
            file.write(json.dumps(item, sort_keys=True) + "\n")


def throughput_per_second(times: list[float], duration: float) -> list[int]:
    buckets = Counter(int(t) for t in times if t >= 0)
    return [buckets.get(second, 0) for second in range(int(duration) + 1)]


def mark_availability(axes, availability: Availability | None) -> None:
    """Each fault's outage (fault to first committed output) shaded, a
    triangle where its rate was back, the longest stall hatched."""
    if availability is None:
        return
    labelled = set()
    for recovery in availability.recoveries:
        if recovery.first_output_s:
            axes.axvspan(recovery.at, recovery.at + recovery.first_output_s, color="#e45756", alpha=0.15, linewidth=0,
                         label=None if "outage" in labelled else "fault to first output")
            labelled.add("outage")
        if recovery.rate_back_s is not None:
            axes.plot([recovery.at + recovery.rate_back_s], [0], marker="^", color="#333333", markersize=7, clip_on=False,
                      label=None if "back" in labelled else "rate back (80%)")
            labelled.add("back")
    stall = availability.longest_stall
    if stall is not None:
        axes.axvspan(stall.start, stall.end, fill=False, hatch="//", edgecolor="#777777", linewidth=0, label=f"longest stall {stall.seconds:.1f} s")


def write_timeline_png(path: str, ok_times: list[float], faults: list[FaultEvent], duration: float, title: str, availability: Availability | None = None) -> str | None:
    """Plot acknowledged operations per second with the faults as vertical
    lines. Returns None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no timeline.png"
    counts = throughput_per_second(ok_times, duration)
    figure, axes = plt.subplots(figsize=(11, 4), dpi=100)
    axes.bar(range(len(counts)), counts, width=1.0, align="edge", color="#4c78a8", label="committed records/s")
    colors: dict[str, str] = {}
    palette = ["#e45756", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b"]
    for fault in faults:
        first_of_kind = fault.kind not in colors
        color = colors.setdefault(fault.kind, palette[len(colors) % len(palette)])
        axes.axvline(fault.at, color=color, linewidth=1.5, label=fault.kind if first_of_kind else None)
    mark_availability(axes, availability)
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("records per second")
    axes.set_title(title)
    axes.set_xlim(0, max(1, duration))
    axes.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return None


def write_report(folder: str, *, settings: dict, history: list[dict], faults: list[FaultEvent], verdict, ok_times: list[float], duration: float,
                 availability: Availability | None = None) -> dict[str, str]:
    """Write the report folder; returns {name: path}."""
    os.makedirs(folder, exist_ok=True)
    paths = {name: os.path.join(folder, name) for name in ("history.jsonl", "faults.jsonl", "verdict.json", "summary.txt", "timeline.png")}
    write_jsonl(paths["history.jsonl"], history)
    write_jsonl(paths["faults.jsonl"], [f.to_json() for f in faults])
    with open(paths["verdict.json"], "w") as file:
        json.dump(verdict.to_json() | ({"availability": availability.to_json()} if availability else {}), file, indent=2, sort_keys=True)
    problem = write_timeline_png(paths["timeline.png"], ok_times, faults, duration, f"{settings.get('workload')} seed {settings.get('seed')}: {'VALID' if verdict.valid else 'ANOMALIES'}",
                                 availability)
    with open(paths["summary.txt"], "w") as file:
        file.write("onceflow chaos run\n")
        for key, value in settings.items():
            file.write(f"  {key}: {value}\n")
        file.write(f"  faults applied: {len(faults)} ({', '.join(f'{k} x{n}' for k, n in Counter(f.kind for f in faults).items()) or 'none'})\n\n")
        file.write(verdict.summary())
        file.write("\n")
        if availability is not None:
            file.write("\n" + "\n".join(availability.lines()) + "\n")
        if problem:
            file.write(f"\n{problem}\n")
    if problem:
        del paths["timeline.png"]
    return paths


def per_second(samples: list[tuple[float, int]], duration: float) -> list[int]:
    """Cumulative ``(seconds, count)`` samples -> records per whole second."""
    totals = [0] * (int(duration) + 1)
    for second in range(len(totals)):
        totals[second] = max((count for at, count in samples if at < second + 1), default=0)
    return [totals[0]] + [totals[i] - totals[i - 1] for i in range(1, len(totals))]


def write_series_png(path: str, series: dict[str, list[tuple[float, int]]], faults: list[FaultEvent], duration: float, title: str,
                     availability: Availability | None = None, moments: dict[str, list[float]] | None = None) -> str | None:
    """The demo's timeline: records per second of each stream (cumulative
    ``(seconds, count)`` samples), the last one, usually small, in a panel of
    its own as a running total, faults as vertical lines on both;
    ``moments`` (``{label: [seconds, ...]}``, such as Spark's committed
    batches) as ticks along the foot of the last panel. Returns None when
    written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no timeline.png"
    names = list(series)
    rates, running = names[:2] if len(names) > 2 else names, names[2:]
    figure, panels = plt.subplots(1 + bool(running), 1, figsize=(11, 4 + 2 * bool(running)), dpi=100, sharex=True, squeeze=False)
    top = panels[0][0]
    for name, color in zip(rates, ["#4c78a8", "#54a24b"]):
        top.step(range(int(duration) + 1), per_second(series[name], duration), where="post", color=color, label=f"{name} (records/s)")
    top.set_ylabel("records per second")
    top.set_title(title)
    axes_all = [top]
    if running:
        bottom = panels[1][0]
        for name in running:
            points = sorted(series[name])
            bottom.step([0.0] + [at for at, _ in points], [0] + [count for _, count in points], where="post", color="#b279a2", label=f"{name} (total)")
        bottom.set_ylabel("rows")
        axes_all.append(bottom)
    colors: dict[str, str] = {}
    palette = ["#e45756", "#f58518", "#000000", "#9d755d", "#72b7b2", "#eeca3b"]
    for fault in faults:
        first_of_kind = fault.kind not in colors
        color = colors.setdefault(fault.kind, palette[len(colors) % len(palette)])
        for axes in axes_all:
            axes.axvline(fault.at, color=color, linewidth=1.5, linestyle="--", label=fault.kind if first_of_kind and axes is top else None)
    mark_availability(top, availability)
    for (label, times), (color, marker) in zip((moments or {}).items(), [("#b279a2", "|"), ("#333333", "x")]):
        if times:
            axes_all[-1].plot(times, [0] * len(times), linestyle="none", marker=marker, markersize=12, markeredgewidth=2, color=color, clip_on=False, label=label)
    for axes in axes_all:
        axes.set_xlim(0, max(1, duration))
        axes.legend(loc="upper right", fontsize="small")
    axes_all[-1].set_xlabel("seconds since start")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return None
