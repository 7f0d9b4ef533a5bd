"""``onceflow acls add|list|remove``: the broker's ACLs, in the shape of
Kafka's ``kafka-acls.sh``:

    onceflow acls add --allow-principal User:bob --operation Write --operation Read --topic orders
    onceflow acls add --allow-principal User:app --producer --topic out --transactional-id app- --resource-pattern-type prefixed
    onceflow acls add --deny-principal User:mallory --deny-host 10.0.0.9 --operation All --topic '*'
    onceflow acls list [--topic T | --group G | ...] [--principal User:bob]
    onceflow acls remove --allow-principal User:bob --operation Read --topic orders
    onceflow acls remove --topic orders                 (every ACL of that topic)

Resources: ``--topic`` and ``--group`` and ``--transactional-id``
(repeatable) and ``--cluster``; ``--resource-pattern-type`` literal (the
default) or prefixed, and for list/remove also any or match. Each of the
``--allow-principal``/``--deny-principal`` principals gets each operation
from each of its ``--allow-host``/``--deny-host`` hosts (default ``*``), on
each resource (``--operation`` defaults to All, as with kafka-acls, unless
``--producer`` or ``--consumer`` is given). ``--producer`` and
``--consumer`` add the operations Kafka's tool grants for them.

Where: ``--bootstrap-server H:P`` (with the security options of the other
client commands: ``--command-config``, ``--sasl-username``, ...) changes a
running broker through CreateAcls/DescribeAcls/DeleteAcls (the principal
needs ALTER on the cluster, or to be a super user); ``--data-dir DIR``
changes the stored ACLs of a broker that is not running (the way to grant
the first administrator before the first start).
"""

from __future__ import annotations

import sys

from onceflow.client_commands import (
    CommandError,
    add_bootstrap_option,
    client_options,
    reporting_errors,
)

RESOURCE_OPTIONS = (("topic", "TOPIC"), ("group", "GROUP"), ("transactional_id", "TRANSACTIONAL_ID"))


def _operation(text: str):
    from protocol.acls import AclOperation

    wanted = text.replace("_", "").replace("-", "").upper()
    for operation in AclOperation:
        if operation.name.replace("_", "") == wanted and operation not in (AclOperation.UNKNOWN, AclOperation.ANY):
            return operation
    names = ", ".join(op.name.title().replace("_", "") for op in AclOperation if op not in (AclOperation.UNKNOWN, AclOperation.ANY))
    raise CommandError(f"unknown operation {text!r}: one of {names}", 2)


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, summary in (("add", "add ACLs"), ("list", "list ACLs (all, or those of the resources named)"), ("remove", "remove the ACLs matching the options")):
        action = actions.add_parser(name, help=summary, description=summary)
        action.add_argument("--data-dir", metavar="DIR", help="change the stored ACLs of a broker that is not running")
        add_bootstrap_option(action)
        action.add_argument("--topic", action="append", default=[], metavar="T", help="a topic (repeatable; * for all)")
        action.add_argument("--group", action="append", default=[], metavar="G", help="a consumer group (repeatable; * for all)")
        action.add_argument("--transactional-id", action="append", default=[], metavar="ID", help="a transactional id (repeatable; * for all)")
        action.add_argument("--cluster", action="store_true", help="the cluster resource")
        patterns = ("literal", "prefixed") if name == "add" else ("literal", "prefixed", "any", "match")
        action.add_argument("--resource-pattern-type", type=str.lower, choices=patterns, default=None, help="how the resource names match (default literal" + ("" if name == "add" else "; list without a resource shows all") + ")")
        if name == "list":
            action.add_argument("--principal", action="append", default=[], metavar="P", help="only the ACLs of this principal (repeatable)")
            continue
        action.add_argument("--allow-principal", action="append", default=[], metavar="P", help="a principal to allow, User:name or User:* (repeatable)")
        action.add_argument("--deny-principal", action="append", default=[], metavar="P", help="a principal to deny (repeatable)")
        action.add_argument("--allow-host", action="append", default=[], metavar="H", help="hosts the allowed principals may come from (default *)")
        action.add_argument("--deny-host", action="append", default=[], metavar="H", help="hosts the denied principals are denied from (default *)")
        action.add_argument("--operation", action="append", default=[], metavar="OP", help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All (repeatable)")
        if name == "add":
            action.add_argument("--producer", action="store_true", help="what a producer needs: Write, Describe, Create on the topics; Write, Describe on the transactional ids; IdempotentWrite with --idempotent")
            action.add_argument("--idempotent", action="store_true", help="with --producer: IdempotentWrite on the cluster")
            action.add_argument("--consumer", action="store_true", help="what a consumer needs: Read, Describe on the topics; Read on the groups")


def _resources(args) -> list[tuple]:
    """(resource type, name) of every resource option."""
    from protocol.acls import CLUSTER_NAME, ResourceType

    resources = [(ResourceType[kind], name) for option, kind in RESOURCE_OPTIONS for name in getattr(args, option)]
    if args.cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return resources


def _pattern_type(args, default="literal"):
    from protocol.acls import PatternType

    return PatternType[(args.resource_pattern_type or default).upper()]


def bindings_to_add(args) -> list:
    """Every ACL ``add`` asks for (resources x principals x hosts x operations)."""
    from protocol.acls import (
        AclBinding,
        AclPermissionType,
        InvalidAclError,
        PatternType,
        ResourceType,
    )
    from protocol.acls import AclOperation as Op

    resources = _resources(args)
    if not resources:
        raise CommandError("name at least one resource: --topic, --group, --transactional-id or --cluster", 2)
    if not args.allow_principal and not args.deny_principal:
        raise CommandError("name at least one --allow-principal or --deny-principal", 2)
    pattern = _pattern_type(args)
    # No --operation means All, as with kafka-acls (unless --producer or
    # --consumer names the operations).
    texts = args.operation or ([] if args.producer or args.consumer else ["All"])
    operations = [_operation(text) for text in texts]
    # (resource type, name, operation, pattern type)
    wanted = [(kind, name, operation, pattern) for kind, name in resources for operation in operations]
    if args.producer:
        for kind, name in resources:
            if kind == ResourceType.TOPIC:
                wanted += [(kind, name, op, pattern) for op in (Op.WRITE, Op.DESCRIBE, Op.CREATE)]
            elif kind == ResourceType.TRANSACTIONAL_ID:
                wanted += [(kind, name, op, pattern) for op in (Op.WRITE, Op.DESCRIBE)]
        if args.idempotent:
            from protocol.acls import CLUSTER_NAME

            wanted.append((ResourceType.CLUSTER, CLUSTER_NAME, Op.IDEMPOTENT_WRITE, PatternType.LITERAL))
    if args.consumer:
        for kind, name in resources:
            if kind == ResourceType.TOPIC:
                wanted += [(kind, name, op, pattern) for op in (Op.READ, Op.DESCRIBE)]
            elif kind == ResourceType.GROUP:
                wanted.append((kind, name, Op.READ, pattern))
    if not wanted:
        raise CommandError("name at least one --operation (or --producer / --consumer)", 2)
    bindings = []
    for permission, principals, hosts in ((AclPermissionType.ALLOW, args.allow_principal, args.allow_host), (AclPermissionType.DENY, args.deny_principal, args.deny_host)):
        for principal in principals:
            for host in hosts or ["*"]:
                for kind, name, operation, pattern_type in wanted:
                    binding = AclBinding.of(kind, name, principal, operation, permission, host=host, pattern_type=pattern_type)
                    try:
                        bindings.append(binding.validate())
                    except InvalidAclError as error:
                        raise CommandError(f"{binding}: {error}", 2) from None
    return list(dict.fromkeys(bindings))


def filters_for(args) -> list:
    """The filters ``list`` or ``remove`` asks for."""
    from protocol.acls import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourceType,
    )

    resources = _resources(args)
    if resources:
        pattern = _pattern_type(args)
        resource_filters = [{"resource_type": kind, "name": name, "pattern_type": pattern} for kind, name in resources]
    elif args.action == "remove":
        raise CommandError("name the resources to remove ACLs from: --topic, --group, --transactional-id or --cluster", 2)
    else:
        resource_filters = [{"resource_type": ResourceType.ANY, "pattern_type": _pattern_type(args, "any")}]
    entries: list[dict] = []
    if args.action == "list":
        entries = [{"principal": p} for p in args.principal] or [{}]
    else:
        operations = [_operation(text) for text in args.operation] or [AclOperation.ANY]
        for permission, principals, hosts in ((AclPermissionType.ALLOW, args.allow_principal, args.allow_host), (AclPermissionType.DENY, args.deny_principal, args.deny_host)):
            for principal in principals:
                # As kafka-acls: a principal without hosts means host *, on remove as on add.
                for host in hosts or ["*"]:
                    entries += [{"principal": principal, "host": host, "operation": op, "permission_type": permission} for op in operations]
        if not entries:
            entries = [{"operation": op} for op in operations]
    return [AclBindingFilter(**resource, **entry) for resource in resource_filters for entry in entries]


def print_bindings(bindings, out=None) -> None:
    """As kafka-acls prints them: per resource pattern, its entries."""
    from broker.security.acls import sorted_bindings

    out = out or sys.stdout
    by_pattern: dict = {}
    for binding in sorted_bindings(bindings):
        by_pattern.setdefault(binding.pattern, []).append(binding.entry)
    for pattern, entries in by_pattern.items():
        out.write(f"Current ACLs for resource `ResourcePattern(resourceType={pattern.resource_type.name}, name={pattern.name}, patternType={pattern.pattern_type.name})`:\n")
        for entry in entries:
            out.write(f" \t(principal={entry.principal}, host={entry.host}, operation={entry.operation.name}, permissionType={entry.permission_type.name})\n")
        out.write("\n")


def run(args) -> int:
    if args.data_dir:
        return reporting_errors("acls", args, lambda: _offline(args))
    return reporting_errors("acls", args, lambda: _over_the_wire(args))


def _offline(args) -> int:
    from broker.security.acl_store import AclStoreError, offline

    try:
        with offline(args.data_dir) as store:
            current = set(store.load())
            if args.action == "add":
                added = [b for b in bindings_to_add(args) if b not in current]
                store.save(current | set(added))
                print(f"added {len(added)} ACLs to {store.path}" + (f" ({len(current) + len(added)} in all)" if current else ""))
                print_bindings(added)
            elif args.action == "list":
                filters = filters_for(args)
                print_bindings([b for b in current if any(f.matches(b) for f in filters)])
            else:
                filters = filters_for(args)
                removed = {b for b in current if any(f.matches(b) for f in filters)}
                store.save(current - removed)
                print(f"removed {len(removed)} ACLs from {store.path}")
                print_bindings(removed)
    except AclStoreError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"cannot write the ACLs in {args.data_dir}: {error.strerror or error}") from None
    return 0


def _over_the_wire(args) -> int:
    from txn import Admin

    with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
        if args.action == "add":
            bindings = bindings_to_add(args)
            admin.create_acls(bindings)
            print(f"added {len(bindings)} ACLs")
            print_bindings(bindings)
        elif args.action == "list":
            found = []
            for acl_filter in filters_for(args):
                found += admin.describe_acls(acl_filter)
            print_bindings(set(found))
        else:
            removed = admin.delete_acls(filters_for(args))
            print(f"removed {len(set(removed))} ACLs")
            print_bindings(set(removed))
    return 0
