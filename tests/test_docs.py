"""The documentation site builds, strictly, and its generated reference pages
cover what the code has.

``tests/test_readme.py`` runs every code block of the site's pages (and the
README's); this module builds the site with ``mkdocs build --strict`` (a
broken link, a missing anchor, a page left out of the navigation, or a
docstring mkdocstrings cannot render fail it) and checks the pages that
``docs/hooks/generated_reference.py`` generates from the code: the command
line reference from the argparse parsers, the settings from the broker's and
the topics' configuration classes, the served APIs from the broker's table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib

import attrs
import pytest

from tests.conftest import REPO

HOOK = os.path.join(REPO, "docs", "hooks", "generated_reference.py")


def generated_reference():
    spec = importlib.util.spec_from_file_location("generated_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_strictly_with_its_generated_pages(tmp_path):
    site = tmp_path / "site"
    environment = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", os.path.join(REPO, "mkdocs.yml"), "--site-dir", str(site)],
                            cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "usage: onceflow broker" in cli and "usage: onceflow topics create" in cli
    assert "&lt;!-- onceflow help --&gt;" not in cli and "<!-- onceflow help -->" not in cli
    assert "transaction.offset.commit.stall.ms" in (site / "reference" / "configuration" / "index.html").read_text()
    assert "EndTxn" in (site / "reference" / "protocol" / "index.html").read_text()
    api = (site / "reference" / "python-api" / "index.html").read_text()
    for name in ("txn.Producer", "txn.Consumer", "streaming.App", "faults.chaos.run_chaos"):
        assert f'id="{name}"' in api, name
    for page in ("concepts/transactions", "concepts/log", "concepts/runner", "concepts/spark-sink"):
        assert 'class="mermaid"' in (site / page / "index.html").read_text(), page


def test_the_command_reference_has_every_command_and_subcommand():
    from onceflow.cli import COMMANDS

    text = generated_reference().command_reference()
    for command in COMMANDS:
        assert f"usage: onceflow {command.name} " in text, command.name
    for subcommand in ("topics create", "topics delete", "transactions find-hanging", "acls add", "users list", "spark-cluster start", "spark finish-decided"):
        assert f"usage: onceflow {subcommand}" in text, subcommand


def test_the_configuration_reference_has_every_setting_with_its_default():
    from broker import config as broker_config
    from storage.config import LogConfig

    text = generated_reference().configuration_reference()
    defaults = {field.name: field.default for field in attrs.fields(broker_config.BrokerConfig)}
    for name, field in {**broker_config._INT_SETTINGS, **broker_config._BOOL_SETTINGS}.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        shown = str(defaults[field]).lower() if isinstance(defaults[field], bool) else str(defaults[field])
        assert shown in row or "unlimited" in row, row
    for name in LogConfig().to_properties():
        assert f"| `{name}` |" in text, name


def test_the_api_reference_lists_every_served_api():
    from broker.apis import SUPPORTED_APIS

    rows = [line for line in generated_reference().api_reference().splitlines() if line.startswith("| ") and not line.startswith(("| API", "| ---"))]
    assert len(rows) == len(SUPPORTED_APIS)
    assert "| EndTxn | 26 | 0-5 |" in rows


def test_the_test_setup_installs_the_docs_tools():
    """The README's test command installs `.[test]`; that brings `.[docs]`,
    so the build test above runs wherever the suite does."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    assert "onceflow[docs]" in extras["test"]
    assert {requirement.split(">")[0].split("=")[0] for requirement in extras["docs"]} >= {"mkdocs", "mkdocs-material", "mkdocstrings[python]"}


def documented_metric_names(page: str) -> set[str]:
    """The metric names a reference page names: whole names, and the short
    forms of a table row (`onceflow_partition_log_end_offset`, `_high_watermark`
    stands for onceflow_partition_high_watermark: the first name's words up to
    some underscore, then the suffix)."""
    names: set[str] = set()
    for line in page.splitlines():
        full = re.findall(r"\b(onceflow_[a-z_]+[a-z])\b", line)
        names.update(full)
        if full:
            cuts = [index for index, char in enumerate(full[0]) if char == "_"]
            for suffix in re.findall(r"`(_[a-z_]+)`", line):
                names.update(full[0][:cut] + suffix for cut in cuts)
    return names


def test_every_metric_the_code_defines_is_in_the_reference():
    """Each metric family broker/metrics.py and streaming/metrics.py define
    (counters with or without their _total) is on reference/metrics.md."""
    defined = set()
    for module in ("broker/metrics.py", "streaming/metrics.py"):
        with open(os.path.join(REPO, module), encoding="utf-8") as file:
            defined |= set(re.findall(r"\"(onceflow_[a-z_]+)\"", file.read()))
    assert len(defined) >= 40, defined
    with open(os.path.join(REPO, "docs", "reference", "metrics.md"), encoding="utf-8") as file:
        documented = documented_metric_names(file.read())
    missing = sorted(name for name in defined if not {name, name + "_total", name.removesuffix("_total")} & documented)
    assert missing == [], missing


def test_the_readmes_links_into_the_site_lead_to_pages():
    """The README is outside the site (mkdocs does not check it): each of its
    relative links must name a file of the checkout."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as file:
        targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", file.read())
    assert len([target for target in targets if target.startswith("docs/")]) >= 20, targets
    for target in targets:
        assert os.path.isfile(os.path.join(REPO, target)), target


#: The performance page's chart: each bar's label -> the table row it draws.
CHART_ROWS = {
    "100 B acks=all": "produce 100 B, acks=all: records/s",
    "100 B idempotent": "produce 100 B, idempotent: records/s",
    "1 KiB acks=all": "produce 1 KiB, acks=all: records/s",
    "1 KiB idempotent": "produce 1 KiB, idempotent: records/s",
    "4 KiB batches": "produce 1 KiB, idempotent, 4 KiB batches: records/s",
    "txn of 100": "transactions of 100 records: records/s",
    "txn of 1": "transactions of 1 record: records/s",
    "read_uncommitted": "consume read_uncommitted: records/s",
    "read_committed": "consume read_committed: records/s",
    "copier": "exactly-once copier (750/txn): records/s",
    "copier steady": "exactly-once copier (750/txn): steady records/s",
}


def test_the_performance_chart_draws_the_table_beside_it():
    """The bars of the bench chart are the "ours / Tansu" column of the
    table they are drawn from, label for label."""
    page = open(os.path.join(REPO, "docs", "performance", "index.md")).read()
    chart = page.split("```mermaid\nxychart-beta", 1)[1].split("```", 1)[0]
    labels = json.loads(re.search(r"x-axis (\[.*\])", chart).group(1))
    bars = json.loads(re.search(r"bar (\[.*\])", chart).group(1))
    ratios = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in CHART_ROWS.values():
            ratios[cells[0]] = float(cells[4])
    assert labels == list(CHART_ROWS)
    assert bars == [ratios[CHART_ROWS[label]] for label in labels]


def test_the_concurrency_charts_draw_the_table_beside_them():
    """Each concurrency chart's two lines are the onceflow and Tansu columns
    of the table's rows for N = 1, 4, 16 and 64 clients."""
    page = open(os.path.join(REPO, "docs", "performance", "index.md")).read()
    table = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("concurrency:"):
            table[cells[0]] = (int(cells[1].replace(",", "")), int(cells[3].replace(",", "")))
    charts = [chart for chart in page.split("```mermaid\n")[1:] if '"clients at once"' in chart.split("```", 1)[0]]
    assert len(charts) == 2
    for chart, row in zip(charts, ("idempotent producers, 10 x 100 B per request", "transactional copiers, 10 records + offsets per transaction")):
        body = chart.split("```", 1)[0]
        assert row in body
        ours, tansu = (json.loads(points) for points in re.findall(r"line (\[.*\])", body))
        prefix = f"concurrency: {row}: records/s, N="
        assert ours == [table[prefix + str(n)][0] for n in (1, 4, 16, 64)]
        assert tansu == [table[prefix + str(n)][1] for n in (1, 4, 16, 64)]
