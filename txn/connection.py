"""One asyncio connection to a broker, with pipelined requests.

``BrokerClient.request(api_key, body)`` picks the highest version both sides
support (from the broker's ApiVersions answer and our schema tables), sends
the request, and resolves when the response with its correlation id arrives.
Several requests may be in flight at once; a reader task owned by the
connection matches responses to them. A broken connection fails every
waiting request with ``ConnectionError``; the caller (the client's retry
policy) reconnects.

Security (``txn.security.SecurityConfig``): on SSL and SASL_SSL the socket is
TLS-wrapped (the broker's certificate checked against the CA file and its
name); on SASL_* the connection authenticates right after ApiVersions, by
``SaslClient``'s exchange (SaslHandshake v1, then SaslAuthenticate). A
refusal or a failed TLS handshake raises ``AuthenticationError``, which is
not retried. When the broker gives the session a lifetime (KIP-368), the
connection authenticates again on its own before it lapses: the next
request after 85-95% of the lifetime waits for the requests in flight, runs
the exchange again, and goes on; past the lifetime it reconnects instead.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time

from protocol.frame_stream import FrameReceiver
from protocol.framing import ClientConnection
from protocol.messages import APIS, ApiKey
from protocol.tasks import cancel_and_wait
from txn.security import PLAINTEXT, AuthenticationError, SaslClient, SecurityConfig

log = logging.getLogger(__name__)


class BrokerClient:
    def __init__(self, host: str, port: int, *, client_id: str = "onceflow-txn", request_timeout: float = 30.0, security: SecurityConfig = PLAINTEXT):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.security = security
        self._ssl_context: ssl.SSLContext | None = None  # built on the first connect, then reused
        self._reauthenticate_after: float | None = None  # monotonic seconds (KIP-368)
        self._session_expires: float | None = None
        self._reauth_lock = asyncio.Lock()
        self.authentications = 0  # completed SASL exchanges on any of this client's connections
        self._framing = ClientConnection(client_id=client_id)
        self._receiver: FrameReceiver | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._read_task: asyncio.Task | None = None
        self.versions: dict[int, tuple[int, int]] = {}
        # Finalized feature levels the broker announced (ApiVersions v3+): name -> max level.
        self.features: dict[str, int] = {}
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
        self._reauthenticate_after = self._session_expires = None
        self._receiver, self._writer = await asyncio.wait_for(self._open(self._framing), self.request_timeout)
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop(self._receiver, self._framing, self._pending))
        try:
            body = await self._send(ApiKey.API_VERSIONS, 3, {"client_software_name": "onceflow-txn", "client_software_version": "0.1"})
            if body["error_code"]:
                body = await self._send(ApiKey.API_VERSIONS, 0, {})
            self.versions = {entry["api_key"]: (entry["min_version"], entry["max_version"]) for entry in body["api_keys"]}
            finalized = body.get("finalized_features") if body.get("finalized_features_epoch", -1) >= 0 else None
            self.features = {entry["name"]: entry["max_version_level"] for entry in finalized or []}
            if self.security.uses_sasl:
                await self._authenticate()
        except (AuthenticationError, TimeoutError, ConnectionError):
            # A half-opened connection is closed now, not when the client is.
            await self._drop()
            raise
        self._ready = True

    async def _open(self, framing: ClientConnection) -> tuple[FrameReceiver, asyncio.StreamWriter]:
        """The socket, TLS-wrapped on SSL and SASL_SSL: its protocol and a writer."""
        if self.security.uses_tls and self._ssl_context is None:
            self._ssl_context = self.security.ssl_context()
        loop = asyncio.get_running_loop()
        if self._ssl_context is None:
            transport, receiver = await loop.create_connection(lambda: FrameReceiver(framing), self.host, self.port)
            return receiver, asyncio.StreamWriter(transport, receiver, None, loop)
        try:
            transport, receiver = await loop.create_connection(
                lambda: FrameReceiver(framing), self.host, self.port, ssl=self._ssl_context, server_hostname=self.host, ssl_handshake_timeout=self.request_timeout
            )
            return receiver, asyncio.StreamWriter(transport, receiver, None, loop)
        except ssl.SSLCertVerificationError as error:
            # Not retriable: an untrusted or misnamed certificate stays so.
            raise AuthenticationError(0, f"TLS handshake with {self.host}:{self.port}", message=f"certificate verify failed: {error.verify_message}") from None
        except ssl.SSLError as error:
            raise AuthenticationError(0, f"TLS handshake with {self.host}:{self.port}", message=error.reason or str(error)) from None

    async def _authenticate(self) -> None:
        """One SASL exchange on this connection (the first, or a KIP-368 re-authentication)."""
        if ApiKey.SASL_HANDSHAKE not in self.versions or ApiKey.SASL_AUTHENTICATE not in self.versions:
            raise AuthenticationError(0, f"SASL with {self.host}:{self.port}", message="the broker does not offer SaslHandshake/SaslAuthenticate (is this a SASL listener?)")
        sasl = SaslClient(self.security)
        started = time.monotonic()
        token = sasl.receive_handshake(await self._send(ApiKey.SASL_HANDSHAKE, 1, sasl.handshake_request()))
        version = self.version_for(ApiKey.SASL_AUTHENTICATE)
        while token is not None:
            token = sasl.receive_authenticate(await self._send(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": token}))
        self.authentications += 1
        if sasl.session_lifetime_ms > 0:
            lifetime = sasl.session_lifetime_ms / 1000
            # As Kafka's clients: somewhere in 85-95% of the lifetime, so a fleet does not re-authenticate at once.
            self._reauthenticate_after = started + lifetime * random.uniform(0.85, 0.95)
            self._session_expires = started + lifetime
        else:
            self._reauthenticate_after = self._session_expires = None

    async def _drop(self) -> None:
        """Close this connection now (after a refused authentication)."""
        self._fail(ConnectionError(f"connection to {self.host}:{self.port} was closed"))
        await cancel_and_wait(self._read_task)
        self._read_task = None

    async def _keep_session(self) -> None:
        """KIP-368: re-authenticate a session near its end; past it, reconnect."""
        if self._reauthenticate_after is None or time.monotonic() < self._reauthenticate_after:
            return
        async with self._reauth_lock:
            if self._reauthenticate_after is None or time.monotonic() < self._reauthenticate_after:
                return  # another request did it while we waited
            if time.monotonic() >= self._session_expires:
                async with self._connect_lock:
                    await self._connect()
                return
            # The broker answers in order; nothing of ours is interleaved with the exchange.
            in_flight = [future for future in self._pending.values() if not future.done()]
            if in_flight:
                await asyncio.wait(in_flight, timeout=max(0.0, self._session_expires - time.monotonic()))
            try:
                await self._authenticate()
            except (TimeoutError, AuthenticationError, ConnectionError):
                await self._drop()
                raise

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
        await self._keep_session()
        awaitable = await self._submit(api_key, self.version_for(api_key) if version is None else version, body, expect_response=expect_response, timeout=timeout)
        return await awaitable

    async def submit(self, api_key: int, body: dict, *, version: int | None = None, expect_response: bool = True):
        """Write the request now; return an awaitable of its response (None
        without one). Requests submitted one after another reach the broker
        in that order, which the producer relies on for its sequences."""
        if not self.connected:
            await self.connect()
        await self._keep_session()
        return await self._submit(api_key, self.version_for(api_key) if version is None else version, body, expect_response=expect_response)

    async def _submit(self, api_key: int, version: int, body: dict, *, expect_response: bool = True, timeout: float | None = None):
        correlation_id, parts = self._framing.send_request_parts(api_key, version, body, expect_response=expect_response)
        future = asyncio.get_running_loop().create_future() if expect_response else None
        if future is not None:
            self._pending[correlation_id] = future
        writer = self._writer
        if writer is None:
            self._pending.pop(correlation_id, None)
            raise ConnectionError(f"connection to {self.host}:{self.port} is closed")
        try:
            for part in parts:  # a Produce request's record sets as they are, not joined into one frame
                writer.write(part)
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

    async def _read_loop(self, receiver: FrameReceiver, framing: ClientConnection, pending: dict) -> None:
        """Answers of one connection, matched to that connection's requests only."""
        try:
            while True:
                if not await receiver.arrived():
                    raise ConnectionError(f"broker at {self.host}:{self.port} closed the connection")
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

    def abort(self) -> None:
        """Cut the connection at once, as a failed network would (the socket
        is reset, nothing more is sent): the requests waiting on it fail with
        ``ConnectionError`` and the next request connects again. A
        fault-injection hook (``Cluster.cut_connections``)."""
        if self._writer is not None:
            self._writer.transport.abort()

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
