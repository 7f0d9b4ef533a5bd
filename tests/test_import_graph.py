"""The import graph of the product's packages points from a higher room to
a lower one, never back. ``MAY_IMPORT`` below is the table of rooms: the one
source; DESIGN.md's table of rooms is a copy of it (change this one first).

    protocol < storage < coordinator, groupcoord < broker
    txn -> protocol          streaming -> txn, protocol
    faults -> broker and what it composes, txn, streaming
    onceflow -> everything (the command line)
    benchmarks -> every product room; <- onceflow's bench command only
    tests <- nothing of the product nor the benchmarks

Every module of every product package is parsed with ``ast`` (nothing is
imported), and every import counts wherever it stands: at the top, inside a
function (a lazy import is still an arrow) or as ``importlib.import_module``
of a literal name. Seams such as crash points and the fault harness's DiskIO
are passed in by the composition root (``broker/broker.py``), which is the
one module of ``broker`` allowed to reach ``faults``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# room -> the rooms it may import (besides itself)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "storage": frozenset({"protocol"}),
    "coordinator": frozenset({"protocol", "storage"}),
    "groupcoord": frozenset({"protocol", "storage"}),
    "broker": frozenset({"protocol", "storage", "coordinator", "groupcoord"}),
    "txn": frozenset({"protocol"}),
    "streaming": frozenset({"protocol", "txn"}),
    # The harness drives whole processes: the broker and the rooms it
    # composes (a DiskIO of storage's shape, the wire format), our clients.
    "faults": frozenset({"protocol", "storage", "coordinator", "groupcoord", "broker", "txn", "streaming"}),
    "onceflow": frozenset({"protocol", "storage", "coordinator", "groupcoord", "broker", "txn", "streaming", "faults"}),
    # PySpark's auto-registration hook: only a name for streaming.spark's data source.
    "pyspark_onceflow": frozenset({"streaming"}),
    # The speed targets drive whole brokers and clients, never the tests' helpers.
    "benchmarks": frozenset({"protocol", "storage", "coordinator", "groupcoord", "broker", "txn", "streaming", "faults", "onceflow"}),
}
ROOMS = frozenset(MAY_IMPORT) | {"tests"}

# Single modules allowed one arrow more than their room.
MODULE_MAY_IMPORT: dict[str, frozenset[str]] = {
    # The composition root chooses the seams (crash points, DiskIO) once.
    "broker.broker": frozenset({"faults"}),
    # The one way into the benchmarks (they are not part of the wheel).
    "onceflow.commands.bench": frozenset({"benchmarks"}),
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``."""
    found = []
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.append((node.lineno, name))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def forbidden_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """The imports of ``module`` (given its source) that point the wrong way."""
    room = module.split(".")[0]
    allowed = MAY_IMPORT[room] | MODULE_MAY_IMPORT.get(module, frozenset()) | {room}
    problems = []
    for line, name in imported_names(source, module, is_package=is_package):
        target = name.split(".")[0]
        if target in ROOMS and target not in allowed:
            problems.append(f"{module}:{line} imports {name} ({room} may import {', '.join(sorted(allowed - {room})) or 'no other room'})")
    return problems


def product_modules() -> list[pathlib.Path]:
    paths = []
    for room in MAY_IMPORT:
        directory = REPO / room
        if directory.is_dir():
            paths += sorted(directory.rglob("*.py"))
    return paths


def test_every_room_of_the_table_is_found():
    """The scan below sees the rooms (a renamed folder must not make it pass empty)."""
    rooms = {path.relative_to(REPO).parts[0] for path in product_modules()}
    assert {"protocol", "storage", "coordinator", "groupcoord", "broker", "txn", "faults", "benchmarks"} <= rooms


def test_no_import_points_from_a_lower_room_to_a_higher_one():
    problems = []
    for path in product_modules():
        problems += forbidden_imports(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
    assert problems == [], "imports against DESIGN.md's table of rooms:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "module, source, wrong",
    [
        ("txn.producer", "from faults.points import point as crash_point\n", "faults.points"),
        ("txn.producer", "def f():\n    import broker.broker\n", "broker.broker"),
        ("storage.log", "import importlib\nimportlib.import_module('faults.disk')\n", "faults.disk"),
        ("coordinator.coordinator", "from groupcoord import records\n", "groupcoord"),
        ("broker.apis", "from faults import points\n", "faults"),
        ("protocol.records", "import storage.segment\n", "storage.segment"),
        ("faults.chaos", "import benchmarks.suite\n", "benchmarks.suite"),
        ("onceflow.cli", "import benchmarks.suite\n", "benchmarks.suite"),
        ("benchmarks.bench_sasl", "def f():\n    from tests.helpers import TestCA\n", "tests.helpers"),
        ("faults.chaos", "import tests.helpers\n", "tests.helpers"),
    ],
)
def test_the_check_catches_a_wrong_arrow(module, source, wrong):
    assert [problem for problem in forbidden_imports(source, module) if f"imports {wrong} " in problem]


@pytest.mark.parametrize(
    "module, source",
    [
        ("broker.broker", "from faults.points import point\n"),
        ("onceflow.commands.bench", "import importlib\nimportlib.import_module('benchmarks.suite')\n"),
        ("faults.process", "from broker.broker import Broker\nimport txn\n"),
        ("streaming.runner", "from txn import Producer\nfrom protocol.errors import ErrorCode\n"),
        ("storage.segment", "from . import index\nfrom .checksum import checked_header\n"),
    ],
)
def test_the_check_lets_the_right_arrows_pass(module, source):
    assert forbidden_imports(source, module) == []


def test_relative_imports_are_resolved():
    assert imported_names("from ..protocol import records\n", "storage.segment") == [(1, "protocol")]
    assert imported_names("from . import segment\n", "storage", is_package=True) == [(1, "storage")]
