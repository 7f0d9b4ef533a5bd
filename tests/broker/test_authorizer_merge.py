"""The authorising dispatcher's split and merge, fuzzed (hypothesis): for
random requests over random topics, some writable/readable and some not,
every partition asked for is answered exactly once, a denied one with
Kafka's error and never passed to the handler, an allowed one with the
handler's answer; nothing denied reaches the handler."""

from __future__ import annotations

import asyncio
import types

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.security.acls import AclAuthorizer, AclBinding
from broker.security.acls import AclOperation as Op
from broker.security.acls import ResourceType as Res
from broker.security.authorizer import AuthorizingDispatch, TopicView
from broker.security.session import Session
from protocol.errors import ErrorCode
from protocol.framing import DecodedRequest
from protocol.messages import ApiKey

TOPICS = ["a", "b", "c", "d"]

# api -> (version, operation, build request body from {topic: partitions},
#         handler answer from the body it got, read {(topic, partition): code} from an answer)
SHAPES = {
    ApiKey.PRODUCE: (
        9,
        Op.WRITE,
        lambda asked: {"acks": -1, "transactional_id": None, "topic_data": [{"name": t, "partition_data": [{"index": p, "records": b""} for p in ps]} for t, ps in asked.items()]},
        lambda body: {"responses": [{"name": t["name"], "partition_responses": [{"index": p["index"], "error_code": 0} for p in t["partition_data"]]} for t in body["topic_data"]]},
        lambda answer: [((t["name"], p["index"]), p["error_code"]) for t in answer["responses"] for p in t["partition_responses"]],
    ),
    ApiKey.FETCH: (
        12,
        Op.READ,
        lambda asked: {"replica_id": -1, "topics": [{"topic": t, "partitions": [{"partition": p} for p in ps]} for t, ps in asked.items()]},
        lambda body: {"responses": [{"topic": t["topic"], "partitions": [{"partition_index": p["partition"], "error_code": 0} for p in t["partitions"]]} for t in body["topics"]]},
        lambda answer: [((t["topic"], p["partition_index"]), p["error_code"]) for t in answer["responses"] for p in t["partitions"]],
    ),
    ApiKey.LIST_OFFSETS: (
        7,
        Op.DESCRIBE,
        lambda asked: {"topics": [{"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in asked.items()]},
        lambda body: {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": 0} for p in t["partitions"]]} for t in body["topics"]]},
        lambda answer: [((t["name"], p["partition_index"]), p["error_code"]) for t in answer["topics"] for p in t["partitions"]],
    ),
    ApiKey.OFFSET_COMMIT: (
        8,
        Op.READ,
        lambda asked: {"group_id": "g", "topics": [{"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in asked.items()]},
        lambda body: {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": 0} for p in t["partitions"]]} for t in body["topics"]]},
        lambda answer: [((t["name"], p["partition_index"]), p["error_code"]) for t in answer["topics"] for p in t["partitions"]],
    ),
    ApiKey.DELETE_RECORDS: (
        2,
        Op.DELETE,
        lambda asked: {"topics": [{"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in asked.items()]},
        lambda body: {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": 0} for p in t["partitions"]]} for t in body["topics"]]},
        lambda answer: [((t["name"], p["partition_index"]), p["error_code"]) for t in answer["topics"] for p in t["partitions"]],
    ),
}


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(sorted(SHAPES)),
    granted=st.sets(st.sampled_from(TOPICS)),
    asked=st.dictionaries(st.sampled_from(TOPICS), st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), min_size=1),
)
def test_every_partition_is_answered_once_and_denied_ones_never_reach_the_handler(api, granted, asked):
    version, operation, build, handle, read = SHAPES[api]
    acls = [AclBinding.of(Res.TOPIC, t, "User:ANONYMOUS", operation) for t in granted] + [AclBinding.of(Res.GROUP, "g", "User:ANONYMOUS", Op.READ)]
    seen_by_handler = []

    async def inner(request, session):
        seen_by_handler.extend(key for key, _code in read(handle(request.body)))
        return handle(request.body)

    view = TopicView(types.SimpleNamespace(topics={t: None for t in TOPICS}, topics_by_id={}), auto_create=False)
    dispatch = AuthorizingDispatch(inner, AclAuthorizer(acls), view)
    request = DecodedRequest(api_key=api, api_version=version, correlation_id=1, client_id="fuzz", body=build(asked), flexible=False)
    answer = asyncio.run(dispatch(request, Session()))
    answered = read(answer)
    wanted = [(t, p) for t, ps in asked.items() for p in ps]
    assert sorted(key for key, _ in answered) == sorted(wanted), "a partition answered twice or not at all"
    for (topic, _partition), code in answered:
        assert code == (ErrorCode.NONE if topic in granted else ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    assert all(topic in granted for topic, _ in seen_by_handler), "a denied topic reached the handler"
    assert sorted(seen_by_handler) == sorted((t, p) for t, p in wanted if t in granted)
