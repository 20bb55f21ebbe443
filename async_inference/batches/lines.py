"""A batch line's id (``batch_req_...``), derived the same way by the worker that runs a line and by the DLQ handler
that ends a chunk no worker could run, so a line has one id whoever wrote it."""

from __future__ import annotations

import hashlib


def line_id(batch_id: str, custom_id: str) -> str:
    """A line's id: derived from the batch and custom_id, so a redelivered chunk reuses it."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}\n{custom_id}".encode()).hexdigest()[:32]
