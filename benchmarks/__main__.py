"""`python -m benchmarks`: the same as `onceflow bench` (benchmarks.suite)."""

import sys

from benchmarks.suite import main

sys.exit(main())
