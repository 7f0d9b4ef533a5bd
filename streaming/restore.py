"""The store shards an instance holds, and their restore from the changelogs.

``Shards`` opens a (store, partition) shard when its partition is assigned:
its SQLite file's contents, then the changelog (read_committed, by a
consumer of its own outside the group) from the file's offset to its stable
end, before the partition's first record is processed. It closes shards when
their partitions go, keeping a revoked shard in memory ("parked") until the
rebalance's assignment arrives: an eager rebalance revokes everything and
mostly gives it back, which then costs no reload.

A shard's SQLite file can never be trusted blindly: its offset is checked
against the changelog before use. Behind (the usual case after a crash
between the Kafka commit and the SQLite apply, or after another instance
owned the partition): catch up from the changelog. Ahead of the stable end,
or behind the log start (the topic was recreated, truncated, or the file came
from elsewhere): thrown away and rebuilt from the changelog alone.
Compaction keeps offsets, so a file behind a compacted changelog still
catches up correctly, with one limit Kafka Streams shares: a file that fell
behind by more than the topic's ``delete.retention.ms`` may miss a deletion
whose tombstone compaction has since dropped.

``restoring`` holds each shard being restored's (position, stable end) in
its changelog, which the metrics read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from streaming.app import App
from streaming.store import Store, StoreFile
from txn.admin import AsyncAdmin
from txn.consumer import AsyncConsumer
from txn.types import TopicPartition

log = logging.getLogger("streaming.runner")

RESTORE_CHUNK = 10_000  # changelog records applied to SQLite per transaction while restoring


class Shards:
    def __init__(self, app: App, admin: AsyncAdmin, restorer: AsyncConsumer, transaction_timeout_ms: int):
        self.app = app
        self.metrics = app.metrics
        self.admin = admin
        self.restorer = restorer
        self.transaction_timeout_ms = transaction_timeout_ms
        self.held: dict[tuple[str, int], tuple[Store, StoreFile]] = {}
        # Shards given up in the rebalance under way (their files closed), kept
        # in memory until its assignment.
        self.parked: dict[tuple[str, int], Store] = {}
        self.restoring: dict[tuple[str, int], tuple[int, int]] = {}

    def store(self, name: str, partition: int) -> Store:
        return self.held[(name, partition)][0]

    def file_of(self, store: Store) -> StoreFile | None:
        """The SQLite file of ``store`` if this shard is still held."""
        shard = self.held.get((store.name, store.partition))
        return shard[1] if shard is not None and shard[0] is store else None

    def path(self, name: str, partition: int) -> str:
        return os.path.join(self.app.state_dir, "stores", f"{name}-{partition}.sqlite")

    async def open(self, name: str, partition: int) -> None:
        file = StoreFile(self.path(name, partition), self.app.changelog_topic(name), partition)
        parked = self.parked.pop((name, partition), None)
        store = None
        if parked is not None:
            # Given up in this rebalance and given back: its memory is the
            # file's contents already (same offset), so only the changelog's
            # tail (another owner's writes meanwhile) is read.
            _nothing, next_offset = await file.open(load=False)
            if not file.discarded_reason and next_offset == parked.next_offset:
                store = parked
            else:
                await file.close()
        if store is None:
            contents, next_offset = await file.open()
            if file.discarded_reason:
                log.warning("store %s-%d: the SQLite file was %s; rebuilding it from the changelog", name, partition, file.discarded_reason)
                self.metrics.add("store_rebuilds")
            store = Store(name, partition, contents, next_offset)
        try:
            await self.catch_up(store, file)
        except BaseException:
            await file.close()
            raise
        self.held[(name, partition)] = (store, file)

    async def close(self, keys, *, park: bool = False) -> None:
        for key in keys:
            store, file = self.held.pop(key)
            store.discard_pending()
            await file.close()
            if park:
                self.parked[key] = store

    async def catch_up_all(self) -> None:
        for store, file in list(self.held.values()):
            await self.catch_up(store, file)

    async def _stable_end(self, tp: TopicPartition) -> int:
        """The changelog's end once every transaction that had written to it
        when we looked is decided (its last stable offset reaches that high
        watermark): a previous owner's commit may still be on its way here."""
        high = (await self.admin.list_offsets({tp: "latest"}, isolation_level="read_uncommitted"))[tp].offset
        deadline = time.monotonic() + 2 * self.transaction_timeout_ms / 1000 + 30
        while True:
            stable = (await self.restorer.end_offsets([tp]))[tp]
            if stable >= high or time.monotonic() > deadline:
                return stable
            await asyncio.sleep(0.1)

    async def catch_up(self, store: Store, file: StoreFile) -> None:
        """Bring a shard to the changelog's stable end (rebuilding it if its
        file cannot be a prefix of the changelog)."""
        tp = TopicPartition(self.app.changelog_topic(store.name), store.partition)
        start = (await self.restorer.beginning_offsets([tp]))[tp]
        end = await self._stable_end(tp)
        reason = None
        if store.next_offset > end:
            reason = f"ahead of the changelog (file at {store.next_offset}, changelog's stable end {end})"
        elif store.next_offset < start and (store.committed or store.next_offset > 0):
            reason = f"behind the changelog's start (file at {store.next_offset}, log start {start}): records it lacks are gone"
        if reason:
            log.warning("store %s-%d: %s; rebuilding from the changelog", store.name, store.partition, reason)
            self.metrics.add("store_rebuilds")
            store.reset(start)
            await file.clear(start)
        elif store.next_offset < start:
            store.next_offset = start
        if store.next_offset >= end:
            return
        began = time.monotonic()
        key = (store.name, store.partition)
        self.restoring[key] = (store.next_offset, end)
        try:
            restored, position = await self._restore(store, file, tp, end)
        finally:
            self.restoring.pop(key, None)
        self.metrics.add("restored_records", restored)
        log.info("store %s-%d: restored %d changelog records up to offset %d in %.2f s", store.name, store.partition, restored, position, time.monotonic() - began)

    async def _restore(self, store: Store, file: StoreFile, tp: TopicPartition, end: int) -> tuple[int, int]:
        """Apply the changelog from the shard's offset to ``end``; (records restored, offset reached)."""
        restorer = self.restorer
        restorer.assign([tp])
        restorer.seek(tp, store.next_offset)
        changes: dict = {}
        restored = 0
        position = store.next_offset
        while position < end:
            # A short wait: at the tail there may be nothing visible left (only
            # a COMMIT marker), and the fetch would wait its whole timeout.
            for record in await restorer.poll(0.05):
                if record.key is not None:
                    changes[record.key] = record.value
                    restored += 1
            position = await restorer.position(tp)
            self.restoring[(store.name, store.partition)] = (position, end)
            if len(changes) >= RESTORE_CHUNK:
                store.apply_committed(changes, position)
                await file.apply(changes, position)
                changes = {}
        if position != store.next_offset:
            store.apply_committed(changes, position)
            await file.apply(changes, position)
        restorer.assign([])
        return restored, position
