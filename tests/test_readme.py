"""Every Python code block of the README runs, as written, and does what the
text around it says (so the README cannot rot)."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO


def python_blocks() -> list[str]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as file:
        return re.findall(r"```python\n(.*?)```", file.read(), flags=re.S)


def test_the_readme_has_the_blocks_these_tests_run():
    blocks = python_blocks()
    assert len(blocks) == 2
    assert "send_offsets_to_transaction" in blocks[0] and "run_chaos" in blocks[1]


def test_transactional_example_copies_orders_to_payments(embedded_broker):
    from txn import Admin, Consumer, Producer, TopicPartition

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"orders": 1, "payments": 1})
    orders = Producer(bootstrap_servers=embedded_broker.bootstrap)
    for i in range(5):
        orders.send("orders", b'{"order": %d}' % i, key=b"acct-%d" % i)
    orders.close()
    code = python_blocks()[0].replace("127.0.0.1:9092", embedded_broker.bootstrap)
    exec(compile(code, "README.md", "exec"), {})
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


@pytest.mark.slow
def test_chaos_example_runs_and_is_valid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report folder lands here
    code = python_blocks()[1]
    namespace: dict = {}
    previous = os.getcwd()
    os.chdir(REPO)  # the processor path in the example is relative to the repository
    try:
        exec(compile(code.replace('"chaos-report"', repr(str(tmp_path / "chaos-report"))), "README.md", "exec"), namespace)
    finally:
        os.chdir(previous)
    assert namespace["verdict"].valid
    assert os.path.exists(tmp_path / "chaos-report" / "verdict.json")
