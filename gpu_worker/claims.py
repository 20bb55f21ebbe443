"""What the worker holds: a queue message, parsed once into the claim it carries, and what became of it.

A message on either lane's queue carries one claim of some kind: a job's ``ClaimCheck``, a batch chunk's
``ChunkClaimCheck``, an embeddings job's ``EmbeddingClaimCheck`` (its payload is an embeddings request). ``parse_claim`` reads a body
once into the one discriminated union ``Claim`` (the ``kind`` field; a body without one is a job's claim check, as
every producer wrote them before there were kinds); a new kind is one more member of ``Claim`` and one more handler in
``gpu_worker.runner``. Nothing else in the worker parses a body.

The runner takes a claim to its final state and says what the pump must do with its message (``Outcome``): delete it,
make it visible again after some seconds, leave it as it is, or hand it back at once. Only the pump
(``gpu_worker.worker``) acts on the queue, as the webhook dispatcher's caller does with its ``Outcome``.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Discriminator, Tag, TypeAdapter, ValidationError

from async_inference.aws import QueueMessage
from async_inference.schemas import ChunkClaimCheck, ClaimCheck, EmbeddingClaimCheck

logger = logging.getLogger("gpu_worker.claims")

JOB = "job"
BATCH_CHUNK = "batch_chunk"
EMBEDDING = "embedding"


def _kind(value: Any) -> str | None:
    """The union's tag: a body's ``kind``, ``job`` when it has none (claim checks carry no kind)."""
    if isinstance(value, dict):
        return value.get("kind", JOB)
    return getattr(value, "kind", JOB)


# One member per kind of claim; a new kind is one more line here (and its handler in gpu_worker.runner).
Claim = Annotated[
    Annotated[ClaimCheck, Tag(JOB)]
    | Annotated[ChunkClaimCheck, Tag(BATCH_CHUNK)]
    | Annotated[EmbeddingClaimCheck, Tag(EMBEDDING)],
    Discriminator(_kind),
]
KINDS = frozenset({JOB, BATCH_CHUNK, EMBEDDING})
_ADAPTER: TypeAdapter[ClaimCheck | ChunkClaimCheck] = TypeAdapter(Claim)


class UnknownKind(ValueError):
    """A body of a kind this worker does not know: a newer producer's, during a rolling deploy."""


def parse_claim(body: str) -> ClaimCheck | ChunkClaimCheck:
    """The claim a queue body carries. ``UnknownKind`` for a kind this worker does not run (another worker may);
    ``ValueError`` for a body that is no claim at all (poison)."""
    try:
        return _ADAPTER.validate_json(body)
    except ValidationError as exc:
        kind = _kind_of_json(body)
        if kind is not None and kind not in KINDS:
            raise UnknownKind(f"claim kind {kind!r} is not one of {sorted(KINDS)}") from None
        raise ValueError(str(exc)) from None


def _kind_of_json(body: str) -> str | None:
    # Only on the error path: a valid body is parsed once, above.
    try:
        value = json.loads(body)
    except ValueError:
        return None
    kind = _kind(value) if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def ident(claim: ClaimCheck | ChunkClaimCheck) -> str:
    """The claim's identity in logs, faults and duplicate checks: a job id, or ``batch_id/chunk``."""
    if isinstance(claim, ChunkClaimCheck):
        return f"{claim.batch_id}/{claim.chunk}"
    return claim.job_id


def engine_requests(claim: ClaimCheck | ChunkClaimCheck | None) -> int:
    """Engine requests a claim stands for: a chunk's lines, else 1."""
    return claim.line_count if isinstance(claim, ChunkClaimCheck) else 1


# --- what the runner decides ----------------------------------------------------------------------------------------


class Action(str, enum.Enum):
    DELETE = "delete"  # done with: its effects are stored
    RETRY = "retry"  # visible again after ``retry_in_s`` (a transient or infrastructure fault)
    LEAVE = "leave"  # untouched: it returns after its visibility timeout (a copy of a claim running elsewhere)
    HAND_BACK = "hand_back"  # visible again at once: this worker cannot run it (its engine died)
    # Sent again as a new message, hidden ``retry_in_s``, the received one deleted: declined by this worker though
    # nothing is wrong with it, so it must not spend one of the receives that lead to the dead-letter queue
    REQUEUE = "requeue"


@dataclass(frozen=True)
class Outcome:
    """What the pump does with a claim's message once the runner is done with it."""

    action: Action
    retry_in_s: int = 0
    reason: str = ""

    @classmethod
    def delete(cls, reason: str = "") -> Outcome:
        return cls(Action.DELETE, reason=reason)

    @classmethod
    def retry(cls, after_s: int, reason: str = "") -> Outcome:
        return cls(Action.RETRY, retry_in_s=max(0, int(after_s)), reason=reason)

    @classmethod
    def leave(cls, reason: str = "") -> Outcome:
        return cls(Action.LEAVE, reason=reason)

    @classmethod
    def requeue(cls, after_s: int, reason: str = "") -> Outcome:
        return cls(Action.REQUEUE, retry_in_s=max(0, int(after_s)), reason=reason)

    @classmethod
    def hand_back(cls, reason: str = "") -> Outcome:
        return cls(Action.HAND_BACK, reason=reason)


# --- a held message -------------------------------------------------------------------------------------------------


@dataclass
class InFlight:
    """A message the worker holds, the claim it carries (None: poison, or of an unknown kind) and its run's state."""

    message: QueueMessage
    claim: ClaimCheck | ChunkClaimCheck | None = None
    lane: str = "interactive"
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    in_engine: bool = False  # waiting for an engine slot or generating (the batch budget reads it)
    protect: bool = False  # a job that could outlast the drain (task_protection "long_jobs")
    started: float = 0.0  # time.monotonic() when its generation began
    running: bool = False  # the runner has it (not a duplicate left alone)
    leased: bool = False  # its job is running here under this worker's lease (renewed by the heartbeat)
    lease_renewed: float = 0.0  # time.monotonic() when the lease was last taken or renewed

    @property
    def lines(self) -> int:
        return engine_requests(self.claim)

    @property
    def rows(self) -> int:
        """The engine rows its claim says its request takes (one for a claim that does not say)."""
        return self.claim.rows if isinstance(self.claim, ClaimCheck) else 1

    @property
    def ident(self) -> str:
        return ident(self.claim) if self.claim is not None else self.message.message_id

    @property
    def job_id(self) -> str | None:
        return self.claim.job_id if isinstance(self.claim, ClaimCheck) else None

    @property
    def tenant(self) -> str | None:
        return self.claim.tenant if self.claim is not None else None

    @property
    def receive_count(self) -> int:
        return self.message.receive_count
