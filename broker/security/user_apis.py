"""KIP-554: DescribeUserScramCredentials and AlterUserScramCredentials, the
Kafka API for SCRAM users, over the broker's ``CredentialStore``.

Clients salt on their side: an upsertion carries the salt, the iteration
count and the salted password, and the broker keeps only the StoredKey and
ServerKey derived from them. A change is written to disk before it is
answered and counts for every authentication that starts afterwards. The
error codes are Kafka's: RESOURCE_NOT_FOUND for a user (or credential) that
does not exist, DUPLICATE_RESOURCE for a user named twice in one request,
UNSUPPORTED_SASL_MECHANISM, UNACCEPTABLE_CREDENTIAL for an empty name or an
iteration count outside 4096..16384. Who may call them is the authorizer's
business (Kafka wants DESCRIBE / ALTER on the cluster).
"""

from __future__ import annotations

import logging

from broker.security.credentials import CredentialError, validate_username
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.scram import MECHANISMS, MECHANISMS_BY_TYPE, credential_from_salted

log = logging.getLogger(__name__)


class UserScramApis:
    def __init__(self, *, credentials):
        self.credentials = credentials

    def handlers(self) -> dict:
        return {
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.handle_describe,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.handle_alter,
        }

    async def handle_describe(self, version: int, body: dict) -> dict:
        users = self.credentials.users()
        requested = body.get("users")
        if not requested:  # null or empty: every user with a SCRAM credential
            names = [name for name, mechanisms in users.items() if any(m in MECHANISMS for m in mechanisms)]
            duplicates = set()
        else:
            names = [entry.get("name") or "" for entry in requested]
            duplicates = {name for name in names if names.count(name) > 1}
        results = []
        for name in dict.fromkeys(names):
            result = {"user": name, "error_code": ErrorCode.NONE, "error_message": None, "credential_infos": []}
            scram = [MECHANISMS[m] for m in users.get(name, ()) if m in MECHANISMS]
            if name in duplicates:
                result.update(error_code=ErrorCode.DUPLICATE_RESOURCE, error_message=f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}")
            elif not scram:
                result.update(error_code=ErrorCode.RESOURCE_NOT_FOUND, error_message=f"Attempt to describe nonexistent user: {name}")
            else:
                result["credential_infos"] = [
                    {"mechanism": mechanism.kafka_type, "iterations": self.credentials.scram_credential(name, mechanism).iterations}
                    for mechanism in scram
                ]
            results.append(result)
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": results}

    async def handle_alter(self, version: int, body: dict) -> dict:
        deletions = body.get("deletions") or []
        upsertions = body.get("upsertions") or []
        errors: dict[str, tuple[int, str]] = {}
        order: list[str] = []
        seen: set[tuple[str, int]] = set()
        for entry in [*deletions, *upsertions]:
            name = entry.get("name") or ""
            if name not in order:
                order.append(name)
            key = (name, entry.get("mechanism"))
            if key in seen:
                errors.setdefault(name, (ErrorCode.DUPLICATE_RESOURCE, f"A user credential cannot be altered twice in the same request: {name}"))
            seen.add(key)
        for entry in [*deletions, *upsertions]:
            name = entry.get("name") or ""
            if name in errors:
                continue
            mechanism = MECHANISMS_BY_TYPE.get(entry.get("mechanism"))
            if mechanism is None:
                errors[name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {entry.get('mechanism')}")
                continue
            try:
                validate_username(name)
            except CredentialError as error:
                errors[name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(error))
                continue
            if entry in upsertions:
                iterations = entry.get("iterations", 0)
                if not mechanism.min_iterations <= iterations <= mechanism.max_iterations:
                    errors[name] = (
                        ErrorCode.UNACCEPTABLE_CREDENTIAL,
                        f"{mechanism.name} iterations must be within {mechanism.min_iterations}..{mechanism.max_iterations}, not {iterations}",
                    )
                elif not entry.get("salt") or not entry.get("salted_password"):
                    errors[name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "salt and salted password may not be empty")
            elif self.credentials.scram_credential(name, mechanism) is None:
                errors[name] = (ErrorCode.RESOURCE_NOT_FOUND, f"Attempt to delete a user credential that does not exist: {name} {mechanism.name}")
        # A user's changes are applied together or not at all (Kafka answers
        # per user): the users without an error change in one write.
        changes = []
        for entry in deletions:
            name = entry.get("name") or ""
            if name not in errors:
                changes.append((name, MECHANISMS_BY_TYPE[entry["mechanism"]].name, None))
        for entry in upsertions:
            name = entry.get("name") or ""
            if name not in errors:
                mechanism = MECHANISMS_BY_TYPE[entry["mechanism"]]
                credential = credential_from_salted(mechanism, bytes(entry["salted_password"]), bytes(entry["salt"]), entry["iterations"])
                changes.append((name, mechanism.name, credential))
        if changes:
            try:
                self.credentials.change(changes)
            except OSError as error:
                log.error("could not store SCRAM credentials: %s", error)
                for name, _mechanism, _credential in changes:
                    errors.setdefault(name, (ErrorCode.UNKNOWN_SERVER_ERROR, f"the credentials could not be stored: {error}"))
        changed = [name for name in order if name not in errors]
        if changed:
            log.info("SCRAM credentials changed for %s", ", ".join(changed))
        results = []
        for name in order:
            code, message = errors.get(name, (ErrorCode.NONE, None))
            results.append({"user": name, "error_code": code, "error_message": message})
        return {"throttle_time_ms": 0, "results": results}
