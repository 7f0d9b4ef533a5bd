"""The broker's edge over real sockets: connection limits (total and per IP),
the authentication timeout (SASL and TLS), KIP-368 session lifetimes and
re-authentication (raw and with librdkafka), the small frame allowed before
authentication, client certificates on an SSL listener (User:<CN>), the
warning for an unauthenticated non-loopback listener, and fuzzed SASL
exchanges over a socket that never crash the broker nor authenticate."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.broker import EmbeddedBroker
from broker.security.credentials import CredentialStore, make
from protocol.errors import ErrorCode
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from tests.helpers import TestCA, wait_for

PASSWORD = "edge-pass"


def store_users(data_dir: str) -> None:
    store = CredentialStore(data_dir).load()
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        store.upsert("alice", mechanism, make(mechanism, PASSWORD))
        store.upsert("bob", mechanism, make(mechanism, "bobs"))


class RawClient:
    """A Kafka client of a few lines over one socket, for what the real
    clients never send."""

    def __init__(self, address: str, *, context: ssl.SSLContext | None = None):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        if context is not None:
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
        self.connection = ClientConnection(client_id="raw")

    def request(self, api_key, version, body) -> dict:
        _correlation, frame = self.connection.send_request(api_key, version, body)
        self.sock.sendall(frame)
        while True:
            response = self.connection.next_response()
            if response is not None:
                return response.body
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.connection.receive_data(data)

    def plain_login(self, username="alice", password=PASSWORD, version=1) -> dict:
        assert self.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})["error_code"] == 0
        return self.request(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": f"\0{username}\0{password}".encode()})

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """Whether the broker closes the connection within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True
        except TimeoutError:
            return False

    def close(self):
        self.sock.close()


@pytest.fixture
def sasl_broker(tmp_path):
    def start(**properties):
        data_dir = str(tmp_path / "data")
        store_users(data_dir)
        props = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0", **properties}
        return EmbeddedBroker(data_dir, properties=props).start()

    started = []

    def make_broker(**properties):
        broker = start(**properties)
        started.append(broker)
        return broker

    yield make_broker
    for broker in started:
        broker.stop()


def test_a_connection_that_never_authenticates_is_closed(sasl_broker):
    broker = sasl_broker(**{"connections.authentication.timeout.ms": "500"})
    idle = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    started = time.monotonic()
    assert idle.closed_by_peer(timeout=10)
    assert 0.4 <= time.monotonic() - started < 8
    # One that logs in in time stays open past the timeout.
    client = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert client.plain_login()["error_code"] == 0
    time.sleep(0.8)
    assert client.request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})["brokers"]
    client.close()


def test_requests_before_authentication_close_the_connection_and_big_frames_are_refused(sasl_broker):
    broker = sasl_broker()
    client = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    with pytest.raises(ConnectionError):
        client.request(ApiKey.METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})
    # A frame above sasl.server.max.receive.size (512 KiB) before authentication.
    big = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    big.sock.sendall(struct.pack(">i", 600_000) + b"\0" * 1024)
    assert big.closed_by_peer()
    # The plaintext listener still answers anyone.
    plain = RawClient(broker.bootstrap)
    assert plain.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
    assert plain.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0


def test_a_session_past_its_lifetime_is_closed_and_reauthentication_renews_it(sasl_broker):
    broker = sasl_broker(**{"connections.max.reauth.ms": "1000"})
    metadata = (ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})
    lapsing = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert lapsing.plain_login()["session_lifetime_ms"] == 1000
    renewing = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    renewing.plain_login()
    time.sleep(0.7)
    assert renewing.plain_login()["error_code"] == 0  # KIP-368: same principal, new lifetime
    time.sleep(0.5)
    assert renewing.request(*metadata)["brokers"]
    with pytest.raises(ConnectionError):
        lapsing.request(*metadata)
    # Re-authenticating as someone else is refused and closes the connection.
    switching = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    switching.plain_login()
    reply = switching.plain_login(username="bob", password="bobs")
    assert reply["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED and "principal" in reply["error_message"]
    assert switching.closed_by_peer()


@pytest.mark.slow
def test_librdkafka_reauthenticates_and_keeps_producing(sasl_broker, caplog):
    import confluent_kafka

    broker = sasl_broker(**{"connections.max.reauth.ms": "1500"})
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": PASSWORD,
            "acks": "all",
        }
    )
    errors = []
    with caplog.at_level(logging.INFO, logger="broker.server"):
        deadline = time.monotonic() + 5
        sent = 0
        while time.monotonic() < deadline:
            producer.produce("reauth", b"x", on_delivery=lambda error, _m: errors.append(error) if error else None)
            sent += 1
            producer.poll(0.05)
        assert producer.flush(30) == 0
    assert errors == []
    reauthentications = [r for r in caplog.records if "re-authenticated" in r.getMessage()]
    assert reauthentications, "librdkafka never re-authenticated"
    assert broker.call(lambda inner: inner.replicas.get_log("reauth", 0).high_watermark) == sent


def test_connection_limits_close_new_connections_at_once(sasl_broker, caplog):
    broker = sasl_broker(**{"max.connections.per.ip": "2"})
    with caplog.at_level(logging.WARNING, logger="broker.server"):
        first, second = RawClient(broker.bootstrap), RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
        assert first.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0
        assert second.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0
        third = RawClient(broker.bootstrap)
        assert third.closed_by_peer(timeout=5)
        assert any("max.connections.per.ip" in record.getMessage() for record in caplog.records)
    first.close()
    # Once one is gone, a new connection is served again.
    wait_for(lambda: _served(broker), timeout=10, what="a free slot")


def _served(broker) -> bool:
    try:
        client = RawClient(broker.bootstrap)
        client.request(ApiKey.API_VERSIONS, 0, {})
        client.close()
        return True
    except (ConnectionError, OSError):
        return False


def test_the_total_connection_limit(sasl_broker):
    broker = sasl_broker(**{"max.connections": "1"})
    only = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert only.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0
    assert RawClient(broker.bootstrap).closed_by_peer(timeout=5)  # the limit is across listeners


def test_client_certificates_on_an_ssl_listener(tmp_path):
    """ssl.client.auth=required: no certificate, no connection; with one the
    principal is User:<CN> (what the metrics hook sees of the session)."""
    ca = TestCA(tmp_path / "ca")
    certfile, keyfile = ca.issue("carol", "carol")
    sessions = []
    broker = EmbeddedBroker(
        str(tmp_path / "data"),
        properties={"listeners": "SSL://127.0.0.1:0", "ssl.client.auth": "required"},
        ssl_certfile=ca.certfile,
        ssl_keyfile=ca.keyfile,
        ssl_cafile=ca.cafile,
    ).start()
    try:
        def record(inner):
            server = inner.servers["SSL"]
            server._on_connection = lambda session: sessions.append(session) or (lambda _s: None)

        broker.call(record)
        with_cert = ssl.create_default_context(cafile=ca.cafile)
        with_cert.load_cert_chain(certfile, keyfile)
        client = RawClient(broker.bootstrap_for("SSL"), context=with_cert)
        assert client.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0
        assert [str(session.principal) for session in sessions] == ["User:carol"]
        assert sessions[0].security_protocol == "SSL"
        without = ssl.create_default_context(cafile=ca.cafile)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            refused = RawClient(broker.bootstrap_for("SSL"), context=without)
            refused.request(ApiKey.API_VERSIONS, 0, {})
        assert len(sessions) == 1
    finally:
        broker.stop()


def test_a_tls_listener_closes_a_connection_that_never_shakes_hands(tmp_path):
    ca = TestCA(tmp_path / "ca")
    with EmbeddedBroker(
        str(tmp_path / "data"),
        properties={"listeners": "SSL://127.0.0.1:0", "connections.authentication.timeout.ms": "500"},
        ssl_certfile=ca.certfile,
        ssl_keyfile=ca.keyfile,
    ) as broker:
        assert RawClient(broker.bootstrap_for("SSL")).closed_by_peer(timeout=10)


def test_an_unauthenticated_listener_off_loopback_is_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="broker.broker"):
        with EmbeddedBroker(str(tmp_path / "a"), host="0.0.0.0"):
            pass
        with EmbeddedBroker(str(tmp_path / "b")):
            pass
    warnings = [record.getMessage() for record in caplog.records if "without authentication" in record.getMessage()]
    assert len(warnings) == 1 and "PLAINTEXT://0.0.0.0:" in warnings[0]


# -- fuzzing over a socket -------------------------------------------------------------------

FRAMES = st.lists(
    st.one_of(
        st.binary(max_size=200),  # arbitrary bytes, often not even a frame
        st.builds(lambda body: struct.pack(">i", len(body)) + body, st.binary(max_size=300)),  # frames of garbage
        st.builds(  # real SASL requests with garbage tokens, in any order
            lambda key, version, payload: ClientConnection().send_request(
                key, version, {"mechanism": payload.decode("latin-1")} if key == ApiKey.SASL_HANDSHAKE else {"auth_bytes": payload}
            )[1],
            st.sampled_from([ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE]),
            st.integers(0, 1),
            st.one_of(st.sampled_from([b"PLAIN", b"SCRAM-SHA-256"]), st.binary(max_size=100)),
        ),
        st.just(struct.pack(">i", 10_000_000)),  # oversized frame announced
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.slow
def test_fuzzed_sasl_over_a_socket_never_crashes_nor_authenticates(sasl_broker):
    broker = sasl_broker(**{"connections.authentication.timeout.ms": "3000"})
    address = broker.bootstrap_for("SASL_PLAINTEXT")
    metadata = ClientConnection().send_request(ApiKey.METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})[1]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames=FRAMES)
    def exchange(frames):
        client = RawClient(address)
        try:
            for frame in frames:
                client.sock.sendall(frame)
            # Whatever came before, a Metadata request must not be answered
            # with topics: the connection never authenticated.
            client.sock.sendall(metadata)
            # End our side: the broker answers what it accepted, then closes.
            client.sock.shutdown(socket.SHUT_WR)
            client.sock.settimeout(5)
            received = b""
            try:
                while chunk := client.sock.recv(65536):
                    received += chunk
            except OSError:  # reset, or timed out
                pass
            assert b"__consumer_offsets" not in received
        except OSError:  # the broker closed first (a malformed frame): that is allowed
            pass
        finally:
            client.close()

    exchange()
    # The broker is alive and logs people in.
    client = RawClient(address)
    assert client.plain_login()["error_code"] == 0
    assert client.request(ApiKey.METADATA, 4, {"topics": None, "allow_auto_topic_creation": False})["topics"]


class RawTokens(RawClient):
    """A client from before Kafka 1.0: SaslHandshake v0, then bare size-prefixed tokens."""

    def token(self, data: bytes) -> bytes:
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        header = self._exactly(4)
        return self._exactly(struct.unpack(">i", header)[0])

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_v0_handshake_takes_raw_tokens(sasl_broker, mechanism):
    from tests.helpers import ScramClient

    broker = sasl_broker()
    client = RawTokens(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert client.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": mechanism})["error_code"] == 0
    if mechanism == "PLAIN":
        assert client.token(f"\0alice\0{PASSWORD}".encode()) == b""  # the empty answer Kafka sends
    else:
        scram = ScramClient(mechanism, "alice", PASSWORD)
        server_first = client.token(scram.first())
        assert client.token(scram.final(server_first)).startswith(b"v=")
    assert client.request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})["brokers"]
    # A wrong password: no answer, the connection is closed.
    refused = RawTokens(broker.bootstrap_for("SASL_PLAINTEXT"))
    refused.request(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})
    with pytest.raises(ConnectionError):
        refused.token(b"\0alice\0wrong")


def test_a_failed_login_is_answered_after_the_delay(sasl_broker):
    broker = sasl_broker(**{"connection.failed.authentication.delay.ms": "600"})
    client = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    started = time.monotonic()
    reply = client.plain_login(password="guess")
    assert reply["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert time.monotonic() - started >= 0.55
    assert client.closed_by_peer()


def test_a_sasl_authenticate_after_the_login_is_answered_and_the_connection_kept(sasl_broker, caplog):
    broker = sasl_broker()
    client = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    assert client.plain_login()["error_code"] == 0
    with caplog.at_level(logging.INFO, logger="broker.server"):
        reply = client.request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0bob\0bobs"})
        assert reply["error_code"] == ErrorCode.ILLEGAL_SASL_STATE
        assert client.request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})["brokers"]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR or "re-authenticated" in record.getMessage()]
    client.close()


@pytest.mark.slow
def test_every_way_a_connection_ends_gives_its_slot_back(sasl_broker):
    """max.connections.per.ip=2 and three connections ending each way: a slot
    kept by any close path would leave no room for the last two."""
    broker = sasl_broker(**{"max.connections.per.ip": "2", "connections.authentication.timeout.ms": "300"})
    address = broker.bootstrap_for("SASL_PLAINTEXT")

    def logged_in_then_closed():
        client = RawClient(address)
        assert client.plain_login()["error_code"] == 0
        client.close()

    def refused_before_login():
        client = RawClient(address)
        with pytest.raises(ConnectionError):
            client.request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})

    def wrong_password():
        client = RawClient(address)
        assert client.plain_login(password="wrong")["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert client.closed_by_peer()

    def oversized_frame():
        client = RawClient(address)
        client.sock.sendall(struct.pack(">i", 600_000) + b"\0" * 64)
        assert client.closed_by_peer()

    def never_authenticates():
        assert RawClient(address).closed_by_peer()

    def reset_mid_request():
        client = RawClient(address)
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.sock.sendall(struct.pack(">i", 100) + b"\0" * 10)
        client.close()  # an RST, not a FIN

    for ending in (logged_in_then_closed, refused_before_login, wrong_password, oversized_frame, never_authenticates, reset_mid_request):
        for _ in range(3):
            wait_for(lambda: _served(broker), timeout=10, what=f"a free slot after {ending.__name__}")
            ending()

    def two_at_once() -> bool:
        clients = []
        try:
            for _ in range(2):
                clients.append(RawClient(address))
                clients[-1].request(ApiKey.API_VERSIONS, 0, {})
            return True
        except (ConnectionError, OSError):
            return False
        finally:
            for client in clients:
                client.close()

    wait_for(two_at_once, timeout=10, what="both slots free")


def test_a_broker_stops_at_once_with_tls_clients_connected(tmp_path):
    """The clients stay connected and never send a close_notify: the stop
    aborts them instead of waiting on each (asyncio's TLS close would wait
    30 s)."""
    ca = TestCA(tmp_path / "ca")
    broker = EmbeddedBroker(
        str(tmp_path / "data"), properties={"listeners": "SSL://127.0.0.1:0"}, ssl_certfile=ca.certfile, ssl_keyfile=ca.keyfile
    ).start()
    clients = [RawClient(broker.bootstrap_for("SSL"), context=ssl.create_default_context(cafile=ca.cafile)) for _ in range(3)]
    for client in clients:
        assert client.request(ApiKey.API_VERSIONS, 0, {})["error_code"] == 0
    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < 5
    assert all(client.closed_by_peer(timeout=5) for client in clients)


def test_requests_before_an_unsupported_one_are_answered_then_the_connection_closes(sasl_broker):
    broker = sasl_broker()
    client = RawClient(broker.bootstrap)
    _correlation, frame = client.connection.send_request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})
    unknown_api = struct.pack(">hhih", 9999, 0, 77, -1)  # api key 9999 v0, correlation 77, no client id
    client.sock.sendall(frame + struct.pack(">i", len(unknown_api)) + unknown_api)
    answers = []
    client.sock.settimeout(10)
    while (data := client.sock.recv(65536)):
        client.connection.receive_data(data)
        while (response := client.connection.next_response()) is not None:
            answers.append(response.body)
    assert len(answers) == 1 and answers[0]["brokers"]


@pytest.mark.parametrize("handshake_version", [1, 0])
def test_a_request_pipelined_behind_a_refused_login_is_never_served(sasl_broker, handshake_version):
    """Handshake, a wrong password and a Metadata in one write: the broker
    answers the login's steps and closes; the Metadata gets no answer."""
    broker = sasl_broker()
    client = RawClient(broker.bootstrap_for("SASL_PLAINTEXT"))
    _c, handshake = client.connection.send_request(ApiKey.SASL_HANDSHAKE, handshake_version, {"mechanism": "PLAIN"})
    wrong = b"\0alice\0wrong"
    if handshake_version == 0:
        login = struct.pack(">i", len(wrong)) + wrong  # a bare token after a v0 handshake
    else:
        _c, login = client.connection.send_request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": wrong})
    _c, metadata = client.connection.send_request(ApiKey.METADATA, 4, {"topics": None, "allow_auto_topic_creation": True})
    client.sock.sendall(handshake + login + metadata)
    client.sock.settimeout(10)
    received = b""
    while (data := client.sock.recv(65536)):
        received += data
    frames = []
    while received:
        (size,) = struct.unpack(">i", received[:4])
        frames.append(received[4 : 4 + size])
        received = received[4 + size :]
    assert len(frames) == (1 if handshake_version == 0 else 2)  # the handshake's answer (and the refusal's): no Metadata
