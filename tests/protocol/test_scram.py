"""protocol.scram against RFC 7677's SCRAM-SHA-256 example exchange."""

import pytest

from protocol import scram

CLIENT_FIRST_BARE = "n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL_WITHOUT_PROOF = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
AUTH_MESSAGE = f"{CLIENT_FIRST_BARE},{SERVER_FIRST},{CLIENT_FINAL_WITHOUT_PROOF}".encode()


def test_rfc7677_example_proof_and_server_signature():
    mechanism = scram.SCRAM_SHA_256
    attributes = scram.parse_attributes(SERVER_FIRST)
    salt = scram.b64decode(attributes["s"])
    salted = scram.salted_password(mechanism, b"pencil", salt, int(attributes["i"]))
    proof = scram.client_proof(mechanism, salted, AUTH_MESSAGE)
    assert scram.b64encode(proof) == "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    credential = scram.make_credential(mechanism, "pencil", iterations=4096, salt=salt)
    assert scram.verify_client_proof(mechanism, credential, AUTH_MESSAGE, proof)
    signature = scram.server_signature(mechanism, credential.server_key, AUTH_MESSAGE)
    assert scram.b64encode(signature) == "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_a_wrong_password_or_truncated_proof_fails_the_check():
    mechanism = scram.SCRAM_SHA_512
    credential = scram.make_credential(mechanism, "right")
    wrong = scram.salted_password(mechanism, b"wrong", credential.salt, credential.iterations)
    proof = scram.client_proof(mechanism, wrong, AUTH_MESSAGE)
    assert not scram.verify_client_proof(mechanism, credential, AUTH_MESSAGE, proof)
    right = scram.salted_password(mechanism, b"right", credential.salt, credential.iterations)
    good = scram.client_proof(mechanism, right, AUTH_MESSAGE)
    assert scram.verify_client_proof(mechanism, credential, AUTH_MESSAGE, good)
    assert not scram.verify_client_proof(mechanism, credential, AUTH_MESSAGE, good[:-1])


def test_iterations_outside_kafkas_bounds_are_refused():
    with pytest.raises(scram.ScramError, match="4096..16384"):
        scram.make_credential(scram.SCRAM_SHA_256, "p", iterations=1000)


@pytest.mark.parametrize("name", ["plain", "a,b", "x=y", "=,=", ""])
def test_username_escaping_round_trips(name):
    assert scram.unescape_username(scram.escape_username(name)) == name


@pytest.mark.parametrize("bad", ["r", "r=a,r=b", "1=x", "=2X", "a=1,,b=2"])
def test_malformed_attributes_are_scram_errors(bad):
    with pytest.raises(scram.ScramError):
        if bad.startswith("="):
            scram.unescape_username(bad)
        else:
            scram.parse_attributes(bad)
