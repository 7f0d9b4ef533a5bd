"""The Grafana dashboard in examples/ asks only for metrics the broker or the
runner expose (a renamed metric would leave a panel empty without this), and
shows nearly all of them."""

from __future__ import annotations

import json
import os
import re

from prometheus_client.parser import text_string_to_metric_families

from broker.broker import EmbeddedBroker
from faults.process import REPO

DASHBOARD = os.path.join(REPO, "examples", "grafana-onceflow.json")
METRIC_NAME = re.compile(r"\b((?:onceflow|process)_[a-z0-9_]+)\b")
# Exposed but not charted: identity and detail a user queries by hand.
NOT_CHARTED = {
    "onceflow_group_generation", "onceflow_runner_app_counter", "onceflow_runner_restore_position",
    "onceflow_metrics_scrapes", "onceflow_metrics_scrape_seconds",  # the endpoint's own cost (the bench reads them)
    "onceflow_requests_waited_fsync",  # the fsync rounds on a client's path (the bench reads them)
}


def exposed_sample_names(text: str) -> tuple[set[str], set[str]]:
    """(families, every sample name they may carry) of an exposition."""
    families, samples = set(), set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        if family.type == "counter":
            samples.add(family.name + "_total")
        elif family.type == "histogram":
            samples |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            samples.add(family.name)
    return families, samples


def exposed(tmp_path) -> tuple[set[str], set[str]]:
    import urllib.request

    import streaming
    from streaming.metrics import RunnerMetrics

    with EmbeddedBroker(str(tmp_path / "data"), metrics_address=("127.0.0.1", 0), properties={"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}) as broker:
        with urllib.request.urlopen(broker.metrics_url, timeout=10) as response:
            broker_families, broker_samples = exposed_sample_names(response.read().decode())

    class IdleRunner:
        assigned, lag, txn_open, restoring = set(), {}, False, {}

    app = streaming.App("127.0.0.1:9", "dashboard", str(tmp_path / "state"), instance_id="one")
    runner_families, runner_samples = exposed_sample_names(RunnerMetrics(app, IdleRunner()).render().decode())
    return broker_families | runner_families, broker_samples | runner_samples


def dashboard_expressions() -> list[str]:
    with open(DASHBOARD) as file:
        dashboard = json.load(file)
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    expressions += [variable["query"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    return expressions


def test_every_expression_names_an_exposed_metric_and_nearly_all_are_charted(tmp_path):
    families, samples = exposed(tmp_path)
    expressions = dashboard_expressions()
    assert len(expressions) > 30
    used = set()
    for expression in expressions:
        names = METRIC_NAME.findall(expression)
        assert names, f"no metric in {expression!r}"
        unknown = [name for name in names if name not in samples]
        assert not unknown, f"{expression!r} names {unknown}, which neither the broker nor the runner exposes"
        used |= set(names)
    charted_families = {family for family in families if any(name == family or name.startswith(family + "_") for name in used)}
    onceflow_families = {family for family in families if family.startswith("onceflow_")}
    assert onceflow_families - charted_families == NOT_CHARTED


def test_the_check_catches_a_misspelt_metric(tmp_path):
    _families, samples = exposed(tmp_path)
    assert "onceflow_requests_total" in samples and "onceflow_request_duration_seconds_bucket" in samples
    assert "onceflow_request_total" not in samples and "onceflow_requests" not in samples
    assert METRIC_NAME.findall('sum(rate(onceflow_requests_total{job=~"$broker_job"}[5m])) / process_resident_memory_bytes') == ["onceflow_requests_total", "process_resident_memory_bytes"]


def test_panels_have_unique_ids_and_a_place_on_the_grid():
    with open(DASHBOARD) as file:
        dashboard = json.load(file)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
