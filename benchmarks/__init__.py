"""Benchmarks: speed figures measured beside the machine's own limits, in one run."""
