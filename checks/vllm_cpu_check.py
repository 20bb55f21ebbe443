"""Run the VllmEngine adapter, then the real worker, on the real vLLM engine on this machine's CPU.

    bash checks/vllm_cpu_setup.sh && .venv-vllm/bin/python -m checks.vllm_cpu_check  (make vllm-cpu-check)

Part 1, the adapter, on SmolLM2-135M-Instruct in float32 (the CPU engine's cached copy, so both engines run the same
weights), checks that:
  - greedy output equals the CPU engine's (transformers) greedy output for the same prompts;
  - a seeded sampled request is reproducible, another seed gives another text;
  - max_tokens ends a request with finish_reason "length" and exactly max_tokens completion tokens;
  - a stop string ends it with "stop" and is not in the text;
  - usage: prompt_tokens is the chat template's token count, completion_tokens counts the end token;
  - a prompt too long for the context is refused before it reaches vLLM;
  - aborting an in-flight request makes its generate raise GenerationAborted at once;
  - the OpenAI parameters, through vLLM's own OpenAI layer: response_format json_schema (the content validates),
    a forced tool call (named, required, legacy function_call: the call names the function and its arguments
    validate), logprobs with top_logprobs (every token has that many alternatives), n choices.
Part 2 (skip with --no-worker) starts the local stack (moto server, API, pollers) with one worker process running
ENGINE=vllm and serving the model as SmolLM2-135M-Instruct (the stack's served models say so: the template's default
model is another), submits jobs through the HTTP API and checks their results against the same greedy texts, and a
json_schema, a forced tool call, a logprobs and an n job.

Part 3 (``--no-embedding`` skips it, ``--embedding-only`` runs it alone) runs the embedding model on vLLM's pooling
runner (``checks.vllm_cpu_embedding_check``).

Prints one line per check and exits 1 if any failed. vLLM spawns its engine in a child process that re-imports this
module: everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# vllm-cpu settings, before vllm is imported: 1 GiB of KV cache is plenty for a 135M model and a few sequences.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

import jsonschema  # noqa: E402

from async_inference.schemas import ChatCompletionRequest  # noqa: E402
from gpu_worker.completions import chat_completion  # noqa: E402
from gpu_worker.engines.base import Generation, GenerationAborted, PromptTooLongError  # noqa: E402

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
GREEDY_TOKENS = 32
PROMPTS = [
    "What is the capital of France?",
    "Name three colours.",
    "Write a haiku about the sea.",
    "Who wrote Hamlet? Answer briefly.",
]
SERVED_NAME = "SmolLM2-135M-Instruct"
# On the CPU backend gpu_memory_utilization is the share of the node's memory that must be free at start (0.92 by
# default): on a shared machine it is not, and the engine refuses to start; the KV cache is VLLM_CPU_KVCACHE_SPACE.
MEMORY_UTILIZATION = 0.2
ENGINE_OPTIONS = {
    "gpu_memory_utilization": MEMORY_UTILIZATION,
    "max_model_len": MAX_MODEL_LEN,
    "max_num_seqs": MAX_NUM_SEQS,
    "enforce_eager": True,
    "dtype": "float32",
    "served_model_name": SERVED_NAME,
    "tool_call_parser": "hermes",
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
# The new parameters: (name, request body fields); each result is checked by check_parameters.
PARAMETER_CASES = [
    (
        "response_format json_schema",
        {
            "messages": [{"role": "user", "content": "Describe a person as JSON with name, age and city."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        },
    ),
    # Any object: a short one asked for, and room to close it (an open-ended object from a 135M model can run past
    # any limit, and a cut object is the documented answer at the limit, not a defect).
    (
        "response_format json_object",
        {
            "messages": [
                {"role": "user", "content": "Reply with a JSON object with one key, colour, naming a colour."}
            ],
            "response_format": {"type": "json_object"},
            "max_tokens": 256,
        },
    ),
    (
        "tool_choice named function",
        {
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ),
    # One call: with parallel calls allowed a small model chains calls until max_tokens (seen on vLLM).
    (
        "tool_choice required",
        {
            "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
    ),
    (
        "legacy function_call",
        {
            "messages": [{"role": "user", "content": "What is the weather in Rome?"}],
            "functions": [t["function"] for t in TOOLS],
            "function_call": {"name": "get_weather"},
        },
    ),
    (
        "logprobs top_logprobs=3",
        {"messages": [{"role": "user", "content": PROMPTS[0]}], "logprobs": True, "top_logprobs": 3},
    ),
    ("n=3", {"messages": [{"role": "user", "content": "Name a colour."}], "n": 3, "temperature": 1.0, "seed": 7}),
]


@dataclass
class Result:
    name: str
    ok: bool
    detail: str = ""


results: list[Result] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append(Result(name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  -- ' + detail if detail else ''}", flush=True)


def chat(text: str, **kw) -> ChatCompletionRequest:
    kw.setdefault("temperature", 0.0)
    return ChatCompletionRequest(model=SERVED_NAME, messages=[{"role": "user", "content": text}], **kw)


def parameter_request(fields: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": SERVED_NAME, "max_tokens": 96, "temperature": 0, **fields})


def check_parameters(where: str, name: str, fields: dict, completion) -> None:
    """The chat.completion (``async_inference.schemas.ChatCompletion``) for one of PARAMETER_CASES honours it."""
    choices = completion.choices
    first = choices[0]
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    try:
        if "response_format" in fields:
            value = json.loads(first.message.content)
            jsonschema.validate(
                value, fields["response_format"].get("json_schema", {}).get("schema", {"type": "object"})
            )
            ok, detail = first.finish_reason == "stop" and isinstance(value, dict), first.message.content
        elif "tools" in fields:
            calls = first.message.tool_calls or []
            wanted = fields["tool_choice"]
            for call in calls:
                jsonschema.validate(json.loads(call.function.arguments), functions[call.function.name])
            named = not isinstance(wanted, dict) or all(c.function.name == wanted["function"]["name"] for c in calls)
            ok = bool(calls) and named and first.finish_reason == "tool_calls"
            detail = f"{first.finish_reason}: {[(c.function.name, c.function.arguments) for c in calls]}"
            if not ok:  # what the model wrote (the text a tool-call parser could not read)
                detail += f", content {first.message.content!r}"
        elif "functions" in fields:
            call = first.message.function_call
            ok = call is not None and call.name == "get_weather" and first.finish_reason == "function_call"
            if ok:
                jsonschema.validate(json.loads(call.arguments), WEATHER)
            detail = f"{first.finish_reason}: {call}"
        elif fields.get("logprobs"):
            content = first.logprobs.content if first.logprobs else []
            ok = len(content) == completion.usage.completion_tokens and all(
                len(t.top_logprobs) == fields["top_logprobs"] for t in content
            )
            detail = f"{len(content)} tokens, first {content[0].model_dump() if content else None}"
        else:
            ok = len(choices) == fields["n"] and [c.index for c in choices] == list(range(fields["n"]))
            detail = repr([c.message.content for c in choices])
    except Exception as exc:  # a JSON or schema error: the check failed, say how
        ok, detail = False, f"{type(exc).__name__}: {exc}; choice {first.model_dump()}"
    check(f"{where}: {name}", ok, detail[:400])


# --- Reference: the CPU engine (transformers) -----------------------------------------------------------------------


async def reference_greedy(model_dir: Path) -> list[Generation]:
    from gpu_worker.engines.cpu import CpuEngine

    engine = CpuEngine(model=str(model_dir), capacity=len(PROMPTS), max_model_len=MAX_MODEL_LEN)
    await engine.start()
    try:
        return list(
            await asyncio.gather(
                *(engine.generate(f"ref-{i}", chat(p, max_tokens=GREEDY_TOKENS)) for i, p in enumerate(PROMPTS))
            )
        )
    finally:
        await engine.close()


# --- Part 1: the adapter --------------------------------------------------------------------------------------------


async def check_adapter(model_dir: Path, expected: list[Generation]) -> None:
    from gpu_worker.engines.vllm_engine import VllmEngine

    started = time.monotonic()
    engine = VllmEngine(model=str(model_dir), **ENGINE_OPTIONS)
    await engine.start()
    print(f"vLLM engine started in {time.monotonic() - started:.1f} s", flush=True)
    try:
        # Greedy, all prompts at once (vLLM batches them).
        t0 = time.monotonic()
        greedy = await asyncio.gather(
            *(engine.generate(f"greedy-{i}", chat(p, max_tokens=GREEDY_TOKENS)) for i, p in enumerate(PROMPTS))
        )
        elapsed = time.monotonic() - t0
        tokens = sum(g.completion_tokens for g in greedy)
        print(f"vLLM greedy batch: {tokens} tokens in {elapsed:.2f} s = {tokens / elapsed:.1f} tokens/s", flush=True)
        for prompt, got, want in zip(PROMPTS, greedy, expected, strict=False):
            check(
                f"greedy equals transformers: {prompt!r}",
                got.text == want.text and got.finish_reason == want.finish_reason,
                f"vllm={got.text!r} ({got.finish_reason}) transformers={want.text!r} ({want.finish_reason})",
            )

        # Seeds: the same seed twice, with different batch mates; another seed.
        story = "Tell me a story about a cat."
        first = await engine.generate("seed-1", chat(story, temperature=1.0, seed=1234, max_tokens=24))
        second, *_ = await asyncio.gather(
            engine.generate("seed-2", chat(story, temperature=1.0, seed=1234, max_tokens=24)),
            *(engine.generate(f"mate-{i}", chat(f"Count to {i + 3}.", temperature=0.8)) for i in range(3)),
        )
        other = await engine.generate("seed-3", chat(story, temperature=1.0, seed=99, max_tokens=24))
        check("seeded sampling is reproducible", first.text == second.text, f"{first.text!r} / {second.text!r}")
        check("another seed gives another text", other.text != first.text, f"{other.text!r}")

        length = await engine.generate("length", chat("Write a long story about a dragon.", max_tokens=5))
        check(
            "max_tokens -> finish_reason length",
            length.finish_reason == "length" and length.completion_tokens == 5,
            f"{length.finish_reason}, {length.completion_tokens} tokens",
        )

        stop = await engine.generate("stop", chat(PROMPTS[0], max_tokens=GREEDY_TOKENS, stop=[" is"]))
        check("stop string trimmed", (stop.text, stop.finish_reason) == ("The capital of France", "stop"), repr(stop))

        from transformers import AutoTokenizer

        from gpu_worker.engines.common import chat_prompt_ids

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        want_prompt = len(chat_prompt_ids(tokenizer, chat(PROMPTS[0])))
        want_completion = len(tokenizer.encode(greedy[0].text, add_special_tokens=False)) + 1  # + the end token
        check(
            "usage",
            (greedy[0].prompt_tokens, greedy[0].completion_tokens) == (want_prompt, want_completion),
            f"prompt {greedy[0].prompt_tokens} (want {want_prompt}), "
            f"completion {greedy[0].completion_tokens} (want {want_completion})",
        )

        try:
            await engine.generate("too-long", chat("word " * 2100, max_tokens=16))
            check("prompt too long refused", False, "no error")
        except PromptTooLongError as exc:
            check("prompt too long refused", True, str(exc))

        essay = chat("Write a long essay on rivers.", temperature=1.0, seed=1, max_tokens=1000)
        task = asyncio.create_task(engine.generate("abort-me", essay))
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await engine.abort("abort-me")
        try:
            outcome = f"returned {await asyncio.wait_for(task, 30)!r}"
            aborted = False
        except GenerationAborted:
            outcome, aborted = f"GenerationAborted after {time.monotonic() - t0:.2f} s", True
        check("abort of an in-flight request raises GenerationAborted", aborted, outcome)

        for i, (name, fields) in enumerate(PARAMETER_CASES):
            generation = await engine.generate(f"param-{i}", parameter_request(fields))
            check_parameters(
                "adapter", name, fields, chat_completion(generation, completion_id="chatcmpl-x", model=SERVED_NAME)
            )
    finally:
        await engine.close()


# --- Part 2: the worker on the local stack --------------------------------------------------------------------------


def check_worker(model_dir: Path, expected: list[Generation]) -> None:
    try:
        from async_inference_client import Client
        from local_runtime.moto_server import free_port
        from local_runtime.stack import LocalDeployment
    except ImportError as exc:
        check("worker on the local stack", False, f"local_runtime is not importable here: {exc}")
        return

    worker_env = {
        "MODEL": str(model_dir),
        "MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "MAX_NUM_SEQS": str(MAX_NUM_SEQS),
        "SERVED_MODEL_NAME": SERVED_NAME,
        "GPU_MEMORY_UTILIZATION": str(MEMORY_UTILIZATION),
        "TOOL_CALL_PARSER": "hermes",
        "ENFORCE_EAGER": "1",
        "DTYPE": "float32",
        "RECEIVE_WAIT_S": "1",
        "LOG_LEVEL": "INFO",
    }
    log_path = Path(tempfile.mkdtemp(prefix="vllm-cpu-check-")) / "worker.log"
    with open(log_path, "ab") as log:
        stack = LocalDeployment(
            api_port=free_port(),
            moto_port=free_port(),
            workers=1,
            engine="vllm",
            worker_env=worker_env,
            worker_log=log,
            served_models=(SERVED_NAME,),
        )
        stack.start()
        try:
            key = next(iter(stack.api_keys))
            api = Client(stack.api_url, key)
            started = time.monotonic()
            jobs = [
                api.submit(
                    {
                        "model": SERVED_NAME,
                        "messages": [{"role": "user", "content": p}],
                        "max_tokens": GREEDY_TOKENS,
                        "temperature": 0,
                    }
                )
                for p in PROMPTS
            ]
            stop_job = api.submit(
                {
                    "model": SERVED_NAME,
                    "temperature": 0,
                    "stop": [" is"],
                    "messages": [{"role": "user", "content": PROMPTS[0]}],
                    "max_tokens": GREEDY_TOKENS,
                }
            )
            parameter_jobs = [
                api.submit(parameter_request(fields).model_dump(mode="json", exclude_none=True))
                for _, fields in PARAMETER_CASES
            ]
            finals = [api.wait(j.job_id, timeout_s=600) for j in [*jobs, stop_job]]
            parameter_finals = [api.wait(j.job_id, timeout_s=600) for j in parameter_jobs]
            print(
                f"worker: {len(finals)} jobs final {time.monotonic() - started:.1f} s after submit "
                f"(includes the vLLM engine start)",
                flush=True,
            )
            for prompt, job, want in zip(PROMPTS, finals, expected, strict=False):
                if job.status != "succeeded":
                    check(f"worker job {prompt!r}", False, f"{job.status.value}: {job.error}")
                    continue
                result = api.result(job)
                choice = result.choices[0]
                check(
                    f"worker job equals transformers greedy: {prompt!r}",
                    choice.message.content == want.text
                    and choice.finish_reason == want.finish_reason
                    and result.usage.completion_tokens == want.completion_tokens,
                    f"{choice.message.content!r} ({choice.finish_reason}, usage {result.usage.model_dump()})",
                )
            stop_final = finals[-1]
            if stop_final.status == "succeeded":
                choice = api.result(stop_final).choices[0]
                check(
                    "worker job with a stop string",
                    choice.message.content == "The capital of France" and choice.finish_reason == "stop",
                    repr(choice),
                )
            else:
                check("worker job with a stop string", False, f"{stop_final.status.value}: {stop_final.error}")
            for (name, fields), job in zip(PARAMETER_CASES, parameter_finals, strict=False):
                if job.status != "succeeded":
                    check(f"worker: {name}", False, f"{job.status.value}: {job.error}")
                else:
                    check_parameters("worker", name, fields, api.result(job))
            check_stream(stack.api_url, key, expected[1])
        finally:
            stack.stop()
    if not all(r.ok for r in results if r.name.startswith("worker")):
        print(f"--- worker log (tail) {log_path}\n{log_path.read_text(errors='replace')[-4000:]}", flush=True)


def check_stream(api_url: str, key: str, want: Generation) -> None:
    """``stream: true`` through the local stack's OpenAI route to the worker on real vLLM: the official SDK reads
    ``chat.completion.chunk`` events from the job's event log, written while vLLM decodes; their text joined is the
    greedy answer, in more than one piece, the last chunk carrying the usage."""
    import openai

    sdk = openai.OpenAI(base_url=api_url + "/v1", api_key=key, max_retries=0, timeout=600)
    started = time.monotonic()
    stream = sdk.chat.completions.create(
        model=SERVED_NAME,
        messages=[{"role": "user", "content": PROMPTS[1]}],
        max_tokens=GREEDY_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[tuple[float, str]] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append((time.monotonic() - started, chunk.choices[0].delta.content))
        if chunk.usage is not None:
            usage = chunk.usage
    text = "".join(piece for _, piece in pieces)
    check(
        "worker: stream: true through the OpenAI route, as vLLM decodes",
        text == want.text
        and len(pieces) > 1
        and usage is not None
        and usage.completion_tokens == want.completion_tokens,
        f"{len(pieces)} content chunks, first at {pieces[0][0] if pieces else 0:.2f} s, last at "
        f"{pieces[-1][0] if pieces else 0:.2f} s; {text!r}; usage {usage.model_dump() if usage else None}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-worker", action="store_true", help="check the adapter only")
    parser.add_argument("--no-embedding", action="store_true", help="skip the pooling runner's embedding check")
    parser.add_argument("--embedding-only", action="store_true", help="run the embedding check alone")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        import vllm
    except ImportError:
        print("vllm is not installed in this Python: run bash gpu_worker/vllm_cpu_setup.sh, then .venv-vllm/bin/python")
        return 2
    print(f"vllm {vllm.__version__}", flush=True)

    from checks.vllm_cpu_embedding_check import check_embedding
    from gpu_worker.engines.cpu_weights import prepare_smollm2

    if args.embedding_only:
        asyncio.run(check_embedding(check))
        return 1 if any(not r.ok for r in results) else 0
    model_dir = prepare_smollm2()
    t0 = time.monotonic()
    expected = asyncio.run(reference_greedy(model_dir))
    print(f"transformers reference ({time.monotonic() - t0:.1f} s): {[g.text for g in expected]}", flush=True)
    asyncio.run(check_adapter(model_dir, expected))
    if not args.no_worker:
        check_worker(model_dir, expected)
    if not args.no_embedding:
        asyncio.run(check_embedding(check))
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
