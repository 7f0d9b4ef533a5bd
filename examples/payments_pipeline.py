"""A stateful exactly-once pipeline on onceflow's runner: per-account running
balances of a stream of payments.

    onceflow run examples/payments_pipeline.py --bootstrap-servers 127.0.0.1:9092 --state-dir ./payments-state
    python examples/payments_pipeline.py --bootstrap-servers 127.0.0.1:9092 --state-dir ./payments-state

Each payment (key: account, value: ``payment-id:account:amount``) becomes
one output record ``payment-id:account:balance-after``. The balances live in
the store ``balances``: a SQLite file per input partition under the state
directory, changelogged to ``payments-pipeline-balances-changelog``. The
runner writes the output, the store's changes and the input offsets in one
transaction, restores the store on start and on every rebalance, and rewinds
after any abort. Kill it at any moment, start as many copies as there are
partitions (each with its own state directory): the output holds each
payment once, with the right balance.

Where it runs: ``--bootstrap-servers``, ``--state-dir`` and
``--instance-id`` (either command), else ``ONCEFLOW_BOOTSTRAP_SERVERS`` and
``ONCEFLOW_STATE_DIR`` (127.0.0.1:9092, ./state/payments-pipeline); the
instance id is generated once and kept in the state directory, and the
transactional id is ``payments-pipeline-{instance id}``.
"""

from __future__ import annotations

import streaming


def build_app(bootstrap: str | None = None, state_dir: str | None = None, *, input_topic: str = "payments", output_topic: str = "balances", application_id: str = "payments-pipeline", **options) -> streaming.App:
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


# Where it runs: onceflow run's --bootstrap-servers and --state-dir, else
# ONCEFLOW_BOOTSTRAP_SERVERS and ONCEFLOW_STATE_DIR (streaming.App).
app = build_app()


if __name__ == "__main__":
    from streaming.cli import main_of  # onceflow run's options, statuses and messages, for this app

    raise SystemExit(main_of(app))
