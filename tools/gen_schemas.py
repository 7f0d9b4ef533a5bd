"""Generate ``protocol/messages.py`` from Kafka's message JSON specifications.

    python tools/gen_schemas.py [../shared/kafka-protocol] > protocol/messages.py

The JSON files (Apache Kafka's ``clients/src/main/resources/common/message``,
kept as reference data beside this repository) say which fields exist in
which versions. This script turns the ones onceflow serves into plain Python
table literals, and their ``apiKey`` numbers into the ``ApiKey`` enum (Kafka's
names: ``ApiKey.PRODUCE == 0``), the one place an API key is spelled; the
codec that reads the tables is ``protocol/schema.py``.
The output is committed, so nothing is built at import time.
"""

from __future__ import annotations

import json
import os
import re
import sys

APIS = [
    "Produce", "Fetch", "ListOffsets", "Metadata", "OffsetCommit", "OffsetFetch", "FindCoordinator",
    "JoinGroup", "Heartbeat", "LeaveGroup", "SyncGroup", "DescribeGroups", "ListGroups",
    "SaslHandshake", "ApiVersions", "CreateTopics", "DeleteTopics", "DeleteRecords", "InitProducerId",
    "OffsetForLeaderEpoch", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn", "WriteTxnMarkers",
    "TxnOffsetCommit", "DescribeConfigs", "AlterConfigs", "SaslAuthenticate", "CreatePartitions",
    "DeleteGroups", "IncrementalAlterConfigs", "OffsetDelete", "DescribeCluster", "DescribeProducers",
    "DescribeTransactions", "ListTransactions", "DescribeAcls", "CreateAcls", "DeleteAcls",
    "DescribeClientQuotas", "AlterClientQuotas", "DescribeUserScramCredentials",
    "AlterUserScramCredentials",
]
RECORDS = [
    "TransactionLogKey", "TransactionLogValue", "OffsetCommitKey", "OffsetCommitValue",
    "GroupMetadataKey", "GroupMetadataValue",
]
# Versions Kafka 4.0 added after the reference specifications beside this
# repository were taken, each the same on the wire as the version before it:
# KIP-890 part 2 gave them a meaning (the request adds its partition to the
# producer's transaction itself; transaction.version 2).
LATER_VERSIONS = {"Produce": 12, "TxnOffsetCommit": 5}
PRIMITIVES = {
    "bool": "BOOL", "int8": "INT8", "int16": "INT16", "uint16": "UINT16", "int32": "INT32",
    "int64": "INT64", "float64": "FLOAT64", "string": "STRING", "bytes": "BYTES",
    "records": "RECORDS", "uuid": "UUID",
}


def snake(name: str) -> str:
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def constant(name: str) -> str:
    return snake(name).upper()


def parse_versions(text: str | None) -> str:
    if text is None or text == "none":
        return "None"
    text = text.strip()
    if text.endswith("+"):
        return f"({int(text[:-1])}, None)"
    if "-" in text:
        low, high = text.split("-")
        return f"({int(low)}, {int(high)})"
    return f"({int(text)}, {int(text)})"


def valid_versions(api: str, text: str) -> str:
    """``parse_versions`` of an API's validVersions, extended to LATER_VERSIONS."""
    if api not in LATER_VERSIONS:
        return parse_versions(text)
    low, high = text.strip().split("-")
    return f"({int(low)}, {max(int(high), LATER_VERSIONS[api])})"


# onceflow's own fields in Kafka's messages, in the JSON specifications' form,
# appended to a message's top-level fields. Only tagged fields: a Kafka
# broker or client skips a tag it does not know. Tags far above Kafka's own
# (0-3 today), so that none of its future ones meets them.
ONCEFLOW_FIELDS = {
    # Seal the open transaction (``coordinator.TransactionCoordinator.seal``);
    # to a Kafka broker an AddPartitionsToTxn of partitions already added.
    "AddPartitionsToTxnRequest": [
        {"name": "OnceflowSeal", "type": "bool", "versions": "3", "taggedVersions": "3", "tag": 10000, "default": "false"},
    ],
}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as file:
        text = file.read()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))


def default_literal(field: dict) -> str | None:
    if "default" not in field:
        return None
    value = field["default"]
    kind = field["type"]
    if isinstance(value, bool):
        return repr(value)
    text = str(value)
    if text == "null":
        return "None"
    if kind == "bool":
        return repr(text.lower() == "true")
    if kind in ("int8", "int16", "uint16", "int32", "int64"):
        return str(int(text, 0))
    if kind == "float64":
        return repr(float(text))
    if kind == "string":
        return repr(text)
    return None


class Emitter:
    def __init__(self):
        self.lines: list[str] = []

    def struct(self, name: str, fields: list, common: dict, indent: int) -> str:
        pad = " " * indent
        inner = []
        for field in fields:
            inner.append(self.field(field, common, indent + 4))
        body = "\n".join(inner)
        return f'Struct("{name}", (\n{body}\n{pad}))'

    def field(self, field: dict, common: dict, indent: int) -> str:
        pad = " " * indent
        kind = field["type"]
        is_array = kind.startswith("[]")
        element = kind[2:] if is_array else kind
        if element in PRIMITIVES:
            type_expr = PRIMITIVES[element]
        elif "fields" in field:
            type_expr = self.struct(element, field["fields"], common, indent)
        elif element in common:
            type_expr = common[element]
        else:
            raise LookupError(f"unknown type {element}")
        if is_array:
            type_expr = f"ArrayOf({type_expr})"
        args = [f'"{snake(field["name"])}"', type_expr, parse_versions(field.get("versions"))]
        if field.get("nullableVersions"):
            args.append(f"nullable={parse_versions(field['nullableVersions'])}")
        if field.get("taggedVersions"):
            args.append(f"tagged={parse_versions(field['taggedVersions'])}")
            args.append(f"tag={int(field['tag'])}")
        default = default_literal(field)
        if default is not None:
            args.append(f"default={default}")
        if field.get("ignorable"):
            args.append("ignorable=True")
        return f"{pad}Field({', '.join(args)}),"


def emit_common_structs(emitter: Emitter, spec: dict, owner: str, out: list[str]) -> dict:
    """Emit each common struct (after the ones it uses); return name -> constant."""
    common: dict[str, str] = {}
    waiting = list(spec.get("commonStructs", []))
    while waiting:
        progressed = False
        for struct in list(waiting):
            try:
                literal = emitter.struct(struct["name"], struct["fields"], common, 0)
            except LookupError:
                continue
            const = f"_{constant(owner)}__{constant(struct['name'])}"
            common[struct["name"]] = const
            out.append(f"{const} = {literal}")
            out.append("")
            waiting.remove(struct)
            progressed = True
        if not progressed:
            raise SystemExit(f"{owner}: common structs refer to unknown types")
    return common


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "shared", "kafka-protocol")
    emitter = Emitter()
    out = [
        '"""Kafka request/response and coordinator-record schemas as plain tables.',
        "",
        "Generated by ``tools/gen_schemas.py`` from Kafka's message JSON specifications",
        "(reference data); regenerate rather than edit. Field names are snake_case",
        "versions of Kafka's; ``versions``/``nullable``/``tagged`` are inclusive",
        "(low, high) ranges with ``None`` for open-ended. ``ApiKey`` names each",
        "request's API key (spell keys with it, never as numbers); ``APIS`` maps a key",
        "to its request and response schemas.",
        '"""',
        "",
        "# fmt: off",
        "from enum import IntEnum",
        "",
        "from protocol.schema import (",
        "    BOOL, BYTES, FLOAT64, INT8, INT16, INT32, INT64, RECORDS, STRING, UINT16, UUID,",
        "    Api, ArrayOf, Field, Message, Struct,",
        ")",
        "",
        "",
        "class ApiKey(IntEnum):",
        '    """The API keys of the requests below, by Kafka\'s names (its ``ApiKeys``)."""',
        "",
    ]
    keys = {api: load(os.path.join(root, "messages", f"{api}Request.json"))["apiKey"] for api in APIS}
    for api, key in sorted(keys.items(), key=lambda item: item[1]):
        out.append(f"    {constant(api)} = {key}")
    out += ["", ""]
    registry = []
    for api in APIS:
        pair = {}
        for side in ("Request", "Response"):
            spec = load(os.path.join(root, "messages", f"{api}{side}.json"))
            spec["fields"] = spec["fields"] + ONCEFLOW_FIELDS.get(f"{api}{side}", [])
            common = emit_common_structs(emitter, spec, api + side, out)
            const = constant(api + side)
            out.append(
                f"{const} = Message(\"{api}{side}\", valid={valid_versions(api, spec['validVersions'])}, "
                f"flexible={parse_versions(spec['flexibleVersions'])}, body={emitter.struct(api + side, spec['fields'], common, 0)})"
            )
            out.append("")
            pair[side] = (const, spec)
        request_const, request_spec = pair["Request"]
        response_const, _ = pair["Response"]
        key = f"ApiKey.{constant(api)}"
        registry.append(f"    {key}: Api({key}, \"{api}\", {request_const}, {response_const}),")
    for record in RECORDS:
        spec = load(os.path.join(root, "coordinator-records", f"{record}.json"))
        common = emit_common_structs(emitter, spec, record, out)
        const = constant(record)
        out.append(
            f"{const} = Message(\"{record}\", valid={parse_versions(spec['validVersions'])}, "
            f"flexible={parse_versions(spec['flexibleVersions'])}, body={emitter.struct(record, spec['fields'], common, 0)})"
        )
        out.append("")
    out.append("APIS = {")
    out.extend(registry)
    out.append("}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
