"""The command line both copiers take: ``transactional_copier.py`` (over
confluent-kafka) and ``txn_copier.py`` (over onceflow's own clients) are
one program, which the chaos harness, the tests and the benchmarks start
with the same arguments. Copy this file beside whichever copier you copy."""

from __future__ import annotations

import argparse


def copier_arguments(description: str, *, client_debug_help: str) -> argparse.ArgumentParser:
    """The copiers' argument parser; ``--client-debug`` means what the
    copier's client library makes of it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--records-per-txn", type=int, default=750)
    parser.add_argument("--abort-ratio", type=float, default=0.0)
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--client-debug", default=None, help=client_debug_help)
    return parser
