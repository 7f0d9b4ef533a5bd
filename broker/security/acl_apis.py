"""The handlers of CreateAcls, DescribeAcls and DeleteAcls (v0-v3).

They change the broker's ``AclAuthorizer`` the durable way: the new set is
written to ``acls.json`` (``broker.security.acl_store``) first, and only
once that write is on disk is it swapped in and the request answered; a
failed write changes nothing and answers an error. Changes are serialised
(one at a time), so two concurrent CreateAcls cannot lose each other's ACLs.

Who may call them (ALTER, DESCRIBE on the cluster) is decided by
``broker.security.authorizer`` like any request. Without an authorizer
configured they answer SECURITY_DISABLED, as Kafka does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import attrs

from broker.security.acl_store import AclStore
from broker.security.acls import (
    AclAuthorizer,
    AclBinding,
    AclBindingFilter,
    InvalidAclError,
)
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

log = logging.getLogger(__name__)

DISABLED_MESSAGE = "no authorizer is configured on this broker (authorizer.class.name)"


def binding_from_creation(creation: dict) -> AclBinding:
    try:
        return AclBinding.of(
            creation.get("resource_type", 0),
            creation.get("resource_name", ""),
            creation.get("principal", ""),
            creation.get("operation", 0),
            creation.get("permission_type", 0),
            host=creation.get("host", ""),
            pattern_type=creation.get("resource_pattern_type", 3),
        ).validate()
    except ValueError as error:  # an unknown code, or InvalidAclError
        raise InvalidAclError(str(error)) from None


def filter_from_request(entry: dict) -> AclBindingFilter:
    return AclBindingFilter(
        resource_type=entry.get("resource_type_filter", 0),
        name=entry.get("resource_name_filter"),
        pattern_type=entry.get("pattern_type_filter", 3),
        principal=entry.get("principal_filter"),
        host=entry.get("host_filter"),
        operation=entry.get("operation", 0),
        permission_type=entry.get("permission_type", 0),
    ).validate()


def binding_fields(binding: AclBinding) -> dict:
    pattern, entry = binding.pattern, binding.entry
    return {
        "resource_type": int(pattern.resource_type),
        "resource_name": pattern.name,
        "pattern_type": int(pattern.pattern_type),
        "principal": entry.principal,
        "host": entry.host,
        "operation": int(entry.operation),
        "permission_type": int(entry.permission_type),
    }


@attrs.define(eq=False, kw_only=True)
class AclApis:
    """The three ACL handlers over one authorizer and its store."""

    authorizer: AclAuthorizer | None
    store: AclStore
    _changing: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)  # one change at a time

    def handlers(self) -> dict:
        return {ApiKey.CREATE_ACLS: self.handle_create_acls, ApiKey.DESCRIBE_ACLS: self.handle_describe_acls, ApiKey.DELETE_ACLS: self.handle_delete_acls}

    async def _apply(self, bindings: Iterable[AclBinding]) -> None:
        """Write, then swap in (raises OSError if the write failed; nothing changed then)."""
        bindings = frozenset(bindings)
        await asyncio.to_thread(self.store.save, bindings)
        self.authorizer.replace(bindings)

    async def handle_create_acls(self, version: int, body: dict) -> dict:
        creations = body.get("creations") or []
        if self.authorizer is None:
            return {"throttle_time_ms": 0, "results": [{"error_code": ErrorCode.SECURITY_DISABLED, "error_message": DISABLED_MESSAGE} for _ in creations]}
        results, valid = [], []
        for creation in creations:
            try:
                valid.append(binding_from_creation(creation))
                results.append({"error_code": ErrorCode.NONE, "error_message": None})
            except InvalidAclError as error:
                results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(error)})
        if valid:
            async with self._changing:
                try:
                    await self._apply(self.authorizer.bindings | set(valid))
                except OSError as error:
                    log.error("could not store new ACLs: %s", error)
                    for result in results:
                        if result["error_code"] == ErrorCode.NONE:
                            result.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=f"the ACLs could not be stored: {error}")
                else:
                    for binding in valid:
                        log.info("ACL added: %s", binding)
        return {"throttle_time_ms": 0, "results": results}

    async def handle_describe_acls(self, version: int, body: dict) -> dict:
        if self.authorizer is None:
            return {"throttle_time_ms": 0, "error_code": ErrorCode.SECURITY_DISABLED, "error_message": DISABLED_MESSAGE, "resources": []}
        try:
            acl_filter = filter_from_request(body)
        except (InvalidAclError, ValueError) as error:
            return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "error_message": str(error), "resources": []}
        resources: dict = {}
        for binding in self.authorizer.matching(acl_filter):
            fields = binding_fields(binding)
            key = (fields["resource_type"], fields["resource_name"], fields["pattern_type"])
            resources.setdefault(key, []).append({name: fields[name] for name in ("principal", "host", "operation", "permission_type")})
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "resources": [{"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls} for (t, n, p), acls in resources.items()],
        }

    async def handle_delete_acls(self, version: int, body: dict) -> dict:
        entries = body.get("filters") or []
        if self.authorizer is None:
            return {"throttle_time_ms": 0, "filter_results": [{"error_code": ErrorCode.SECURITY_DISABLED, "error_message": DISABLED_MESSAGE, "matching_acls": []} for _ in entries]}
        async with self._changing:
            results, doomed = [], set()
            for entry in entries:
                try:
                    matched = self.authorizer.matching(filter_from_request(entry))
                except (InvalidAclError, ValueError) as error:
                    results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(error), "matching_acls": []})
                    continue
                doomed.update(matched)
                results.append({"error_code": ErrorCode.NONE, "error_message": None, "matching_acls": [{"error_code": ErrorCode.NONE, "error_message": None, **binding_fields(b)} for b in matched]})
            if doomed:
                try:
                    await self._apply(self.authorizer.bindings - doomed)
                except OSError as error:
                    log.error("could not store the ACLs left after a delete: %s", error)
                    for result in results:
                        if result["error_code"] == ErrorCode.NONE:
                            result.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=f"the ACLs could not be stored: {error}", matching_acls=[])
                else:
                    for binding in doomed:
                        log.info("ACL removed: %s", binding)
        return {"throttle_time_ms": 0, "filter_results": results}
