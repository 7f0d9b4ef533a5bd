"""SCRAM (RFC 5802, with SHA-256/512 per RFC 7677): the arithmetic both sides
share and the attribute syntax of its messages, without I/O or state.

Kafka's SCRAM-SHA-256 and SCRAM-SHA-512 mechanisms run this exchange inside
SaslAuthenticate. The broker's state machine (``broker.security``) and our
clients' (``txn``) build on these functions; what is stored for a user is a
``ScramCredential`` (salt, StoredKey, ServerKey, iterations), never the
password: the server can check a proof and prove itself with it, but cannot
log in as the user.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

import attrs


@attrs.frozen
class ScramMechanism:
    """One SCRAM mechanism by its SASL name, with Kafka's numeric type (as in
    DescribeUserScramCredentials) and its hash."""

    name: str
    kafka_type: int
    hash_name: str
    # Kafka refuses credentials below 4096 iterations and above 16384.
    min_iterations: int = 4096
    max_iterations: int = 16384

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS = {mechanism.name: mechanism for mechanism in (SCRAM_SHA_256, SCRAM_SHA_512)}
MECHANISMS_BY_TYPE = {mechanism.kafka_type: mechanism for mechanism in MECHANISMS.values()}


class ScramError(ValueError):
    """A SCRAM message that is malformed or fails a check (the exchange ends)."""


@attrs.frozen
class ScramCredential:
    """What the server keeps for one user and mechanism (RFC 5802 section 3)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salted_password(mechanism: ScramMechanism, password: bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i): PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password, salt, iterations)


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return mechanism.hmac(salted, b"Client Key")


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return mechanism.hmac(salted, b"Server Key")


def credential_from_salted(mechanism: ScramMechanism, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The stored form from a salted password (what AlterUserScramCredentials
    sends: KIP-554 clients salt on their side)."""
    return ScramCredential(
        salt=salt,
        stored_key=mechanism.hash(client_key(mechanism, salted)),
        server_key=server_key(mechanism, salted),
        iterations=iterations,
    )


def make_credential(mechanism: ScramMechanism, password: str, *, iterations: int = 4096, salt: bytes | None = None) -> ScramCredential:
    """A fresh credential for ``password`` with a random 32-byte salt."""
    if not mechanism.min_iterations <= iterations <= mechanism.max_iterations:
        raise ScramError(
            f"{mechanism.name} iterations must be within {mechanism.min_iterations}..{mechanism.max_iterations}, not {iterations}"
        )
    salt = os.urandom(32) if salt is None else salt
    salted = salted_password(mechanism, password.encode("utf-8"), salt, iterations)
    return credential_from_salted(mechanism, salted, salt, iterations)


def client_proof(mechanism: ScramMechanism, salted: bytes, auth_message: bytes) -> bytes:
    """ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage)."""
    key = client_key(mechanism, salted)
    signature = mechanism.hmac(mechanism.hash(key), auth_message)
    return bytes(a ^ b for a, b in zip(key, signature))


def verify_client_proof(mechanism: ScramMechanism, credential: ScramCredential, auth_message: bytes, proof: bytes) -> bool:
    """The server's check: recover ClientKey from the proof and compare its
    hash with StoredKey in constant time."""
    signature = mechanism.hmac(credential.stored_key, auth_message)
    if len(proof) != len(signature):
        return False
    recovered = bytes(a ^ b for a, b in zip(proof, signature))
    return hmac.compare_digest(mechanism.hash(recovered), credential.stored_key)


def server_signature(mechanism: ScramMechanism, key_of_server: bytes, auth_message: bytes) -> bytes:
    """ServerSignature = HMAC(ServerKey, AuthMessage), sent as ``v=``."""
    return mechanism.hmac(key_of_server, auth_message)


MAX_NONCE_LENGTH = 512


def new_nonce() -> str:
    """A fresh nonce part: 24 random bytes as printable characters without
    ',' (RFC 5802 section 5.1), for the client's nonce and the server's
    extension of it alike."""
    return secrets.token_urlsafe(24)


def check_nonce(nonce: str) -> None:
    """A peer's nonce must be printable ASCII without ',' and of a sane length."""
    if not 0 < len(nonce) <= MAX_NONCE_LENGTH:
        raise ScramError(f"nonce of {len(nonce)} characters")
    if any(not (0x21 <= ord(char) <= 0x7E) or char == "," for char in nonce):
        raise ScramError("nonce holds characters outside printable ASCII")


def parse_attributes(message: str) -> dict[str, str]:
    """``r=abc,s=xyz,i=4096`` -> {"r": "abc", ...}; a repeated or malformed
    attribute is a ScramError."""
    attributes: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError(f"malformed SCRAM attribute {part[:32]!r}")
        if part[0] in attributes:
            raise ScramError(f"repeated SCRAM attribute {part[0]!r}")
        attributes[part[0]] = part[2:]
    return attributes


def escape_username(name: str) -> str:
    """saslname escaping: ``,`` -> ``=2C`` and ``=`` -> ``=3D``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(text: str) -> str:
    """The inverse of ``escape_username``; any other ``=`` sequence is an error."""
    out = []
    index = 0
    while index < len(text):
        if text[index] == "=":
            code = text[index : index + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise ScramError(f"bad escape in SCRAM username {text[:64]!r}")
            index += 3
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ScramError(f"bad base64 in SCRAM message {text[:64]!r}") from None
