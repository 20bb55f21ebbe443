"""``make bench-attacks``: what each attack of issue 30 costs another tenant, as the other tenant's job time under
attack over its time alone (goal: at most 2x).

In one process, on the CPU engine (SmolLM2-135M) behind the worker's admission (``gpu_worker.lanes.Admission``, the
rows and the fair order the worker uses), not through the local stack: what is measured is what one accepted request
costs the engine every tenant shares, which the queue, S3 and DynamoDB in front of it do not change. The victim is
tenant B's 8-token greedy job; each attack is tenant A's, started just before it:

- grammar: A's 1,600-pattern schema (90 KB), then four fresh schemas at the pattern limit, while B runs a plain and a
  constrained job; beside it, as a reference and not an attack, B's job beside the same four requests without schemas;
- template: A's own chat template looping 15k x 100k times;
- tokenize: ``chat_template_kwargs: {"tokenize": true}`` (the job must fail as the client's, at once);
- huge_prompt: a 15 MB prompt;
- rows: 40 jobs of A with ``n: 8`` (320 rows on an engine of 8), each 32 tokens;
- webhook: not the engine: A's receivers (one for each event) drip one header line a second; B's webhook, queued
  behind 20 of A's events in batches of 10 delivered at once (the dispatcher Lambda), arrives this many seconds after
  it would alone.

``--only rows,template`` runs only the attacks named (``--webhooks-only``: the webhook's alone).

Prints one line per attack and ends with one JSON object: ``{attack: ratio}`` (and the webhook's delay in seconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import EngineError
from gpu_worker.engines.cpu import CpuEngine
from gpu_worker.lanes import INTERACTIVE, Admission

CAPACITY = 8
LOOPING_TEMPLATE = "{% for i in range(15000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


def chat(text: str, **body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": text}], "temperature": 0, **body}
    )


def unchecked(**fields: Any) -> ChatCompletionRequest:
    """A request of tenant A's with ``fields`` set past the request model's validation."""
    return chat("x", max_tokens=8).model_copy(update=fields)


def patterned(branches: int, salt: str = "") -> dict[str, Any]:
    patterns = [{"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}{salt}x{i}[0-9]+$"} for i in range(branches)]
    return {"type": "object", "properties": {"v": {"anyOf": patterns}}, "required": ["v"]}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


class Bench:
    def __init__(self, engine: CpuEngine) -> None:
        self.engine = engine
        self.admission = Admission(CAPACITY, reserve=0, abort=engine.abort)
        self.ids = 0

    async def job(self, tenant: str, request: ChatCompletionRequest) -> float:
        """One job through the admission and the engine: its seconds (an engine error is an ending too)."""
        self.ids += 1
        request_id = f"{tenant}-{self.ids}"
        started = time.monotonic()
        async with self.admission.slot(
            INTERACTIVE, request_id, tenant=tenant, rows=request.n or 1, max_tokens=request.max_tokens
        ):
            try:
                await self.engine.generate(request_id, request)
            except EngineError:
                pass
        return time.monotonic() - started

    async def victim(self) -> float:
        return await self.job("b", chat("What is the capital of France?", max_tokens=8))

    async def under(self, attack: Callable[[], list[Awaitable[Any]]], victim: Callable[[], Awaitable[float]]) -> float:
        """The victim's seconds with the attack's jobs started just before it."""
        attacks = [asyncio.ensure_future(a) for a in attack()]
        await asyncio.sleep(0.05)
        took = await victim()
        for task in attacks:
            task.cancel()
        await asyncio.gather(*attacks, return_exceptions=True)
        return took


async def engine_attacks(engine: CpuEngine) -> dict[str, float]:
    bench = Bench(engine)
    constrained = chat("Give a value.", max_tokens=8, response_format=schema_format({"type": "object"}))
    await bench.victim()  # warm up: the first prefill and the grammar compiler
    await bench.job("b", constrained)

    async def alone(victim: Callable[[], Awaitable[float]]) -> float:
        # Measured just before each attack, the median of three: the host is shared, its speed drifts.
        return statistics.median([await victim() for _ in range(3)])

    def grammar() -> list[Awaitable[Any]]:
        big = [bench.job("a", chat("x", max_tokens=8, response_format=schema_format(patterned(1600))))]
        at_limit = [
            bench.job("a", chat("x", max_tokens=8, response_format=schema_format(patterned(64, f"{bench.ids}s{i}"))))
            for i in range(4)
        ]
        return big + at_limit

    attacks: dict[str, Callable[[], list[Awaitable[Any]]]] = {
        "grammar": grammar,
        # The request model refuses these two at the API (a 400): set past its validation, as a payload that did not
        # come through the API would reach the worker, they test the engine's own refusal.
        "template": lambda: [bench.job("a", unchecked(chat_template_kwargs={"chat_template": LOOPING_TEMPLATE}))],
        "tokenize": lambda: [bench.job("a", unchecked(chat_template_kwargs={"tokenize": True}))],
        "huge_prompt": lambda: [bench.job("a", chat("word " * 3_000_000, max_tokens=8))],
        "rows": lambda: [bench.job("a", chat(f"Count to {i}.", max_tokens=32, n=8, temperature=1)) for i in range(40)],
    }
    victims: dict[str, Callable[[], Awaitable[float]]] = {
        "plain": bench.victim,
        "constrained": lambda: bench.job("b", constrained),
    }
    # Not an attack: four of A's ordinary 8-token requests, as the grammar attack's four but without their schemas. What
    # sharing the engine costs B in itself (on two cores one row's step takes about 0.028 s, eight rows' 0.053 s),
    # printed beside the grammar attack so that what the schemas add shows apart from it; not held to the 2x goal.
    references: dict[str, Callable[[], list[Awaitable[Any]]]] = {
        "grammar": lambda: [bench.job("a", chat(f"x{bench.ids}s{i}", max_tokens=8)) for i in range(4)],
    }
    ratios: dict[str, float] = {}
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(attacks)
    for name, attack in attacks.items():
        if name not in only:
            continue
        for kind in ("plain", "constrained") if name == "grammar" else ("plain",):
            label = name if kind == "plain" else f"{name}_{kind}"
            base = await alone(victims[kind])
            took = await bench.under(attack, victims[kind])
            ratios[label] = round(took / base, 2)
            print(f"{label}: {took:.2f} s under attack, {base:.2f} s alone: {ratios[label]}x", flush=True)
            if name in references:
                loaded = await bench.under(references[name], victims[kind])
                print(
                    f"  {label}, reference: {loaded:.2f} s beside four of A's requests without schemas (ordinary load, "
                    f"not an attack): {loaded / base:.2f}x",
                    flush=True,
                )
    return ratios


# --- Webhooks -------------------------------------------------------------------------------------------------------


def dripping_receiver(stop: threading.Event) -> int:
    """A receiver that answers each POST with one header line a second, for a minute."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)

    def answer(connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                for i in range(60):
                    if stop.wait(1):
                        return
                    connection.sendall(f"X-Drip-{i}: 1\r\n".encode())
            except OSError:
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(connection,), daemon=True).start()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


class _Jobs:
    """The dispatcher's job table, in memory: one job per event, each with its webhook."""

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}

    def get(self, job_id: str) -> Any:
        return self.jobs.get(job_id)

    def record_webhook_attempt(self, job_id: str, attempt: dict[str, Any], *, status: str | None = None) -> bool:
        return True


def webhook_delay_s() -> float:
    """Seconds B's webhook arrives after its batch starts: 20 of A's events for dripping receivers ahead of it,
    through the dispatcher, in batches of 10 delivered at once, one batch after the other (an invocation ends with its
    slowest delivery)."""
    import datetime as dt

    from async_inference.jobs import JobStatus
    from async_inference.schemas import Job, ResultNotification, Timings, WebhookState, utcnow
    from async_inference.webhooks.dispatch import Dispatcher
    from async_inference.webhooks.secrets import TenantSecrets
    from async_inference.webhooks.signing import new_secret

    stop = threading.Event()
    # One receiver for each of A's events (a tenant names what host and port it likes): paused one by one, each would
    # hold a batch for a whole deadline.
    slow_ports = [dripping_receiver(stop) for _ in range(20)]
    fast = socket.create_server(("127.0.0.1", 0))
    fast_port = fast.getsockname()[1]
    delivered: list[float] = []

    def fast_serve() -> None:
        connection, _ = fast.accept()
        with connection:
            connection.recv(65536)
            delivered.append(time.monotonic())
            connection.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=fast_serve, daemon=True).start()
    store, secret, now = _Jobs(), new_secret(), utcnow()

    def event(n: int, tenant: str, port: int) -> str:
        job = Job(
            job_id=f"job_{n:032x}", tenant=tenant, status=JobStatus.SUCCEEDED, created_at=now, updated_at=now,
            request_bucket="b", request_key="k", deadline=now + dt.timedelta(hours=1), timeout_s=60, attempts=1,
            webhook=WebhookState(url=f"http://127.0.0.1:{port}/in", events=["completed"]),
        )  # fmt: skip
        store.jobs[job.job_id] = job
        return ResultNotification(
            job_id=job.job_id, tenant=tenant, status=job.status, timings=Timings(created_at=now)
        ).model_dump_json(exclude_none=True)

    dispatcher = Dispatcher(store=store, secrets=TenantSecrets({"a": secret, "b": secret}.get), allow_local=True)
    events = [event(i, "a", port) for i, port in enumerate(slow_ports)] + [event(20, "b", fast_port)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        for first in range(0, len(events), 10):
            list(pool.map(lambda body: dispatcher.dispatch(body, 1), events[first : first + 10]))
    stop.set()
    fast.close()
    return round(delivered[0] - started, 2) if delivered else float("inf")


async def engine_bench() -> dict[str, float]:
    engine = CpuEngine(capacity=CAPACITY)
    await engine.start()
    try:
        return await engine_attacks(engine)
    finally:
        await engine.close()


def main() -> int:
    ratios = asyncio.run(engine_bench()) if "--webhooks-only" not in sys.argv else {}
    delay = webhook_delay_s()
    print(f"webhook: B's webhook {delay} s late behind 20 events for 20 dripping receivers", flush=True)
    print(json.dumps({**ratios, "webhook_delay_s": delay}))
    return 0 if all(r <= 2 for r in ratios.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
