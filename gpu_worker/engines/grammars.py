"""The CPU engine's compiled grammars: one xgrammar grammar per output schema, compiled off the shared path.

A compile can take seconds; it must cost the other requests nothing but the CPU it uses. So:

- compiles run on one thread of their own (not the event loop's default pool, whose threads the decoding loop and the
  tokenizer use: several long compiles there left the decoding loop no thread), one at a time, with one compiler
  thread (xgrammar's default is 8, which on a small host takes every core from the decoding loop), at the lowest CPU
  priority (Linux schedules threads by their own nice value): a compile uses what the decoding loop leaves;
- no lock is held while compiling: the cache is read and written under a lock held for a dictionary lookup only;
- a compile has ``budget_s`` seconds: a request whose grammar is not ready by then fails with a
  ``PermanentEngineError`` naming the field, and its schema is remembered as too costly, so the same schema sent
  again fails at once instead of compiling again (a compile cannot be stopped midway: it finishes on its thread and
  is dropped);
- the cache keeps at most ``cache_bytes`` of compiled grammars (xgrammar's ``memory_size_bytes``), least recently
  used out first, and xgrammar's own cache, unbounded by default, is off.

Schemas over the size, depth, alternatives or pattern limits never get here (``gpu_worker.engines.schema_budget``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_worker.engines.base import PermanentEngineError

COMPILE_BUDGET_S = 5.0
GRAMMAR_CACHE_BYTES = 256 * 1024 * 1024
REFUSED_KEPT = 1024  # schemas remembered as over the budget


def _lowest_priority() -> None:
    """Run the calling thread at nice 19 (Linux: per thread; elsewhere, or not permitted, it keeps its priority)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class Grammars:
    """Compiled grammars by schema, for one tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        stop_token_ids: list[int],
        budget_s: float = COMPILE_BUDGET_S,
        cache_bytes: int = GRAMMAR_CACHE_BYTES,
    ) -> None:
        self._tokenizer_args = (tokenizer, vocab_size, stop_token_ids)
        self._compiler: Any = None  # made by the first compile, on the compile thread
        self.budget_s = budget_s
        self.cache_bytes = cache_bytes
        self._lock = threading.Lock()  # held for lookups and inserts only, never for a compile
        self._compiled: collections.OrderedDict[str, tuple[Any, int]] = collections.OrderedDict()
        self._refused: collections.OrderedDict[str, str] = collections.OrderedDict()  # schema -> why
        self._running: dict[str, asyncio.Future[Any]] = {}  # compiles in flight, shared by requests for one schema
        self._thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="grammar-compile", initializer=_lowest_priority
        )
        self.compiles = 0  # compiles started

    @staticmethod
    def key(schema: dict[str, Any]) -> str:
        return json.dumps(schema)  # not sorted: the grammar emits properties in the schema's order, as OpenAI does

    def cached(self, schema: dict[str, Any]) -> Any:
        """The grammar already compiled for ``schema``, or None."""
        key = self.key(schema)
        with self._lock:
            entry = self._compiled.get(key)
            if entry is None:
                return None
            self._compiled.move_to_end(key)
            return entry[0]

    async def get(self, schema: dict[str, Any], field: str) -> Any:
        """The compiled grammar for ``schema`` (``field`` of the request, named in errors), compiled within the
        budget; a ``PermanentEngineError`` when the schema cannot be compiled or not within the budget."""
        key = self.key(schema)
        compiled = self.cached(schema)
        if compiled is not None:
            return compiled
        why = self._refused.get(key)
        if why is not None:
            raise PermanentEngineError(f"{field}: {why}")
        running = self._running.get(key)
        if running is None:
            self.compiles += 1
            running = asyncio.wrap_future(self._thread.submit(self._compile, key))
            self._running[key] = running
            running.add_done_callback(lambda _: self._running.pop(key, None))
        try:
            # shield: a request that gives up leaves the compile to the others waiting for it (and to the cache)
            return await asyncio.wait_for(asyncio.shield(running), timeout=self.budget_s)
        except TimeoutError:
            why = (
                f"the schema's grammar did not compile within {self.budget_s:g} s, this deployment's budget; "
                "simplify the schema (fewer alternatives or patterns, less nesting)"
            )
            self._refuse(key, why)
            raise PermanentEngineError(f"{field}: {why}") from None
        except (RuntimeError, ValueError) as exc:  # xgrammar's errors for schemas it cannot take
            why = f"the schema cannot be compiled to a grammar: {exc}"
            self._refuse(key, why)
            raise PermanentEngineError(f"{field}: {why}") from exc

    def _refuse(self, key: str, why: str) -> None:
        self._refused[key] = why
        if len(self._refused) > REFUSED_KEPT:
            self._refused.popitem(last=False)

    def _compile(self, key: str) -> Any:
        """On the compile thread: compile, and cache what compiled (even once its requests gave up on it)."""
        import xgrammar as xgr

        if self._compiler is None:
            tokenizer, vocab_size, stop_token_ids = self._tokenizer_args
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        # Compact JSON (no free whitespace between tokens): a small model left free to emit whitespace can emit it
        # until max_tokens. Strict mode: no properties beyond the schema's, as OpenAI's strict structured outputs.
        compiled = self._compiler.compile_json_schema(key, any_whitespace=False, strict_mode=True)
        size = int(getattr(compiled, "memory_size_bytes", 0))
        with self._lock:
            self._compiled[key] = (compiled, size)
            while len(self._compiled) > 1 and sum(s for _, s in self._compiled.values()) > self.cache_bytes:
                self._compiled.popitem(last=False)
        return compiled

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
