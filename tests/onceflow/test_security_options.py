"""The client commands' security options: --command-config with Kafka's
properties, the flags over it, the password variable, and clear errors."""

import pytest

from onceflow.cli import build_parser
from onceflow.client_commands import CommandError, client_options
from txn.config import AdminConfig, build


def parse(*words):
    return build_parser().parse_args(list(words))


def test_flags_override_the_command_config_file(tmp_path, monkeypatch):
    monkeypatch.delenv("ONCEFLOW_SASL_PASSWORD", raising=False)
    properties = tmp_path / "client.properties"
    properties.write_text(
        "# as for kafka-topics.sh --command-config\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism = SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="from-file";\n'
        "ssl.ca.location: /etc/ca.pem\n"
        "client.id=tool\n"
    )
    args = parse("topics", "--command-config", str(properties), "--sasl-username", "bob", "--sasl-password", "from-flag", "list")
    config = build(AdminConfig, bootstrap_servers="h:1", **client_options(args))
    security = config.security
    assert (security.security_protocol, security.sasl_mechanism, security.ssl_cafile) == ("SASL_SSL", "SCRAM-SHA-512", "/etc/ca.pem")
    assert (security.sasl_username, security.sasl_password) == ("bob", "from-flag")
    assert config.client_id == "tool"


def test_the_password_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ONCEFLOW_SASL_PASSWORD", "from-env")
    args = parse("produce", "t", "--security-protocol", "sasl_plaintext", "--sasl-username", "u")
    security = build(AdminConfig, bootstrap_servers="h:1", **client_options(args)).security
    assert security.security_protocol == "SASL_PLAINTEXT" and security.sasl_password == "from-env"


def test_no_options_is_plaintext(monkeypatch):
    monkeypatch.delenv("ONCEFLOW_SASL_PASSWORD", raising=False)
    assert build(AdminConfig, bootstrap_servers="h:1", **client_options(parse("consume", "t"))).security.security_protocol == "PLAINTEXT"


def test_a_bad_file_or_value_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(CommandError, match="cannot read --command-config"):
        client_options(parse("topics", "--command-config", str(tmp_path / "missing"), "list"))
    bad = tmp_path / "bad.properties"
    bad.write_text("linger.ms=5\n")
    with pytest.raises(CommandError, match="linger.ms is not a client setting"):
        client_options(parse("topics", "--command-config", str(bad), "list"))
    bad.write_text("security.protocol\n")
    with pytest.raises(CommandError, match="bad.properties:1: expected key=value"):
        client_options(parse("topics", "--command-config", str(bad), "list"))
    with pytest.raises(SystemExit):
        parse("topics", "--security-protocol", "TLS", "list")
    assert "invalid choice: 'TLS'" in capsys.readouterr().err


def test_run_passes_the_flags_to_every_client_of_the_app(tmp_path, monkeypatch):
    """``onceflow run app.py --security-protocol ...``: the flags land in the
    app's consumer and producer options (hence its admin and restorer too)."""
    import streaming
    from onceflow.client_commands import security_options

    monkeypatch.delenv("ONCEFLOW_SASL_PASSWORD", raising=False)
    args = parse("run", "app.py", "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "u", "--sasl-password", "p", "--ssl-cafile", "/ca.pem")
    app = streaming.App("h:1", "secure-app", str(tmp_path / "state"))
    app.add_client_options(security_options(args))
    for options in (app.consumer_options, app.producer_options):
        security = build(AdminConfig, bootstrap_servers="h:1", **options).security
        assert (security.security_protocol, security.sasl_mechanism, security.sasl_username, security.ssl_cafile) == ("SASL_SSL", "SCRAM-SHA-512", "u", "/ca.pem")
