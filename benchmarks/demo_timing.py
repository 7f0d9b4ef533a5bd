"""How long the default ``onceflow demo`` takes, beside its limit, in local
mode and on a Spark standalone cluster started for the run.

    python -m benchmarks.demo_timing [--seed 1] [--runs 1] [--modes plain,cluster] [--json FILE] [-- extra demo options]

The README's main command must finish in under three minutes on a two-core
machine, Spark's JVM starts (the first, and one per driver kill) included;
with ``--spark-cluster`` (the cluster's start and stop included) in under
four. This runs the default demo (20,000 payments, 6 kills, Spark on) as a
user would, ``python -m onceflow demo`` (mode ``plain``) and ``python -m
onceflow demo --spark-cluster`` (mode ``cluster``), and prints its wall time, the time the
demo reports, the limit, their ratio and the machine's load average at the
start and the end (the figure means little on a machine busy with other
work: say the load beside it). It is a benchmark, not a test: nothing fails
when the limit is passed, the figure is recorded (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

LIMIT_SECONDS = 180.0
MODES = {"plain": ([], LIMIT_SECONDS), "cluster": (["--spark-cluster"], 240.0)}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_demo(seed: int, extra: list[str], limit: float = LIMIT_SECONDS) -> dict:
    with tempfile.TemporaryDirectory(prefix="onceflow-demo-timing-") as folder:
        load_before = os.getloadavg()
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "onceflow", "demo", "--seed", str(seed), "--report", os.path.join(folder, "report"), *extra],
                                cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - started
        load_after = os.getloadavg()
    reported = re.search(r"^\s+time\s+([\d.]+) s$", result.stdout, flags=re.M)
    return {
        "seed": seed,
        "exit_status": result.returncode,
        "verdict_ok": "OK: exactly once" in result.stdout,
        "wall_seconds": round(wall, 1),
        "reported_seconds": float(reported.group(1)) if reported else None,
        "limit_seconds": limit,
        "wall_over_limit": round(wall / limit, 2),
        "load_average_1m_before_after": [round(load_before[0], 1), round(load_after[0], 1)],
        "cores": os.cpu_count(),
        "demo_options": extra,
        "report_tail": result.stdout.splitlines()[-22:],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds seed, seed+1, ... (default 1: a run takes minutes)")
    parser.add_argument("--modes", default="plain,cluster", help="plain (local mode), cluster (--spark-cluster), or both (default)")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("extra", nargs="*", help="more `onceflow demo` options, after --")
    args = parser.parse_args(argv)
    runs = []
    for mode in args.modes.split(","):
        options, limit = MODES[mode]
        for index in range(args.runs):
            run = time_demo(args.seed + index, options + args.extra, limit) | {"mode": mode}
            runs.append(run)
            print(f"onceflow demo {' '.join(options)} seed {run['seed']}: {run['wall_seconds']:.1f} s wall ({run['reported_seconds']} s reported) "
                  f"= {run['wall_over_limit']:.2f} of the {limit:.0f} s limit; verdict {'OK' if run['verdict_ok'] else 'FAILED'}; "
                  f"load average {run['load_average_1m_before_after'][0]} -> {run['load_average_1m_before_after'][1]} on {run['cores']} cores", flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"limits_seconds": {mode: limit for mode, (_options, limit) in MODES.items()}, "runs": runs}, file, indent=2)
    return 0 if all(run["verdict_ok"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
