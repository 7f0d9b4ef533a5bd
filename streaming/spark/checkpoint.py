"""Reading Spark's checkpoint from Python, without pyspark: the source end
offsets a microbatch planned (``<checkpoint>/offsets/<batch>``), which the
sink's ``commitOffsetsToGroup`` commits to a consumer group and the fault
harness checks against. The checkpoint must be on a file system this
process can open.
"""

from __future__ import annotations

import json
import os

from streaming.spark.decision import SinkError


def read_source_offsets(checkpoint_location: str, batch_id: int) -> dict[tuple[str, int], int]:
    """The end offsets of batch ``batch_id`` of every onceflow-shaped source
    (``{"topic": {"partition": next offset}}``), from Spark's offset log
    ``<checkpoint>/offsets/<batch>`` (written before the batch runs). The
    checkpoint must be on a file system this process can open."""
    path = checkpoint_location[len("file:") :] if checkpoint_location.startswith("file:") else checkpoint_location
    if "://" in path:
        raise SinkError(f"commitOffsetsToGroup reads the checkpoint's offset log, which needs a local or mounted checkpointLocation, not {checkpoint_location!r}")
    log_file = os.path.join(path, "offsets", str(batch_id))
    try:
        with open(log_file, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as error:
        raise SinkError(f"commitOffsetsToGroup: cannot read {log_file}: {error}") from error
    offsets: dict[tuple[str, int], int] = {}
    for line in lines[2:]:  # "v1", the batch metadata, then one line per source
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if not isinstance(source, dict):
            continue
        for topic, partitions in source.items():
            if not isinstance(partitions, dict):
                break
            for partition, offset in partitions.items():
                if isinstance(offset, int) and str(partition).lstrip("-").isdigit():
                    offsets[(topic, int(partition))] = offset
    if not offsets:
        raise SinkError(f"commitOffsetsToGroup: no Kafka-shaped source offsets in {log_file} (it needs the onceflow source)")
    return offsets
