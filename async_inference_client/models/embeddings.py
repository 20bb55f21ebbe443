"""The result of an embeddings job: OpenAI's embedding list (openai-python's ``CreateEmbeddingResponse``), which a
job submitted with ``endpoint="/v1/embeddings"`` leaves at its result URL, and a batch line's response body."""

from __future__ import annotations

import base64
import struct
from typing import Literal

from pydantic import BaseModel


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a str: base64 of float32 little-endian (``encoding_format: "base64"``)

    def vector(self) -> list[float]:
        """The floats, whichever encoding they came in."""
        if isinstance(self.embedding, str):
            raw = base64.b64decode(self.embedding)
            return list(struct.unpack(f"<{len(raw) // 4}f", raw))
        return list(self.embedding)


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """OpenAI's ``CreateEmbeddingResponse``: a job's result object and a batch line's response body. ``job_id`` is set
    on a job's result only, as on a chat.completion."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    job_id: str | None = None
