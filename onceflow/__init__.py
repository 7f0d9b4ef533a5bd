"""The product's command line, ``onceflow``: one table of commands
(``onceflow.cli.COMMANDS``), each a module in ``onceflow.commands``.

This package may import every other room, but only lazily: a command's module
is imported when that command is chosen, so ``onceflow --help`` and the
client commands load neither Spark nor the fault harness nor the benchmarks.
"""
