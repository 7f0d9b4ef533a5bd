"""Users' credentials, stored hashed in the data directory.

One file, readable by the broker's user only, replaced atomically and
durably (``broker.security.private_files``) on every change, so a crash
leaves the old set or the new one::

    __cluster_metadata/credentials.json
    {"version": 1,
     "secret": "<base64>",          # keys what unknown users are shown
     "users": {"alice": {
         "SCRAM-SHA-256": {"salt": b64, "stored_key": b64, "server_key": b64, "iterations": 4096},
         "SCRAM-SHA-512": {...},
         "PLAIN": {"salt": b64, "hash": b64, "iterations": 4096}}}}

SCRAM credentials are ``protocol.scram.ScramCredential`` (StoredKey and
ServerKey, never the password). A PLAIN user is kept as a salted PBKDF2-SHA256
hash of the password, checked in constant time. A name with no credential
for a mechanism is answered like a stored user picked by a keyed hash of the
name (the salt's length and the iteration count of that user's, the salt
derived from the store's secret, the same every time; a PLAIN check hashes
as many rounds), so an exchange does not tell whether a user exists.

The broker holds one ``CredentialStore`` for its data directory and changes
it through ``upsert``/``delete`` (write the file, then apply: an
authentication that starts after the call sees the change). ``onceflow users
--data-dir`` changes the same file while no broker runs (it takes the data
directory's lock, so it refuses while a broker holds it).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import os
from contextlib import contextmanager

import attrs

from broker.security.private_files import replace_private_file, tighten
from protocol.scram import MECHANISMS, ScramCredential, ScramMechanism, make_credential

PLAIN = "PLAIN"
CREDENTIAL_MECHANISMS = (PLAIN, *MECHANISMS)
DEFAULT_ITERATIONS = 4096
PLAIN_HASH = "sha256"
_FILE_VERSION = 1


class CredentialError(ValueError):
    """A credential that cannot be stored (said in the message)."""


@attrs.frozen
class PlainCredential:
    """A PLAIN user's password as a salted PBKDF2 hash."""

    salt: bytes
    hash: bytes
    iterations: int

    @classmethod
    def make(cls, password: str, *, iterations: int = DEFAULT_ITERATIONS) -> PlainCredential:
        salt = os.urandom(32)
        return cls(salt, _plain_hash(password, salt, iterations), iterations)

    def verify(self, password: str) -> bool:
        return hmac.compare_digest(_plain_hash(password, self.salt, self.iterations), self.hash)


def _plain_hash(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(PLAIN_HASH, password.encode("utf-8"), salt, iterations)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def make(mechanism: str, password: str, *, iterations: int = DEFAULT_ITERATIONS):
    """A fresh credential of ``mechanism`` for ``password``."""
    if mechanism == PLAIN:
        if not 4096 <= iterations <= 1_000_000:
            raise CredentialError(f"PLAIN hashing iterations must be within 4096..1000000, not {iterations}")
        return PlainCredential.make(password, iterations=iterations)
    scram = MECHANISMS.get(mechanism)
    if scram is None:
        raise CredentialError(f"unknown mechanism {mechanism!r} (one of {', '.join(CREDENTIAL_MECHANISMS)})")
    try:
        return make_credential(scram, password, iterations=iterations)
    except ValueError as error:
        raise CredentialError(str(error)) from None


def validate_username(name: str) -> None:
    if not name:
        raise CredentialError("a user name may not be empty")
    if any(ord(char) < 0x20 for char in name):
        raise CredentialError(f"a user name may not contain control characters: {name!r}")


class CredentialStore:
    """The credentials of one data directory, in memory and on disk."""

    def __init__(self, data_dir: str, *, io=None):
        self.path = os.path.join(data_dir, "__cluster_metadata", "credentials.json")
        self._io = io
        self._users: dict[str, dict] = {}
        self._secret = b""

    def load(self) -> CredentialStore:
        """Read the file (a missing file is an empty store; it is created
        with its secret at the first write, or by ``ensure_secret``)."""
        try:
            with open(self.path, "rb") as handle:
                data = json.loads(handle.read())
        except FileNotFoundError:
            self._users, self._secret = {}, b""
            return self
        except (OSError, ValueError) as error:
            raise CredentialError(f"cannot read {self.path}: {error}") from None
        try:
            tighten(self.path)
        except OSError as error:
            raise CredentialError(f"cannot make {self.path} private: {error}") from None
        try:
            if data.get("version") != _FILE_VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            self._secret = _unb64(data["secret"])
            self._users = {name: _decode_user(entries) for name, entries in data["users"].items()}
        except (KeyError, TypeError, ValueError) as error:
            raise CredentialError(f"{self.path} is damaged: {error}") from None
        return self

    def ensure_secret(self) -> None:
        """Give the store its secret (and file) if it has none yet, so fake
        salts stay the same across restarts."""
        if not self._secret:
            self._write(self._users, os.urandom(32))

    # -- reading ---------------------------------------------------------------

    def users(self) -> dict[str, tuple[str, ...]]:
        """name -> the mechanisms it has a credential for."""
        return {name: tuple(sorted(entries)) for name, entries in sorted(self._users.items())}

    def get(self, name: str, mechanism: str):
        return self._users.get(name, {}).get(mechanism)

    def scram_credential(self, name: str, mechanism: ScramMechanism) -> ScramCredential | None:
        credential = self.get(name, mechanism.name)
        return credential if isinstance(credential, ScramCredential) else None

    def _template(self, name: str, mechanism: str):
        """The stored credential of ``mechanism`` an unknown ``name`` is made
        to look like: one of the users', picked by a keyed hash of the name
        (the same one every time, each stored credential as likely as its
        share), or None when no user has one."""
        stored = [entries[mechanism] for _user, entries in sorted(self._users.items()) if mechanism in entries]
        if not stored:
            return None
        pick = int.from_bytes(self._keyed(f"template\0{mechanism}\0{name}")[:8], "big")
        return stored[pick % len(stored)]

    def _keyed(self, text: str) -> bytes:
        secret = self._secret or b"onceflow-no-secret-yet"
        return hmac.new(secret, text.encode(), "sha512").digest()

    def fake_scram_credential(self, name: str, mechanism: ScramMechanism) -> ScramCredential:
        """What a SCRAM exchange shows for a name with no credential: a salt
        stable per name and unguessable without the store's secret, of the
        length and with the iteration count of a stored user's (so neither
        tells whether the name exists), and keys no proof can match."""
        template = self._template(name, mechanism.name)
        length = len(template.salt) if template is not None else 32
        iterations = template.iterations if template is not None else DEFAULT_ITERATIONS
        salt = b"".join(self._keyed(f"salt{block}\0{mechanism.name}\0{name}") for block in range(-(-length // 64)))[:length]
        return ScramCredential(salt, os.urandom(mechanism.digest_size), os.urandom(mechanism.digest_size), iterations)

    def verify_plain(self, name: str, password: str) -> bool:
        """Checks ``password``; an unknown name costs the same hashing work
        as a stored user's."""
        credential = self.get(name, PLAIN)
        if isinstance(credential, PlainCredential):
            return credential.verify(password)
        template = self._template(name, PLAIN)
        iterations = template.iterations if template is not None else DEFAULT_ITERATIONS
        _plain_hash(password, self._keyed(f"plain\0{name}")[:32], iterations)
        return False

    # -- changing (write the file, then apply) ------------------------------------

    def upsert(self, name: str, mechanism: str, credential) -> None:
        self.change([(name, mechanism, credential)])

    def delete(self, name: str, mechanism: str | None = None) -> bool:
        """Remove one credential (or all of the user's); False if none was there."""
        entries = self._users.get(name)
        if not entries or (mechanism is not None and mechanism not in entries):
            return False
        self.change([(name, mechanism, None)])
        return True

    def change(self, changes) -> None:
        """Apply ``(name, mechanism, credential)`` changes (credential None:
        delete it; mechanism None too: every credential of the name) in one
        write, so a crash keeps all of them or none."""
        users = {user: dict(entries) for user, entries in self._users.items()}
        for name, mechanism, credential in changes:
            if credential is not None:
                validate_username(name)
                users.setdefault(name, {})[mechanism] = credential
            elif mechanism is None:
                users.pop(name, None)
            else:
                users.get(name, {}).pop(mechanism, None)
                if name in users and not users[name]:
                    del users[name]
        self._write(users, self._secret or os.urandom(32))

    def _write(self, users: dict[str, dict], secret: bytes) -> None:
        data = {
            "version": _FILE_VERSION,
            "secret": _b64(secret),
            "users": {name: _encode_user(entries) for name, entries in sorted(users.items())},
        }
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        replace_private_file(self.path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"), io=self._io)
        self._users, self._secret = users, secret


def _encode_user(entries: dict) -> dict:
    encoded = {}
    for mechanism, credential in entries.items():
        if isinstance(credential, PlainCredential):
            encoded[mechanism] = {"salt": _b64(credential.salt), "hash": _b64(credential.hash), "iterations": credential.iterations}
        else:
            encoded[mechanism] = {
                "salt": _b64(credential.salt),
                "stored_key": _b64(credential.stored_key),
                "server_key": _b64(credential.server_key),
                "iterations": credential.iterations,
            }
    return encoded


def _decode_user(entries: dict) -> dict:
    decoded = {}
    for mechanism, values in entries.items():
        if mechanism == PLAIN:
            decoded[mechanism] = PlainCredential(_unb64(values["salt"]), _unb64(values["hash"]), int(values["iterations"]))
        elif mechanism in MECHANISMS:
            decoded[mechanism] = ScramCredential(
                salt=_unb64(values["salt"]),
                stored_key=_unb64(values["stored_key"]),
                server_key=_unb64(values["server_key"]),
                iterations=int(values["iterations"]),
            )
        else:
            raise ValueError(f"unknown mechanism {mechanism!r}")
    return decoded


class DataDirInUse(Exception):
    """A broker holds the data directory (change credentials over the wire then)."""


@contextmanager
def offline_store(data_dir: str):
    """The store of a data directory no broker is using, under the
    directory's lock for as long as the caller changes it."""
    if not os.path.isdir(data_dir):
        os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, ".lock"), "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DataDirInUse(
                f"a broker is using {data_dir} (.lock is held): stop it, or use --bootstrap-server to change users over the wire"
            ) from None
        try:
            yield CredentialStore(data_dir).load()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
