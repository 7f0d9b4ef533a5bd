"""No definition of the product's packages goes uncalled.

Every function, class and method defined in a product module must have its
name used somewhere in the tree besides its own ``def`` line: a call, an
attribute, an import, or a string naming it (``getattr``, an entry point).
Tests, benchmarks, examples and tools count as callers. The check is by
name, parsed with ``ast`` (nothing is imported), so it can miss dead code
whose name another live definition shares; it never flags code in use
except a hook that a framework calls by its name, and those are listed in
``CALLED_BY_A_FRAMEWORK`` with who calls them. Decorated top-level
functions (``@atexit.register``) are registered, hence used.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

PRODUCT = ("protocol", "storage", "coordinator", "groupcoord", "broker", "txn", "streaming", "faults", "onceflow", "pyspark_onceflow")

# Method names that only a framework calls, never our code: name -> who.
CALLED_BY_A_FRAMEWORK: dict[str, str] = {
    "streamWriter": "PySpark's DataSource (a streaming write)",
    "prepareForTriggerAvailableNow": "PySpark's DataSourceStreamReader (Trigger.AvailableNow)",
    "reportLatestOffset": "PySpark's DataSourceStreamReader (progress reports)",
    "_get_close_waiter": "asyncio's StreamWriter.wait_closed (protocol.frame_stream's protocol under its writer)",
    "_replace_writer": "asyncio's StreamWriter.start_tls, Python 3.11 (protocol.frame_stream's protocol under its writer)",
    "_replace_transport": "asyncio's StreamWriter.start_tls, Python 3.12+ (protocol.frame_stream's protocol under its writer)",
    "get_buffer": "asyncio's transports (a BufferedProtocol: where the next bytes go)",
    "buffer_updated": "asyncio's transports (a BufferedProtocol: bytes were written there)",
    "eof_received": "asyncio's transports (the peer closed its side)",
    "connection_made": "asyncio's transports (protocol.frame_stream's protocol: the connection is up)",
    "connection_lost": "asyncio's transports (protocol.frame_stream's protocol: the connection is gone)",
    "pause_writing": "asyncio's transports (the send buffer is full)",
    "resume_writing": "asyncio's transports (the send buffer has room again)",
    "_drain_helper": "asyncio's StreamWriter.drain (protocol.frame_stream's protocol under its writer)",
}


HOOK_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def python_files() -> list[pathlib.Path]:
    return [path for path in sorted(REPO.rglob("*.py")) if not path.relative_to(REPO).parts[0].startswith(".")]


def definitions(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of the top-level functions and classes and of the
    methods of top-level classes, dunders and registered functions left out."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.ClassDef):
            found.append((node.lineno, node.name))
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((member.lineno, member.name))
    return [(line, name) for line, name in found if not (name.startswith("__") and name.endswith("__"))]


def used_names(tree: ast.Module) -> collections.Counter:
    """Every name ``tree`` mentions other than by defining it."""
    names: collections.Counter = collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names[node.id] += 1
        elif isinstance(node, ast.Attribute):
            names[node.attr] += 1
        elif isinstance(node, ast.alias):
            names[node.name.split(".")[-1]] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.isidentifier():
                names[node.value] += 1
            elif HOOK_REFERENCE.fullmatch(node.value):  # "package.module:function", as crashPointHook names one
                names[node.value.rsplit(":", 1)[1]] += 1
    return names


def dead_definitions(product: dict[str, str], others: list[str]) -> list[str]:
    """``product`` maps a path to its source; ``others`` are the sources of
    the rest of the tree. Returns ``path:line name`` of each definition whose
    name nothing uses."""
    trees = {path: ast.parse(source) for path, source in product.items()}
    used: collections.Counter = collections.Counter()
    for tree in [*trees.values(), *(ast.parse(source) for source in others)]:
        used.update(used_names(tree))
    return [
        f"{path}:{line} {name}"
        for path, tree in trees.items()
        for line, name in definitions(tree)
        if used[name] == 0 and name not in CALLED_BY_A_FRAMEWORK
    ]


def test_every_definition_of_the_product_has_a_caller():
    product, others = {}, []
    for path in python_files():
        relative = path.relative_to(REPO)
        if relative.parts[0] in PRODUCT:
            product[str(relative)] = path.read_text()
        else:
            others.append(path.read_text())
    assert {pathlib.Path(path).parts[0] for path in product} >= {"protocol", "storage", "broker", "txn", "streaming", "faults"}
    dead = dead_definitions(product, others)
    assert dead == [], "definitions nothing calls (delete them, or call them):\n" + "\n".join(dead)


@pytest.mark.parametrize(
    "source, dead",
    [
        ("def zigzag_encode(value):\n    return value << 1\n", "1 zigzag_encode"),
        ("class Segment:\n    def is_empty(self):\n        return True\n\nSegment()\n", "2 is_empty"),
        ("async def drain():\n    pass\n", "1 drain"),
    ],
)
def test_the_check_finds_an_uncalled_definition(source, dead):
    assert dead_definitions({"storage/segment.py": source}, []) == [f"storage/segment.py:{dead}"]


@pytest.mark.parametrize(
    "source, elsewhere",
    [
        ("def helper():\n    pass\n", "from storage.segment import helper\n"),
        ("class Log:\n    def flush(self):\n        pass\n", "Log().flush()\n"),
        ("def handle_fetch():\n    pass\n", "getattr(apis, 'handle_fetch')\n"),
        ("import atexit\n@atexit.register\ndef _stop():\n    pass\n", ""),
    ],
)
def test_the_check_lets_a_used_definition_pass(source, elsewhere):
    assert dead_definitions({"storage/segment.py": source}, [elsewhere]) == []
