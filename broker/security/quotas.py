"""Client quotas (KIP-13, with KIP-219's throttling): produce and fetch byte
rates per user principal, their durable store, the AlterClientQuotas and
DescribeClientQuotas APIs (KIP-546), and the layer that throttles.

Configuration uses Kafka's names: an entity is a user (``user`` with a name,
or with a null name for the default that applies to every user without a
quota of its own) and its values are ``producer_byte_rate`` and
``consumer_byte_rate`` in bytes per second. A principal with neither its own
nor a default quota is not metered. Unauthenticated connections are the
user ``ANONYMOUS``, as in Kafka.

- ``RateMeter`` is Kafka's sampled rate, sans-I/O: ``quota.window.num``
  samples of ``quota.window.size.seconds`` each; the rate is the bytes in
  the live samples over the time they span, never less than all but one
  sample's length (so a first burst is measured over the whole window, not
  over its own few milliseconds).
- A request that takes its principal over the quota is answered at once, with
  ``throttle_time_ms`` = (observed - quota) / quota * window: how long the
  client must stay silent for the rate to fall back to the quota. The server
  then does not read from that connection for that long (Kafka mutes the
  channel), whether or not the client honours the field. Produce is metered
  by the bytes of its record batches, Fetch by the bytes of records it
  returns. Unlike Kafka, a throttled Fetch still carries its records (Kafka
  answers it empty and forgets the bytes): the mute holds the rate as well,
  and a single fetch larger than a window's allowance cannot starve.
- ``QuotaStore`` keeps the configuration in ``client-quotas.json`` in the data
  directory, replaced atomically and fsynced before an AlterClientQuotas is
  answered (write, then apply).
- ``QuotaLayer`` wraps the broker's dispatcher (a layer of its own, beside
  authorisation's), meters and sets ``throttle_time_ms``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os

import attrs

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from storage.durable import replace_file

log = logging.getLogger(__name__)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
USER = "user"
KNOWN_ENTITY_TYPES = ("user", "client-id", "ip")
STORE_FILE = "client-quotas.json"

# DescribeClientQuotas match types (KIP-546).
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2


class QuotaError(ValueError):
    """A quota configuration that cannot be applied (the message says why)."""


# -- the meter -------------------------------------------------------------------------------------


@attrs.define
class RateMeter:
    """A rate over ``samples`` windows of ``window_seconds`` (Kafka's SampledStat
    Rate). Times are seconds on any monotonic clock."""

    window_seconds: float = 1.0
    samples: int = 11
    _windows: collections.deque = attrs.field(factory=collections.deque)  # [start, amount]

    def record(self, amount: float, now: float) -> None:
        self._expire(now)
        if self._windows and now < self._windows[-1][0] + self.window_seconds:
            self._windows[-1][1] += amount
        else:
            self._windows.append([now, amount])

    def _expire(self, now: float) -> None:
        horizon = now - self.samples * self.window_seconds
        while self._windows and self._windows[0][0] <= horizon:
            self._windows.popleft()

    def window_length(self, now: float) -> float:
        """The time the rate is measured over."""
        self._expire(now)
        elapsed = now - self._windows[0][0] if self._windows else 0.0
        full_windows = int(elapsed // self.window_seconds)
        if full_windows < self.samples - 1:
            elapsed += (self.samples - 1 - full_windows) * self.window_seconds
        return max(elapsed, self.window_seconds)

    def rate(self, now: float) -> float:
        self._expire(now)
        return sum(amount for _start, amount in self._windows) / self.window_length(now)

    def throttle_seconds(self, bound: float, now: float) -> float:
        """How long to stay silent for the rate to come back to ``bound`` (0: within it)."""
        observed = self.rate(now)
        if observed <= bound:
            return 0.0
        return (observed - bound) / bound * self.window_length(now)


# -- the configuration -----------------------------------------------------------------------------


def _validate(values: dict) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        if key not in QUOTA_KEYS:
            raise QuotaError(f"{key} is not a quota onceflow enforces (it knows {', '.join(QUOTA_KEYS)})")
        value = float(value)
        if not math.isfinite(value) or value <= 0:
            raise QuotaError(f"{key} must be a positive number of bytes per second, not {value!r}")
        out[key] = value
    return out


@attrs.frozen
class QuotaConfig:
    """Every configured quota: user name -> {key: bytes/s}; the key None is
    the default user."""

    users: dict = attrs.field(factory=dict)

    def for_user(self, user: str, key: str) -> float | None:
        """The quota that applies to ``user``: its own, else the default's, else None."""
        own = self.users.get(user)
        if own is not None and key in own:
            return own[key]
        default = self.users.get(None)
        if default is not None and key in default:
            return default[key]
        return None

    def altered(self, user: str | None, changes: dict[str, float | None]) -> QuotaConfig:
        """The configuration after setting (a number) or removing (None) values."""
        values = dict(self.users.get(user, {}))
        for key, value in changes.items():
            if key not in QUOTA_KEYS:
                raise QuotaError(f"{key} is not a quota onceflow enforces (it knows {', '.join(QUOTA_KEYS)})")
            if value is None:
                values.pop(key, None)
            else:
                values.update(_validate({key: value}))
        users = dict(self.users)
        if values:
            users[user] = values
        else:
            users.pop(user, None)
        return QuotaConfig(users)

    def to_json(self) -> bytes:
        entries = [{"user": user, "quotas": values} for user, values in sorted(self.users.items(), key=lambda item: (item[0] is not None, item[0] or ""))]
        return json.dumps({"version": 1, "users": entries}, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> QuotaConfig:
        document = json.loads(data)
        if document.get("version") != 1:
            raise QuotaError(f"unknown client-quotas version {document.get('version')!r}")
        return cls({entry["user"]: _validate(entry["quotas"]) for entry in document["users"]})


class QuotaStore:
    """``client-quotas.json`` in the data directory."""

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, STORE_FILE)

    def load(self) -> QuotaConfig:
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return QuotaConfig()
        try:
            return QuotaConfig.from_json(data)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise QuotaError(f"{self.path} is damaged ({error}); fix or remove it (the quotas in it are lost then)") from None

    def save(self, config: QuotaConfig) -> None:
        replace_file(self.path, config.to_json())


# -- the manager -----------------------------------------------------------------------------------


class ClientQuotas:
    """The configuration and one meter per (quota key, user) being metered."""

    def __init__(self, store: QuotaStore, *, window_seconds: float = 1.0, samples: int = 11, max_throttle_ms: int | None = None):
        self.store = store
        self.config = store.load()
        self.window_seconds = window_seconds
        self.samples = samples
        # Kafka caps a throttle at the whole quota window.
        self.max_throttle_ms = max_throttle_ms if max_throttle_ms is not None else int(window_seconds * samples * 1000)
        self._meters: dict[tuple[str, str], RateMeter] = {}
        # (key, user) -> until when (clock seconds) its last throttle runs
        self._throttled_until: dict[tuple[str, str], float] = {}

    def apply(self, config: QuotaConfig) -> None:
        """Make ``config`` durable, then use it."""
        self.store.save(config)
        self.config = config

    @property
    def idle(self) -> bool:
        """No quota is configured and no throttle is running: a request
        needs no metering (a quota set later starts its meter from then)."""
        return not self.config.users and not self._throttled_until

    def record(self, key: str, user: str, amount: int, now: float) -> int:
        """Meter ``amount`` bytes of ``user`` under ``key``; returns throttle_time_ms."""
        bound = self.config.for_user(user, key)
        if bound is None:
            self._meters.pop((key, user), None)
            return 0
        meter = self._meters.get((key, user))
        if meter is None:
            meter = self._meters[(key, user)] = RateMeter(self.window_seconds, self.samples)
        meter.record(amount, now)
        throttle_ms = min(self.max_throttle_ms, math.ceil(meter.throttle_seconds(bound, now) * 1000))
        if throttle_ms:
            self._throttled_until[(key, user)] = max(self._throttled_until.get((key, user), 0.0), now + throttle_ms / 1000)
        return throttle_ms

    def delay(self, key: str, user: str, now: float) -> float:
        """Seconds before a request of ``user`` under ``key`` may be served:
        what is left of its last throttle (0 when not throttled)."""
        until = self._throttled_until.get((key, user))
        if until is None:
            return 0.0
        if until <= now:
            del self._throttled_until[(key, user)]
            return 0.0
        return until - now

    def rate(self, key: str, user: str, now: float) -> float:
        meter = self._meters.get((key, user))
        return 0.0 if meter is None else meter.rate(now)


# -- the APIs --------------------------------------------------------------------------------------


class QuotaApis:
    """AlterClientQuotas and DescribeClientQuotas (KIP-546) on ``ClientQuotas``."""

    def __init__(self, quotas: ClientQuotas):
        self.quotas = quotas

    def handlers(self) -> dict:
        return {ApiKey.DESCRIBE_CLIENT_QUOTAS: self.handle_describe, ApiKey.ALTER_CLIENT_QUOTAS: self.handle_alter}

    async def handle_alter(self, version: int, body: dict) -> dict:
        config = self.quotas.config
        results = []
        for entry in body.get("entries") or []:
            entity = [{"entity_type": part["entity_type"], "entity_name": part["entity_name"]} for part in entry.get("entity") or []]
            try:
                user = _user_entity(entity)
                changes = {}
                for op in entry.get("ops") or []:
                    if op["key"] in changes:
                        raise QuotaError(f"{op['key']} is changed twice in one entry")
                    changes[op["key"]] = None if op["remove"] else op["value"]
                config = config.altered(user, changes)
            except QuotaError as error:
                results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(error), "entity": entity})
                continue
            results.append({"error_code": ErrorCode.NONE, "error_message": None, "entity": entity})
        if not body.get("validate_only") and config != self.quotas.config:
            try:
                self.quotas.apply(config)
            except OSError as error:
                log.error("could not store client quotas: %s", error)
                for result in results:
                    if result["error_code"] == ErrorCode.NONE:
                        result.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=f"the quotas could not be stored: {error}")
        return {"throttle_time_ms": 0, "entries": results}

    async def handle_describe(self, version: int, body: dict) -> dict:
        components = body.get("components") or []
        for component in components:
            if component["entity_type"] not in KNOWN_ENTITY_TYPES:
                return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "error_message": f"unknown entity type {component['entity_type']!r}", "entries": None}
            if component["match_type"] not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
                return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "error_message": f"unknown match type {component['match_type']}", "entries": None}
        entries = []
        for user, values in sorted(self.quotas.config.users.items(), key=lambda item: (item[0] is not None, item[0] or "")):
            if _matches(user, components, strict=body.get("strict", False)):
                entries.append({
                    "entity": [{"entity_type": USER, "entity_name": user}],
                    "values": [{"key": key, "value": value} for key, value in sorted(values.items())],
                })
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "entries": entries}


def _user_entity(entity: list[dict]) -> str | None:
    types = [part["entity_type"] for part in entity]
    if types != [USER]:
        if len(set(types)) != len(types):
            raise QuotaError("an entity names each entity type at most once")
        raise QuotaError(f"onceflow enforces user quotas only; the entity {{{', '.join(types) or 'nothing'}}} is not supported")
    return entity[0]["entity_name"]


def _matches(user: str | None, components: list[dict], *, strict: bool) -> bool:
    """Whether the entity {user: user} passes the filter (every component
    matches; ``strict``: and it has no entity type the filter does not name)."""
    for component in components:
        if component["entity_type"] != USER:
            return False  # our entities hold a user and nothing else
        if component["match_type"] == MATCH_EXACT and (user is None or component["match"] != user):
            return False
        if component["match_type"] == MATCH_DEFAULT and user is not None:
            return False
        if component["match_type"] == MATCH_ANY and user is None:
            return False  # "any specified name": the default is not a name
    return not strict or bool(components)


# -- the throttling layer --------------------------------------------------------------------------


def produced_bytes(body: dict) -> int:
    return sum(len(partition.get("records") or b"") for topic in body.get("topic_data") or [] for partition in topic.get("partition_data") or [])


def fetched_bytes(body: dict) -> int:
    return sum(len(partition.get("records") or b"") for topic in body.get("responses") or [] for partition in topic.get("partitions") or [])


class QuotaLayer:
    """Wraps a dispatcher: meters Produce and Fetch per user and sets
    ``throttle_time_ms`` in their answers (``broker.server`` mutes the
    connection for that long).

    Our server reads pipelined requests ahead (Kafka's reads one at a time
    per connection), and a user may have several connections: so a Produce
    or Fetch of a user still under a throttle also waits here for it to
    end before it is served. One user's traffic then keeps to its quota
    however many requests or connections carry it. A user's requests pass
    that wait one at a time, in the order they arrived."""

    def __init__(self, inner, quotas: ClientQuotas, *, clock):
        self._inner = inner
        self.quotas = quotas
        self._clock = clock  # () -> monotonic seconds
        # (key, user) -> its FIFO gate and how many requests hold or await it
        # (dropped at zero, so the map holds only users with requests in flight).
        self._gates: dict[tuple[str, str], list] = {}

    async def __call__(self, request, session):
        if not self._gates and self.quotas.idle:
            # No quota set, nobody throttled and no request at a gate: nothing
            # to meter or wait for, and nothing this request could overtake.
            return await self._inner(request, session)
        if request.api_key == ApiKey.PRODUCE:
            key = PRODUCER_BYTE_RATE
        elif request.api_key == ApiKey.FETCH:
            key = CONSUMER_BYTE_RATE
        else:
            return await self._inner(request, session)
        user = session.principal.name
        entry = self._gates.get((key, user))
        if entry is None:
            entry = self._gates[(key, user)] = [asyncio.Lock(), 0]
        gate = entry[0]
        entry[1] += 1
        # One request of a user at a time waits out its throttle, in the order
        # they arrived (the lock is FIFO): pipelined produces must reach the
        # log in the order they were sent, and their answers, written in
        # request order, must not wait behind one that keeps losing the race.
        try:
            async with gate:
                while (delay := self.quotas.delay(key, user, self._clock())) > 0:
                    await asyncio.sleep(delay)
                if key == PRODUCER_BYTE_RATE:
                    # Metered on arrival, as Kafka does, so the requests behind it see it.
                    throttle_ms = self.quotas.record(key, user, produced_bytes(request.body), self._clock())
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._gates[(key, user)]
        if key == PRODUCER_BYTE_RATE:
            # Started before the next request passes the gate (the lock hands
            # over through the event loop), so appends keep the arrival order.
            response = await self._inner(request, session)
        else:
            response = await self._inner(request, session)
            throttle_ms = 0 if response is None else self.quotas.record(key, user, fetched_bytes(response), self._clock())
        if throttle_ms and response is not None:
            response["throttle_time_ms"] = max(response.get("throttle_time_ms", 0), throttle_ms)
        return response
