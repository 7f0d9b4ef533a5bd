"""A/B of two checkouts' brokers on the bench's own scenarios, interleaved in one run.

    python -m benchmarks.ab BASELINE_DIR [--rounds 5] [--records 200000] [--only "PREFIX;..."] [--tansu] [--config KEY=VALUE ...] [--slow-fsync MS]

Each round starts a fresh broker from this checkout and one from the other
(``BASELINE_DIR``, e.g. a ``git worktree`` of the code before a change), in
alternating order, and runs the same scenarios of ``benchmarks.suite``
(default: produce 100 B acks=all and the two consume rows) against each, so a
noisy shared machine hits both alike; ``--tansu`` adds the peer to every round.
It prints every round, then per scenario the median of each and the median
and range of the per-round ratios (this / baseline). ``--profile DIR`` runs
each broker under ``py-spy record`` (collapsed stacks, one file per broker, in DIR).

This module owns only the interleaving and the report; the scenarios and the
peer are ``benchmarks.suite``'s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from typing import Self

from benchmarks.suite import (
    REPO,
    SCENARIOS,
    select_scenarios,
    ScenarioSettings,
    TansuTarget,
    tansu_available,
)
from faults.process import BrokerProcess

DEFAULT_ONLY = "produce 100 B, acks=all;consume"


class CheckoutTarget:
    """``onceflow broker`` run from a given checkout (its own code: the
    checkout is the working directory, so ``-m onceflow`` imports it)."""

    def __init__(self, name: str, checkout: str, work: str, profile_dir: str | None = None, config: tuple[str, ...] = ()):
        self.name, self.checkout, self.work, self.profile_dir, self.config = name, checkout, work, profile_dir, config

    def __enter__(self) -> Self:
        data = os.path.join(self.work, f"{self.name}-{uuid.uuid4().hex[:6]}")
        wrapper: tuple[str, ...] = ()
        if self.profile_dir:
            stacks = os.path.join(self.profile_dir, f"{self.name}-{uuid.uuid4().hex[:4]}.txt")
            wrapper = (shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-f", "raw", "-o", stacks, "-r", "200", "--")
        self.broker = BrokerProcess(data, "group.initial.rebalance.delay.ms=0", *self.config, checkout=self.checkout, log_path=data + ".log", wrapper=wrapper).start()
        self.bootstrap = self.broker.bootstrap
        self.process = self.broker.process
        return self

    def __exit__(self, *exc) -> None:
        # SIGINT lets py-spy write its profile; a plain broker stops on it too.
        self.broker.signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.broker.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="the other checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--only", default=DEFAULT_ONLY, help="semicolon-separated scenario name prefixes (names have commas)")
    parser.add_argument("--tansu", action="store_true", help="the peer too, every round")
    parser.add_argument("--profile", metavar="DIR", help="run each broker under py-spy record, collapsed stacks here")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a setting of both brokers (repeatable)")
    parser.add_argument("--slow-fsync", type=float, default=0.0, metavar="MS",
                        help="every fsync of both brokers takes this much longer (a slower device: faults.disk); both checkouts must know it")
    args = parser.parse_args(argv)
    scenarios = select_scenarios(SCENARIOS, args.only)
    settings = ScenarioSettings(records=args.records)
    work = tempfile.mkdtemp(prefix="onceflow-ab-")
    if args.slow_fsync:
        from faults.disk import ENVIRONMENT_VARIABLE, DiskFaultControl

        control = os.path.join(work, "disk-control.json")
        DiskFaultControl(control).slow_fsyncs(args.slow_fsync / 1000, seconds=365 * 24 * 3600.0)
        os.environ[ENVIRONMENT_VARIABLE] = control  # the brokers' environment
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    checkouts = {"this": REPO, "baseline": os.path.abspath(args.baseline)}
    results: dict[str, dict[str, list[float]]] = {}  # scenario -> target -> records/s per round
    try:
        for round_number in range(1, args.rounds + 1):
            order = list(checkouts) if round_number % 2 else list(reversed(checkouts))
            targets = [lambda n=name: CheckoutTarget(n, checkouts[n], work, args.profile, tuple(args.config)) for name in order]
            if args.tansu and tansu_available():
                targets.append(TansuTarget)
            for factory in targets:
                with factory() as target:
                    for scenario in scenarios:
                        # Every records/s figure (the concurrency rows give one per N).
                        for key, metric in scenario.run(target.bootstrap, settings).items():
                            if not key.startswith("records/s"):
                                continue
                            name = scenario.name + key.removeprefix("records/s")
                            results.setdefault(name, {}).setdefault(target.name, []).append(metric.value)
                            print(f"  round {round_number} {target.name:<9} {name}: {metric.value:,.0f} records/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nthis = {REPO}, baseline = {checkouts['baseline']}, {args.rounds} rounds interleaved")
    print("| scenario | this | baseline | this / baseline: median (range) |" + (" tansu |" if args.tansu else ""))
    print("| --- | --- | --- | --- |" + (" --- |" if args.tansu else ""))
    for name, by_target in results.items():
        ratios = [a / b for a, b in zip(by_target["this"], by_target["baseline"])]
        tansu = f" {statistics.median(by_target['tansu']):,.0f} |" if "tansu" in by_target else ""
        print(f"| {name} | {statistics.median(by_target['this']):,.0f} | {statistics.median(by_target['baseline']):,.0f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |{tansu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
