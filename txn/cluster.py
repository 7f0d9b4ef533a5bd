"""What a client knows about the cluster, and its connections to it.

``Cluster`` owns one ``BrokerClient`` per broker (by node id, bootstrap
servers before the first Metadata answer), the topic metadata (partition
counts and leaders), coordinator lookups (FindCoordinator, cached per key
until a request says NOT_COORDINATOR), and the retries every client
shares: retriable errors and lost connections are tried again under
``protocol.retry``'s client policies (``client_request``; ``coordinator_busy``
and ``reconnect`` for the waits after those failures) up to the call's
deadline.

It talks only over the wire, so it works against any Kafka broker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.retry import attempts, client_request, coordinator_busy, reconnect
from txn.config import CommonConfig
from txn.connection import BrokerClient
from txn.errors import RetriableError, RetriesExhaustedError, classify, is_retriable

log = logging.getLogger(__name__)

COORDINATOR_MOVED = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}
# Answers that mean "the coordinator is busy for a moment": finishing the
# previous transaction's markers (CONCURRENT_TRANSACTIONS, e.g. a restarted
# instance's InitProducerId over the transaction its dead predecessor left
# open) or loading its log after a restart. They clear in tens of
# milliseconds, so their retries wait ``protocol.retry.coordinator_busy``'s
# short first wait instead of retry_backoff_ms.
COORDINATOR_BUSY = {ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}


class Cluster:
    def __init__(self, config: CommonConfig):
        self.config = config
        self._bootstrap = [self._address(server) for server in config.bootstrap_servers]
        self._clients: dict[tuple[str, int], BrokerClient] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.partition_counts: dict[str, int] = {}
        self.leaders: dict[tuple[str, int], int] = {}
        self._coordinators: dict[tuple[int, str], tuple[str, int]] = {}
        self._metadata_lock = asyncio.Lock()
        self._metadata_time = 0.0

    @staticmethod
    def _address(server: str) -> tuple[str, int]:
        host, _, port = server.rpartition(":")
        return (host or "127.0.0.1", int(port))

    # -- connections --------------------------------------------------------------------

    async def connection(self, address: tuple[str, int], *, lane: str = "") -> BrokerClient:
        """The connection to ``address``; a ``lane`` names a second one of
        its own, for requests that must not wait behind the others (or hold them up)."""
        key = (address, lane) if lane else address
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = BrokerClient(*address, client_id=self.config.client_id, request_timeout=self.config.request_timeout_ms / 1000, security=self.config.security)
        if not client.connected:
            await client.connect()
        return client

    async def any_broker(self) -> BrokerClient:
        """A connected broker: a known one if any is up, else a bootstrap server."""
        candidates = list(dict.fromkeys([*self.brokers.values(), *self._bootstrap]))
        connected = [self._clients[a] for a in candidates if a in self._clients and self._clients[a].connected]
        if connected:
            return connected[0]
        last_error: Exception | None = None
        for address in random.sample(candidates, len(candidates)):
            try:
                return await self.connection(address)
            except OSError as error:  # ConnectionError and TimeoutError are OSErrors
                last_error = error
        raise ConnectionError(f"no broker reachable among {candidates}: {last_error}")

    async def leader(self, topic: str, partition: int) -> BrokerClient:
        if (topic, partition) not in self.leaders:
            await self.refresh([topic])
        node = self.leaders.get((topic, partition))
        if node is None or node not in self.brokers:
            raise RetriableError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition}")
        return await self.connection(self.brokers[node])

    async def close(self) -> None:
        for client in list(self._clients.values()):
            await client.close()
        self._clients.clear()

    def cut_connections(self) -> None:
        """Cut every connection now, as a failed network would (a
        fault-injection hook: ``BrokerClient.abort``); the client's retries
        reconnect and carry on."""
        for client in self._clients.values():
            client.abort()

    async def abandon(self) -> None:
        """Drop every connection now, for a client given up on without a
        flush (a producer replaced after a failure: what it had not sent is
        lost, and its open transaction is left to the coordinator, which the
        next instance's ``init_transactions`` asks to end it). Unlike
        ``close`` it never raises: a connection that fails to close is
        logged and dropped all the same."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.close()
            except Exception as error:  # given up on: nothing more is owed to it
                log.debug("a connection of an abandoned client failed to close: %r", error)

    # -- metadata -------------------------------------------------------------------------

    async def refresh(self, topics: list[str] | None, *, allow_auto_create: bool = True) -> dict:
        """Ask for metadata of ``topics`` (None: every topic) and remember it."""
        async with self._metadata_lock:
            client = await self.any_broker()
            body = await client.request(ApiKey.METADATA, {"topics": None if topics is None else [{"name": t} for t in topics], "allow_auto_topic_creation": allow_auto_create})
            self.brokers.update({b["node_id"]: (b["host"], b["port"]) for b in body["brokers"]})
            for topic in body["topics"]:
                if topic["error_code"]:
                    continue
                self.partition_counts[topic["name"]] = len(topic["partitions"])
                for partition in topic["partitions"]:
                    self.leaders[(topic["name"], partition["partition_index"])] = partition["leader_id"]
            self._metadata_time = time.monotonic()
            return body

    async def partitions_for(self, topic: str) -> int:
        """The partition count of ``topic``, creating it if the broker auto-creates."""
        if topic not in self.partition_counts or time.monotonic() - self._metadata_time > self.config.metadata_max_age_ms / 1000:
            async for attempt in self.retrying(self.config.request_timeout_ms / 1000):
                with attempt:
                    body = await self.refresh([topic])
                    for entry in body["topics"]:
                        if entry["name"] == topic and entry["error_code"]:
                            raise classify(entry["error_code"], f"metadata for {topic}")
        return self.partition_counts[topic]

    def forget_leader(self, topic: str, partition: int) -> None:
        self.leaders.pop((topic, partition), None)

    # -- coordinators ----------------------------------------------------------------------

    async def coordinator(self, key: str, key_type: int, *, lane: str = "") -> BrokerClient:
        address = self._coordinators.get((key_type, key))
        if address is None:
            client = await self.any_broker()
            version = client.version_for(ApiKey.FIND_COORDINATOR)
            body = await client.request(ApiKey.FIND_COORDINATOR, {"key": key, "key_type": key_type, "coordinator_keys": [key]}, version=version)
            entry = body["coordinators"][0] if version >= 4 else body
            if entry["error_code"]:
                raise classify(entry["error_code"], f"FindCoordinator({key})")
            address = self._coordinators[(key_type, key)] = (entry["host"], entry["port"])
        return await self.connection(address, lane=lane)

    def forget_coordinator(self, key: str, key_type: int) -> None:
        self._coordinators.pop((key_type, key), None)

    async def coordinator_request(self, key: str, key_type: int, api_key: int, body: dict, *, max_version: int | None = None, timeout: float | None = None,
                                  held: bool = False) -> dict:
        """Send to the coordinator of ``key``; a coordinator that moved is looked up again.

        Returns the response; error codes in it are the caller's to judge,
        except NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE at the top level,
        which raise (retriable) after forgetting the cached coordinator.
        ``held``: a request the coordinator may hold for long (JoinGroup until
        every member rejoined, SyncGroup until the leader's assignment) goes
        over a connection of its own, as Kafka's consumer keeps its
        coordinator's apart: a broker answers a connection's requests in
        order, so it would hold up this client's fetches meanwhile."""
        try:
            client = await self.coordinator(key, key_type, lane="held" if held else "")
            version = client.version_for(api_key)
            if max_version is not None:
                version = min(version, max_version)
            response = await client.request(api_key, body, version=version, timeout=timeout)
        except OSError:
            self.forget_coordinator(key, key_type)
            raise
        code = response.get("error_code", 0)
        if code in COORDINATOR_MOVED:
            self.forget_coordinator(key, key_type)
            raise RetriableError(code, f"coordinator of {key}")
        return response

    # -- retries ------------------------------------------------------------------------------

    def retrying(self, deadline_seconds: float):
        """Tries of a request (``async for attempt in cluster.retrying(d):
        with attempt: ...``): retriable errors and lost connections again
        under the client's policy until ``deadline_seconds``, then
        ``RetriesExhaustedError``; anything else at once."""
        config = self.config
        return attempts(client_request(config.retry_backoff_ms, config.retry_backoff_max_ms).within(deadline_seconds),
                        retriable=is_retriable, wait_policy=self.wait_policy_after, give_up=_exhausted)

    def wait_policy_after(self, error: BaseException):
        """The waits after ``error``: a busy coordinator's are shorter, a
        lost connection's capped lower (``protocol.retry``'s table)."""
        config = self.config
        if getattr(error, "code", None) in COORDINATOR_BUSY:
            return coordinator_busy(config.retry_backoff_max_ms)
        if isinstance(error, ConnectionError):
            return reconnect(config.retry_backoff_ms, config.retry_backoff_max_ms)
        return client_request(config.retry_backoff_ms, config.retry_backoff_max_ms)


def _exhausted(error: BaseException, tries: int) -> RetriesExhaustedError:
    return RetriesExhaustedError(getattr(error, "code", 0), f"gave up after {tries} attempts", message=str(error))
