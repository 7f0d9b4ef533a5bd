"""Kafka's ACL values as the wire carries them (CreateAcls, DescribeAcls,
DeleteAcls), shared by the broker's authorizer (``broker.security.acls``)
and our admin client (``txn.admin``): the enums with Kafka's codes
(``org.apache.kafka.common.acl`` / ``resource``), a resource pattern, an
access control entry, an ACL (``AclBinding``: pattern + entry) with the
validation Kafka's controller applies, and the filter of DescribeAcls and
DeleteAcls (``AclBindingFilter``): ANY matches every value of a field, a
null name/principal/host any value, and the pattern type MATCH selects the
ACLs that would apply to the named resource (its literal, the wildcard, its
prefixes).
"""

from __future__ import annotations

import enum

import attrs


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"
# The one name of the CLUSTER resource (Kafka's CLUSTER_NAME).
CLUSTER_NAME = "kafka-cluster"

# An ALLOW of one of these operations also allows the key (AclOperation's javadoc).
IMPLIED_BY = {
    AclOperation.DESCRIBE: frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}),
}

# The operations that mean something for each resource type (Kafka's
# docs, "Operations and Resources on Protocols"), for authorized-operation sets.
OPERATIONS_OF = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
}


class InvalidAclError(ValueError):
    """An ACL or filter that cannot be stored or used (Kafka answers INVALID_REQUEST)."""


def _enum_name(value) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


@attrs.frozen
class ResourcePattern:
    resource_type: ResourceType = attrs.field(converter=ResourceType)
    name: str
    pattern_type: PatternType = attrs.field(converter=PatternType, default=PatternType.LITERAL)

    def __str__(self) -> str:
        return f"{self.resource_type.name}:{self.pattern_type.name}:{self.name}"


@attrs.frozen
class AccessControlEntry:
    principal: str
    host: str
    operation: AclOperation = attrs.field(converter=AclOperation)
    permission_type: AclPermissionType = attrs.field(converter=AclPermissionType)


@attrs.frozen
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    @classmethod
    def of(cls, resource_type, name: str, principal: str, operation, permission_type=AclPermissionType.ALLOW, *, host: str = WILDCARD_HOST, pattern_type=PatternType.LITERAL) -> AclBinding:
        """One ACL from its parts; enum members or their codes alike."""
        return cls(ResourcePattern(resource_type, name, pattern_type), AccessControlEntry(principal, host, operation, permission_type))

    def validate(self) -> AclBinding:
        """Raise InvalidAclError unless this ACL can be stored (what Kafka's
        controller accepts); return it."""
        pattern, entry = self.pattern, self.entry
        if pattern.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"invalid resource type {_enum_name(pattern.resource_type)}")
        if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"invalid pattern type {_enum_name(pattern.pattern_type)}: an ACL is LITERAL or PREFIXED")
        if not pattern.name:
            raise InvalidAclError("invalid empty resource name")
        if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
            raise InvalidAclError(f"the only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        if entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"invalid operation {_enum_name(entry.operation)}")
        if entry.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAclError(f"invalid permission type {_enum_name(entry.permission_type)}")
        kind, separator, name = entry.principal.partition(":")
        if not separator or not kind or not name:
            raise InvalidAclError(f"a principal is written Type:name (User:alice), not {entry.principal!r}")
        if not entry.host:
            raise InvalidAclError("invalid empty host (use * for every host)")
        return self

    def __str__(self) -> str:
        entry = self.entry
        return f"{entry.permission_type.name} {entry.principal} from {entry.host} {entry.operation.name} on {self.pattern}"


def _enum_or_unknown(kind, value):
    try:
        return kind(value)
    except ValueError:
        return kind.UNKNOWN


@attrs.frozen
class AclBindingFilter:
    """DescribeAcls' and DeleteAcls' filter: None and ANY match anything."""

    resource_type: ResourceType = attrs.field(converter=lambda v: _enum_or_unknown(ResourceType, v), default=ResourceType.ANY)
    name: str | None = None
    pattern_type: PatternType = attrs.field(converter=lambda v: _enum_or_unknown(PatternType, v), default=PatternType.ANY)
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = attrs.field(converter=lambda v: _enum_or_unknown(AclOperation, v), default=AclOperation.ANY)
    permission_type: AclPermissionType = attrs.field(converter=lambda v: _enum_or_unknown(AclPermissionType, v), default=AclPermissionType.ANY)

    def validate(self) -> AclBindingFilter:
        unknown = [
            field
            for field, value in (("resource type", self.resource_type), ("pattern type", self.pattern_type), ("operation", self.operation), ("permission type", self.permission_type))
            if value.name == "UNKNOWN"
        ]
        if unknown:
            raise InvalidAclError(f"the filter has an UNKNOWN {', '.join(unknown)}")
        return self

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != pattern.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        # MATCH: the ACLs that would apply to a resource of this name.
        if pattern.pattern_type == PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        return self.name.startswith(pattern.name)

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        return (
            (self.principal is None or self.principal == entry.principal)
            and (self.host is None or self.host == entry.host)
            and (self.operation == AclOperation.ANY or self.operation == entry.operation)
            and (self.permission_type == AclPermissionType.ANY or self.permission_type == entry.permission_type)
        )

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)


MATCH_ALL = AclBindingFilter()
