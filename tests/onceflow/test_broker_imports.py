"""What ``onceflow broker`` imports before it is ready: only what its
configuration uses. The interpreter and the imports are most of a restart
(``onceflow bench --restart``), so a module pulled in for nothing costs every
start. Each check runs a real broker process through the command line and
reads ``sys.modules`` at its ready line; the same probe with the option that
needs a module shows the module does load then (so the check can fail)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# The broker's ready line, as onceflow.commands.broker announces it, is where
# the probe looks: it prints the loaded modules it was asked about and stops
# the broker with SIGTERM (a clean stop, exit 0).
PROBE = """
import os, signal, sys
from onceflow import cli, logs

WATCHED = {watched!r}
announce = logs.announce

def watch(message, *args, **fields):
    announce(message, *args, **fields)
    if message.startswith("onceflow broker ready on"):
        loaded = sorted(name for name in sys.modules if name in WATCHED or name.split(".")[0] in WATCHED)
        print("LOADED " + " ".join(loaded), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

logs.announce = watch
sys.exit(cli.main(["broker", "--data-dir", {data_dir!r}, "--listen", "127.0.0.1:0", *{extra!r}]))
"""

# Never needed by a broker with default settings:
# - prometheus_client (and the http.server, urllib and email modules it
#   brings) serves --metrics only;
# - importlib.metadata is what the crc32c package's __init__ reads its
#   version with (protocol.records loads the extension alone);
# - our clients, the streaming half, the benchmarks and Spark are other rooms.
NOT_AT_DEFAULT = ("prometheus_client", "importlib.metadata", "http.server", "email", "txn", "streaming", "benchmarks", "pyspark")


def loaded_at_ready(data_dir, *extra: str) -> set[str]:
    code = PROBE.format(watched=NOT_AT_DEFAULT, data_dir=str(data_dir), extra=list(extra))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("LOADED")]
    assert len(lines) == 1, result.stdout + result.stderr
    return set(lines[0].split()[1:])


def test_a_broker_with_default_settings_imports_none_of_the_optional_modules(tmp_path):
    assert loaded_at_ready(tmp_path / "data") == set()


def test_metrics_bring_prometheus_client(tmp_path):
    loaded = loaded_at_ready(tmp_path / "data", "--metrics", "127.0.0.1:0")
    assert "prometheus_client" in loaded


def test_the_hardware_crc_is_the_crc32c_package_s_own_function():
    """protocol.records loads crc32c's extension by itself: the function must
    be the package's (Kafka's CRC-32C), loaded without the package."""
    probe = (
        "import sys\nfrom protocol import records\n"
        "alone = 'crc32c' not in sys.modules and 'importlib.metadata' not in sys.modules\n"
        "import crc32c\n"
        "same = all(records.crc32c(data) == crc32c.crc32c(data) for data in (b'', b'123456789', bytes(range(256)) * 9))\n"
        "print(records.HARDWARE_CRC, alone, same, hex(records.crc32c(b'123456789')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.split() == ["True", "True", "True", "0xe3069283"], result.stdout + result.stderr
