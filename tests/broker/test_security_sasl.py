"""The SASL state machine without sockets (``broker.security.sasl``): PLAIN
and SCRAM exchanges that succeed and that fail, what a connection may send
in each state, KIP-368 lifetimes and re-authentication; then
Hypothesis-fuzzed exchanges (truncated, reordered, oversized, garbage
tokens) that never raise anything but a refusal and never authenticate."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.security.credentials import CredentialStore, make
from broker.security.sasl import TRANSITIONS, SaslRefusal, SaslServer, SaslState
from broker.security.session import KafkaPrincipal
from protocol import scram
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from tests.helpers import ScramClient

PASSWORD = "correct horse"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def credentials(tmp_path_factory):
    store = CredentialStore(str(tmp_path_factory.mktemp("credentials"))).load()
    for mechanism in MECHANISMS:
        store.upsert("alice", mechanism, make(mechanism, PASSWORD))
        store.upsert("bob", mechanism, make(mechanism, "bobs"))
    return store


def machine(credentials, reauth_ms=0):
    return SaslServer(mechanisms=MECHANISMS, credentials=credentials, reauth_ms=reauth_ms)


def handshake(server, mechanism, now=0):
    return server.receive(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism}, now)


def token(server, data: bytes, now=0, version=1):
    return server.receive(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": data}, now)


def login(server, mechanism, username, password, now=0):
    """Run one exchange; returns the last SaslAuthenticate reply."""
    assert handshake(server, mechanism, now).body["error_code"] == ErrorCode.NONE
    if mechanism == "PLAIN":
        return token(server, f"\0{username}\0{password}".encode(), now)
    client = ScramClient(mechanism, username, password)
    first = token(server, client.first(), now)
    if first.close:
        return first
    return token(server, client.final(first.body["auth_bytes"]), now)


def test_every_state_in_the_table_is_reachable_and_failed_is_final():
    targets = set(TRANSITIONS.values())
    assert targets | {SaslState.AWAIT_HANDSHAKE} == set(SaslState)
    assert not any(state is SaslState.FAILED for state, _event in TRANSITIONS)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_right_password_authenticates(credentials, mechanism):
    server = machine(credentials)
    assert server.receive(ApiKey.API_VERSIONS, 3, {}, 0) is None  # ApiVersions goes to the dispatcher
    reply = login(server, mechanism, "alice", PASSWORD)
    assert reply.body["error_code"] == ErrorCode.NONE and not reply.close
    assert server.principal == KafkaPrincipal("User", "alice") and server.state is SaslState.AUTHENTICATED
    assert server.receive(ApiKey.PRODUCE, 9, {}, 0) is None  # now anything goes through


def test_scram_server_proves_it_knows_the_credential(credentials):
    server = machine(credentials)
    handshake(server, "SCRAM-SHA-512")
    client = ScramClient("SCRAM-SHA-512", "alice", PASSWORD)
    first = token(server, client.first())
    final = token(server, client.final(first.body["auth_bytes"]))
    assert final.body["auth_bytes"] == b"v=" + scram.b64encode(client.expected_signature).encode()


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("username, password", [("alice", "wrong"), ("mallory", PASSWORD), ("bob", PASSWORD)])
def test_a_wrong_password_or_unknown_user_is_refused_and_closes(credentials, mechanism, username, password):
    server = machine(credentials)
    reply = login(server, mechanism, username, password)
    assert reply.close and reply.body["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "Authentication failed" in reply.body["error_message"]
    assert server.principal is None and server.state is SaslState.FAILED
    with pytest.raises(SaslRefusal):
        server.receive(ApiKey.METADATA, 1, {}, 0)


def test_unknown_users_get_a_stable_salt_and_the_same_answer_shape(credentials):
    def server_first(name):
        server = machine(credentials)
        handshake(server, "SCRAM-SHA-256")
        return scram.parse_attributes(token(server, ScramClient("SCRAM-SHA-256", name, "x").first()).body["auth_bytes"].decode())

    known, unknown, again = server_first("alice"), server_first("nobody"), server_first("nobody")
    assert set(known) == set(unknown) == {"r", "s", "i"}
    assert unknown["s"] == again["s"] and unknown["i"] == known["i"]
    assert len(scram.b64decode(unknown["s"])) == len(scram.b64decode(known["s"]))


@pytest.mark.parametrize(
    "tamper",
    ["nonce", "binding", "proof", "channel binding flag", "authzid", "extension", "reuse"],
)
def test_scram_checks_refuse_tampered_exchanges(credentials, tamper):
    server = machine(credentials)
    handshake(server, "SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
    first = {
        "channel binding flag": f"y,,{client.first_bare}".encode(),
        "authzid": f"n,a=bob,{client.first_bare}".encode(),
        "extension": f"n,,{client.first_bare},x=1".encode(),
    }.get(tamper, client.first())
    reply = token(server, first)
    if reply.close:
        assert reply.body["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
        return
    server_first = reply.body["auth_bytes"]
    if tamper == "nonce":
        final = client.final(server_first, nonce=client.nonce + "forged")
    elif tamper == "binding":
        final = client.final(server_first, binding="eSws")
    elif tamper == "proof":
        final = client.final(server_first)[:-8] + b"AAAAAAA="
    else:  # reuse: the client-first message again where the final is due
        final = client.first()
    reply = token(server, final)
    assert reply.close and reply.body["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert server.principal is None


def test_before_authentication_only_the_handshake_and_api_versions_pass(credentials):
    with pytest.raises(SaslRefusal, match="METADATA"):
        machine(credentials).receive(ApiKey.METADATA, 12, {}, 0)
    with pytest.raises(SaslRefusal):
        machine(credentials).receive(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0" + PASSWORD.encode()}, 0)
    server = machine(credentials)
    handshake(server, "PLAIN")
    with pytest.raises(SaslRefusal):  # between handshake and token
        server.receive(ApiKey.PRODUCE, 9, {}, 0)


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones(credentials):
    server = SaslServer(mechanisms=("SCRAM-SHA-256",), credentials=credentials)
    reply = handshake(server, "PLAIN")
    assert reply.close and reply.body == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": ["SCRAM-SHA-256"]}


def test_the_session_lifetime_is_announced_and_enforced(credentials):
    server = machine(credentials, reauth_ms=1000)
    reply = login(server, "SCRAM-SHA-256", "alice", PASSWORD, now=5000)
    assert reply.body["session_lifetime_ms"] == 1000
    assert server.receive(ApiKey.FETCH, 12, {}, 5999) is None
    with pytest.raises(SaslRefusal, match="lifetime"):
        server.receive(ApiKey.FETCH, 12, {}, 6000)


def test_reauthentication_renews_the_session_and_keeps_the_principal(credentials):
    server = machine(credentials, reauth_ms=1000)
    login(server, "PLAIN", "alice", PASSWORD, now=0)
    reply = login(server, "PLAIN", "alice", PASSWORD, now=900)
    assert reply.body["error_code"] == ErrorCode.NONE and server.expires_at_ms == 1900
    assert server.receive(ApiKey.FETCH, 12, {}, 1500) is None
    # Another user's credentials on the same connection: refused, closed.
    reply = login(server, "PLAIN", "bob", "bobs", now=1600)
    assert reply.close and "Cannot change principals" in reply.body["error_message"]
    assert server.state is SaslState.FAILED


def test_reauthentication_keeps_the_mechanism(credentials):
    server = machine(credentials, reauth_ms=1000)
    login(server, "PLAIN", "alice", PASSWORD)
    reply = handshake(server, "SCRAM-SHA-256")
    assert reply.close and reply.body["error_code"] == ErrorCode.ILLEGAL_SASL_STATE


# -- fuzzing -----------------------------------------------------------------------------

REQUEST_KEYS = st.sampled_from([ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA, ApiKey.PRODUCE])
TOKENS = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=4096, max_size=70000),  # oversized tokens
    st.builds(lambda name, rest: f"n,,n={name},r={rest}".encode(), st.sampled_from(["alice", "bob", "mallory", ""]), st.text(max_size=40)),
    st.builds(lambda rest: f"c=biws,r={rest},p=".encode() + rest.encode(), st.text(max_size=60)),
    st.builds(lambda name, password: f"\0{name}\0{password}".encode(), st.sampled_from(["alice", "bob", "x"]), st.text(max_size=20)),
)
STEPS = st.lists(
    st.tuples(REQUEST_KEYS, st.sampled_from(list(MECHANISMS) + ["GSSAPI", "", "plain", "SCRAM-SHA-1"]), TOKENS, st.integers(0, 2)),
    max_size=12,
)


FUZZ_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


def drive(server, steps, *, principal):
    """Feed fuzzed steps until the machine refuses or closes; after every
    step the connection's principal must still be ``principal``."""
    for now, (api_key, mechanism, data, version) in enumerate(steps):
        body = {"mechanism": mechanism} if api_key == ApiKey.SASL_HANDSHAKE else {"auth_bytes": data}
        try:
            reply = server.receive(api_key, version, body, now)
        except SaslRefusal:
            break
        assert server.principal == principal, f"principal became {server.principal} by {steps}"
        if reply is not None and reply.close:
            break
    assert server.principal == principal


@settings(max_examples=300, **FUZZ_SETTINGS)
@given(steps=STEPS)
def test_fuzzed_exchanges_never_crash_nor_authenticate(credentials, steps):
    drive(machine(credentials, reauth_ms=100), steps, principal=None)


# -- after the login ---------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_sasl_authenticate_without_a_new_handshake_is_answered_illegal_state(credentials, mechanism):
    # Kafka answers ILLEGAL_SASL_STATE to a SaslAuthenticate after a finished
    # login that no SaslHandshake reopened; the session stays as it was.
    server = machine(credentials, reauth_ms=1000)
    login(server, mechanism, "alice", PASSWORD)
    for data in (b"\0bob\0bobs", b"n,,n=bob,r=abc", b""):
        reply = token(server, data, now=10)
        assert reply.body["error_code"] == ErrorCode.ILLEGAL_SASL_STATE and not reply.close
        assert server.principal == KafkaPrincipal("User", "alice") and server.state is SaslState.AUTHENTICATED
    assert server.receive(ApiKey.FETCH, 12, {}, 20) is None


@settings(max_examples=200, **FUZZ_SETTINGS)
@given(steps=STEPS)
def test_fuzzed_steps_after_a_login_never_crash_nor_change_the_principal(credentials, steps):
    server = machine(credentials, reauth_ms=100)
    login(server, "PLAIN", "alice", PASSWORD)
    drive(server, steps, principal=KafkaPrincipal("User", "alice"))


# -- unknown users look like known ones ------------------------------------------------------


def _server_first(store, name, mechanism="SCRAM-SHA-256"):
    server = machine(store)
    handshake(server, mechanism)
    return scram.parse_attributes(token(server, ScramClient(mechanism, name, "x").first()).body["auth_bytes"].decode())


def test_an_unknown_user_gets_the_iteration_count_and_salt_length_of_stored_users(tmp_path):
    # Users made by a KIP-554 client with 8192 iterations and a 16-byte salt:
    # a fixed 4096 and 32 bytes for unknown names would tell them apart.
    mechanism = scram.SCRAM_SHA_256
    store = CredentialStore(str(tmp_path)).load()
    for name in ("alice", "bob"):
        salt = os.urandom(16)
        salted = scram.salted_password(mechanism, b"pw", salt, 8192)
        store.upsert(name, mechanism.name, scram.credential_from_salted(mechanism, salted, salt, 8192))
    known, unknown = _server_first(store, "alice"), _server_first(store, "nobody")
    assert unknown["i"] == known["i"] == "8192"
    assert len(scram.b64decode(unknown["s"])) == len(scram.b64decode(known["s"])) == 16
    assert _server_first(store, "nobody")["s"] == unknown["s"]


def test_unknown_users_iteration_counts_are_stable_and_drawn_from_the_stored_ones(tmp_path):
    store = CredentialStore(str(tmp_path)).load()
    for index, iterations in enumerate([4096, 4096, 8192, 16384]):
        store.upsert(f"user{index}", "SCRAM-SHA-512", make("SCRAM-SHA-512", "pw", iterations=iterations))
    counts = {name: _server_first(store, name, "SCRAM-SHA-512")["i"] for name in (f"stranger{i}" for i in range(40))}
    assert set(counts.values()) <= {"4096", "8192", "16384"} and len(set(counts.values())) > 1
    assert all(_server_first(store, name, "SCRAM-SHA-512")["i"] == count for name, count in list(counts.items())[:5])


def test_an_unknown_plain_user_costs_the_hashing_of_a_stored_one(tmp_path, monkeypatch):
    from broker.security import credentials as credentials_module

    store = CredentialStore(str(tmp_path)).load()
    store.upsert("alice", "PLAIN", make("PLAIN", "pw", iterations=20000))
    spent = []
    real_hash = credentials_module._plain_hash
    monkeypatch.setattr(credentials_module, "_plain_hash", lambda password, salt, iterations: spent.append(iterations) or real_hash(password, salt, iterations))
    assert not store.verify_plain("alice", "wrong") and not store.verify_plain("nobody", "wrong")
    assert spent == [20000, 20000]


def test_a_scram_authzid_equal_to_the_user_is_accepted_as_kafka_does(credentials):
    server = machine(credentials)
    handshake(server, "SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", "alice", PASSWORD)
    first = token(server, f"n,a=alice,{client.first_bare}".encode())
    assert not first.close
    # c= carries the whole gs2 header, authzid included.
    reply = token(server, client.final(first.body["auth_bytes"], binding=scram.b64encode(b"n,a=alice,")))
    assert reply.body["error_code"] == ErrorCode.NONE and server.principal == KafkaPrincipal("User", "alice")
    # The bare biws with an authzid in the header does not match it.
    server = machine(credentials)
    handshake(server, "SCRAM-SHA-256")
    first = token(server, f"n,a=alice,{client.first_bare}".encode())
    assert token(server, client.final(first.body["auth_bytes"])).close and server.principal is None


@pytest.mark.parametrize(
    "plain_token, accepted",
    [
        (f"alice\0alice\0{PASSWORD}", True),  # an authzid naming the user itself
        (f"bob\0alice\0{PASSWORD}", False),  # acting as someone else: Kafka refuses it
        (f"\0alice\0{PASSWORD}\0extra", False),
        (f"alice\0{PASSWORD}", False),
        (f"\0\0{PASSWORD}", False),
        ("\0alice\0", False),
    ],
)
def test_plain_takes_an_authzid_only_when_it_is_the_user(credentials, plain_token, accepted):
    server = machine(credentials)
    handshake(server, "PLAIN")
    reply = token(server, plain_token.encode())
    assert (reply.body["error_code"] == ErrorCode.NONE) is accepted and reply.close is not accepted
    assert server.principal == (KafkaPrincipal("User", "alice") if accepted else None)
