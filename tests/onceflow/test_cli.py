"""The ``onceflow`` command line as one table with one dispatch: every
command's help is real, global options reach every command, commands are
imported only when chosen, and the packaging ships the product's packages
and not the benchmarks."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib

import pytest

from onceflow.cli import COMMANDS
from tests.conftest import REPO

HEAVY = ("pyspark", "matplotlib", "faults", "benchmarks", "streaming")  # what --help and the client commands never load


def onceflow(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onceflow", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def parsers_of(command) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """The command's parser as its module builds it, and its subcommands' parsers, with their words."""
    parser = argparse.ArgumentParser(prog=f"onceflow {command.name}")
    importlib.import_module(command.module).add_arguments(parser)
    found = [((command.name,), parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [((command.name, name), sub) for name, sub in action.choices.items()]
    return found


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions if not isinstance(action, argparse._HelpAction) for option in action.option_strings]


def test_the_help_lists_every_command():
    result = onceflow("--help")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line[4] != " "]
    assert listed == [command.name for command in COMMANDS]
    assert "--log-level" in result.stdout
    for command in COMMANDS:
        assert command.summary.split()[0] in result.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_every_command_has_real_help_after_the_global_options(command):
    for words, parser in parsers_of(command):
        result = onceflow("--log-level", "DEBUG", *words, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: onceflow {' '.join(words)}"), result.stdout
        for option in option_strings(parser):
            assert option in result.stdout, f"`onceflow {' '.join(words)} --help` does not name {option}"
        undescribed = [action.option_strings for action in parser._actions if action.option_strings and not action.help]
        assert undescribed == [], f"options of `onceflow {' '.join(words)}` without a description"


def test_global_options_reach_the_command():
    """The old dispatch sent chaos and bench past the parser: `--log-level
    DEBUG chaos` exited 2 without a word. Now chaos parses its options and
    answers bad ones itself, and logging is set before any command runs."""
    chaos = onceflow("--log-level", "DEBUG", "chaos", "--faults", "no-such-fault", "--duration", "1")
    assert chaos.returncode == 2 and "onceflow chaos: unknown fault kind(s): no-such-fault" in chaos.stderr, chaos.stderr
    probe = ("import logging, sys\nfrom onceflow.cli import main\n"
             "status = main(['--log-level', 'error', 'dump-log', 'no-such-file.log'])\n"
             "print(status, logging.getLevelName(logging.getLogger().getEffectiveLevel()))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "1 ERROR", result.stdout + result.stderr
    bad = onceflow("--log-level", "LOUD", "topics", "list")
    assert bad.returncode == 2 and "--log-level" in bad.stderr and "'LOUD' is not one of" in bad.stderr


def test_help_imports_only_the_chosen_command():
    probe = ("import sys\nfrom onceflow import cli\n"
             "for argv in (['--help'], ['topics', '--help']):\n"
             "    try:\n        cli.main(argv)\n    except SystemExit as exit:\n        assert exit.code == 0, exit.code\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('onceflow.commands.')))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "['onceflow.commands.topics']"


def test_a_client_command_loads_no_spark_harness_or_benchmarks(embedded_broker):
    probe = ("import sys\nfrom onceflow import cli\n"
             f"status = cli.main(['topics', '--bootstrap-server', {embedded_broker.bootstrap!r}, 'list'])\n"
             f"print(status, sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "0 []", result.stdout + result.stderr


def packaged() -> set[str]:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        return set(tomllib.load(file)["tool"]["setuptools"]["packages"])


def run_as_installed(code: str, packages_from: str, cwd) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python that imports the packaged packages from
    ``packages_from`` and nothing else of this repository, as after
    ``pip install`` (``packages_from`` = a site directory holding copies) or
    ``pip install -e .`` (``packages_from`` = the checkout: an editable
    install maps the packaged packages only). Dependencies come from this
    environment's site-packages, without its own editable mapping."""
    top_level = sorted({name.split(".")[0] for name in packaged()})
    preamble = (
        "import importlib.machinery, sys\n"
        f"sys.path.append({sysconfig.get_paths()['purelib']!r})\n"
        "class Installed:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        f"        return importlib.machinery.PathFinder.find_spec(name, [{packages_from!r}]) if name in {top_level!r} else None\n"
        "sys.meta_path.insert(0, Installed)\n"
    )
    return subprocess.run([sys.executable, "-S", "-c", preamble + code], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_bench_from_a_wheel_says_so_in_one_line(tmp_path):
    site = tmp_path / "site"
    for name in {name.split(".")[0] for name in packaged()}:
        shutil.copytree(os.path.join(REPO, name), site / name, ignore=shutil.ignore_patterns("__pycache__"))
    result = run_as_installed("from onceflow.cli import main\nsys.exit(main(['bench', '--rounds', '1']))", str(site), tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("onceflow bench: the benchmarks are not installed"), result.stderr


def test_bench_from_an_editable_install_finds_the_checkouts_benchmarks(tmp_path):
    probe = ("try:\n    import benchmarks\nexcept ImportError:\n    print('not on the path')\n"
             "from onceflow.commands.bench import benchmark_suite\nprint(benchmark_suite().__file__)")
    result = run_as_installed(probe, REPO, tmp_path)
    assert result.stdout.splitlines() == ["not on the path", os.path.join(REPO, "benchmarks", "suite.py")], result.stdout + result.stderr


def test_the_wheel_holds_every_product_package_and_no_benchmarks():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        assert tomllib.load(file)["project"]["scripts"]["onceflow"] == "onceflow.cli:main"
    not_shipped = {"tests", "benchmarks", "examples", "tools", "build", "dist"}
    present = set()
    for directory, subdirectories, files in os.walk(REPO):
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".") and d != "__pycache__"]
        relative = os.path.relpath(directory, REPO)
        if "__init__.py" in files and relative.split(os.sep)[0] not in not_shipped:
            present.add(relative.replace(os.sep, "."))
    assert packaged() == present
    assert "benchmarks" not in packaged() and {"onceflow", "onceflow.commands"} <= packaged()
