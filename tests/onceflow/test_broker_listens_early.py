"""``onceflow broker`` listens before it imports the broker: most of a
restart is the interpreter and the imports (seconds on a loaded machine),
and a client refused meanwhile backs off (librdkafka doubles its reconnect
back-off per refusal, issue 28), where one that connects waits and is
answered once the broker is ready.

The probe runs the command line in a process of its own with an import hook
that, the moment ``broker.broker`` is first imported, connects to the port
the broker was told to listen on, sends an ApiVersions request on that
connection and keeps it; after the ready line it reads the answer."""

from __future__ import annotations

import subprocess
import sys

from faults.process import restartable_port
from tests.conftest import REPO

PROBE = """
import importlib.abc, os, signal, socket, sys, threading
from onceflow import cli, logs
from protocol.framing import ClientConnection

PORT = {port}
held = {{}}

class ConnectOnBrokerImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "broker.broker" and "connection" not in held:
            try:
                connection = socket.create_connection(("127.0.0.1", PORT), timeout=5)
            except OSError as error:
                print("REFUSED", error, flush=True)
                held["connection"] = None
            else:
                framing = ClientConnection(client_id="early")
                _correlation, frame = framing.send_request(18, 3, {{"client_software_name": "probe", "client_software_version": "1"}})
                connection.sendall(frame)
                held["connection"], held["framing"] = connection, framing
        return None

sys.meta_path.insert(0, ConnectOnBrokerImport())
announce = logs.announce

def read_the_answer_then_stop():
    connection = held.get("connection")
    if connection is not None:
        framing = held["framing"]
        answer = None
        while answer is None:
            data = connection.recv(65536)
            if not data:
                break
            framing.receive_data(data)
            answer = framing.next_response()
        print("CLOSED" if answer is None else f"ANSWERED error_code={{answer.body['error_code']}}", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

def watch(message, *args, **fields):
    announce(message, *args, **fields)
    if message.startswith("onceflow broker ready on"):
        threading.Thread(target=read_the_answer_then_stop, daemon=True).start()  # the loop must go on to answer

logs.announce = watch
sys.exit(cli.main(["broker", "--data-dir", {data_dir!r}, "--listen", "127.0.0.1:{port}"]))
"""


def test_a_connection_made_before_the_broker_is_imported_is_answered_once_ready(tmp_path):
    port = restartable_port()
    code = PROBE.format(port=port, data_dir=str(tmp_path / "data"))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REFUSED" not in result.stdout, f"the port refused a connection while the broker was being imported: {result.stdout}"
    assert "ANSWERED error_code=0" in result.stdout, result.stdout + result.stderr
