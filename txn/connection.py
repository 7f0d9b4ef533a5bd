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
from protocol.messages import APIS

log = logging.getLogger(__name__)

API_VERSIONS = 18


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

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        self._framing = ClientConnection(client_id=self.client_id)
        self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.request_timeout)
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        body = await self._send(API_VERSIONS, 3, {"client_software_name": "onceflow-txn", "client_software_version": "0.1"})
        if body["error_code"]:
            body = await self._send(API_VERSIONS, 0, {})
        self.versions = {entry["api_key"]: (entry["min_version"], entry["max_version"]) for entry in body["api_keys"]}

    def version_for(self, api_key: int) -> int:
        ours = APIS[api_key].request.valid
        theirs = self.versions.get(api_key)
        if theirs is None:
            raise ConnectionError(f"broker at {self.host}:{self.port} does not serve {APIS[api_key].name}")
        high = min(ours[1], theirs[1])
        if high < max(ours[0], theirs[0]):
            raise ConnectionError(f"no common version of {APIS[api_key].name}")
        return high

    async def request(self, api_key: int, body: dict, *, version: int | None = None, expect_response: bool = True) -> dict | None:
        if not self.connected:
            await self.connect()
        return await self._send(api_key, self.version_for(api_key) if version is None else version, body, expect_response=expect_response)

    async def _send(self, api_key: int, version: int, body: dict, *, expect_response: bool = True) -> dict | None:
        correlation_id, frame = self._framing.send_request(api_key, version, body, expect_response=expect_response)
        future = asyncio.get_running_loop().create_future() if expect_response else None
        if future is not None:
            self._pending[correlation_id] = future
        try:
            async with self._lock:
                self._writer.write(frame)
                await self._writer.drain()
        except (ConnectionError, OSError) as error:
            self._fail(ConnectionError(f"send to {self.host}:{self.port} failed: {error}"))
            raise ConnectionError(str(error)) from error
        if future is None:
            return None
        try:
            return await asyncio.wait_for(future, self.request_timeout)
        finally:
            self._pending.pop(correlation_id, None)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(1 << 20)
                if not data:
                    raise ConnectionError(f"broker at {self.host}:{self.port} closed the connection")
                self._framing.receive_data(data)
                while (response := self._framing.next_response()) is not None:
                    future = self._pending.get(response.correlation_id)
                    if future is not None and not future.done():
                        future.set_result(response.body)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._fail(error if isinstance(error, ConnectionError) else ConnectionError(str(error)))

    def _fail(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    async def close(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
            try:
                await self._read_task
            except (asyncio.CancelledError, Exception):
                pass
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (OSError, ConnectionError):
                pass
            self._writer = None
