"""Request traces in the Azure LLM inference trace format: TIMESTAMP, ContextTokens, GeneratedTokens."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_ROOT = Path(__file__).resolve().parents[2]
# shared/ sits beside the main checkout, and two levels up from a worktree.
SHARED_DATA = next(
    (p / "shared" / "data" for p in (_ROOT.parent, _ROOT.parent.parent) if (p / "shared").is_dir()),
    _ROOT.parent / "shared" / "data",
)
AZURE_CONVERSATION = SHARED_DATA / "AzureLLMInferenceTrace_conv_2023.csv"


@dataclass(frozen=True)
class Request:
    """One job of the trace: when it is submitted (seconds after the first) and its token counts."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


def _timestamp(text: str) -> dt.datetime:
    # The Azure traces carry 7 fractional digits; datetime takes at most 6.
    text = text.strip()
    if "." in text:
        head, fraction = text.split(".", 1)
        text = f"{head}.{fraction[:6]}"
    return dt.datetime.fromisoformat(text)


def load(path: Path) -> list[Request]:
    """The trace's requests in arrival order; a file without the three columns is refused, naming them."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
        rows = [(_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in reader]
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort(key=lambda row: row[0])
    start = rows[0][0]
    return [
        Request((stamp - start).total_seconds(), max(1, context), max(1, generated))
        for stamp, context, generated in rows
    ]


def embedding_requests(requests: list[Request], max_tokens: int) -> list[Request]:
    """The trace as an embedding fleet's jobs: the same arrivals, each input truncated to the model's ``max_tokens``
    (what an encoder embeds of it) and no output (an embedding is one prefill, no decode)."""
    return [
        dataclasses.replace(r, context_tokens=min(r.context_tokens, max_tokens), generated_tokens=0) for r in requests
    ]
