"""The apps the runner benchmark runs, one process per instance: the same two
apps written for onceflow's runner and for Quix Streams 3, both exactly once.

    python -m benchmarks.runner_apps {onceflow|quix} {map|balances|join} --bootstrap H:P \\
        --input payments --output out --group G --state-dir DIR [--table accounts] [--commit-interval-ms 100]

Input: payments, key the account (str), value JSON ``{"id", "account",
"amount", "sent"}`` (``sent``: the producer's clock, for latency).

- ``map`` (stateless): each payment becomes ``{"id", "account", "cents",
  "sent"}``. onceflow: the dataflow layer (``app.stream(...).map(...).to(...)``).
- ``balances`` (stateful): a running balance per account in a state store
  (changelogged), each payment becoming ``{"id", "account", "balance",
  "sent"}``. onceflow: the processor API, as in the issue's example.
- ``join`` (a stream-table join): each payment joined with its account's
  record in the ``--table`` topic (key: account; value ``{"region"}``),
  becoming ``{"id", "account", "region", "sent"}``. onceflow: ``app.table``
  and ``stream.join`` (timestamp-ordered across the two topics); Quix:
  ``join_asof`` (the latest table record at or before the payment's
  timestamp), the nearest it has.

Both frameworks commit every ``--commit-interval-ms`` (output, state
changelog and input offsets in one Kafka transaction); SIGTERM stops either
cleanly.
"""

from __future__ import annotations

import argparse
import sys


def to_cents(payment: dict) -> dict:
    return {"id": payment["id"], "account": payment["account"], "cents": payment["amount"] * 100, "sent": payment["sent"]}


def with_region(payment: dict, account: dict) -> dict:
    return {"id": payment["id"], "account": payment["account"], "region": account["region"], "sent": payment["sent"]}


def run_onceflow(args) -> None:
    import streaming

    app = streaming.App(bootstrap_servers=args.bootstrap, application_id=args.group, state_dir=args.state_dir, commit_interval_ms=args.commit_interval_ms)
    if args.app == "map":
        app.stream(args.input, key_format="str", value_format="json").map(to_cents).to(args.output)
    elif args.app == "join":
        accounts = app.table(args.table, key_format="str", value_format="json")
        app.stream(args.input, key_format="str", value_format="json").join(accounts, with_region).to(args.output)
    else:
        @app.processor(source=args.input, sink=args.output, stores=["balances"], key_format="str", value_format="json")
        def running_balance(record, ctx):
            store = ctx.store("balances")
            balance = store.get(record.key, 0) + record.value["amount"]
            store.put(record.key, balance)
            payment = record.value
            ctx.emit(record.key, {"id": payment["id"], "account": record.key, "balance": balance, "sent": payment["sent"]})
    app.run()


def run_quix(args) -> None:
    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest", processing_guarantee="exactly-once",
        commit_interval=args.commit_interval_ms / 1000, state_dir=args.state_dir, loglevel="WARNING",
    )
    source = app.topic(args.input, key_deserializer="str", value_deserializer="json")
    sink = app.topic(args.output, key_serializer="str", value_serializer="json")
    frame = app.dataframe(source)
    if args.app == "map":
        frame = frame.apply(to_cents)
    elif args.app == "join":
        accounts = app.dataframe(app.topic(args.table, key_deserializer="str", value_deserializer="json"))
        frame = frame.join_asof(accounts, how="inner", on_merge=with_region)
    else:
        def running_balance(payment, state):
            balance = state.get("balance", 0) + payment["amount"]
            state.set("balance", balance)
            return {"id": payment["id"], "account": payment["account"], "balance": balance, "sent": payment["sent"]}

        frame = frame.apply(running_balance, stateful=True)
    frame.to_topic(sink)
    app.run()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=["onceflow", "quix"])
    parser.add_argument("app", choices=["map", "balances", "join"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--table", help="the table topic of the join app")
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    args = parser.parse_args(argv)
    (run_onceflow if args.framework == "onceflow" else run_quix)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
