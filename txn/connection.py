"""One asyncio connection to a broker, with pipelined requests.

``BrokerClient.request(api_key, body)`` picks the highest version both sides
support (from the broker's ApiVersions answer and our schema tables), sends
the request, and resolves when the response with its correlation id arrives.
Several requests may be in flight at once; a reader task owned by the
connection matches responses to them. A broken connection fails every
waiting request with ``ConnectionError``; the caller (the client's retry
policy) reconnects.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.framing import ClientConnection
from protocol.messages import APIS, ApiKey
from protocol.tasks import cancel_and_wait

log = logging.getLogger(__name__)



class BrokerClient:
    def __init__(self, host: str, port: int, *, client_id: str = "onceflow-txn", request_timeout: float = 30.0):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout
        self._framing = ClientConnection(client_id=client_id)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._read_task: asyncio.Task | None = None
        self.versions: dict[int, tuple[int, int]] = {}
        self._lock = asyncio.Lock()
        self._connect_lock = asyncio.Lock()
        self._ready = False  # connected and the broker's API versions known

    @property
    def connected(self) -> bool:
        return self._ready and self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        async with self._connect_lock:
            if not self.connected:
                await self._connect()

    async def _connect(self) -> None:
        # Everything still waiting on the old connection fails now: its
        # answers can no longer come, and a caller that waited for its timeout
        # instead (the producer's retries) would fall behind the batches after it.
        self._fail(ConnectionError(f"connection to {self.host}:{self.port} was lost"))
        # The old connection's reader ends before the new one starts: one reader per client.
        await cancel_and_wait(self._read_task)
        self._read_task = None
        self._ready = False
        self._framing = ClientConnection(client_id=self.client_id)
        self._pending = {}
        self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.request_timeout)
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop(self._reader, self._framing, self._pending))
        body = await self._send(ApiKey.API_VERSIONS, 3, {"client_software_name": "onceflow-txn", "client_software_version": "0.1"})
        if body["error_code"]:
            body = await self._send(ApiKey.API_VERSIONS, 0, {})
        self.versions = {entry["api_key"]: (entry["min_version"], entry["max_version"]) for entry in body["api_keys"]}
        self._ready = True

    def version_for(self, api_key: int) -> int:
        ours = APIS[api_key].request.valid
        theirs = self.versions.get(api_key)
        if theirs is None:
            raise ConnectionError(f"broker at {self.host}:{self.port} does not serve {APIS[api_key].name}")
        high = min(ours[1], theirs[1])
        if high < max(ours[0], theirs[0]):
            raise ConnectionError(f"no common version of {APIS[api_key].name}")
        return high

    async def request(self, api_key: int, body: dict, *, version: int | None = None, expect_response: bool = True, timeout: float | None = None) -> dict | None:
        """Send and wait for the answer (``timeout`` overrides the client's
        request timeout, for requests the broker holds, like JoinGroup)."""
        if not self.connected:
            await self.connect()
        awaitable = await self._submit(api_key, self.version_for(api_key) if version is None else version, body, expect_response=expect_response, timeout=timeout)
        return await awaitable

    async def submit(self, api_key: int, body: dict, *, version: int | None = None, expect_response: bool = True):
        """Write the request now; return an awaitable of its response (None
        without one). Requests submitted one after another reach the broker
        in that order, which the producer relies on for its sequences."""
        if not self.connected:
            await self.connect()
        return await self._submit(api_key, self.version_for(api_key) if version is None else version, body, expect_response=expect_response)

    async def _submit(self, api_key: int, version: int, body: dict, *, expect_response: bool = True, timeout: float | None = None):
        correlation_id, frame = self._framing.send_request(api_key, version, body, expect_response=expect_response)
        future = asyncio.get_running_loop().create_future() if expect_response else None
        if future is not None:
            self._pending[correlation_id] = future
        writer = self._writer
        if writer is None:
            self._pending.pop(correlation_id, None)
            raise ConnectionError(f"connection to {self.host}:{self.port} is closed")
        try:
            writer.write(frame)
            if writer.transport.get_write_buffer_size() > 1 << 20:
                async with self._lock:
                    await writer.drain()
        except (ConnectionError, OSError, RuntimeError) as error:
            self._fail(ConnectionError(f"send to {self.host}:{self.port} failed: {error}"))
            raise ConnectionError(str(error)) from error
        return self._response(correlation_id, future, timeout, self._pending)

    async def _response(self, correlation_id: int, future: asyncio.Future | None, timeout: float | None, pending: dict) -> dict | None:
        if future is None:
            return None
        try:
            return await asyncio.wait_for(future, timeout or self.request_timeout)
        finally:
            # Only this request's entry, of this connection (ids restart per connection).
            if pending.get(correlation_id) is future:
                del pending[correlation_id]

    async def _send(self, api_key: int, version: int, body: dict, *, expect_response: bool = True) -> dict | None:
        return await (await self._submit(api_key, version, body, expect_response=expect_response))

    async def _read_loop(self, reader, framing, pending: dict) -> None:
        """Answers of one connection, matched to that connection's requests only."""
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    raise ConnectionError(f"broker at {self.host}:{self.port} closed the connection")
                framing.receive_data(data)
                while (response := framing.next_response()) is not None:
                    future = pending.get(response.correlation_id)
                    if future is not None and not future.done():
                        future.set_result(response.body)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if pending is self._pending:  # still the current connection
                self._fail(error if isinstance(error, ConnectionError) else ConnectionError(str(error)))

    def _fail(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        self._ready = False
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    async def close(self) -> None:
        await cancel_and_wait(self._read_task)  # it ends every failure itself; only cancellation reaches here
        self._read_task = None
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (OSError, ConnectionError):
                pass
            self._writer = None
