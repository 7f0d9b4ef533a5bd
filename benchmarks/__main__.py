"""`python -m benchmarks`: the same as `onceflow bench` (benchmarks.suite)."""

import sys

from onceflow.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
