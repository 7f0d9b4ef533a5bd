"""A stateful exactly-once pipeline on onceflow's runner: per-account running
balances of a stream of payments.

    onceflow run examples/payments_pipeline.py          (settings from the environment, below)
    python examples/payments_pipeline.py --bootstrap 127.0.0.1:9092 --state-dir ./payments-state

Each payment (key: account, value: ``payment-id:account:amount``) becomes
one output record ``payment-id:account:balance-after``. The balances live in
the store ``balances``: a SQLite file per input partition under the state
directory, changelogged to ``payments-pipeline-balances-changelog``. The
runner writes the output, the store's changes and the input offsets in one
transaction, restores the store on start and on every rebalance, and rewinds
after any abort. Kill it at any moment, start as many copies as there are
partitions (each with its own state directory): the output holds each
payment once, with the right balance.

Environment for ``onceflow run``: ``PAYMENTS_BOOTSTRAP`` (127.0.0.1:9092),
``PAYMENTS_STATE_DIR`` (./payments-state), ``PAYMENTS_INPUT`` (payments),
``PAYMENTS_OUTPUT`` (balances), ``PAYMENTS_INSTANCE_ID`` (generated once and
kept in the state directory; the transactional id is
``payments-pipeline-{instance id}``).
"""

from __future__ import annotations

import argparse
import os
import sys

import streaming


def build_app(bootstrap: str, state_dir: str, *, input_topic: str = "payments", output_topic: str = "balances", application_id: str = "payments-pipeline", **options) -> streaming.App:
    # Static membership (the runner's default) lets a restarted instance take
    # its partitions back at once; a short session lets the others take over
    # quickly from one that died for good.
    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, **options}
    app = streaming.App(bootstrap, application_id, state_dir, **options)

    @app.processor(source=input_topic, sink=output_topic, stores=["balances"], key_format="str", value_format="str")
    def running_balance(record, ctx):
        payment_id, account, amount = record.value.split(":")
        balances = ctx.store("balances")
        balance = balances.get(account, 0) + int(amount)
        balances.put(account, balance)
        ctx.emit(account, f"{payment_id}:{account}:{balance}")

    return app


app = build_app(
    os.environ.get("PAYMENTS_BOOTSTRAP", "127.0.0.1:9092"),
    os.environ.get("PAYMENTS_STATE_DIR", "payments-state"),
    input_topic=os.environ.get("PAYMENTS_INPUT", "payments"),
    output_topic=os.environ.get("PAYMENTS_OUTPUT", "balances"),
    instance_id=os.environ.get("PAYMENTS_INSTANCE_ID") or None,
)


def main(argv=None) -> int:
    from streaming.cli import run as run_app_module  # the same exit codes and messages as `onceflow run`

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--state-dir", default="payments-state")
    parser.add_argument("--input", default="payments")
    parser.add_argument("--output", default="balances")
    parser.add_argument("--instance-id", default="", help="this instance's id (default: generated once, kept in the state directory)")
    parser.add_argument("--until-idle", type=float, default=None)
    args = parser.parse_args(argv)
    os.environ.update(PAYMENTS_BOOTSTRAP=args.bootstrap, PAYMENTS_STATE_DIR=args.state_dir, PAYMENTS_INPUT=args.input, PAYMENTS_OUTPUT=args.output, PAYMENTS_INSTANCE_ID=args.instance_id)
    return run_app_module(argparse.Namespace(path=os.path.abspath(__file__), app="app", until_idle=args.until_idle, progress_interval=5.0))


if __name__ == "__main__":
    sys.exit(main())
