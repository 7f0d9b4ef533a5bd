"""txn.security: the settings' spellings and checks, and the client-side
SASL machine against a server built from protocol.scram (RFC 7677's example
exchange reproduced byte for byte)."""

import pickle

import pytest

from protocol import scram
from protocol.errors import ErrorCode
from txn.config import ConsumerConfig, ProducerConfig, build
from txn.errors import ConfigError
from txn.security import (
    AuthenticationError,
    SaslClient,
    SaslState,
    SecurityConfig,
    parse_jaas_config,
)

OK = {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}


def scram_config(mechanism="SCRAM-SHA-512", password="s3cret-pw"):
    return SecurityConfig(security_protocol="SASL_SSL", sasl_mechanism=mechanism, sasl_username="alice", sasl_password=password)


class ScramServer:
    """The server's half of one SCRAM exchange, from a stored credential."""

    def __init__(self, mechanism, credential, *, server_nonce="srvNONCE", iterations=None, sign_with=None):
        self.mechanism = mechanism
        self.credential = credential
        self.server_nonce = server_nonce
        self.iterations = iterations or credential.iterations
        self.sign_with = sign_with or credential.server_key

    def first(self, client_first: bytes) -> bytes:
        assert client_first.startswith(b"n,,")
        self.client_first_bare = client_first[3:].decode()
        self.nonce = scram.parse_attributes(self.client_first_bare)["r"] + self.server_nonce
        self.server_first = f"r={self.nonce},s={scram.b64encode(self.credential.salt)},i={self.iterations}"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> tuple[bool, bytes]:
        text = client_final.decode()
        without_proof, _, proof = text.rpartition(",p=")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        ok = scram.verify_client_proof(self.mechanism, self.credential, auth_message, scram.b64decode(proof))
        return ok, b"v=" + scram.b64encode(scram.server_signature(self.mechanism, self.sign_with, auth_message)).encode()


def run_scram(client: SaslClient, server: ScramServer, lifetime_ms=0):
    token = client.receive_handshake({"error_code": 0, "mechanisms": [client.mechanism]})
    token = client.receive_authenticate({**OK, "auth_bytes": server.first(token)})
    ok, server_final = server.final(token)
    if not ok:
        return client.receive_authenticate({**OK, "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": "Authentication failed during authentication due to invalid credentials with SASL mechanism"})
    return client.receive_authenticate({**OK, "auth_bytes": server_final, "session_lifetime_ms": lifetime_ms})


# -- the machine ------------------------------------------------------------------------------------


def test_rfc7677_example_exchange_through_the_machine():
    config = SecurityConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username="user", sasl_password="pencil")
    client = SaslClient(config, nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.handshake_request() == {"mechanism": "SCRAM-SHA-256"}
    assert client.receive_handshake({"error_code": 0, "mechanisms": ["SCRAM-SHA-256"]}) == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = client.receive_authenticate({**OK, "auth_bytes": server_first})
    assert final == b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert client.receive_authenticate({**OK, "auth_bytes": b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", "session_lifetime_ms": 60000}) is None
    assert client.authenticated and client.session_lifetime_ms == 60000


@pytest.mark.parametrize("mechanism", [scram.SCRAM_SHA_256, scram.SCRAM_SHA_512])
def test_scram_exchange_with_a_server_holding_the_credential(mechanism):
    credential = scram.make_credential(mechanism, "s3cret-pw")
    client = SaslClient(scram_config(mechanism.name))
    client.handshake_request()
    assert run_scram(client, ScramServer(mechanism, credential)) is None
    assert client.state is SaslState.AUTHENTICATED


def test_a_server_that_cannot_prove_itself_is_refused():
    """It says the exchange succeeded but signs with a key it derived without
    the credential: our client must not trust the connection."""
    mechanism = scram.SCRAM_SHA_512
    credential = scram.make_credential(mechanism, "s3cret-pw")
    impostor = ScramServer(mechanism, credential, sign_with=b"\0" * len(credential.server_key))
    client = SaslClient(scram_config())
    client.handshake_request()
    with pytest.raises(AuthenticationError, match="could not prove"):
        run_scram(client, impostor)
    assert client.state is SaslState.FAILED


def test_wrong_password_is_the_brokers_refusal_and_does_not_show_the_password():
    mechanism = scram.SCRAM_SHA_512
    credential = scram.make_credential(mechanism, "right-password")
    client = SaslClient(scram_config(password="wrong-password-xyz"))
    client.handshake_request()
    with pytest.raises(AuthenticationError) as caught:
        run_scram(client, ScramServer(mechanism, credential))
    assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "invalid credentials" in str(caught.value)
    assert "wrong-password-xyz" not in str(caught.value) and "wrong-password-xyz" not in repr(client)


@pytest.mark.parametrize(
    "server_first, complaint",
    [
        (b"r=someone-elses-nonce,s=c2FsdA==,i=4096", "does not extend"),
        (b"r={nonce},s=c2FsdA==,i=4096", "does not extend"),  # nothing of the server's added
        (b"r={nonce}xyz,s=c2FsdA==,i=1024", "below 4096"),
        (b"r={nonce}xyz,s=c2FsdA==,i=99999", "above 16384"),
        (b"r={nonce}xyz,s=!!notbase64,i=4096", "malformed"),
        (b"r={nonce}xyz,i=4096", "malformed"),
        (b"r={nonce}x\x7fy,s=c2FsdA==,i=4096", "nonce is malformed"),  # a control character in the server's part
        (b"\xff\xfe", "malformed"),
        (b"m=ext,r={nonce}xyz,s=c2FsdA==,i=4096", "extension"),
    ],
)
def test_bad_server_first_messages_are_refused(server_first, complaint):
    client = SaslClient(scram_config(), nonce="clientNONCE")
    client.handshake_request()
    client.receive_handshake({"error_code": 0, "mechanisms": ["SCRAM-SHA-512"]})
    with pytest.raises(AuthenticationError, match=complaint):
        client.receive_authenticate({**OK, "auth_bytes": server_first.replace(b"{nonce}", b"clientNONCE")})
    assert client.state is SaslState.FAILED


def test_server_final_error_attribute_and_missing_signature_are_refused():
    for server_final, complaint in ((b"e=invalid-proof", "invalid-proof"), (b"x=1", "no server signature")):
        client = SaslClient(scram_config(), nonce="clientNONCE")
        client.handshake_request()
        client.receive_handshake({"error_code": 0, "mechanisms": []})
        client.receive_authenticate({**OK, "auth_bytes": b"r=clientNONCEsrv,s=c2FsdA==,i=4096"})
        with pytest.raises(AuthenticationError, match=complaint):
            client.receive_authenticate({**OK, "auth_bytes": server_final})


def test_unsupported_mechanism_lists_what_the_broker_offers():
    client = SaslClient(scram_config())
    client.handshake_request()
    with pytest.raises(AuthenticationError, match="does not enable SCRAM-SHA-512 .*offers: PLAIN"):
        client.receive_handshake({"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": ["PLAIN"]})


def test_plain_sends_rfc4616_credentials_and_reads_the_session_lifetime():
    client = SaslClient(SecurityConfig(security_protocol="SASL_PLAINTEXT", sasl_username="bob", sasl_password="pw"))
    assert client.handshake_request() == {"mechanism": "PLAIN"}
    assert client.receive_handshake({"error_code": 0, "mechanisms": ["PLAIN"]}) == b"\0bob\0pw"
    assert client.receive_authenticate({**OK, "session_lifetime_ms": 5000}) is None
    assert client.authenticated and client.session_lifetime_ms == 5000


def test_messages_out_of_order_are_illegal_sasl_state():
    client = SaslClient(scram_config())
    with pytest.raises(AuthenticationError) as caught:
        client.receive_handshake({"error_code": 0, "mechanisms": []})
    assert caught.value.code == ErrorCode.ILLEGAL_SASL_STATE
    client = SaslClient(scram_config())
    with pytest.raises(AuthenticationError):
        client.receive_authenticate(OK)
    client.handshake_request()
    with pytest.raises(AuthenticationError):
        client.handshake_request()


def test_a_plaintext_config_has_no_sasl_exchange():
    with pytest.raises(ValueError):
        SaslClient(SecurityConfig())


# -- the settings -----------------------------------------------------------------------------------


def test_every_spelling_reaches_the_same_security_config():
    ours = build(ProducerConfig, bootstrap_servers="h:1", security_protocol="sasl_ssl", sasl_mechanism="scram-sha-256", sasl_username="u", sasl_password="p", ssl_cafile="/ca.pem")
    kafka = build(ProducerConfig, {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/ca.pem"})
    java = build(ProducerConfig, {
        "bootstrap.servers": "h:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";',
        "ssl.truststore.location": "/ca.pem", "ssl.truststore.type": "PEM",
    })
    kafka_python = build(ProducerConfig, bootstrap_servers="h:1", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="u", sasl_plain_password="p", ssl_cafile="/ca.pem")
    assert ours.security == kafka.security == java.security == kafka_python.security
    assert ours.security.security_protocol == "SASL_SSL" and ours.security.uses_tls and ours.security.uses_sasl


def test_unknown_values_are_clear_errors():
    with pytest.raises(ConfigError, match="security_protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"):
        build(ConsumerConfig, bootstrap_servers="h:1", security_protocol="TLS")
    with pytest.raises(ConfigError, match="sasl_mechanism must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"):
        build(ConsumerConfig, bootstrap_servers="h:1", security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_username="u", sasl_password="p")
    with pytest.raises(ConfigError, match="needs sasl_username and sasl_password"):
        build(ConsumerConfig, bootstrap_servers="h:1", security_protocol="SASL_PLAINTEXT")
    with pytest.raises(ConfigError, match="truststore.type JKS is not supported"):
        build(ConsumerConfig, {"bootstrap.servers": "h:1", "security.protocol": "SSL", "ssl.truststore.location": "/t.jks", "ssl.truststore.type": "JKS"})
    with pytest.raises(ConfigError, match="login module .*Krb5LoginModule is not supported"):
        parse_jaas_config('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;')


def test_jaas_config_values_may_hold_quotes_and_spaces():
    parsed = parse_jaas_config(r'org.apache.kafka.common.security.plain.PlainLoginModule required  username="a b"  password="p\"q;r";')
    assert parsed == {"sasl_username": "a b", "sasl_password": 'p"q;r'}


def test_password_never_appears_in_reprs_or_errors():
    secret = "hunter2-do-not-print"
    config = build(ProducerConfig, bootstrap_servers="h:1", security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password=secret, ssl_key_password=secret)
    assert secret not in repr(config) and secret not in str(config) and secret not in repr(config.security)
    with pytest.raises(ConfigError) as caught:
        build(ProducerConfig, bootstrap_servers="h:1", security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password=secret, linger_ms=-1)
    assert secret not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        SecurityConfig(security_protocol="SSL", ssl_certfile="/nonexistent.pem", ssl_key_password=secret).ssl_context()
    assert secret not in str(caught.value)


def test_a_config_with_security_pickles_and_overrides_keep_the_rest():
    config = build(ConsumerConfig, bootstrap_servers="h:1", security_protocol="SASL_SSL", sasl_username="u", sasl_password="p")
    assert pickle.loads(pickle.dumps(config)) == config
    changed = build(ConsumerConfig, config, sasl_mechanism="SCRAM-SHA-512")
    assert changed.security.sasl_username == "u" and changed.security.sasl_mechanism == "SCRAM-SHA-512"
    assert build(ConsumerConfig, bootstrap_servers="h:1").security == SecurityConfig()


def test_a_connection_that_fails_before_it_is_ready_is_closed_at_once():
    """A listener that accepts but never answers ApiVersions (a SASL_SSL port
    dialled in plain text behaves so): once our request times out the
    socket is closed, not left open until the client is."""
    import asyncio

    from txn.connection import BrokerClient

    async def scenario():
        peer_closed = asyncio.Event()

        async def silent(reader, writer):
            while await reader.read(65536):
                pass
            peer_closed.set()
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BrokerClient("127.0.0.1", port, request_timeout=0.3)
        try:
            with pytest.raises((TimeoutError, ConnectionError)):
                await client.connect()
            async with asyncio.timeout(2):
                await peer_closed.wait()
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
