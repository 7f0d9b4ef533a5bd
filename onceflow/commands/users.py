"""``onceflow users add|delete|list``: the users SASL clients log in as.

    onceflow users add alice --password S3cret [--mechanism SCRAM-SHA-512] --data-dir ./onceflow-data
    onceflow users add alice --password S3cret --bootstrap-server 127.0.0.1:9092 [--sasl-username admin ...]
    onceflow users delete alice [--mechanism SCRAM-SHA-256] (--data-dir DIR | --bootstrap-server H:P)
    onceflow users list (--data-dir DIR | --bootstrap-server H:P)

With ``--data-dir`` the data directory's credential file is changed
directly (``broker.security.credentials``), while no broker runs on it:
what a broker finds there when it starts. With ``--bootstrap-server`` the
change goes over the wire through Kafka's own API for it (KIP-554,
AlterUserScramCredentials: the password is salted here, the broker never
sees it) and counts at once for new logins. KIP-554 covers SCRAM only, so
PLAIN users are managed offline. Passwords are stored hashed, never as
they are; ``--password`` may be left out for ``ONCEFLOW_USER_PASSWORD``
(a flag shows in ``ps``).
"""

from __future__ import annotations

import os
import sys

from onceflow.client_commands import (
    DEFAULT_BOOTSTRAP,
    CommandError,
    add_bootstrap_option,
    client_options,
    reporting_errors,
)

MECHANISM_CHOICES = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
PASSWORD_VARIABLE = "ONCEFLOW_USER_PASSWORD"


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user or change its password", description="add a user or change its password (for one mechanism)")
    add.add_argument("name")
    add.add_argument("--password", help=f"the password (or the environment variable {PASSWORD_VARIABLE})")
    add.add_argument("--mechanism", type=str.upper, choices=MECHANISM_CHOICES, default="SCRAM-SHA-256", help="which SASL mechanism it is for (default SCRAM-SHA-256)")
    add.add_argument("--iterations", type=int, default=4096, help="SCRAM/PBKDF2 iterations (4096..16384 for SCRAM; default 4096)")
    delete = actions.add_parser("delete", help="delete a user's credentials", description="delete a user's credentials (all, or one mechanism's)")
    delete.add_argument("name")
    delete.add_argument("--mechanism", type=str.upper, choices=MECHANISM_CHOICES, default=None, help="only this mechanism's credential (default: all)")
    listing = actions.add_parser("list", help="list users and their mechanisms", description="list users and their mechanisms")
    for action in (add, delete, listing):
        action.add_argument("--data-dir", default=None, metavar="DIR", help="change a stopped broker's data directory directly")
        add_bootstrap_option(action)


def run(args) -> int:
    return reporting_errors("users", args, lambda: _users(args, sys.stdout))


def _users(args, out) -> int:
    if args.data_dir and args.bootstrap_server != DEFAULT_BOOTSTRAP:
        raise CommandError("give either --data-dir (offline) or --bootstrap-server (over the wire), not both", code=2)
    if args.action == "add":
        password = args.password if args.password is not None else os.environ.get(PASSWORD_VARIABLE)
        if not password:
            raise CommandError(f"users add needs --password (or {PASSWORD_VARIABLE})", code=2)
        args.password = password
    if args.data_dir:
        return _offline(args, out)
    return _over_the_wire(args, out)


def _offline(args, out) -> int:
    from broker.security.credentials import (
        CredentialError,
        DataDirInUse,
        make,
        offline_store,
    )

    try:
        with offline_store(args.data_dir) as store:
            if args.action == "add":
                store.upsert(args.name, args.mechanism, make(args.mechanism, args.password, iterations=args.iterations))
                print(f"user {args.name}: {args.mechanism} credential stored in {args.data_dir}", file=out)
            elif args.action == "delete":
                if not store.delete(args.name, args.mechanism):
                    raise CommandError(f"user {args.name} has no {args.mechanism or 'credential'} in {args.data_dir}")
                print(f"user {args.name}: {args.mechanism or 'every'} credential deleted", file=out)
            else:
                for name, mechanisms in store.users().items():
                    described = [f"{m}(iterations={store.get(name, m).iterations})" for m in mechanisms]
                    print(f"{name}\t{','.join(described)}", file=out)
    except DataDirInUse as error:
        raise CommandError(str(error), code=1) from None
    except CredentialError as error:
        raise CommandError(str(error)) from None
    return 0


def _over_the_wire(args, out) -> int:
    from txn import Admin
    from txn.errors import KafkaError

    if getattr(args, "mechanism", None) == "PLAIN":
        raise CommandError("PLAIN users are managed offline (--data-dir): Kafka's API for users (KIP-554) covers SCRAM only", code=2)
    with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
        if args.action == "add":
            try:
                admin.upsert_user_scram_credential(args.name, args.password, mechanism=args.mechanism, iterations=args.iterations)
            except ValueError as error:
                raise CommandError(str(error)) from None
            print(f"user {args.name}: {args.mechanism} credential stored", file=out)
        elif args.action == "delete":
            mechanisms = [args.mechanism] if args.mechanism else None
            if mechanisms is None:
                try:
                    mechanisms = list(admin.describe_user_scram_credentials([args.name]).get(args.name, {}))
                except KafkaError as error:
                    raise CommandError(f"user {args.name}: {error}") from None
            for mechanism in mechanisms:
                admin.delete_user_scram_credential(args.name, mechanism)
            print(f"user {args.name}: {', '.join(mechanisms)} credential deleted", file=out)
        else:
            for name, mechanisms in sorted(admin.describe_user_scram_credentials().items()):
                described = [f"{m}(iterations={iterations})" for m, iterations in sorted(mechanisms.items())]
                print(f"{name}\t{','.join(described)}", file=out)
    return 0
