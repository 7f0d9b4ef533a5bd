"""Record real clients' request frames, for the decoding tests.

    .venv/bin/python tests/protocol/captures/capture.py

Runs an embedded broker behind a recording TCP proxy, lets confluent-kafka,
kafka-python and aiokafka each create a topic, produce and fetch, and saves the
first request frame of each (client, api key) as ``<client>-<api>-v<version>.bin``.
Re-run it when a client upgrade changes what it sends.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from broker.broker import EmbeddedBroker  # noqa: E402
from protocol.messages import APIS  # noqa: E402


class RecordingProxy:
    def __init__(self):
        self.frames: dict[tuple[int, int], bytes] = {}
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.target_port = None

    def start(self, target_port: int):
        self.target_port = target_port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, False), daemon=True).start()

    def _pump(self, source, sink, record):
        buffer = b""
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if record:
                buffer += data
                while len(buffer) >= 4:
                    (size,) = struct.unpack(">i", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                    api_key, version = struct.unpack(">hh", frame[4:8])
                    self.frames.setdefault((api_key, version), frame)
            sink.sendall(data)


def exercise_confluent(bootstrap):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("capture-confluent", 1, 1)])["capture-confluent"].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "capture-confluent"})
    producer.produce("capture-confluent", key=b"k", value=b"v", headers=[("h", b"1")])
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "client.id": "capture-confluent"})
    consumer.assign([TopicPartition("capture-confluent", 0, 0)])
    consumer.poll(3)
    consumer.close()


def exercise_kafka_python(bootstrap):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="capture-kafka-python")
    admin.create_topics([NewTopic("capture-kafka-python", 1, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="capture-kafka-python", enable_idempotence=False)
    producer.send("capture-kafka-python", key=b"k", value=b"v", headers=[("h", b"1")]).get(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="capture-kafka-python", consumer_timeout_ms=2000)
    consumer.assign([TopicPartition("capture-kafka-python", 0)])
    consumer.seek(TopicPartition("capture-kafka-python", 0), 0)
    list(consumer)
    consumer.close()


def exercise_aiokafka(bootstrap):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="capture-aiokafka")
        await admin.start()
        await admin.create_topics([NewTopic("capture-aiokafka", 1, 1)])
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="capture-aiokafka")
        await producer.start()
        await producer.send_and_wait("capture-aiokafka", key=b"k", value=b"v", headers=[("h", b"1")])
        await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id="capture-aiokafka")
        await consumer.start()
        consumer.assign([TopicPartition("capture-aiokafka", 0)])
        consumer.seek(TopicPartition("capture-aiokafka", 0), 0)
        await consumer.getmany(timeout_ms=2000)
        await consumer.stop()

    asyncio.run(run())


def main():
    for client, exercise in [("confluent", exercise_confluent), ("kafka-python", exercise_kafka_python), ("aiokafka", exercise_aiokafka)]:
        proxy = RecordingProxy()
        # The broker advertises the proxy, so every connection passes through it.
        with EmbeddedBroker(tempfile.mkdtemp(), advertised_port=proxy.port) as broker:
            proxy.start(broker.port)
            exercise(f"127.0.0.1:{proxy.port}")
            for (api_key, version), frame in sorted(proxy.frames.items()):
                if api_key in (0, 1, 3, 18, 19, 2):
                    name = f"{client}-{APIS[api_key].name}-v{version}.bin"
                    with open(os.path.join(HERE, name), "wb") as file:
                        file.write(frame)
                    print("saved", name, len(frame), "bytes")
            proxy.listener.close()


if __name__ == "__main__":
    main()
