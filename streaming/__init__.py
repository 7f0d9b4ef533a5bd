"""Stream processing on top of ``txn``: the processor API and an exactly-once
consume-transform-produce runner with SQLite state stores.

    import streaming

    app = streaming.App(bootstrap_servers="127.0.0.1:9092", application_id="balances", state_dir="./state")

    @app.processor(source="payments", sink="balances", stores=["balances"], key_format="str", value_format="json")
    def running_balance(record, ctx):
        store = ctx.store("balances")
        balance = store.get(record.key, 0) + record.value["amount"]
        store.put(record.key, balance)
        ctx.emit(record.key, {"account": record.key, "balance": balance})

    app.run()   # until SIGTERM/SIGINT; app.run(until_idle=5.0) for batch-like runs

What is here:

- ``streaming.app``: ``App``, ``Record``, the processor's ``Context``
  (``ctx``), the processor and timer registry (``App.schedule``), instance
  identity kept in ``state_dir``.
- ``streaming.runner``: the loop (one consumer-group member and one
  transactional producer per instance; poll, rebalance, rewind), its
  lifecycle as one transition table (``streaming.lifecycle``), and its
  pieces: ``streaming.task`` (a record through the processors, timers, dead
  letters; no I/O), ``streaming.transaction`` (output, changelog and offsets
  in one transaction, and its outcome), ``streaming.restore`` (store shards
  and their restore from the changelogs).
- ``streaming.testing``: ``TestDriver``, the app without a broker.
- ``streaming.store``: ``Store`` (what ``ctx.store(name)`` returns; its key
  encoding and order) and the SQLite file of each (store, partition) shard.
- ``streaming.serde``: the ``"bytes"``, ``"str"``, ``"json"`` formats,
  ``resolve(fmt)`` and the internal topics' typed JSON format.
- ``streaming.windows``, ``streaming.durations``: event-time windows
  (tumbling, hopping, session); durations as timedelta or milliseconds.
- ``streaming.cli``: ``onceflow run path/to/app.py``.
- ``App.stream(...)``: the dataflow layer (``streaming.dataflow``), compiled
  to ordinary processors of the same runner; ``streaming.spark``: the Spark
  Structured Streaming source and exactly-once sink (importing it does not
  import pyspark).
"""

from streaming.app import App, Context, Metrics, Record
from streaming.errors import InstanceFencedError, ProcessingError, StateDirInUseError, StreamingError

from streaming.serde import Serde, SerializationError, resolve
from streaming.store import Store, StoreError

__all__ = [
    "App",
    "Context",
    "InstanceFencedError",
    "Metrics",
    "ProcessingError",
    "Record",
    "Serde",
    "SerializationError",
    "StateDirInUseError",
    "Store",
    "StoreError",
    "StreamingError",
    "resolve",
]
