"""The fsync rounds on a client's path: which requests waited for some write
to become durable before their answer.

A client's operation (a transaction, a produce request) takes as long as
the rounds it waits for one after another, so the broker counts, per
request, whether its answer waited for a durability future that was not
yet done: a transactional Produce (its batch, and the once-appended
AddPartitions record it stands for), a TxnOffsetCommit, InitProducerId, the
decision of an EndTxn. The handlers mark each such wait with
``note_durability_wait``; the measuring layer (``broker.metrics.MeasuredDispatch``)
opens a ``RequestWait`` per request (``measure``) and counts the request
once if any mark landed (``onceflow_requests_waited_fsync_total``). What a
request's own task starts inherits the cell (the coordinator's state
changes run as its tasks); what follows the answer (markers, Complete)
does not mark. With no measuring layer (no ``--metrics``) a mark is one
context lookup.
"""

from __future__ import annotations

import asyncio
import contextvars

import attrs


@attrs.define
class RequestWait:
    """Whether the request being handled waited for an fsync."""

    waited: bool = False


_CURRENT: contextvars.ContextVar[RequestWait | None] = contextvars.ContextVar("client_fsync_wait", default=None)


def measure() -> tuple[RequestWait, contextvars.Token]:
    """Open the cell of the request about to be handled (reset the token after it)."""
    cell = RequestWait()
    return cell, _CURRENT.set(cell)


def finish(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def note_durability_wait(durable) -> None:
    """The request being handled will wait for ``durable`` (a durability
    future, or an awaitable of one) before it answers; a future already
    done (nothing left to fsync, or ``flush.policy=os``) is no round."""
    cell = _CURRENT.get()
    if cell is not None and not (isinstance(durable, asyncio.Future) and durable.done()):
        cell.waited = True
