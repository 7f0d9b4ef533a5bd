"""``ApiKey`` is the one spelling of an API key: generated with the schemas
from Kafka's JSON specifications, it agrees with them, with the schema table,
and with the keys real clients put on the wire."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from protocol.framing import ServerConnection
from protocol.messages import APIS, ApiKey

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Kafka's JSON specifications, kept as reference data beside the repository
# (not in it): where tools/gen_schemas.py reads them by default.
REFERENCE = os.path.join(REPO, "..", "shared", "kafka-protocol")
CAPTURES = os.path.join(REPO, "tests", "protocol", "captures")
needs_reference = pytest.mark.skipif(not os.path.isdir(os.path.join(REFERENCE, "messages")), reason="Kafka's JSON specifications are not beside this checkout")


def kafka_constant(name: str) -> str:
    """Kafka's enum name for a message name: ListOffsets -> LIST_OFFSETS."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)).upper()


def test_every_schema_is_keyed_by_its_api_key():
    assert set(APIS) == set(ApiKey)
    for key, api in APIS.items():
        assert api.key == key and ApiKey[kafka_constant(api.name)] == key, api.name


def test_known_numbers():
    # A few that the Kafka protocol guide fixes, checked by hand.
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.API_VERSIONS, ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN) == (0, 1, 18, 22, 26)
    assert ApiKey.TXN_OFFSET_COMMIT == 28 and ApiKey.LIST_TRANSACTIONS == 66


@needs_reference
def test_api_keys_agree_with_kafkas_specifications():
    keys = {}
    for path in glob.glob(os.path.join(REFERENCE, "messages", "*Request.json")):
        with open(path, encoding="utf-8") as file:
            spec = json.loads(re.sub(r"^\s*//.*$", "", file.read(), flags=re.M))
        keys[spec["name"][: -len("Request")]] = spec["apiKey"]
    for key in ApiKey:
        name = APIS[key].name
        assert keys[name] == key, f"{name}: ours {int(key)}, Kafka's {keys[name]}"


@needs_reference
def test_the_committed_tables_are_what_the_generator_writes():
    generated = subprocess.run([sys.executable, os.path.join(REPO, "tools", "gen_schemas.py"), REFERENCE], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(REPO, "protocol", "messages.py"), encoding="utf-8") as file:
        assert file.read() == generated, "protocol/messages.py was edited by hand or the generator changed: regenerate it"


def test_real_clients_send_the_keys_we_name():
    """Frames recorded from confluent-kafka, kafka-python and aiokafka carry
    the API key the file's API name has in ``ApiKey``."""
    checked = 0
    for path in sorted(glob.glob(os.path.join(CAPTURES, "*.bin"))):
        api_name = os.path.basename(path).rsplit("-v", 1)[0].split("-")[-1]
        with open(path, "rb") as file:
            data = file.read()
        connection = ServerConnection()
        connection.receive_data(data)
        request = connection.next_request()
        assert request.api_key == ApiKey[kafka_constant(api_name)], path
        checked += 1
    assert checked >= 10
