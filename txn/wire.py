"""A small synchronous Kafka connection: send one request, read its response.

The seed of onceflow's own clients, used today by the command-line tools
(``onceflow transactions ...``). It negotiates nothing: callers pick API
versions the broker advertises. Talks only over the wire.
"""

from __future__ import annotations

import socket

from protocol.errors import ErrorCode, error_name
from protocol.framing import ClientConnection


class KafkaWireError(Exception):
    def __init__(self, code: int, context: str):
        self.code = code
        super().__init__(f"{context}: {error_name(code)} ({code})")


class BrokerConnection:
    def __init__(self, bootstrap: str, *, client_id: str = "onceflow-cli", timeout: float = 30.0):
        host, _, port = bootstrap.rpartition(":")
        self.address = (host or "127.0.0.1", int(port))
        self.timeout = timeout
        self._connection = ClientConnection(client_id=client_id)
        self._socket: socket.socket | None = None

    def __enter__(self) -> "BrokerConnection":
        self._socket = socket.create_connection(self.address, timeout=self.timeout)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def request(self, api_key: int, version: int, body: dict) -> dict:
        if self._socket is None:
            raise RuntimeError("use BrokerConnection as a context manager")
        correlation_id, frame = self._connection.send_request(api_key, version, body)
        self._socket.sendall(frame)
        while True:
            response = self._connection.next_response()
            if response is not None:
                if response.correlation_id != correlation_id:
                    raise KafkaWireError(ErrorCode.UNKNOWN_SERVER_ERROR, "response out of order")
                return response.body
            data = self._socket.recv(1 << 20)
            if not data:
                raise ConnectionError(f"broker at {self.address[0]}:{self.address[1]} closed the connection")
            self._connection.receive_data(data)
