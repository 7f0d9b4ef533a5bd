"""The payments balances example as the runner's tests run it: settings from
the environment, and the fault harness's crash points composed in (armed by
ONCEFLOW_CRASH_POINTS, e.g. streaming.after_commit_before_store_apply@3:exit)."""

import json
import os
import sys

from faults.points import point
from faults.process import REPO

sys.path.insert(0, os.path.join(REPO, "examples"))
from payments_pipeline import build_app  # noqa: E402

options = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300, "transaction_timeout_ms": 6000, "request_timeout_ms": 5000, **json.loads(os.environ.get("RUNNER_TEST_OPTIONS", "{}"))}
app = build_app(os.environ["RUNNER_TEST_BOOTSTRAP"], os.environ["RUNNER_TEST_STATE_DIR"], crash_point=point, **options)
