"""Access control lists with Kafka's model: the decision over them
(sans-I/O: no sockets, no files). The values (``AclBinding``, the enums with
the codes the wire carries, ``AclBindingFilter``) live in ``protocol.acls``,
shared with our admin client, and are re-exported here.

An ACL (``AclBinding``) says: *principal* from *host* is ALLOWed (or DENYed)
*operation* on the resources a *pattern* names. A pattern is a resource type
(TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER, ...), a name and a pattern type:
LITERAL (the name itself, or ``*`` for every resource of the type) or
PREFIXED (every name starting with it). The codes of every enum are Kafka's
(``org.apache.kafka.common.acl`` / ``resource``), as CreateAcls, DescribeAcls
and DeleteAcls carry them.

``AclAuthorizer.authorize`` decides as Kafka's AclAuthorizer and
StandardAuthorizer do:

1. a super user (``super.users``) may do anything;
2. the ACLs that apply to the resource are those of its literal name, of the
   literal wildcard ``*`` and of every prefix of its name;
3. if none applies, the answer is ``allow.everyone.if.no.acl.found``
   (false unless configured, as in Kafka);
4. a DENY that matches the principal (or ``User:*``), the host (or ``*``) and
   the operation (or ALL) refuses, whatever ALLOWs say;
5. otherwise an ALLOW that matches allows; an ALLOW of READ, WRITE, DELETE
   or ALTER also allows DESCRIBE, one of ALTER_CONFIGS also allows
   DESCRIBE_CONFIGS (a DENY implies nothing but itself);
6. anything else is refused.

Decisions are cached per (principal, host, operation, resource); the cache is
emptied whenever the ACLs change, so a check on the produce path is one
dictionary look-up. A denial is logged (``broker.security.audit``, INFO) when
it is decided, so once per principal, host, operation and resource until the
ACLs change, not once per request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs

from protocol.acls import (  # noqa: F401  (the model, re-exported beside its decision)
    CLUSTER_NAME,
    IMPLIED_BY,
    MATCH_ALL,
    OPERATIONS_OF,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
)

# Denials, as Kafka's authorizer logger reports them: once per principal,
# host, operation and resource until the ACLs change (decisions are cached).
audit = logging.getLogger("broker.security.audit")


@attrs.frozen
class AuthorizerSettings:
    """``super.users`` (principals, ``User:admin``) and
    ``allow.everyone.if.no.acl.found``, as Kafka names them."""

    super_users: frozenset = attrs.field(factory=frozenset, converter=frozenset)
    allow_everyone_if_no_acl_found: bool = False

    @staticmethod
    def parse_super_users(text: str) -> frozenset:
        """Kafka's ``super.users``: principals separated by semicolons."""
        users = frozenset(part.strip() for part in text.split(";") if part.strip())
        for user in users:
            kind, separator, name = user.partition(":")
            if not separator or not kind or not name:
                raise ValueError(f"super.users wants principals Type:name separated by ';', not {user!r}")
        return users


# Bound on cached decisions: principals x resources can grow without end
# (a client naming random topics); past it the cache starts again.
MAX_CACHED_DECISIONS = 100_000


class AclAuthorizer:
    """The ACLs in force and the decision over them (Kafka's semantics, see
    the module's docstring). Mutated only through ``replace`` (the broker
    writes the new set to disk first, then swaps it in)."""

    def __init__(self, bindings: Iterable[AclBinding] = (), settings: AuthorizerSettings | None = None):
        self.settings = settings or AuthorizerSettings()
        self.bindings: frozenset[AclBinding] = frozenset()
        self._literal: dict[tuple[ResourceType, str], list[AccessControlEntry]] = {}
        self._prefixed: dict[ResourceType, list[tuple[str, AccessControlEntry]]] = {}
        self._count_by_type: dict[ResourceType, int] = {}
        self._cache: dict[tuple, bool] = {}
        self.replace(bindings)

    def replace(self, bindings: Iterable[AclBinding]) -> None:
        """Make ``bindings`` the ACLs in force (and forget every cached decision)."""
        self.bindings = frozenset(bindings)
        literal: dict = {}
        prefixed: dict = {}
        counts: dict = {}
        for binding in self.bindings:
            pattern = binding.pattern
            counts[pattern.resource_type] = counts.get(pattern.resource_type, 0) + 1
            if pattern.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(pattern.resource_type, []).append((pattern.name, binding.entry))
            else:
                literal.setdefault((pattern.resource_type, pattern.name), []).append(binding.entry)
        self._literal, self._prefixed, self._count_by_type = literal, prefixed, counts
        self._cache = {}

    def matching(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return sorted((b for b in self.bindings if acl_filter.matches(b)), key=_binding_order)

    def is_super_user(self, principal: str) -> bool:
        return principal in self.settings.super_users

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """May ``principal`` (``User:alice``) connecting from ``host`` do
        ``operation`` on the resource?"""
        key = (principal, host, operation, resource_type, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, name)
            if not decision:
                audit.info("principal %s is denied operation %s from host %s on resource %s:%s", principal, operation.name, host, resource_type.name, name)
            self._remember(key, decision)
        return decision

    def _remember(self, key: tuple, decision: bool) -> None:
        if len(self._cache) >= MAX_CACHED_DECISIONS:
            self._cache = {}
        self._cache[key] = decision

    def _applicable(self, resource_type: ResourceType, name: str) -> list[AccessControlEntry]:
        entries = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD_RESOURCE:
            entries += self._literal.get((resource_type, WILDCARD_RESOURCE), ())
        for prefix, entry in self._prefixed.get(resource_type, ()):
            if name.startswith(prefix):
                entries.append(entry)
        return entries

    def _decide(self, principal, host, operation, resource_type, name) -> bool:
        if principal in self.settings.super_users:
            return True
        if name is None:  # a resource without a name is nobody's
            return False
        entries = self._applicable(resource_type, name)
        if not entries:
            return self.settings.allow_everyone_if_no_acl_found
        principals = (principal, WILDCARD_PRINCIPAL)
        hosts = (host, WILDCARD_HOST)
        relevant = [e for e in entries if e.principal in principals and e.host in hosts]
        if any(e.permission_type == AclPermissionType.DENY and e.operation in (operation, AclOperation.ALL) for e in relevant):
            return False
        allowing = IMPLIED_BY.get(operation, (operation,))
        return any(e.permission_type == AclPermissionType.ALLOW and (e.operation == AclOperation.ALL or e.operation in allowing) for e in relevant)

    def authorize_any(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """May the principal do ``operation`` on at least one resource of the
        type (KIP-679's authorizeByResourceType, which lets an idempotent
        producer with WRITE on some topic initialise without IDEMPOTENT_WRITE)?
        An ALLOW counts unless a DENY covers everything it names: a DENY of
        the wildcard, of the same literal, or of a prefix of its name."""
        key = (principal, host, operation, resource_type, None)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide_any(principal, host, operation, resource_type)
            self._remember(key, decision)
        return decision

    def _decide_any(self, principal, host, operation, resource_type) -> bool:
        if principal in self.settings.super_users:
            return True
        if not self._count_by_type.get(resource_type):
            return self.settings.allow_everyone_if_no_acl_found
        principals = (principal, WILDCARD_PRINCIPAL)
        hosts = (host, WILDCARD_HOST)

        def applies(entry, permission) -> bool:
            return entry.permission_type == permission and entry.operation in (operation, AclOperation.ALL) and entry.principal in principals and entry.host in hosts

        denied_literals = set()
        denied_prefixes = []
        allowed: list[tuple[str, PatternType]] = []
        for (kind, name), entries in self._literal.items():
            if kind != resource_type:
                continue
            for entry in entries:
                if applies(entry, AclPermissionType.DENY):
                    denied_literals.add(name)
                elif applies(entry, AclPermissionType.ALLOW):
                    allowed.append((name, PatternType.LITERAL))
        for prefix, entry in self._prefixed.get(resource_type, ()):
            if applies(entry, AclPermissionType.DENY):
                denied_prefixes.append(prefix)
            elif applies(entry, AclPermissionType.ALLOW):
                allowed.append((prefix, PatternType.PREFIXED))
        if WILDCARD_RESOURCE in denied_literals:
            return False
        for name, pattern_type in allowed:
            if any(name.startswith(prefix) for prefix in denied_prefixes):
                continue
            if pattern_type == PatternType.LITERAL and name in denied_literals:
                continue
            return True
        return False

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """Kafka's authorized-operations bit field (KIP-430): bit ``code`` set
        for each meaningful operation the principal may do on the resource."""
        bits = 0
        for operation in OPERATIONS_OF.get(resource_type, ()):
            if self.authorize(principal, host, operation, resource_type, name):
                bits |= 1 << int(operation)
        return bits


def _binding_order(binding: AclBinding):
    pattern, entry = binding.pattern, binding.entry
    return (int(pattern.resource_type), pattern.name, int(pattern.pattern_type), entry.principal, entry.host, int(entry.operation), int(entry.permission_type))


def sorted_bindings(bindings: Iterable[AclBinding]) -> list[AclBinding]:
    """A stable order (resource, then entry) for listings and the stored file."""
    return sorted(bindings, key=_binding_order)
