"""Streaming a job's answer as it decodes: the worker appends deltas to the job's event log (``log``), and any API
instance follows the log (``follow``) and serves it as OpenAI's server-sent events (``sse``).

A route streams a job with::

    segments = follow(EventLog(table_name), job_id, ended=lambda: end_of_job(...))
    for frame in chat_completion_chunks(segments, completion_id=..., model=..., include_usage=...):
        ...  # write the frame to the response stream

docs/streaming.md has the whole path, the store's cost and the transport.
"""

from async_inference.streaming.follow import Follow, StreamInterrupted, end_of, follow
from async_inference.streaming.log import ChoiceEnd, Delta, End, EventLog, Segment, ToolCallEnd
from async_inference.streaming.sse import (
    DONE,
    KEEPALIVE,
    MEDIA_TYPE,
    chat_completion_chunks,
    completion_chunks,
    response_events,
)

__all__ = [
    "DONE",
    "KEEPALIVE",
    "MEDIA_TYPE",
    "ChoiceEnd",
    "Delta",
    "End",
    "EventLog",
    "Follow",
    "Segment",
    "StreamInterrupted",
    "ToolCallEnd",
    "chat_completion_chunks",
    "completion_chunks",
    "end_of",
    "follow",
    "response_events",
]
