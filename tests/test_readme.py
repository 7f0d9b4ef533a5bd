"""Every code block of the README and of the documentation site (docs/)
runs, as written, and does what the text around it says (so neither can
rot).

The code is fenced: ``python`` and ``sh`` blocks are executed here (each by
the test that names it in ``SH_BLOCKS`` or ``PYTHON_BLOCKS``; a block no test
runs fails ``test_every_executable_block_has_its_test``), ``text`` blocks are
command synopses (checked against ``--help``) and diagrams (the files they
name must exist), ``mermaid`` blocks are diagrams drawn by the site. A block
may appear on several pages (the README's quickstarts are also on the site's
getting-started pages): every copy must be the same text, and its test runs
it once for all. The only rewrite a test makes is the broker address
(127.0.0.1:9092 becomes a free port) and, where named, a shorter duration.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers import free_port

README = os.path.join(REPO, "README.md")
DOCUMENTS = [README] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
BIN = os.path.dirname(sys.executable)  # where `onceflow` and `python` of this environment live
MERMAID_DIAGRAMS = ("sequenceDiagram", "flowchart", "stateDiagram-v2", "xychart-beta")

# A unique piece of each block -> the test that runs it.
SH_BLOCKS = {
    "pip install -e . && .venv/bin/onceflow demo": "test_setup_demo_command_is_exactly_once_through_kills_on_a_fresh_copy",
    "pip install -e '.[test]' && .venv/bin/python -m pytest": "test_setup_test_command_is_what_ci_runs",
    "--transactional-id loader": "test_first_session_block",
    "--keep-data ./demo-run": "test_demo_inspection_block",
    "examples/transactional_copier.py": "test_copier_command_copies",
    "onceflow chaos --workload copier": "test_chaos_command_runs_and_reports",
    "onceflow chaos --workload streaming --app": "test_chaos_quickstart_on_your_own_app",
    "onceflow bench": "test_bench_command_runs_every_scenario",
}
PYTHON_BLOCKS = {
    "confluent_kafka": "test_confluent_kafka_example_round_trips",
    "send_offsets_to_transaction": "test_transactional_example_copies_orders_to_payments",
    "run_chaos": "test_chaos_example_runs_and_is_valid",
    "app.run(until_idle=5.0)": "test_runner_quickstart_app",
    "def test_running_balances(tmp_path)": "test_first_processor_test_passes",
    "from streaming.testing import TestDriver": "test_runner_quickstart_test_passes_without_a_broker",
    "streaming.spark.register(spark)": "test_spark_quickstart_query",
    'app.table("account-regions"': "test_joins_guide_example_runs_through_the_test_driver",
}


def read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def fenced_blocks_of(path: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```$", read(path), flags=re.S | re.M)


def fenced_blocks() -> list[tuple[str, str]]:
    return [block for path in DOCUMENTS for block in fenced_blocks_of(path)]


def blocks_of(kind: str) -> list[str]:
    """The distinct blocks of that kind over the README and the site, in order."""
    return list(dict.fromkeys(body for language, body in fenced_blocks() if language == kind))


def the_block(kind: str, marker: str) -> str:
    matches = [body for body in blocks_of(kind) if marker in body]
    assert len(matches) == 1, f"expected one {kind} block with {marker!r} (every copy the same text), found {len(matches)} different ones"
    return matches[0]


def run_sh(block: str, cwd, *, timeout: float, replacements: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = block
    for old, new in (replacements or {}).items():
        assert old in script, f"{old!r} is not in the block any more"
        script = script.replace(old, new)
    environment = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout)


# -- the documents' shape ------------------------------------------------------------


def test_the_site_has_pages_to_check():
    pages = [path for path in DOCUMENTS if path != README]
    assert len(pages) >= 20, pages


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: os.path.relpath(path, REPO))
def test_every_code_block_is_fenced_with_a_known_kind(path):
    outside = re.sub(r"^```\w*\n.*?^```$", "", read(path), flags=re.S | re.M)
    assert "```" not in outside, "an unclosed fence: its code would not be checked"
    # mkdocstrings' directives (`::: txn.Producer` and their indented options) are not code.
    outside = re.sub(r"^::: .*\n(?:    .*\n|\n)*", "", outside, flags=re.M)
    indented = [line for line in outside.splitlines() if line.startswith("    ") and line.strip()]
    assert indented == [], "indented code blocks are not executed; fence them"
    kinds = {language for language, _ in fenced_blocks_of(path)}
    assert kinds <= {"python", "sh", "text", "mermaid"}, kinds


def test_every_executable_block_has_its_test():
    for kind, registry in (("sh", SH_BLOCKS), ("python", PYTHON_BLOCKS)):
        for body in blocks_of(kind):
            owners = [test for marker, test in registry.items() if marker in body]
            assert len(owners) == 1, f"this {kind} block has {len(owners)} tests:\n{body}"
            assert owners[0] in globals(), owners[0]
        assert len(blocks_of(kind)) == len(registry), f"a {kind} block listed here is gone from the README and the site"


def test_mermaid_blocks_are_diagrams():
    diagrams = blocks_of("mermaid")
    assert len(diagrams) >= 7, "the concept pages' diagrams are gone"
    for body in diagrams:
        assert body.split(None, 1)[0] in MERMAID_DIAGRAMS, body[:200]
def synopsis_lines() -> list[str]:
    """Synopsis lines of the text blocks, continuation lines joined."""
    lines: list[str] = []
    for body in blocks_of("text"):
        for line in body.splitlines():
            if line.startswith("onceflow "):
                lines.append(line.strip())
            elif lines and line.startswith(" ") and line.strip().startswith("[") and body.lstrip().startswith("onceflow "):
                lines[-1] += " " + line.strip()
    return lines


def help_of(*words: str) -> str:
    result = subprocess.run([os.path.join(BIN, "onceflow"), *words, "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
    return result.stdout if result.returncode == 0 else ""


def test_command_synopses_match_the_help():
    """Every option a synopsis line shows exists in the --help of that
    command or of one of the subcommands it names."""
    lines = synopsis_lines()
    assert len(lines) >= 10
    for line in lines:
        words = line.split()
        command = words[1]
        help_text = help_of(command)
        assert help_text, f"`onceflow {command} --help` failed"
        for word in words[2:]:
            if re.fullmatch(r"[a-z][a-z|-]*", word):  # subcommands: create|list|..., describe
                for sub in word.split("|"):
                    help_text += help_of(command, sub)
        for option in re.findall(r"--[a-z][a-z-]*", line):
            assert option in help_text, f"{line!r}: {option} is in no --help of `onceflow {command}`"


def test_diagrams_name_files_that_exist():
    names = set()
    for body in blocks_of("text"):
        if body.lstrip().startswith("onceflow "):
            continue
        names |= set(re.findall(r"([a-z_]+/)", body)) | set(re.findall(r"\b([a-z_]+\.py)\b", body))
    assert names, "the architecture diagrams are gone"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith("/"):
            assert os.path.isdir(os.path.join(REPO, name)), name
        else:
            assert any(path.endswith("/" + name) for path in tracked), name


# -- sh blocks -----------------------------------------------------------------------


def test_setup_test_command_is_what_ci_runs():
    """CI (.ci/run) runs exactly the README's test command on a clean clone,
    so this very suite is that command's check."""
    command = the_block("sh", "pip install -e '.[test]'").strip()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as file:
        ci = file.read()
    assert command in ci.splitlines()


@pytest.mark.slow
def test_setup_demo_command_is_exactly_once_through_kills_on_a_fresh_copy(tmp_path):
    """The main job exactly as written: a new virtualenv in a copy of the
    project, `pip install -e .`, `onceflow demo` with its defaults (a random
    seed, printed): pipeline, broker and Spark driver SIGKILLed, every
    balance and every Spark row once: the suite's one run of the default
    demo."""
    copy = tmp_path / "onceflow"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", "demo-report"))
    result = run_sh(the_block("sh", ".venv/bin/onceflow demo"), copy, timeout=900)
    report = result.stdout
    assert result.returncode == 0, report[-5000:] + result.stderr[-3000:]
    assert "verdict                     OK: exactly once" in report
    assert "payments in                 20000 (+1 closing payment)" in report
    assert "balances out (committed)    20001" in report
    # 20,000 payments 30 ms of event time apart span ten one-minute windows, each with all four regions, whatever the seed.
    rows = re.search(r"Spark rows out \(committed\)\s+(\d+) of (\d+) ", report)
    assert rows and rows.group(1) == rows.group(2) and int(rows.group(2)) == 40, report[-3000:]
    assert re.search(r"wrong totals\s+0\n", report) and re.search(r"wrong balances\s+0\n", report)
    assert re.search(r"faults injected\s+6 \(", report) and "kill-spark-driver" in report and "kill-broker" in report and "kill-pipeline" in report
    assert re.search(r"driver started [2-9] times", report)
    progress = [line for line in report.splitlines() if "payments" in line and " in  balances" in line]
    assert len(progress) >= 20, "a progress line every second or two"
    # Spark's rows rise batch by batch (windows close while the run goes on), not all at the end.
    # (Two steps at least: on a loaded machine a batch takes longer and reads
    # more, and CI saw 0, 8, 24, then the last 16 rows after the last line.)
    row_counts = {int(m.group(1)) for line in progress if (m := re.search(r"Spark rows\s+(\d+) out", line))}
    assert len(row_counts - {0, 40}) >= 2, sorted(row_counts)
    # The Spark driver kill lands on a decided batch not yet committed; the completer finishes it.
    kill = re.search(r"Spark driver kills\s+1 \(1 with a batch decided and not wholly committed\)\n\s+t=\s*[\d.]+s  batch \d+: decided, .*; completer: committed (\d+) of batch \d+'s (\d+) decided", report)
    assert kill and int(kill.group(1)) >= 1, report[-3000:]
    # The report goes to ./demo-report/ of the directory the command runs in.
    assert (copy / "demo-report" / "timeline.png").stat().st_size > 10_000
    assert "verdict                     OK: exactly once" in (copy / "demo-report" / "report.txt").read_text()
    seconds = float(re.search(r"time\s+([\d.]+) s", report).group(1))
    print(f"default demo took {seconds:.1f} s (the limit is 180 s on an idle two-core machine; benchmarks/demo_timing.py records it)")


def test_first_session_block(tmp_path):
    port = free_port()
    result = run_sh(the_block("sh", "--transactional-id loader"), tmp_path, timeout=120, replacements={"127.0.0.1:9092": f"127.0.0.1:{port}"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert 'acct-7\t{"amount": 5}' in out and 'acct-9\t{"amount": 2}' in out
    assert re.search(r"^loader\s", out, flags=re.M), "the transactional id shows in `transactions list`"
    assert out.count("endTxnMarker: COMMIT") >= 1
    assert (tmp_path / "data" / "orders-2").is_dir()


@pytest.mark.slow
def test_demo_inspection_block(tmp_path):
    port = free_port()
    result = run_sh(the_block("sh", "--keep-data ./demo-run"), tmp_path, timeout=600, replacements={"127.0.0.1:9092": f"127.0.0.1:{port}"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "verdict                     OK: exactly once" in result.stdout
    commits = re.search(r"^(\d+)$", result.stdout, flags=re.M)
    assert commits and int(commits.group(1)) > 0, "dump-log shows COMMIT markers in balances-0"
    assert re.search(r"^payments-pipeline-\w+\s", result.stdout, flags=re.M), result.stdout[-2000:]
    assert (tmp_path / "demo-run" / "history").is_dir()


@pytest.mark.slow
def test_copier_command_copies(embedded_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": embedded_broker.bootstrap})
    for name in ("in", "out"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(10)
    producer = Producer({"bootstrap.servers": embedded_broker.bootstrap, "enable.idempotence": True})
    for i in range(500):
        producer.produce("in", b"record-%d" % i)
    assert producer.flush(30) == 0
    command = the_block("sh", "examples/transactional_copier.py").replace("127.0.0.1:9092", embedded_broker.bootstrap)
    environment = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    copier = subprocess.Popen(["bash", "-c", "exec " + command.replace("\\\n", " ")], cwd=REPO, env=environment,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = Consumer({"bootstrap.servers": embedded_broker.bootstrap, "group.id": "readme-check", "isolation.level": "read_committed"})
    reader.assign([TopicPartition("out", 0, 0)])
    copied = []
    try:
        for _ in range(300):
            copied += [m.value() for m in reader.consume(500, 0.2) if m.error() is None]
            if len(copied) >= 500:
                break
    finally:
        copier.terminate()
        copier.wait(30)
        reader.close()
    assert sorted(copied) == sorted(b"record-%d" % i for i in range(500))


@pytest.mark.slow
def test_chaos_command_runs_and_reports(tmp_path):
    block = the_block("sh", "onceflow chaos --workload copier")
    result = run_sh(block, tmp_path, timeout=600, replacements={"--duration 60": "--duration 12"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for name in ("history.jsonl", "verdict.json", "summary.txt", "faults.jsonl"):
        assert (tmp_path / "chaos-report" / name).exists(), name


@pytest.mark.slow
def test_bench_command_runs_every_scenario(tmp_path):
    """The benchmark as the README runs it, with tiny sizes (this checks the
    harness, not speed): every scenario against both brokers, JSON and PNG."""
    import json

    from benchmarks.suite import CPU_METRICS, SCENARIOS, tansu_available

    block = the_block("sh", "onceflow bench")
    result = run_sh(block, tmp_path, timeout=900, replacements={
        "--rounds 3": "--rounds 1 --records 4000 --seconds 0.5 --copier-records 3000 --latency-rate 200"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert {row["scenario"] for row in report["rows"]} == {scenario.name for scenario in SCENARIOS}
    for row in report["rows"]:
        # CPU shares are read in clock ticks (10 ms): a tiny run may see none.
        floor = (lambda value: value >= 0) if row["metric"] in CPU_METRICS else (lambda value: value > 0)
        assert floor(row["onceflow"]), row
        if tansu_available() and not row["metric"].startswith("fsync rounds per"):  # counted by our broker only
            assert row["peer"] is not None and floor(row["peer"]), row
    assert {row["metric"] for row in report["rows"] if row["scenario"] == "produce 100 B, acks=all"} >= {"records/s", *CPU_METRICS}
    rounds = {row["scenario"]: row["onceflow"] for row in report["rows"] if row["metric"] == "fsync rounds per transaction"}
    assert 1.5 <= rounds["transactions of 1 record"] <= 2.5, rounds  # Produce, EndTxn's decision (librdkafka)
    assert report["limits"]["fsyncs_per_s"] > 0 and report["limits"]["loopback_mb_per_s"] > 0
    assert "Tansu does not filter aborted records" in result.stdout
    if tansu_available():
        assert (tmp_path / "bench.png").stat().st_size > 0


# -- python blocks --------------------------------------------------------------------


def test_transactional_example_copies_orders_to_payments(embedded_broker):
    from txn import Admin, Consumer, Producer, TopicPartition

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"orders": 1, "payments": 1})
    orders = Producer(bootstrap_servers=embedded_broker.bootstrap)
    for i in range(5):
        orders.send("orders", b'{"order": %d}' % i, key=b"acct-%d" % i)
    orders.close()
    code = the_block("python", "send_offsets_to_transaction").replace("127.0.0.1:9092", embedded_broker.bootstrap)
    exec(compile(code, "the docs", "exec"), {"__name__": "__main__"})
    reader = Consumer(bootstrap_servers=embedded_broker.bootstrap)
    reader.assign([TopicPartition("payments", 0)])
    copied = []
    for _ in range(20):
        copied += reader.poll(0.2)
    reader.close()
    assert sorted(r.value for r in copied) == [b'{"order": %d}' % i for i in range(5)]
    checker = Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id="payments")
    assert checker.committed([TopicPartition("orders", 0)])[TopicPartition("orders", 0)].offset == 5
    checker.close()


def test_confluent_kafka_example_round_trips(embedded_broker, capsys):
    from txn import Admin

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"orders": 1})
    code = the_block("python", "confluent_kafka").replace("127.0.0.1:9092", embedded_broker.bootstrap)
    exec(compile(code, "the docs", "exec"), {})
    assert capsys.readouterr().out.strip() == """b'acct-7' b'{"amount": 5}'"""


@pytest.mark.slow
def test_chaos_example_runs_and_is_valid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report folder lands here
    code = the_block("python", "run_chaos")
    namespace: dict = {}
    previous = os.getcwd()
    os.chdir(REPO)  # the processor path in the example is relative to the repository
    try:
        exec(compile(code.replace('"chaos-report"', repr(str(tmp_path / "chaos-report"))), "the docs", "exec"), namespace)
    finally:
        os.chdir(previous)
    assert namespace["verdict"].valid
    assert os.path.exists(tmp_path / "chaos-report" / "verdict.json")


@pytest.mark.slow
def test_chaos_quickstart_on_your_own_app(tmp_path):
    block = the_block("sh", "onceflow chaos --workload streaming --app")
    result = run_sh(block.replace("examples/", os.path.join(REPO, "examples") + "/"), tmp_path, timeout=600, replacements={"--duration 30": "--duration 15"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "VALID" in result.stdout
    assert json.loads((tmp_path / "app-chaos" / "verdict.json").read_text())["valid"] is True


def test_runner_quickstart_app(embedded_broker, tmp_path):
    from txn import Admin, Consumer, Producer, TopicPartition

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"payments": 3, "balances": 3})
    amounts = [("acct-1", 5), ("acct-2", 7), ("acct-1", -2), ("acct-3", 1), ("acct-2", 3)]
    with Producer(bootstrap_servers=embedded_broker.bootstrap) as producer:
        for account, amount in amounts:
            producer.send("payments", json.dumps({"amount": amount}).encode(), key=account.encode())
    code = the_block("python", "app.run(until_idle=5.0)").replace("127.0.0.1:9092", embedded_broker.bootstrap).replace("./balances-state", str(tmp_path / "state"))
    exec(compile(code, "the docs", "exec"), {"__name__": "__main__"})
    reader = Consumer(bootstrap_servers=embedded_broker.bootstrap)
    reader.assign([TopicPartition("balances", p) for p in range(3)])
    out = []
    for _ in range(20):
        out += reader.poll(0.2)
    reader.close()
    last = {}
    for record in sorted(out, key=lambda r: (r.partition, r.offset)):
        last[record.key.decode()] = json.loads(record.value)["balance"]
    assert len(out) == len(amounts)
    assert last == {"acct-1": 3, "acct-2": 10, "acct-3": 1}


def test_first_processor_test_passes(tmp_path):
    """The getting-started page's pytest test of a processor, run as pytest
    would: its test function called with a fresh tmp_path."""
    code = the_block("python", "def test_running_balances(tmp_path)")
    namespace: dict = {}
    exec(compile(code, "the docs", "exec"), namespace)
    namespace["test_running_balances"](tmp_path)


def test_runner_quickstart_test_passes_without_a_broker(tmp_path):
    (tmp_path / "balances.py").write_text(the_block("python", "app.run(until_idle=5.0)"))
    (tmp_path / "test_balances.py").write_text(the_block("python", "from streaming.testing import TestDriver"))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_balances.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (tmp_path / "balances-state").exists(), "the driver touches no state directory"


def test_joins_guide_example_runs_through_the_test_driver(tmp_path):
    (tmp_path / "joins_example.py").write_text(the_block("python", 'app.table("account-regions"'))
    result = subprocess.run([sys.executable, "joins_example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (tmp_path / "state").exists(), "the driver touches no state directory"


def as_the_readme_runs_it(tmp_path) -> dict:
    """The environment of a user who set up as the README says and runs the
    venv's python by path without activating it: no PYSPARK_PYTHON, no
    PYTHONPATH, and a ``python3`` first on PATH that is not the venv's (the
    base interpreter, without onceflow or pyspark)."""
    other = tmp_path / "other-python"
    other.mkdir()
    (other / "python3").symlink_to(sys._base_executable)
    path = [str(other)] + [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and os.path.abspath(d) != os.path.dirname(sys.executable)]
    environment = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "VIRTUAL_ENV")}
    environment["PATH"] = os.pathsep.join(path)
    probe = subprocess.run(["python3", "-c", "import pyspark"], env=environment, capture_output=True)
    assert probe.returncode != 0, "python3 on the test's PATH must not be able to import pyspark"
    return environment


@pytest.mark.slow
def test_spark_quickstart_query(tmp_path):
    """The Spark block as a program of its own (a JVM of its own), against a
    broker process, run the way the README's set-up implies (issue 35):
    `.venv/bin/python query.py` with another python3 first on PATH."""
    from faults.process import BrokerProcess
    from txn import Admin, Consumer, Producer, TopicPartition

    broker = BrokerProcess(str(tmp_path / "data")).start()
    try:
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topics({"payments": 2, "payment-counts": 1})
        with Producer(bootstrap_servers=broker.bootstrap) as producer:
            for number in range(30):
                producer.send("payments", b'{"amount": 1}', key=b"acct-%d" % (number % 3))
        code = the_block("python", "streaming.spark.register(spark)").replace("127.0.0.1:9092", broker.bootstrap)
        (tmp_path / "query.py").write_text(code)
        result = subprocess.run([sys.executable, "query.py"], cwd=tmp_path, env=as_the_readme_runs_it(tmp_path), capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert (tmp_path / "payment-counts-checkpoint" / "commits").is_dir()
        reader = Consumer(bootstrap_servers=broker.bootstrap)
        reader.assign([TopicPartition("payment-counts", 0)])
        counts = {}
        for _ in range(20):
            for record in reader.poll(0.2):
                counts[record.key.decode()] = int(record.value)
        reader.close()
        assert counts == {"acct-0": 10, "acct-1": 10, "acct-2": 10}
    finally:
        broker.terminate()
