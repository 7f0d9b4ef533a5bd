"""Cluster metadata on disk: the node's identity and the topic registry.

Layout under the data directory::

    meta.properties                 node.id, cluster.id, version (as Kafka writes it)
    __cluster_metadata/topics.json  {"topics": {name: {"id": uuid, "partitions": n,
                                     "config": {...}, "internal": bool}}}

``topics.json`` is replaced atomically and durably
(``storage.durable.replace_file``), so a crash leaves either the old registry
or the new one, never a torn file. A topic is in the registry
before any of its partition directories exists, and leaves it before they are
deleted: on start, partition directories that no registered topic owns are
leftovers of an interrupted delete and are removed.
"""

from __future__ import annotations

import json
import os
import uuid

import attrs

from protocol.properties import parse_properties
from storage.durable import replace_file


@attrs.frozen
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    config: dict = attrs.field(factory=dict)  # per-topic overrides, Kafka names, string values
    internal: bool = False

    def to_json(self) -> dict:
        return {"id": str(self.topic_id), "partitions": self.partitions, "config": self.config, "internal": self.internal}

    @classmethod
    def from_json(cls, name: str, data: dict) -> "TopicInfo":
        return cls(
            name=name,
            topic_id=uuid.UUID(data["id"]),
            partitions=int(data["partitions"]),
            config=dict(data.get("config", {})),
            internal=bool(data.get("internal", False)),
        )



class MetadataStore:
    """Reads and writes ``meta.properties`` and the topic registry."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.metadata_dir = os.path.join(data_dir, "__cluster_metadata")
        self.topics_path = os.path.join(self.metadata_dir, "topics.json")
        self.meta_properties_path = os.path.join(data_dir, "meta.properties")

    def ensure_layout(self, node_id: int, cluster_id: str | None) -> str:
        """Create the directories and identity; return the cluster id.

        Raises ValueError when the directory belongs to another node or cluster.
        """
        os.makedirs(self.metadata_dir, exist_ok=True)
        if os.path.exists(self.meta_properties_path):
            with open(self.meta_properties_path, encoding="utf-8") as file:
                properties = parse_properties(file.read(), source=self.meta_properties_path)
            stored_node = int(properties.get("node.id", node_id))
            stored_cluster = properties.get("cluster.id")
            if stored_node != node_id:
                raise ValueError(
                    f"{self.data_dir} belongs to node {stored_node}, not node {node_id} "
                    f"(meta.properties); use another --data-dir"
                )
            if cluster_id is not None and stored_cluster and stored_cluster != cluster_id:
                raise ValueError(f"{self.data_dir} belongs to cluster {stored_cluster}, not {cluster_id}")
            if stored_cluster:
                return stored_cluster
        cluster_id = cluster_id or _new_cluster_id()
        text = f"version=1\nnode.id={node_id}\ncluster.id={cluster_id}\n"
        replace_file(self.meta_properties_path, text.encode())
        return cluster_id

    def load_topics(self) -> dict[str, TopicInfo]:
        try:
            with open(self.topics_path, "rb") as file:
                data = json.loads(file.read())
        except FileNotFoundError:
            return {}
        return {name: TopicInfo.from_json(name, entry) for name, entry in data.get("topics", {}).items()}

    def save_topics(self, topics: dict[str, TopicInfo]) -> None:
        document = {"topics": {name: info.to_json() for name, info in sorted(topics.items())}}
        replace_file(self.topics_path, json.dumps(document, indent=1, sort_keys=True).encode())


def _new_cluster_id() -> str:
    # Kafka's cluster ids are a base64url-encoded UUID without padding (22 chars).
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
