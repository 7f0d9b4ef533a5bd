"""The broker process's composition: data directory, logs, handlers, listener.

``Broker`` wires the rooms together and owns start-up and shutdown order:

1. lock the data directory (one broker per directory) and check its identity;
2. read the topic registry and recover the partition logs changed since
   they were last whole (after a clean stop, none); the others open when
   first used (``broker.replica``);
3. serve the listeners (one ``KafkaServer`` each, sharing one connection
   limiter and the credential store); only now is the broker "ready"
   (``start()`` returns). They are bound and listening from before step 2:
   a client connecting while the broker recovers is connected at once and
   its requests wait to be read until ready, as on Kafka's brokers (their
   acceptors bind at start-up, their processors read once the broker is
   up), instead of being refused: a refused librdkafka client doubles its
   reconnect back-off and came back seconds after the broker was ready;

and on ``stop()`` the reverse: stop the background loops, stop accepting,
close connections, flush and close the logs (which writes their
clean-shutdown markers), release the lock.

The background loops (housekeeping, group timers, offset retention,
transaction timers) are children of the broker's ``asyncio.TaskGroup``,
entered when the broker is ready and left when it stops: none outlives the
broker, and one that crashes cancels the task that started the broker (so
the process stops and says why) instead of dying unseen.

``EmbeddedBroker`` runs the same broker on its own thread and event loop on an
ephemeral port, for tests, examples and the demo.

This is where the seams are chosen, once per broker, and passed down
(``FaultSeams``): the crash-point callable the coordinators, the marker
writer and the group APIs call, and the DiskIO every partition log writes
through. By default they come from the fault harness as the process's
environment arms it (``ONCEFLOW_CRASH_POINTS``, ``ONCEFLOW_DISK_FAULTS``);
no room below reads the environment or imports ``faults``. The broker also
owns the one index budget (``storage.index.IndexBudget``) its logs share.

Outermost around the dispatcher sits the offset-commit watch
(``broker.offset_commit_watch``, unless ``transaction.offset.commit.stall.ms``
is 0), one of the background loops: it closes the connection of a producer
whose TxnOffsetCommit is overdue, which wakes librdkafka after a restart.

With ``metrics_address`` the broker keeps its Prometheus metrics
(``broker.metrics``): the dispatcher is wrapped in ``MeasuredDispatch``, the
logs report their fsync rounds, the transaction coordinator's durable
completions and the server's connections are counted, and ``/metrics`` is
served on the broker's own loop (started after the listener, stopped first).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from typing import TYPE_CHECKING, Callable

import attrs

from broker.admin_apis import AdminApis
from broker.apis import SUPPORTED_APIS, KafkaApis
from broker.config import BrokerConfig
from broker.replica import PartitionUnavailableError, ReplicaManager
from broker.server import KafkaServer
from broker.storage_adapter import (
    log_config_defaults,
    partition_holds_data,
    partition_log_opener,
    partition_needs_recovery,
    reconfigure_partition_log,
    validate_log_properties,
)
from protocol.clock import Clock
from protocol.loop_thread import LoopThread
from protocol.tasks import cancel_and_wait, every
from storage.durable import DiskIO
from storage.group_commit import FsyncRounds
from storage.index import IndexBudget

if TYPE_CHECKING:
    from broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)


class DataDirError(Exception):
    """The data directory cannot be used (locked by another broker, unwritable, foreign)."""


def no_crash_point(name: str) -> None:
    """A crash point that never fires (no fault harness)."""


@attrs.frozen
class FaultSeams:
    """What a fault harness may replace in one broker."""

    crash_point: Callable[[str], None] = no_crash_point
    disk_io: DiskIO | None = None  # None: the real system calls
    # False only to show the hazard it closes (faults.disk's power-cut tests).
    end_unknown_transactions: bool = True
    # False only to show the hazard it closes (``transaction.durable.at.end``'s power-cut tests).
    abort_ongoing_after_unclean_stop: bool = True
    # False only to show the hazard it closes (a commit whose markers were not waited for).
    commit_decided_unmarked: bool = True
    # False only to show the hazard it closes (``transaction.durable.at.end``: a transaction a cut took back whole).
    fence_ended_after_unclean_stop: bool = True
    # False only to show the hazard it closes (a batch kept, its AddPartitions record lost, its producer's commit).
    abort_producer_of_unknown_transactions: bool = True
    # The boot of the kernel this start runs in; None: the kernel's own. A
    # power-cut test names a new one (the machine rebooted).
    boot_id: str | None = None

    @classmethod
    def from_environment(cls) -> "FaultSeams":
        """The seams the fault harness armed this process with through its
        environment (``faults.points``, ``faults.disk``), read once, here."""
        from faults.disk import (
            boot_id_from_environment,
            io_from_environment,
            keeps_ended_epochs,
            keeps_producer_of_unknown_transactions,
            keeps_ongoing_transactions,
            keeps_unknown_transactions,
            leaves_decided_unmarked,
        )
        from faults.points import point

        return cls(
            crash_point=point, disk_io=io_from_environment(), end_unknown_transactions=not keeps_unknown_transactions(),
            abort_ongoing_after_unclean_stop=not keeps_ongoing_transactions(), commit_decided_unmarked=not leaves_decided_unmarked(),
            fence_ended_after_unclean_stop=not keeps_ended_epochs(),
            abort_producer_of_unknown_transactions=not keeps_producer_of_unknown_transactions(), boot_id=boot_id_from_environment(),
        )


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        seams: FaultSeams | None = None,
        index_budget: IndexBudget | None = None,
        clock: Clock | None = None,
        metrics_address: tuple[str, int] | None = None,
        listening: dict[str, socket.socket] | None = None,
    ):
        self.config = config.with_data_dir(config.data_dir)
        # listener name -> its socket, bound and listening already (``onceflow
        # broker`` binds before importing the broker); the others are bound in start().
        self._listening = dict(listening or {})
        self.seams = FaultSeams.from_environment() if seams is None else seams
        # Every index of this broker's logs counts against this one budget
        # (and only this broker's loop touches them).
        self.index_budget = IndexBudget() if index_budget is None else index_budget
        # One group-commit flusher for every log: N requests waiting on any
        # partitions (data, __transaction_state, __consumer_offsets) share
        # one fsync round (storage.group_commit).
        self.fsync_rounds = FsyncRounds()
        # One clock for the coordinators (tests and the fault harness may pass their own).
        self.clock = clock or Clock()
        self.replicas: ReplicaManager | None = None
        self.apis: KafkaApis | None = None
        self.server: KafkaServer | None = None  # the first listener's
        self.servers: dict[str, KafkaServer] = {}  # listener name -> its server
        self.ports: dict[str, int] = {}  # listener name -> bound port
        self.credentials = None
        self._lock_file = None
        self._task_scope: contextlib.AsyncExitStack | None = None  # holds the TaskGroup
        self._loops: list[asyncio.Task] = []
        self.transactions = None
        self.groups = None
        self.quotas = None  # broker.security.quotas.ClientQuotas, from the data directory
        self.port: int | None = None
        # broker.security.acls.AclAuthorizer when authorizer.class.name is set.
        self.authorizer = None
        self.dispatcher = None
        # broker.offset_commit_watch.OffsetCommitWatch, unless transaction.offset.commit.stall.ms is 0.
        self.offset_commit_watch = None
        # Prometheus metrics, when an address to serve them on is given.
        self.metrics_address = metrics_address
        self.metrics: BrokerMetrics | None = None
        if metrics_address is not None:
            # Imported only here: prometheus_client (and the http, email and
            # urllib modules it pulls in) is a fifth of a start's imports, and
            # a broker without --metrics never uses it.
            from broker.metrics import BrokerMetrics

            self.metrics = BrokerMetrics()
        self.metrics_endpoint = None
        self.metrics_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.config.host}:{self.port}"

    def bootstrap_for(self, listener_name: str) -> str:
        """``host:port`` a client connects to for the listener so named."""
        listener = next(item for item in self.config.effective_listeners if item.name == listener_name)
        return f"{listener.host}:{self.ports[listener_name]}"

    async def start(self) -> None:
        """Recover the logs and listen. Raises DataDirError or OSError (bind) on failure."""
        data_dir = self.config.data_dir
        try:
            os.makedirs(data_dir, exist_ok=True)
            self._lock_data_dir(data_dir)
        except OSError as error:
            raise DataDirError(f"cannot use data directory {data_dir}: {error.strerror or error}") from None
        dispatch = self._dispatch
        if self.metrics is not None:
            from broker.metrics import MeasuredDispatch

            dispatch = MeasuredDispatch(dispatch, self.metrics, lambda: self.replicas.topics_by_id)
        try:
            # Listening from here on, serving only once ready: a client that
            # connects during recovery waits, connected, instead of being
            # refused and backing off (librdkafka doubles its reconnect
            # back-off per refused attempt, up to 10 s).
            await self._listen(dispatch)
        except (OSError, ValueError):
            await self._stop_servers()
            self._unlock()
            raise
        log.info("listening on %s:%d; connections wait until the broker is ready", self.config.host, self.port)
        try:
            await self._recover_and_serve(data_dir)
        except BaseException:
            await self._stop_servers()
            raise

    async def _recover_and_serve(self, data_dir: str) -> None:
        try:
            from broker.metadata import MetadataStore

            cluster_id = MetadataStore(data_dir).ensure_layout(self.config.node_id, self.config.cluster_id)
            self.replicas = ReplicaManager(
                data_dir,
                self.config.log_defaults,
                open_log=partition_log_opener(io=self.seams.disk_io, index_budget=self.index_budget, flush_observer=self.metrics, fsync_rounds=self.fsync_rounds),
                reconfigure_log=reconfigure_partition_log,
                validate_config=validate_log_properties,
                needs_recovery=partition_needs_recovery,
                holds_data=partition_holds_data,
                crash_point=self.seams.crash_point,
                boot_id=self.seams.boot_id,
            )
            self.authorizer = self._load_authorizer(data_dir)
            self.replicas.load()
            self._ensure_offsets_topic()
            from broker.security.quotas import ClientQuotas, QuotaStore

            self.quotas = ClientQuotas(QuotaStore(data_dir), window_seconds=self.config.quota_window_size_seconds, samples=self.config.quota_window_num)
            from broker.security.credentials import CredentialStore

            self.credentials = CredentialStore(data_dir, io=self.seams.disk_io).load()
            self.credentials.ensure_secret()
        except ValueError as error:
            self._unlock()
            raise DataDirError(str(error)) from None
        except OSError as error:
            self._unlock()
            raise DataDirError(f"cannot use data directory {data_dir}: {error}") from None

        from broker.groups import GroupApis, GroupManager
        from broker.transactions import TransactionManager

        crash_point = self.seams.crash_point
        self.groups = GroupManager(replicas=self.replicas, config=self.config, clock=self.clock)
        await self.groups.start()
        self.transactions = TransactionManager(
            replicas=self.replicas, config=self.config, crash_point=crash_point, on_marker=self.groups.on_marker, clock=self.clock,
            on_state_written=self.metrics.transaction_state_written if self.metrics is not None else None,
        )
        await self.transactions.start(
            end_unknown_transactions=self.seams.end_unknown_transactions, abort_ongoing_after_unclean_stop=self.seams.abort_ongoing_after_unclean_stop,
            commit_decided_unmarked=self.seams.commit_decided_unmarked, fence_ended_after_unclean_stop=self.seams.fence_ended_after_unclean_stop,
            abort_producer_of_unknown=self.seams.abort_producer_of_unknown_transactions,
        )
        self.groups.offsets_log.answers_once_appended = self.transactions.coordinator.answers_once_appended

        try:
            for server in self.servers.values():
                await server.start()
            if self.metrics is not None:
                self.metrics.watch(self)
                self.metrics_endpoint = await self.metrics.serve(*self.metrics_address)
                self.metrics_port = self.metrics_endpoint.bound_port
        except (OSError, ValueError):
            await self._stop_servers()
            await self.transactions.stop()
            await self.groups.stop()
            await self.replicas.aclose()
            await self.fsync_rounds.aclose()
            self._unlock()
            raise
        from broker.security.listeners import AdvertisedEndpoints

        listeners = self.config.effective_listeners
        advertised = AdvertisedEndpoints(
            {listener.name: listener.advertised(self.ports[listener.name]) for listener in listeners}, default=listeners[0].name
        )
        from broker.security.user_apis import UserScramApis
        from broker.txn_apis import TransactionApis

        txn_apis = TransactionApis(
            transactions=self.transactions,
            replicas=self.replicas,
            node_id=self.config.node_id,
            advertised=advertised,
            offsets_partitions=self.config.offsets_topic_partitions,
        )
        coordinator = self.transactions.coordinator
        from coordinator.metadata import TRANSACTION_VERSION_2, TopicPartition  # once, not on every transactional Produce

        def partition_in_transaction(producer_id, producer_epoch, topic, partition):
            return coordinator.verify_transactional_produce(producer_id, producer_epoch, TopicPartition(topic, partition))

        async def add_to_transaction(transactional_id, producer_id, producer_epoch, partitions):
            return await coordinator.add_partitions(
                transactional_id, producer_id, producer_epoch, [TopicPartition(topic, index) for topic, index in partitions], transaction_version=TRANSACTION_VERSION_2
            )

        group_apis = GroupApis(groups=self.groups, transactions=self.transactions, replicas=self.replicas, crash_point=crash_point)
        admin_apis = AdminApis(config=self.config, replicas=self.replicas, cluster_id=cluster_id, advertised=advertised, log_config_defaults=log_config_defaults())
        from broker.security.acl_apis import AclApis
        from broker.security.acl_store import AclStore
        from broker.security.quotas import QuotaApis, QuotaLayer

        acl_apis = AclApis(authorizer=self.authorizer, store=AclStore(data_dir))
        self.apis = KafkaApis(
            config=self.config,
            replicas=self.replicas,
            cluster_id=cluster_id,
            advertised=advertised,
            extra_handlers={
                **admin_apis.handlers(),
                **txn_apis.handlers(),
                **group_apis.handlers(),
                **acl_apis.handlers(),
                **UserScramApis(credentials=self.credentials).handlers(),
                **QuotaApis(self.quotas).handlers(),
            },
            partition_in_transaction=partition_in_transaction,
            answers_once_appended=coordinator.answers_once_appended,
            add_to_transaction=add_to_transaction,
        )
        # Inside the ACL check (a denied request is not metered): Produce and
        # Fetch are metered per user and throttled (KIP-13, KIP-219).
        self.dispatcher = self._authorizing(QuotaLayer(self.apis.dispatch, self.quotas, clock=self.clock.monotonic))
        loops = {"housekeeping": self._housekeep(), **self.groups.background(), **self.transactions.background()}
        if self.config.transaction_offset_commit_stall_ms > 0:
            from broker.offset_commit_watch import OffsetCommitWatch

            # Outermost: a TxnOffsetCommit the authorizer refuses still shows
            # that its client is not stuck.
            self.offset_commit_watch = OffsetCommitWatch(self.dispatcher, wait_ms=self.config.transaction_offset_commit_stall_ms, clock=self.clock.monotonic)
            self.dispatcher = self.offset_commit_watch
            loops["offset commit watch"] = self.offset_commit_watch.run()
        self._task_scope = contextlib.AsyncExitStack()
        tasks = await self._task_scope.enter_async_context(asyncio.TaskGroup())
        self._loops = [tasks.create_task(loop, name=f"broker {name}") for name, loop in loops.items()]
        log.info("onceflow broker ready on %s:%d (data in %s)", self.config.host, self.port, data_dir)
        if len(listeners) > 1:
            log.info("listeners: %s", ", ".join(f"{item.name}://{item.host}:{self.ports[item.name]}" for item in listeners))

    async def _listen(self, dispatch) -> None:
        """One server per listener, bound and listening but not serving yet
        (``_recover_and_serve`` starts them); they share the connection
        limits and the credentials. A bind failure (OSError) or an unusable TLS setting
        (ValueError) reaches the caller."""
        from broker.security.limits import ConnectionLimiter
        from broker.security.sasl import SaslServer
        from broker.security.tls import server_context

        config = self.config
        limiter = ConnectionLimiter(max_connections=config.max_connections, max_connections_per_ip=config.max_connections_per_ip)

        def new_sasl_server() -> SaslServer:
            return SaslServer(mechanisms=config.sasl_enabled_mechanisms, credentials=self.credentials, reauth_ms=config.connections_max_reauth_ms)

        context = None
        open_to_all = []
        for listener in config.effective_listeners:
            if listener.uses_tls and context is None:
                context = server_context(
                    certfile=config.ssl_certfile, keyfile=config.ssl_keyfile, cafile=config.ssl_cafile, client_auth=config.ssl_client_auth
                )
            server = KafkaServer(
                dispatch,
                host=listener.host,
                port=listener.port,
                max_frame_size=config.socket_request_max_bytes,
                max_inflight_per_connection=config.max_inflight_requests_per_connection,
                on_unsupported=self._answer_unsupported,
                supported_versions=SUPPORTED_APIS,
                on_connection=self.metrics.connection_opened if self.metrics is not None else None,
                listener=listener,
                ssl_context=context,
                new_sasl_server=new_sasl_server,
                limiter=limiter,
                authentication_timeout=config.authentication_timeout_ms / 1000.0,
                pre_authentication_max_frame_size=config.sasl_server_max_receive_size,
                failed_authentication_delay=config.failed_authentication_delay_ms / 1000.0,
                sock=self._listening.pop(listener.name, None),
                arriving=self.fsync_rounds.arriving,
            )
            self.servers[listener.name] = server
            self.ports[listener.name] = await server.listen()
            if self.server is None:
                self.server, self.port = server, self.ports[listener.name]
            if not listener.is_loopback and not (listener.uses_sasl or (listener.security_protocol == "SSL" and config.ssl_client_auth == "required")):
                open_to_all.append(f"{listener.name}://{listener.host}:{self.ports[listener.name]}")
        if open_to_all:
            log.warning(
                "listening on %s without authentication: anyone who can reach it may read, write and fence transactions (use SASL_SSL or SASL_PLAINTEXT)",
                ", ".join(open_to_all),
            )

    async def _stop_servers(self) -> None:
        servers, self.servers, self.server = list(self.servers.values()), {}, None
        for server in servers:
            await server.stop()

    async def _housekeep(self) -> None:
        """Retention, compaction and producer-id expiry, every
        ``log.retention.check.interval.ms`` (Kafka's name; default 5 minutes)."""
        await every(self.config.retention_check_interval_ms / 1000.0, self._housekeep_once, "housekeeping")

    async def _housekeep_once(self) -> None:
        """One round of ``_housekeep`` over every partition; one that fails is logged and skipped."""
        from storage.cleaner import Cleaner

        for number, (topic, partition) in enumerate(self.replicas.partitions()):
            if number % 500 == 499:
                await asyncio.sleep(0)  # thousands of partitions: let requests in
            # A partition not open since start has nothing in memory to
            # expire and is opened only if it has segments to delete or clean.
            if not self.replicas.is_open(topic, partition) and not self.replicas.needs_housekeeping(topic, partition):
                continue
            try:
                try:
                    partition_log = self.replicas.get_log(topic, partition)
                except PartitionUnavailableError:
                    continue  # logged by get_log; tried again next time
                if partition_log is None:
                    continue  # deleted meanwhile
                partition_log.enforce_retention()
                if partition_log.config.compact:
                    Cleaner(partition_log, crash_point=self.seams.crash_point).clean()
                partition_log.remove_expired_producers()
            except Exception:
                log.exception("housekeeping of %s-%d failed", topic, partition)

    async def stop(self) -> None:
        """The loops first, then the rest in reverse order of start; a loop
        that had crashed is raised (by the TaskGroup) once all is closed."""
        try:
            # The loops first: they use the listener's logs and the coordinators.
            await cancel_and_wait(*self._loops)
        finally:
            self._loops = []
            try:
                await self._close()
            finally:
                scope, self._task_scope = self._task_scope, None
                if scope is not None:
                    await scope.aclose()

    async def _close(self) -> None:
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
            self.metrics_endpoint = None
        await self._stop_servers()
        if self.transactions is not None:
            await self.transactions.stop()
            self.transactions = None
        if self.groups is not None:
            await self.groups.stop()
            self.groups = None
        if self.replicas is not None:
            await self.replicas.aclose()
            self.replicas = None
        await self.fsync_rounds.aclose()  # the logs have left it; its flusher has nothing left
        self._unlock()

    def _ensure_offsets_topic(self) -> None:
        """``__consumer_offsets`` exists from the first start: transactions that
        commit offsets put markers in it (the group coordinator reads it)."""
        if "__consumer_offsets" not in self.replicas.topics:
            self.replicas.create_topic(
                "__consumer_offsets",
                self.config.offsets_topic_partitions,
                {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024)},
                internal=True,
            )

    async def _dispatch(self, request, session):
        return await self.dispatcher(request, session)

    def _load_authorizer(self, data_dir: str):
        """The ACL authorizer with the stored ACLs, or None when
        ``authorizer.class.name`` is not set (then nothing is checked: every
        connection may do everything, as in Kafka without an authorizer). A
        damaged ACL file stops the start (DataDirError): taken for "no ACLs"
        it could open what the ACLs closed."""
        if not self.config.authorizer:
            return None
        from broker.security.acl_store import AclStore, AclStoreError
        from broker.security.acls import AclAuthorizer, AuthorizerSettings

        try:
            bindings = AclStore(data_dir).load()
        except AclStoreError as error:
            raise ValueError(str(error)) from None
        settings = AuthorizerSettings(super_users=self.config.super_users, allow_everyone_if_no_acl_found=self.config.allow_everyone_if_no_acl_found)
        if not bindings and not settings.super_users and not settings.allow_everyone_if_no_acl_found:
            log.warning(
                "the ACL authorizer is on with no ACLs, no super.users and allow.everyone.if.no.acl.found=false: "
                "every request will be refused; add ACLs with `onceflow acls add --data-dir %s` while the broker is stopped, or set super.users",
                data_dir,
            )
        if all(listener.security_protocol == "PLAINTEXT" for listener in self.config.effective_listeners):
            log.warning("the ACL authorizer is on but no listener authenticates: every client is User:ANONYMOUS, told apart only by host")
        log.info("ACL authorizer on: %d ACLs, super users %s", len(bindings), ", ".join(sorted(settings.super_users)) or "none")
        return AclAuthorizer(bindings, settings)

    def _authorizing(self, dispatch):
        """``dispatch`` behind the ACL check when an authorizer is configured
        (``broker.security.authorizer``), else ``dispatch`` itself."""
        if self.authorizer is None:
            return dispatch
        from broker.security.authorizer import AuthorizingDispatch, TopicView

        return AuthorizingDispatch(dispatch, self.authorizer, TopicView(self.replicas, self.config.auto_create_topics))

    def _answer_unsupported(self, error) -> bytes | None:
        """Kafka answers an ApiVersions request of a version it does not know
        with a v0 response carrying UNSUPPORTED_VERSION and its ranges, so the
        client can retry with a version both sides know. Anything else unknown
        closes the connection (returning None)."""
        from protocol.errors import ErrorCode
        from protocol.framing import encode_api_versions_fallback
        from protocol.messages import ApiKey

        if error.api_key != ApiKey.API_VERSIONS or self.apis is None:
            return None
        return encode_api_versions_fallback(error.correlation_id, self.apis.api_versions_body(ErrorCode.UNSUPPORTED_VERSION))

    def _lock_data_dir(self, data_dir: str) -> None:
        path = os.path.join(data_dir, ".lock")
        handle = open(path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise DataDirError(f"data directory {data_dir} is in use by another broker (.lock is held)") from None
        self._lock_file = handle

    def _unlock(self) -> None:
        if self._lock_file is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock_file.close()
                self._lock_file = None


class EmbeddedBroker:
    """A broker on its own thread and event loop, for tests and examples.

    >>> with EmbeddedBroker(data_dir) as broker:
    ...     producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})

    The thread is ``protocol.loop_thread.LoopThread`` serving the broker: one
    task owns it from ``start()`` to ``stop()``.
    """

    def __init__(
        self, data_dir: str, *, port: int = 0, seams: FaultSeams | None = None, clock: Clock | None = None,
        metrics_address: tuple[str, int] | None = None, **config_fields,
    ):
        properties = config_fields.pop("properties", {})
        self.config = BrokerConfig.from_properties(properties, data_dir=data_dir, port=port, **config_fields)
        self.seams = seams
        self.clock = clock
        self.metrics_address = metrics_address  # ("127.0.0.1", 0): serve /metrics on a free port
        self.broker: Broker | None = None
        self._thread: LoopThread | None = None

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def port(self) -> int:
        return self.broker.port

    def bootstrap_for(self, listener_name: str) -> str:
        return self.broker.bootstrap_for(listener_name)

    @property
    def metrics_url(self) -> str:
        """Where the broker serves its metrics (given ``metrics_address``)."""
        return f"http://{self.metrics_address[0]}:{self.broker.metrics_port}/metrics"

    def start(self) -> "EmbeddedBroker":
        thread = LoopThread("onceflow-broker")
        try:
            self.broker = thread.run(lambda: Broker(self.config, seams=self.seams, clock=self.clock, metrics_address=self.metrics_address))
            thread.serve(self.broker.start, self.broker.stop)
        except BaseException:
            thread.stop()
            raise
        self._thread = thread
        return self

    def call(self, function, *args):
        """Run ``function(broker, *args)`` on the broker's loop and return its result."""
        async def invoke():
            result = function(self.broker, *args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return self._thread.call(invoke())

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop(timeout=60)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


__all__ = ["Broker", "DataDirError", "EmbeddedBroker", "FaultSeams", "SUPPORTED_APIS"]
