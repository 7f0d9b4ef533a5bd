"""How an app is pointed at a cluster and started (issue 31's friendlier
edges): ``App`` takes ``ONCEFLOW_BOOTSTRAP_SERVERS`` and
``ONCEFLOW_STATE_DIR`` when not given, ``onceflow run`` takes a module name
(``package.module`` or ``module:variable``) as well as a path, and an app
module's ``__main__`` block runs the app it built through
``streaming.cli.main_of`` (``onceflow run``'s options; the module is built
once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import streaming
from streaming.cli import load_app
from tests.conftest import REPO
from tests.helpers import create_topic


def test_the_app_takes_where_it_runs_from_the_environment_when_not_given(tmp_path, monkeypatch):
    monkeypatch.setenv("ONCEFLOW_BOOTSTRAP_SERVERS", "cluster:9093")
    monkeypatch.setenv("ONCEFLOW_STATE_DIR", str(tmp_path / "from-env"))
    app = streaming.App(application_id="env")
    assert (app.bootstrap_servers, app.state_dir) == ("cluster:9093", str(tmp_path / "from-env"))
    given = streaming.App("given:9092", "env", str(tmp_path / "given"))
    assert (given.bootstrap_servers, given.state_dir) == ("given:9092", str(tmp_path / "given")), "what is given wins"
    monkeypatch.delenv("ONCEFLOW_BOOTSTRAP_SERVERS")
    monkeypatch.delenv("ONCEFLOW_STATE_DIR")
    monkeypatch.chdir(tmp_path)
    default = streaming.App(application_id="env")
    assert (default.bootstrap_servers, default.state_dir) == ("127.0.0.1:9092", str(tmp_path / "state" / "env"))
    default.place(bootstrap_servers="placed:1", state_dir="elsewhere", instance_id="i-7")
    assert (default.bootstrap_servers, default.state_dir) == ("placed:1", str(tmp_path / "elsewhere"))


def test_onceflow_run_takes_a_module_name_or_module_colon_variable(tmp_path, monkeypatch):
    package = tmp_path / "apps"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "billing.py").write_text(
        "import streaming\n"
        "app = streaming.App('h:1', 'billing', 'state')\n"
        "audit = streaming.App('h:1', 'audit', 'state2')\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('onceflow run must not run the main block')\n"
    )
    monkeypatch.chdir(tmp_path)  # found as `python -m` finds modules: from here
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "apps", raising=False)
    monkeypatch.delitem(sys.modules, "apps.billing", raising=False)
    assert load_app("apps.billing").application_id == "billing"
    assert load_app("apps.billing:audit").application_id == "audit"
    assert load_app("apps/billing.py").application_id == "billing", "a path as before"
    with pytest.raises(LookupError, match="no app module 'apps.missing'"):
        load_app("apps.missing")
    with pytest.raises(LookupError, match="no App named 'nothing'"):
        load_app("apps.billing:nothing")
    with pytest.raises(FileNotFoundError):
        load_app("apps/missing.py")


@pytest.mark.slow
def test_an_app_modules_main_block_runs_the_app_it_built_once_with_onceflow_runs_options(embedded_broker, tmp_path):
    create_topic(embedded_broker.bootstrap, "edge-in", 1)
    create_topic(embedded_broker.bootstrap, "edge-out", 1)
    builds = tmp_path / "builds"
    module = tmp_path / "edge_app.py"
    module.write_text(
        "import streaming\n"
        f"with open({str(builds)!r}, 'a') as file:\n"
        "    file.write('built\\n')\n"
        "app = streaming.App(application_id='edge')\n"
        "app.stream('edge-in').to('edge-out')\n"
        "if __name__ == '__main__':\n"
        "    from streaming.cli import main_of\n"
        "    raise SystemExit(main_of(app))\n"
    )
    environment = dict(os.environ, PYTHONPATH=REPO)
    environment.pop("ONCEFLOW_BOOTSTRAP_SERVERS", None)
    done = subprocess.run(
        [sys.executable, str(module), "--bootstrap", embedded_broker.bootstrap, "--state-dir", str(tmp_path / "state"), "--until-idle", "1", "--progress-interval", "0"],
        env=environment, cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "onceflow run: stopped" in done.stderr
    assert builds.read_text() == "built\n", "the module was built once"
    assert os.path.isdir(tmp_path / "state"), "the state directory given on the command line"


def test_peek_and_print_look_at_each_record_and_pass_it_on_unchanged(tmp_path):
    import io

    from streaming.testing import TestDriver

    app = streaming.App("h:1", "peeking", str(tmp_path))
    seen, printed = [], io.StringIO()
    (app.stream("in", key_format="str", value_format="json")
        .peek(seen.append)
        .filter(lambda value: value["n"] > 1)
        .print("kept", file=printed)
        .peek(lambda key, value: seen.append((key, value["n"])), with_key=True)
        .map(lambda value: value["n"] * 10)
        .to("out", value_format="json"))
    driver = TestDriver(app)
    for n in (1, 2, 3):
        driver.pipe("in", f"k{n}", {"n": n})
    assert driver.read("out") == [("k2", 20), ("k3", 30)]
    assert seen == [{"n": 1}, {"n": 2}, ("k2", 2), {"n": 3}, ("k3", 3)]
    assert printed.getvalue() == "kept 'k2': {'n': 2}\nkept 'k3': {'n': 3}\n"


def test_a_sigterm_while_the_app_module_loads_is_a_clean_stop(tmp_path):
    """``onceflow run`` takes SIGTERM as a stop from its start, not only once
    the app's run installs its handlers: a stop asked while the app module
    is still importing (here: held until the test lets it go) ends the
    command with status 0 before anything runs. Before, it died of the
    signal (-15)."""
    import signal
    import time

    loading, go = tmp_path / "loading", tmp_path / "go"
    module = tmp_path / "slow_app.py"
    module.write_text(
        "import os, time\n"
        "import streaming\n"
        f"open({str(loading)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.01)\n"
        "app = streaming.App(application_id='slow', bootstrap_servers='127.0.0.1:9')\n"
        "app.stream('slow-in').to('slow-out')\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "onceflow", "run", str(module), "--state-dir", str(tmp_path / "state")],
        env=dict(os.environ, PYTHONPATH=REPO), cwd=str(tmp_path), stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not loading.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the app module never started loading"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the signal is taken while the module still loads
        go.touch()
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr[-2000:]
    assert "stopped before it started" in stderr
    assert not (tmp_path / "state").exists(), "nothing ran"
