"""What every synchronous client is: its asyncio twin, run on a loop thread
of its own (``protocol.loop_thread.LoopThread``), with blocking calls.

``SyncClient`` is the one shape of ``txn.Producer``, ``txn.Consumer`` and
``txn.Admin``: it builds the async client on the loop (``AsyncProducer``,
``AsyncConsumer``, ``AsyncAdmin``), accepts a Kafka-style properties dict as
its first argument, pickles as its configuration (Spark ships clients to
executors that way), is a context manager, and ``close()`` closes the async
client on its loop, then stops the thread (which cancels and waits for
whatever the client left running). Each facade adds only what is its own:
the producer's send hand-off and delivery futures, the consumer's listener
callbacks on the caller's thread, the admin's blocking method table.
"""

from __future__ import annotations

from typing import Callable

from protocol.loop_thread import LoopThread

_CLASS_DEFAULT = object()


def rebuild(cls, config):
    """Unpickle a client (sync or async) from its configuration."""
    return cls(config=config)


def properties_first(bootstrap_servers, config):
    """``Client({"bootstrap.servers": ...})``: a dict in the first place is the configuration."""
    if isinstance(bootstrap_servers, dict):
        return None, bootstrap_servers
    return bootstrap_servers, config


class SyncClient:
    thread_name = "onceflow-client"
    close_timeout: float | None = 60

    def __init__(self, build_async: Callable[[], object]):
        """Start the loop thread and build the async client on it
        (``build_async`` runs there); nothing is left running on failure."""
        self._thread = LoopThread(self.thread_name)
        try:
            self._async = self._thread.run(build_async)
        except BaseException:
            self._thread.stop()
            raise

    def __reduce__(self):
        return (rebuild, (type(self), self._async.config))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def config(self):
        return self._async.config

    def close(self, timeout=_CLASS_DEFAULT) -> None:
        """Close the async client (within ``timeout`` seconds, default the
        class's ``close_timeout``; None: no limit), then stop the loop thread."""
        try:
            self._call(self._async.close(), self.close_timeout if timeout is _CLASS_DEFAULT else timeout)
        finally:
            self._thread.stop()

    def cut_connections(self) -> None:
        """Cut every connection of the client now, as a failed network would:
        a fault-injection hook for chaos tests and demos (the client's own
        retries reconnect; what was in flight is retried or fails as after a
        real network fault). Returns once the connections are cut."""
        self._thread.run(self._async.cluster.cut_connections)

    def _call(self, coroutine, timeout: float | None = None):
        """Run ``coroutine`` on the client's loop and wait for its result."""
        return self._thread.call(coroutine, timeout)
