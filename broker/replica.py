"""Topics and their partition logs: create, delete, grow, look up, and wait for data.

``ReplicaManager`` is the broker's one owner of open ``storage`` logs (the name
is Kafka's; with one broker every partition has one replica, the leader). It
keeps the topic registry (``broker.metadata``) and the partition directories
in step, applies per-topic configuration over the broker defaults, and lets a
long-polling Fetch wait until any of its partitions grows.

Everything here runs on the broker's event loop; only fsyncs leave it (inside
storage's group committer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid

from broker.metadata import MetadataStore, TopicInfo
from storage.names import InvalidTopicError, partition_dir_name, validate_topic_name
from storage.recovery import log_summary

log = logging.getLogger(__name__)


class TopicExistsError(Exception):
    pass


class UnknownTopicError(Exception):
    pass


class InvalidPartitionsError(ValueError):
    pass


class InvalidConfigError(ValueError):
    pass


class ReplicaManager:
    def __init__(self, data_dir: str, log_defaults: dict, *, open_log, validate_config):
        """``open_log(path, properties) -> log`` and ``validate_config(properties)``
        come from storage; they are injected so this class stays about topics."""
        self.data_dir = data_dir
        self.store = MetadataStore(data_dir)
        self.log_defaults = dict(log_defaults)
        self._open_log = open_log
        self._validate_config = validate_config
        self.topics: dict[str, TopicInfo] = {}
        self.topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self.logs: dict[tuple[str, int], object] = {}
        self._waiters: dict[tuple[str, int], set[asyncio.Future]] = {}

    # -- start and stop -----------------------------------------------------

    def load(self) -> None:
        """Open every registered partition (running crash recovery) and drop leftovers."""
        self.topics = self.store.load_topics()
        self.topics_by_id = {info.topic_id: info for info in self.topics.values()}
        owned = set()
        for info in self.topics.values():
            for partition in range(info.partitions):
                owned.add(partition_dir_name(info.name, partition))
                self._open_partition(info, partition)
        for entry in os.listdir(self.data_dir):
            path = os.path.join(self.data_dir, entry)
            if entry in owned or not os.path.isdir(path) or entry.startswith("__cluster_metadata"):
                continue
            if _looks_like_partition_dir(entry) or entry.endswith("-delete"):
                log.warning("removing %s: no registered topic owns it (an interrupted delete)", path)
                shutil.rmtree(path, ignore_errors=True)
        log_summary(self.logs.values())

    async def aclose(self) -> None:
        """Close every log under the broker's loop: each waits for its
        flusher's fsync in flight before its files close (``PartitionLog.aclose``)."""
        for partition_log in self.logs.values():
            try:
                await partition_log.aclose()
            except Exception:
                log.exception("closing a partition log failed")
        self.logs.clear()

    def close(self) -> None:
        for partition_log in self.logs.values():
            try:
                partition_log.close()
            except Exception:
                log.exception("closing a partition log failed")
        self.logs.clear()

    # -- topics -------------------------------------------------------------

    def effective_config(self, info: TopicInfo) -> dict:
        properties = dict(self.log_defaults)
        properties.update(info.config)
        return properties

    def create_topic(self, name: str, partitions: int, config: dict | None = None, *, internal: bool = False, validate_only: bool = False) -> TopicInfo:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicExistsError(f"topic '{name}' already exists")
        if partitions < 1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, not {partitions}")
        config = {str(k): str(v) for k, v in (config or {}).items()}
        try:
            self._validate_config({**self.log_defaults, **config})
        except ValueError as error:
            raise InvalidConfigError(str(error)) from None
        info = TopicInfo(name=name, topic_id=uuid.uuid4(), partitions=partitions, config=config, internal=internal)
        if validate_only:
            return info
        topics = dict(self.topics)
        topics[name] = info
        self.store.save_topics(topics)  # registered first: a crash leaves a topic with empty partitions
        self.topics = topics
        self.topics_by_id[info.topic_id] = info
        for partition in range(partitions):
            self._open_partition(info, partition)
        log.info("created topic %s with %d partitions", name, partitions)
        return info

    def delete_topic(self, name: str) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        topics = dict(self.topics)
        del topics[name]
        self.store.save_topics(topics)  # unregistered first: leftovers are swept at start
        self.topics = topics
        self.topics_by_id.pop(info.topic_id, None)
        for partition in range(info.partitions):
            partition_log = self.logs.pop((name, partition), None)
            if partition_log is not None:
                partition_log.close()
            path = os.path.join(self.data_dir, partition_dir_name(name, partition))
            shutil.rmtree(path, ignore_errors=True)
            self._wake((name, partition))
        log.info("deleted topic %s", name)
        return info

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        if count <= info.partitions:
            raise InvalidPartitionsError(
                f"topic '{name}' has {info.partitions} partitions; the new count must be larger, not {count}"
            )
        grown = TopicInfo(name=name, topic_id=info.topic_id, partitions=count, config=info.config, internal=info.internal)
        if validate_only:
            return grown
        topics = dict(self.topics)
        topics[name] = grown
        self.store.save_topics(topics)
        self.topics = topics
        self.topics_by_id[grown.topic_id] = grown
        for partition in range(info.partitions, count):
            self._open_partition(grown, partition)
        return grown

    def alter_topic_config(self, name: str, config: dict) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        config = {str(k): str(v) for k, v in config.items()}
        try:
            self._validate_config({**self.log_defaults, **config})
        except ValueError as error:
            raise InvalidConfigError(str(error)) from None
        changed = TopicInfo(name=name, topic_id=info.topic_id, partitions=info.partitions, config=config, internal=info.internal)
        topics = dict(self.topics)
        topics[name] = changed
        self.store.save_topics(topics)
        self.topics = topics
        self.topics_by_id[changed.topic_id] = changed
        for partition in range(info.partitions):
            partition_log = self.logs.get((name, partition))
            if partition_log is not None and hasattr(partition_log, "update_config"):
                partition_log.update_config(self.effective_config(changed))
        return changed

    # -- partitions ---------------------------------------------------------

    def get_log(self, topic: str, partition: int):
        return self.logs.get((topic, partition))

    def _open_partition(self, info: TopicInfo, partition: int) -> None:
        path = os.path.join(self.data_dir, partition_dir_name(info.name, partition))
        self.logs[(info.name, partition)] = self._open_log(path, self.effective_config(info))

    # -- waiting for data (Fetch long-poll) -----------------------------------

    def notify_appended(self, topic: str, partition: int) -> None:
        self._wake((topic, partition))

    def _wake(self, key) -> None:
        waiters = self._waiters.pop(key, None)
        if waiters:
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def wait_for_data(self, keys: list[tuple[str, int]], timeout: float) -> None:
        """Return when any of ``keys`` is appended to, or after ``timeout`` seconds."""
        if timeout <= 0 or not keys:
            return
        future = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(future)
                    if not waiters:
                        del self._waiters[key]


def _looks_like_partition_dir(entry: str) -> bool:
    topic, _, partition = entry.rpartition("-")
    return bool(topic) and partition.isdigit()


__all__ = [
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "ReplicaManager",
    "TopicExistsError",
    "UnknownTopicError",
]
