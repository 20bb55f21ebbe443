"""Conversation state of the Responses API: the history a ``previous_response_id`` names, and ``truncation``.

A response that names a previous one continues it as OpenAI's does: the conversation it runs is each earlier
response's input items followed by its output items, oldest first, then its own input. The chain is followed through
each stored response's own ``previous_response_id``, at most ``MAX_CHAIN`` responses deep. The earlier responses'
``instructions`` are not carried over (OpenAI: "the instructions from a previous response will not be carried over");
only the new request's are the system message.

``truncation``: with ``"auto"`` the oldest items of the conversation are dropped until the prompt, as the API
estimates it (``async_inference.limits.estimate_prompt_tokens``), and ``max_output_tokens`` fit the model's context,
and the chat request's messages fit ``MAX_MESSAGES`` (OpenAI: "the model will truncate the response to fit the context
window by dropping items from the beginning of the conversation"). With ``"disabled"`` (the default) nothing is
dropped: a conversation over the context is a 400 ``context_length_exceeded``.

Pure functions over the wire models: ``ResponseService`` reads the stored responses and calls them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import TypeAdapter

from async_inference import settings
from async_inference.limits import RequestLimits, estimate_prompt_tokens
from async_inference.responses import chat_messages, to_chat_request
from async_inference.schemas.responses import (
    FunctionCallOutputItem,
    InputItem,
    Item,
    ReasoningItem,
    ResponseCreate,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
)

# How many stored responses one request's history may follow. Each costs the API a job read and two S3 reads
# (the Responses body, the result) before the job is queued; past it, truncation "auto" keeps the newest
# MAX_CHAIN responses (what it would drop first), "disabled" is a 400 naming previous_response_id.
MAX_CHAIN = 100
_INPUT_ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[InputItem])


@dataclass(frozen=True)
class Turn:
    """One stored response of a conversation: its request and the output its job produced."""

    request: ResponseCreate
    output: Sequence[ResponseOutputMessage | ResponseFunctionToolCall]


def output_as_input(output: Iterable[ResponseOutputMessage | ResponseFunctionToolCall]) -> list[Item]:
    """A response's output items as input items (what a client sends back to continue it by hand): a message stays
    an assistant message with its ``output_text`` and ``refusal`` parts, a function call a ``function_call`` item."""
    return _INPUT_ITEMS.validate_python([item.model_dump() for item in output])


def history(turns: Iterable[Turn]) -> list[Item]:
    """The items of ``turns`` (oldest first): each one's input items, then its output items."""
    items: list[Item] = []
    for turn in turns:
        items.extend(turn.request.items())
        items.extend(output_as_input(turn.output))
    return items


def _without_oldest(items: Sequence[Item], count: int) -> list[Item]:
    """``items`` less its ``count`` oldest, and less what was left leading without its start: a function call's output
    whose call was dropped (a chat template refuses a tool message that answers no call), an earlier turn's
    reasoning."""
    kept = list(items[count:])
    while len(kept) > 1 and isinstance(kept[0], FunctionCallOutputItem | ReasoningItem):
        kept.pop(0)
    return kept


def fits(request: ResponseCreate, items: Sequence[Item], limits: RequestLimits) -> bool:
    """Whether ``request`` running ``items`` fits the chat request's message limit and, as the API estimates its
    prompt, the model's context with its ``max_output_tokens``."""
    if len(chat_messages(request, items)) > settings.MAX_MESSAGES:
        return False
    chat = to_chat_request(request, items)
    return estimate_prompt_tokens(chat, limits) + chat.max_tokens <= limits.context_tokens


def truncated(request: ResponseCreate, items: Sequence[Item], limits: RequestLimits) -> list[Item]:
    """The conversation ``request`` runs: ``items`` as they are, or, with ``truncation: "auto"``, less the fewest
    oldest items that make it fit (``fits``); at least the newest item is kept (if even that cannot fit, the request
    is refused for its context as any other)."""
    if request.truncation != "auto" or len(items) <= 1 or fits(request, items, limits):
        return list(items)
    # Dropping more never makes the prompt longer: the fewest to drop is found by bisection, a few conversions in all.
    low, high = 1, len(items) - 1
    while low < high:
        middle = (low + high) // 2
        if fits(request, _without_oldest(items, middle), limits):
            high = middle
        else:
            low = middle + 1
    return _without_oldest(items, low)
