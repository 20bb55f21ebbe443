"""``POST /v1/embeddings`` as OpenAI takes it and answers it: the request a batch line or a job carries, and the
embedding list the worker returns (docs/design/embeddings.md).

Field for field openai-python's ``types/embedding_create_params.py`` and ``create_embedding_response.py``, so the
official SDK parses what comes back. What this service does with each request field:

* ``input``: one string or a list of strings (at most ``MAX_EMBEDDING_INPUTS``, none empty), embedded one vector each,
  in order. Token arrays (a list of integers, or a list of them) are refused with a 400 naming ``input``: OpenAI's
  clients make them with OpenAI's tokenizer (tiktoken), whose ids mean other words in any model served here, so
  honouring them would silently embed the wrong text.
* ``encoding_format``: ``float`` (the default, as OpenAI's) or ``base64`` (the vector's float32 little-endian bytes,
  base64: what the SDK decodes with ``numpy.frombuffer(..., dtype="float32")``).
* ``dimensions``: honoured where the model was trained to be cut (Matryoshka); for another model only its own
  dimension is accepted, anything else is a 400 naming ``dimensions`` (the engine knows its model, so the worker
  refuses it: the line's 400, the job's failure reason).
* ``user``: accepted without effect, as on chat requests.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StringConstraints
from pydantic_core import PydanticCustomError

from async_inference import settings
from async_inference_client.models.base import StrictModel
from async_inference_client.models.embeddings import Embedding, EmbeddingList, EmbeddingUsage

EMBEDDINGS_ENDPOINT = "/v1/embeddings"
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of one request's input


def _no_token_arrays(value: Any) -> Any:
    """A token array (``[1, 2]`` or ``[[1, 2]]``) is refused by name, before the union reports a type error."""
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, int) or (isinstance(first, list) and (not first or isinstance(first[0], int))):
            raise PydanticCustomError(
                "token_array",
                "token arrays are not accepted: their ids come from OpenAI's tokenizer and mean other words to the "
                "model served here; send the text itself (a string or a list of strings)",
            )
    return value


EmbeddingText = Annotated[str, StringConstraints(min_length=1, max_length=settings.MAX_UPLOAD_BYTES)]


class EmbeddingRequest(StrictModel):
    """``POST /v1/embeddings``'s body (openai-python's ``EmbeddingCreateParams``)."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    input: Annotated[
        EmbeddingText | Annotated[list[EmbeddingText], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)],
        BeforeValidator(_no_token_arrays),
    ]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    user: Annotated[str, StringConstraints(max_length=256)] | None = None

    def canonical(self) -> dict[str, Any]:
        """The request as JobSubmission.fingerprint() digests it: every field, defaults filled in."""
        return self.model_dump(mode="json")

    @property
    def texts(self) -> list[str]:
        """The inputs, one per vector."""
        return [self.input] if isinstance(self.input, str) else list(self.input)


def encode_vector(vector: Sequence[float], encoding_format: str | None) -> list[float] | str:
    """A vector as the request asked: floats, or base64 of its float32 little-endian bytes."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return [float(x) for x in vector]


def decode_vector(data: list[float] | str) -> list[float]:
    """The floats of an ``embedding``, whichever encoding it came in."""
    return Embedding(index=0, embedding=data).vector()


def embedding_list(
    vectors: Sequence[Sequence[float]],
    *,
    model: str,
    prompt_tokens: int,
    encoding_format: str | None,
    job_id: str | None = None,
) -> EmbeddingList:
    """The embedding list for one request's vectors, in input order."""
    return EmbeddingList(
        data=[Embedding(index=i, embedding=encode_vector(v, encoding_format)) for i, v in enumerate(vectors)],
        model=model,
        usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        job_id=job_id,
    )
