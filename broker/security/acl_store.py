"""The ACLs on disk: ``acls.json`` in the data directory.

Format (one JSON object, written whole, mode 0600, by ``broker.security.private_files``,
so a crash leaves the old set or the new one, never a mix):

    {"format": 1,
     "sha256": "<hex digest of the canonical JSON of the acls array>",
     "acls": [{"resource_type": "TOPIC", "name": "orders", "pattern_type": "LITERAL",
               "principal": "User:bob", "host": "*", "operation": "WRITE",
               "permission_type": "ALLOW"}, ...]}

Enum values are Kafka's names, so the file reads like ``kafka-acls --list``.
The digest catches a damaged file (a flipped byte, a hand edit that broke
it): loading then raises ``AclStoreError`` and the broker refuses to start,
because an unreadable ACL file taken for "no ACLs" could open everything
(with ``allow.everyone.if.no.acl.found``) or lock everyone out. No file is
no ACLs (a new data directory).

The broker writes the new set before it answers CreateAcls/DeleteAcls and
before it swaps the set in (write, then apply). ``onceflow acls --data-dir``
edits the file offline under the data directory's lock, so never beside a
running broker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable

from broker.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
    sorted_bindings,
)
from broker.security.private_files import replace_private_file, tighten

FILE_NAME = "acls.json"
FORMAT = 1


class AclStoreError(Exception):
    """The ACL file cannot be read or written (damaged, foreign, unwritable)."""


def _canonical(acls: list[dict]) -> bytes:
    return json.dumps(acls, sort_keys=True, separators=(",", ":")).encode()


def _to_json(binding: AclBinding) -> dict:
    pattern, entry = binding.pattern, binding.entry
    return {
        "resource_type": pattern.resource_type.name,
        "name": pattern.name,
        "pattern_type": pattern.pattern_type.name,
        "principal": entry.principal,
        "host": entry.host,
        "operation": entry.operation.name,
        "permission_type": entry.permission_type.name,
    }


def _from_json(item: dict) -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType[item["resource_type"]], item["name"], PatternType[item["pattern_type"]]),
        AccessControlEntry(item["principal"], item["host"], AclOperation[item["operation"]], AclPermissionType[item["permission_type"]]),
    ).validate()


def encode(bindings: Iterable[AclBinding]) -> bytes:
    acls = [_to_json(binding) for binding in sorted_bindings(bindings)]
    document = {"format": FORMAT, "sha256": hashlib.sha256(_canonical(acls)).hexdigest(), "acls": acls}
    return (json.dumps(document, indent=1) + "\n").encode()


def decode(data: bytes, where: str = FILE_NAME) -> list[AclBinding]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise AclStoreError(f"{where} is damaged (not JSON: {error}); restore it from a backup or remove it to start with no ACLs") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("acls"), list):
        raise AclStoreError(f"{where} is not an onceflow ACL file of format {FORMAT}")
    acls = document["acls"]
    if hashlib.sha256(_canonical(acls)).hexdigest() != document.get("sha256"):
        raise AclStoreError(f"{where} is damaged (its checksum does not match its ACLs); restore it from a backup or remove it to start with no ACLs")
    try:
        return [_from_json(item) for item in acls]
    except (KeyError, TypeError, InvalidAclError) as error:
        raise AclStoreError(f"{where} holds an invalid ACL: {error}") from None


class AclStore:
    """``acls.json`` of one data directory."""

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, FILE_NAME)

    def load(self) -> list[AclBinding]:
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return []
        except OSError as error:
            raise AclStoreError(f"cannot read {self.path}: {error.strerror or error}") from None
        try:
            tighten(self.path)  # one an earlier version wrote world-readable
        except OSError as error:
            raise AclStoreError(f"cannot make {self.path} private: {error.strerror or error}") from None
        return decode(data, self.path)

    def save(self, bindings: Iterable[AclBinding]) -> None:
        """Durably replace the stored set (raises OSError; the old set then stays)."""
        replace_private_file(self.path, encode(bindings))


@contextlib.contextmanager
def offline(data_dir: str):
    """The data directory's ACL store, for a tool, while no broker runs on it
    (the broker's ``.lock`` is taken, so a broker cannot start meanwhile)."""
    try:
        os.makedirs(data_dir, exist_ok=True)  # ACLs may be set before the first start
    except OSError as error:
        raise AclStoreError(f"cannot use data directory {data_dir}: {error.strerror or error}") from None
    with open(os.path.join(data_dir, ".lock"), "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise AclStoreError(f"data directory {data_dir} is in use by a running broker: change its ACLs with --bootstrap-server") from None
        try:
            yield AclStore(data_dir)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
