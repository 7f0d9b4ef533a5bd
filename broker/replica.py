"""Topics and their partition logs: create, delete, grow, look up, and wait for data.

``ReplicaManager`` is the broker's one owner of open ``storage`` logs (the name
is Kafka's; with one broker every partition has one replica, the leader). It
keeps the topic registry (``broker.metadata``) and the partition directories
in step, applies per-topic configuration over the broker defaults, and lets a
long-polling Fetch wait until any of its partitions grows.

Partitions are opened when first used (``get_log``), not at start, so that
start, stop and topic creation cost nothing per idle partition:

- a clean stop writes ``.clean_shutdown`` in the data directory once every
  open log has closed cleanly (each then carries its own mark, see
  ``storage.log``); the next start removes it and opens nothing but what
  the coordinators load;
- after any other stop, start opens (and so recovers) every partition whose
  directory lacks its mark and holds files: exactly those changed since
  they were last whole. Recovery happens before the broker serves, bounded
  by what was written since, and never on a request's path; the rest are
  whole and open in a few file reads when first asked for. (Were a mark to
  go missing anyway, the lazy open recovers that partition then.)
- creating a topic writes the registry once (atomically and durably: the
  topic exists whole or not at all) and then makes the partition
  directories with one fsync of the data directory; a partition directory
  lost to a crash before that is made again when the partition is opened;
- a partition whose open fails (a disk error, too many open files, a
  damaged file) stays closed and ``get_log`` raises
  ``PartitionUnavailableError``: each handler answers that partition
  KAFKA_STORAGE_ERROR and serves the others, and the next request tries
  the open again. The same holds for one whose recovery at start fails.

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
from protocol.names import InvalidTopicError, validate_topic_name
from storage.durable import fsync_directory, replace_file
from storage.names import parse_partition_dir, partition_dir_name
from storage.recovery import log_summary

log = logging.getLogger(__name__)

# In the data directory after a clean stop (Kafka's .kafka_cleanshutdown).
CLEAN_STOP_FILE = ".clean_shutdown"
# In the data directory: the kernel's boot id when this data was last served.
BOOT_ID_FILE = ".boot_id"
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id() -> str | None:
    """The running kernel's boot id (Linux: new at every boot), or None where
    there is none to read."""
    try:
        with open(KERNEL_BOOT_ID, encoding="ascii") as file:
            return file.read().strip() or None
    except OSError:
        return None


class TopicExistsError(Exception):
    pass


class UnknownTopicError(Exception):
    pass


class InvalidPartitionsError(ValueError):
    pass


class InternalTopicError(ValueError):
    """A change to ``__consumer_offsets`` or ``__transaction_state`` that
    only the coordinators may make (they map an id to its partition by hash
    modulo the partition count, and load their state from these logs)."""


class InvalidConfigError(ValueError):
    pass


class PartitionUnavailableError(Exception):
    """A registered partition whose log could not be opened: a disk error,
    too many open files, a damaged file. Requests for it get Kafka's
    KAFKA_STORAGE_ERROR (retriable: a client refreshes its metadata and
    tries again) while the broker serves every other partition; nothing is
    kept, so the next request for it tries the open again."""

    error_name = "KAFKA_STORAGE_ERROR"


class ReplicaManager:
    def __init__(self, data_dir: str, log_defaults: dict, *, open_log, reconfigure_log, validate_config, needs_recovery, holds_data=lambda path: True,
                 crash_point=lambda name: None, boot_id: str | None = None):
        """``open_log(path, properties) -> log``, ``reconfigure_log(log,
        properties)`` (an open log takes a topic's altered settings),
        ``validate_config(properties)``,
        ``needs_recovery(path) -> bool`` (the directory was changed since it
        was last whole) and ``holds_data(path) -> bool`` (it may hold records)
        come from storage; they are injected so this class stays about
        topics. ``crash_point`` is the fault harness's seam, and so is
        ``boot_id`` (the boot this start runs in; None: the kernel's)."""
        self.data_dir = data_dir
        self.store = MetadataStore(data_dir)
        self.log_defaults = dict(log_defaults)
        self._open_log = open_log
        self._reconfigure_log = reconfigure_log
        self.validate_config = validate_config
        self._needs_recovery = needs_recovery
        self._holds_data = holds_data
        self.crash_point = crash_point
        self.topics: dict[str, TopicInfo] = {}
        self.topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self.logs: dict[tuple[str, int], object] = {}  # the open ones
        self.recovered_at_start: list[tuple[str, int]] = []
        # Whether this start followed a clean stop (``load``): after an
        # unclean one, bytes acknowledged before their fsync may be gone.
        self.stopped_clean = True
        # Whether the last process to serve this data ran in this same boot
        # of the kernel (``load``): then an unclean stop was the process's
        # alone (a SIGKILL, an OOM kill), and every byte it wrote, synced or
        # not, is still in the page cache, so nothing acknowledged is gone.
        # A new boot (a power cut, an OS crash) or an unknown one: False.
        self.same_boot = False
        self._boot_id = boot_id if boot_id is not None else kernel_boot_id()
        self._created_empty: set[tuple[str, int]] = set()
        self._waiters: dict[tuple[str, int], set[asyncio.Future]] = {}
        self._failed_opens: set[tuple[str, int]] = set()  # whose last open failed (logged in full once)
        self._deleting: set[str] = set()  # topics whose delete is closing their logs

    # -- start and stop -----------------------------------------------------

    def load(self) -> None:
        """Read the registry, drop leftovers of interrupted deletes and, unless
        the broker stopped cleanly, open (recovering) every partition changed
        since it was last whole. The others open when first used."""
        self.topics = self.store.load_topics()
        self.topics_by_id = {info.topic_id: info for info in self.topics.values()}
        stopped_clean = self.stopped_clean = os.path.exists(self._clean_stop_path)
        if stopped_clean:
            # From now on a crash is unclean, whatever the partitions say.
            os.remove(self._clean_stop_path)
            fsync_directory(self.data_dir)
        self._note_boot()
        for name in self.topics:
            validate_topic_name(name)  # once per topic: a registry edited by hand names no path outside
        owned = {partition_dir_name(info.name, partition) for info in self.topics.values() for partition in range(info.partitions)}
        with os.scandir(self.data_dir) as entries:
            for entry in entries:
                if entry.name in owned or entry.name.startswith("__cluster_metadata") or not entry.is_dir(follow_symlinks=False):
                    continue
                if parse_partition_dir(entry.name) is not None or entry.name.endswith("-delete"):
                    log.warning("removing %s: no registered topic owns it (an interrupted delete)", entry.path)
                    shutil.rmtree(entry.path, ignore_errors=True)
        self.recovered_at_start = []
        if not stopped_clean:
            for info in self.topics.values():
                for partition in range(info.partitions):
                    if self._needs_recovery(self._partition_path(info.name, partition)):
                        try:
                            self._open_partition(info, partition)
                        except Exception:
                            # One damaged partition does not keep the broker
                            # down: it stays closed, and requests for it get
                            # KAFKA_STORAGE_ERROR (get_log tries again).
                            log.exception("recovering partition %s-%d failed; it stays offline", info.name, partition)
                            self._failed_opens.add((info.name, partition))
                            continue
                        self.recovered_at_start.append((info.name, partition))
        log_summary(self.logs[key] for key in self.recovered_at_start)

    def _note_boot(self) -> None:
        """Compare the boot id recorded by the last process that served this
        data with this one's (``same_boot``), then record this one, durably,
        before anything is served: a power cut from now on leaves this id
        behind for a start in another boot to see."""
        path = os.path.join(self.data_dir, BOOT_ID_FILE)
        try:
            with open(path, encoding="ascii") as file:
                recorded = file.read().strip()
        except OSError:
            recorded = None
        self.same_boot = self._boot_id is not None and recorded == self._boot_id
        if self._boot_id is not None and recorded != self._boot_id:
            try:
                replace_file(path, self._boot_id.encode("ascii"))
            except OSError as error:
                # Safe to go on: a later start then finds the older boot's id
                # and treats its stop as a machine's (the cautious reading).
                log.warning("could not record the boot id in %s: %s", path, error)

    @property
    def _clean_stop_path(self) -> str:
        return os.path.join(self.data_dir, CLEAN_STOP_FILE)

    async def aclose(self) -> None:
        """Close every open log under the broker's loop: each waits for its
        flusher's fsync in flight before its files close (``PartitionLog.aclose``).
        If all closed cleanly, mark the stop clean."""
        clean = True
        for partition_log in self.logs.values():
            try:
                await partition_log.aclose()
            except Exception:
                log.exception("closing a partition log failed")
                clean = False
            clean = clean and getattr(partition_log, "failed", None) is None
        self.logs.clear()
        self._mark_clean_stop(clean)

    def close(self) -> None:
        clean = True
        for partition_log in self.logs.values():
            try:
                partition_log.close()
            except Exception:
                log.exception("closing a partition log failed")
                clean = False
            clean = clean and getattr(partition_log, "failed", None) is None
        self.logs.clear()
        self._mark_clean_stop(clean)

    def _mark_clean_stop(self, clean: bool) -> None:
        """Every partition directory now carries its own mark or holds
        nothing to recover; say so, so the next start need not look. No
        fsync: if a machine crash loses this file the next start looks."""
        if not clean:
            return
        try:
            with open(self._clean_stop_path, "wb"):
                pass
        except OSError as error:
            log.warning("could not mark the stop clean (the next start checks every partition): %s", error)

    # -- topics -------------------------------------------------------------

    def effective_config(self, info: TopicInfo) -> dict:
        properties = dict(self.log_defaults)
        properties.update(info.config)
        return properties

    def create_topic(self, name: str, partitions: int, config: dict | None = None, *, internal: bool = False, validate_only: bool = False) -> TopicInfo:
        (created,) = self.create_topics([(name, partitions, config)], internal=internal, validate_only=validate_only)
        if isinstance(created, Exception):
            raise created
        return created

    def create_topics(self, specs, *, internal: bool = False, validate_only: bool = False) -> list:
        """Create several topics (``(name, partitions, config)`` each) with one
        registry write and one fsync of the data directory for all. Returns,
        per spec, its TopicInfo or the error that refused it (InvalidTopicError,
        TopicExistsError, InvalidPartitionsError, InvalidConfigError)."""
        results: list = []
        accepted: dict[str, TopicInfo] = {}
        for name, partitions, config in specs:
            try:
                info = self._new_topic(name, partitions, config, internal=internal)
                if name in accepted:
                    raise TopicExistsError(f"topic '{name}' is named twice")
            except (InvalidTopicError, TopicExistsError, InvalidPartitionsError, InvalidConfigError) as error:
                results.append(error)
                continue
            accepted[name] = info
            results.append(info)
        if validate_only or not accepted:
            return results
        topics = {**self.topics, **accepted}
        self.crash_point("replicas.topics_registering")
        self.store.save_topics(topics)  # the topics exist whole from here; their directories follow
        self.topics = topics
        for info in accepted.values():
            self.topics_by_id[info.topic_id] = info
        self.crash_point("replicas.topic_registered")
        self._make_partition_dirs([(info.name, partition) for info in accepted.values() for partition in range(info.partitions)])
        for info in accepted.values():
            log.info("created topic %s with %d partitions", info.name, info.partitions)
        return results

    def _new_topic(self, name: str, partitions: int, config: dict | None, *, internal: bool) -> TopicInfo:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicExistsError(f"topic '{name}' already exists")
        if name in self._deleting:
            raise TopicExistsError(f"topic '{name}' is marked for deletion")
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, not {partitions}")
        config = {str(k): str(v) for k, v in (config or {}).items()}
        try:
            self.validate_config({**self.log_defaults, **config})
        except ValueError as error:
            raise InvalidConfigError(str(error)) from None
        return TopicInfo(name=name, topic_id=uuid.uuid4(), partitions=partitions, config=config, internal=internal)

    def _make_partition_dirs(self, partitions: list[tuple[str, int]]) -> None:
        """Empty directories for new partitions, made durable by one fsync of
        the data directory (their logs open when first used). A directory
        already there is a leftover no registered partition owned (a delete
        interrupted before its files went): it goes first."""
        self._created_empty.update(partitions)
        for name, partition in partitions:
            path = self._partition_path(name, partition)
            try:
                os.mkdir(path)
            except FileExistsError:
                log.warning("removing %s: left over from an earlier topic of the same name", path)
                shutil.rmtree(path)
                os.mkdir(path)
        fsync_directory(self.data_dir)

    async def delete_topic(self, name: str) -> TopicInfo:
        """Unregister the topic, then close its open logs and remove its
        directories. A log closes with ``aclose``, which first waits out a
        group-commit round fsyncing its files on a worker thread (closing
        them under it would fail that fsync, or let the thread fsync a
        descriptor reused by another file). Meanwhile requests for the
        topic find it unknown and a CreateTopics of the same name is refused
        (TopicExistsError: Kafka's "marked for deletion")."""
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        if info.internal:
            raise InternalTopicError(f"cannot delete internal topic {name}: the coordinators keep their state in it")
        topics = dict(self.topics)
        del topics[name]
        self.store.save_topics(topics)  # unregistered first: leftovers are swept at start
        self.topics = topics
        self.topics_by_id.pop(info.topic_id, None)
        closing = [(partition, self.logs.pop((name, partition), None)) for partition in range(info.partitions)]
        for partition in range(info.partitions):
            self._failed_opens.discard((name, partition))
            self._created_empty.discard((name, partition))
            self._wake((name, partition))
        self._deleting.add(name)
        try:
            for partition, partition_log in closing:
                if partition_log is not None:
                    try:
                        await partition_log.aclose()
                    except Exception:
                        # Its files go anyway: the topic is gone from the registry.
                        log.exception("closing %s-%d for its topic's delete failed", name, partition)
                shutil.rmtree(self._partition_path(name, partition), ignore_errors=True)
        except BaseException:
            # Cancelled (the broker stops): the rest close now, synchronously;
            # a descriptor a worker still fsyncs stays open until it returns
            # (LogSegment.pin_for_fsync). Their directories go at the next start.
            for _partition, partition_log in closing:
                if partition_log is not None and not partition_log.closed:
                    partition_log.close()
            raise
        finally:
            self._deleting.discard(name)
        log.info("deleted topic %s", name)
        return info

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        if info.internal:
            raise InternalTopicError(f"cannot change the partition count of internal topic {name}: a coordinator finds an id's partition by hash modulo the count")
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
        self._make_partition_dirs([(name, partition) for partition in range(info.partitions, count)])
        return grown

    def alter_topic_config(self, name: str, config: dict) -> TopicInfo:
        info = self.topics.get(name)
        if info is None:
            raise UnknownTopicError(f"topic '{name}' does not exist")
        config = {str(k): str(v) for k, v in config.items()}
        try:
            self.validate_config({**self.log_defaults, **config})
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
            if partition_log is not None:
                self._reconfigure_log(partition_log, self.effective_config(changed))
        return changed

    # -- partitions ---------------------------------------------------------

    def get_log(self, topic: str, partition: int):
        """The partition's log, opened now if this is its first use since
        start; None if the topic or partition does not exist. Raises
        ``PartitionUnavailableError`` if the open fails (every handler
        answers that partition with its error code)."""
        partition_log = self.logs.get((topic, partition))
        if partition_log is not None:
            return partition_log
        info = self.topics.get(topic)
        if info is None or not isinstance(partition, int) or not 0 <= partition < info.partitions:
            return None
        try:
            return self._open_partition(info, partition)
        except Exception as error:
            # Nothing is kept: the next request tries again (a full fd
            # table or a passing disk error may clear). The traceback is
            # logged once per partition until an open succeeds.
            key = (topic, partition)
            if key in self._failed_opens:
                log.error("opening partition %s-%d failed again: %s", topic, partition, error)
            else:
                log.exception("opening partition %s-%d failed", topic, partition)
            self._failed_opens.add(key)
            raise PartitionUnavailableError(f"partition {topic}-{partition} could not be opened: {error}") from error

    def has_partition(self, topic: str, partition: int) -> bool:
        """Whether the partition is registered (without opening its log)."""
        info = self.topics.get(topic)
        return info is not None and isinstance(partition, int) and 0 <= partition < info.partitions

    def logs_to_replay(self, topic: str) -> list[tuple[int, object]]:
        """(partition, log) of ``topic``'s partitions that may hold records, opened
        (so recovered if need be): what a coordinator replays at start. A
        partition that is not open and whose directory holds no data
        (``holds_data``: every segment empty, no interrupted write) would
        replay nothing and stays closed until first used; most of the 50 +
        50 internal partitions never hold a record, and opening them was
        most of a start's own work after a clean stop."""
        info = self.topics[topic]
        found = []
        for partition in range(info.partitions):
            if (topic, partition) in self.logs or self._holds_data(self._partition_path(topic, partition)):
                found.append((partition, self.get_log(topic, partition)))
        return found

    def is_open(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.logs

    def created_unopened(self) -> list[tuple[str, int]]:
        """Partitions created since start and not opened since: empty, so
        their offsets (all 0) are known without opening them."""
        return [key for key in self._created_empty if key not in self.logs and key[0] in self.topics and key[1] < self.topics[key[0]].partitions]

    def partitions(self) -> list[tuple[str, int]]:
        """Every registered partition, open or not."""
        return [(info.name, partition) for info in self.topics.values() for partition in range(info.partitions)]

    def _partition_path(self, topic: str, partition: int) -> str:
        return os.path.join(self.data_dir, partition_dir_name(topic, partition))

    def _open_partition(self, info: TopicInfo, partition: int):
        path = self._partition_path(info.name, partition)
        if not os.path.isdir(path):
            # Lost to a crash between the registry write and the directories
            # (or removed by hand): made again, durably, before data goes in.
            os.makedirs(path, exist_ok=True)
            fsync_directory(self.data_dir)
        partition_log = self.logs[(info.name, partition)] = self._open_log(path, self.effective_config(info))
        self._failed_opens.discard((info.name, partition))
        return partition_log

    def needs_housekeeping(self, topic: str, partition: int) -> bool:
        """Whether retention or compaction could have anything to do in a
        partition that is not open: only whole segments before the active
        one are ever deleted or cleaned, so one with a single segment has
        nothing (and stays closed)."""
        path = self._partition_path(topic, partition)
        try:
            with os.scandir(path) as entries:
                return sum(1 for entry in entries if entry.name.endswith(".log")) > 1
        except FileNotFoundError:
            return False

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


__all__ = [
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "PartitionUnavailableError",
    "ReplicaManager",
    "TopicExistsError",
    "UnknownTopicError",
]
