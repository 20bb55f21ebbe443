"""The benchmarks' engine wrapper (bench.instruments.Timed) is the engine it wraps to the worker: every hook the worker calls
is passed through. It once kept ``texts_so_far`` to itself, so a streamed job's text reached its log only whole at
the end, and `make bench` reported 1.36 s of added time to first token that was the wrapper's."""

from __future__ import annotations

import asyncio

from async_inference.schemas import ChatCompletionRequest
from bench.instruments import Timed
from gpu_worker.engines.base import Engine, Generation
from gpu_worker.engines.echo import EchoEngine


class Midway(EchoEngine):
    """An engine with one request half-way through its answer."""

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        return ("Once upon",) if request_id == "job-1" else None

    def tokens_so_far(self, request_id: str) -> int | None:
        return 2 if request_id == "job-1" else None


def test_the_wrapper_shows_the_worker_what_the_engine_has_decoded_so_far():
    timed = Timed(Midway())
    assert (timed.texts_so_far("job-1"), timed.tokens_so_far("job-1")) == (("Once upon",), 2)
    assert (timed.texts_so_far("other"), timed.tokens_so_far("other")) == (None, None)


def test_the_wrapper_overrides_every_hook_an_engine_has():
    hooks = {name for name, value in vars(Engine).items() if callable(value) or isinstance(value, property)}
    hooks = {name for name in hooks if not name.startswith("_")}
    assert {name for name in hooks if getattr(Timed, name) is getattr(Engine, name)} == set()


def test_the_wrapper_times_a_generation_it_passes_through():
    timed = Timed(EchoEngine())
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi there"}], max_tokens=4)
    generation = asyncio.run(timed.generate("job-2", request))
    assert isinstance(generation, Generation) and "job-2" in timed.started
