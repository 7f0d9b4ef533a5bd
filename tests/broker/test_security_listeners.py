"""Listeners Kafka style (``broker.security.listeners``, ``BrokerConfig``):
parsing, protocol maps, advertised addresses per listener, and the bad
settings refused with a clear message."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.security.listeners import (
    AdvertisedEndpoints,
    Listener,
    ListenerError,
    parse_listeners,
)
from broker.security.session import Session


def test_a_bare_host_port_is_one_plaintext_listener():
    assert parse_listeners("0.0.0.0:9092") == (Listener("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092),)
    assert BrokerConfig(port=9092).effective_listeners == (Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),)


def test_several_listeners_with_their_protocols_and_advertised_addresses():
    listeners = parse_listeners(
        "PLAINTEXT://127.0.0.1:9092, SASL_SSL://0.0.0.0:9093,ssl://[::1]:9094",
        advertised="SASL_SSL://broker.example.com:19093",
    )
    assert [(item.name, item.security_protocol, item.host, item.port) for item in listeners] == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),
        ("SASL_SSL", "SASL_SSL", "0.0.0.0", 9093),
        ("SSL", "SSL", "::1", 9094),
    ]
    assert listeners[1].advertised() == ("broker.example.com", 19093)
    assert listeners[0].advertised(bound_port=9092) == ("127.0.0.1", 9092)
    assert listeners[1].uses_tls and listeners[1].uses_sasl and not listeners[1].is_loopback
    assert listeners[2].uses_tls and not listeners[2].uses_sasl and listeners[2].is_loopback


def test_custom_names_through_the_protocol_map():
    listeners = parse_listeners("INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093", protocol_map="INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL")
    assert [(item.name, item.security_protocol) for item in listeners] == [("INTERNAL", "PLAINTEXT"), ("EXTERNAL", "SASL_SSL")]


@pytest.mark.parametrize(
    "listeners, advertised, protocol_map, complaint",
    [
        ("BOGUS://127.0.0.1:1", None, None, "neither a security protocol"),
        ("PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2", None, None, "repeated: PLAINTEXT"),
        ("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092", None, None, "same port"),
        ("PLAINTEXT://127.0.0.1", None, None, "HOST:PORT"),
        ("PLAINTEXT://127.0.0.1:99999", None, None, "HOST:PORT"),
        ("PLAINTEXT://127.0.0.1:1", "SSL://x:2", None, "does not define"),
        ("A://127.0.0.1:1", None, "A:NOPE", "NAME:PROTOCOL"),
        ("", None, None, "at least one"),
    ],
)
def test_bad_listener_settings_are_refused_with_the_reason(listeners, advertised, protocol_map, complaint):
    with pytest.raises(ListenerError, match=complaint):
        parse_listeners(listeners, advertised=advertised, protocol_map=protocol_map)


def test_config_from_kafka_properties():
    config = BrokerConfig.from_properties(
        {
            "listeners": "SASL_SSL://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9092",
            "advertised.listeners": "PLAINTEXT://public:9092",
            "sasl.enabled.mechanisms": "scram-sha-512,PLAIN",
            "ssl.client.auth": "required",
            "max.connections.per.ip": "7",
            "connections.max.reauth.ms": "60000",
        }
    )
    assert (config.host, config.port) == ("127.0.0.1", 9093)
    assert config.sasl_enabled_mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert config.ssl_client_auth == "required"
    assert config.max_connections_per_ip == 7 and config.connections_max_reauth_ms == 60000
    assert config.effective_listeners[1].advertised() == ("public", 9092)
    assert config.log_defaults == {}  # none of these is mistaken for a topic setting
    with pytest.raises(ValueError, match="sasl.enabled.mechanisms"):
        BrokerConfig.from_properties({"sasl.enabled.mechanisms": "GSSAPI"})
    with pytest.raises(ValueError, match="need listeners"):
        BrokerConfig.from_properties({"advertised.listeners": "PLAINTEXT://x:1"})


def test_the_one_advertise_of_a_command_line_applies_to_the_first_listener():
    config = BrokerConfig.from_properties({"listeners": "SASL_SSL://0.0.0.0:0,PLAINTEXT://127.0.0.1:0"}, advertised_host="proxy", advertised_port=7000)
    assert config.effective_listeners[0].advertised(bound_port=1234) == ("proxy", 7000)
    assert config.effective_listeners[1].advertised(bound_port=1235) == ("127.0.0.1", 1235)


def test_each_session_gets_its_listeners_address():
    endpoints = AdvertisedEndpoints({"PLAINTEXT": ("a", 1), "SASL_SSL": ("b", 2)}, default="PLAINTEXT")
    assert endpoints.address_for(Session(listener="SASL_SSL")) == ("b", 2)
    assert endpoints.address_for(Session(listener="PLAINTEXT")) == ("a", 1)
    assert endpoints.address_for(None) == ("a", 1)


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--listen", "SASL_SSL://127.0.0.1:0"], "needs a certificate"),
        (["--listen", "BOGUS://127.0.0.1:0"], "neither a security protocol"),
        (["--listen", "SSL://127.0.0.1:0", "--ssl-certfile", "/nonexistent.pem"], "cannot load"),
        (["--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--sasl-mechanisms", "GSSAPI"], "sasl.enabled.mechanisms"),
    ],
)
def test_the_broker_command_refuses_bad_security_settings(tmp_path, argv, complaint):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"), *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert complaint in result.stderr and "Traceback" not in result.stderr
