"""Following a job's log: segments in order until the end, the end read from the job when the log lacks it, and a
stream that cannot go on said so."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionChunk

from async_inference.jobs import JobStatus
from async_inference.streaming import (
    KEEPALIVE,
    ChoiceEnd,
    Delta,
    End,
    EventLog,
    Follow,
    Segment,
    StreamInterrupted,
    chat_completion_chunks,
    end_of,
    follow,
)
from tests.streaming.sdk import parse
from tests.streaming.test_deltas import running_job


class FakeClock:
    """A clock that moves only when the follower sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def how(clock: FakeClock, **kw) -> Follow:
    return Follow(clock=clock, sleep=clock.sleep, **kw)


def test_segments_come_in_order_until_the_end(event_log: EventLog):
    for seq, text in ((1_000_001, "a"), (1_000_002, "b")):
        event_log.append("job_f1", Segment(seq=seq, deltas=[Delta(text=text)]))
    event_log.append("job_f1", Segment(seq=1_000_003, end=End(status="succeeded", choices=[])))
    segments = list(follow(event_log, "job_f1", ended=lambda: None, how=how(FakeClock())))
    assert [s.seq for s in segments] == [1_000_001, 1_000_002, 1_000_003] and segments[-1].end is not None


def test_after_skips_the_segments_a_reader_has(event_log: EventLog):
    for seq in (1_000_001, 1_000_002):
        event_log.append("job_f2", Segment(seq=seq, deltas=[Delta(text=str(seq))]))
    event_log.append("job_f2", Segment(seq=1_000_003, end=End(status="cancelled")))
    segments = list(follow(event_log, "job_f2", ended=lambda: None, after=1_000_001, how=how(FakeClock())))
    assert [s.seq for s in segments] == [1_000_002, 1_000_003]


def test_an_end_only_on_the_job_ends_the_stream_without_repeating_what_it_showed(event_log: EventLog):
    # GIVEN a log whose run streamed "Hel" and then ended without writing its end (its write failed)
    event_log.append("job_f3", Segment(seq=1_000_001, deltas=[Delta(text="Hel")]))
    whole = End(status="succeeded", choices=[ChoiceEnd(text="Hello", finish_reason="stop")])
    # WHEN the reader looks at the job, which has ended
    segments = list(follow(event_log, "job_f3", ended=lambda: whole, how=how(FakeClock(), check_s=1)))
    # THEN the last segment is the job's end, with only the text not shown yet
    assert segments[-1].end is not None and segments[-1].end.choices[0].text == "lo"


def test_a_run_restarted_after_part_of_it_was_shown_interrupts_the_stream(event_log: EventLog):
    event_log.append("job_f4", Segment(seq=1_000_001, deltas=[Delta(text="first run")]))
    event_log.append("job_f4", Segment(seq=2_000_001, deltas=[Delta(text="second run")]))
    with pytest.raises(StreamInterrupted, match="restarted"):
        list(follow(event_log, "job_f4", ended=lambda: None, how=how(FakeClock())))


def test_a_job_still_running_at_the_longest_hold_interrupts_the_stream(event_log: EventLog):
    clock = FakeClock()
    with pytest.raises(StreamInterrupted, match="still running after 5 s"):
        list(follow(event_log, "job_f5", ended=lambda: None, how=how(clock, max_wait_s=5, poll_s=1)))
    assert 5 <= clock.now <= 6


def test_the_end_of_a_job_is_read_from_its_state_and_result():
    job = running_job("job_f6")
    assert end_of(job) is None
    failed = job.model_copy(update={"status": JobStatus.FAILED, "error": "prompt too long"})
    assert end_of(failed) == End(status="failed", error="prompt too long")
    result = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    succeeded = end_of(job.model_copy(update={"status": JobStatus.SUCCEEDED}), result)
    assert succeeded is not None and succeeded.choices == [ChoiceEnd(text="hi", finish_reason="length")]
    assert (succeeded.prompt_tokens, succeeded.completion_tokens) == (3, 1)


def test_a_quiet_log_yields_keepalives_the_sdk_skips(event_log: EventLog):
    # GIVEN a job that waits in the queue for 40 s before its first token, then ends
    clock = FakeClock()
    ends_at = 40.0

    def ended():
        return (
            End(status="succeeded", choices=[ChoiceEnd(text="hi", finish_reason="stop")])
            if clock.now >= ends_at
            else None
        )

    segments = list(follow(event_log, "job_f7", ended=ended, how=how(clock, keepalive_s=15, poll_s=1, check_s=1)))
    # THEN the reader got a keep-alive every 15 s of silence, then the end
    assert [s.empty for s in segments] == [True, True, False]
    frames = list(chat_completion_chunks(segments, completion_id="c", model="m"))
    assert frames.count(KEEPALIVE) == 2
    assert "".join(c.choices[0].delta.content or "" for c in parse(frames, ChatCompletionChunk)) == "hi"


def test_the_end_of_a_responses_job_is_read_from_its_stored_response():
    # GIVEN a Responses job that ended with a call and some text, stored as its Response
    response = {
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
        ],
        "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13},
    }
    job = running_job("job_f8").model_copy(update={"status": JobStatus.SUCCEEDED})
    # WHEN a reader takes its end from the job
    end = end_of(job, response)
    # THEN the Responses stream can be made of it: the text, the call, the usage
    assert end is not None and end.choices[0].text == "Let me look." and end.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in end.choices[0].tool_calls] == [("call_1", "lookup")]
    assert (end.prompt_tokens, end.completion_tokens) == (9, 4)


def test_the_end_of_a_completions_job_is_read_from_its_text_completion():
    result = {"object": "text_completion", "choices": [{"index": 0, "text": "once", "finish_reason": "length"}]}
    end = end_of(running_job("job_f9").model_copy(update={"status": JobStatus.SUCCEEDED}), result)
    assert end is not None and end.choices == [ChoiceEnd(text="once", finish_reason="length")]
