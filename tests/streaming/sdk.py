"""The official ``openai`` SDK's own stream parser over frames this service produced (no network)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx2
import openai


def parse(frames: Iterable[str], cast_to: Any, path: str = "/v1/chat/completions") -> list[Any]:
    """The typed events ``openai.Stream`` makes of ``frames``, as a client reading them from ``path`` gets them."""
    response = httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content="".join(frames).encode(),
        request=httpx2.Request("POST", f"http://local{path}"),
    )
    client = openai.OpenAI(api_key="test", base_url="http://local/v1")
    return list(openai.Stream(cast_to=cast_to, response=response, client=client))
