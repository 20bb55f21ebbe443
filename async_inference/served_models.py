"""Which model names this deployment serves: the stack's configured model (``SERVED_MODELS``), checked on every job
and batch line, and listed by ``GET /v1/models``.

A request for another model is a 404 ``model_not_found``, as vLLM and OpenAI answer, rather than silently served by
the deployed model. ``"*"`` in the list (the local runtime's echo and simulated engines, which serve any name) accepts
every name; it is never listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ANY_MODEL = "*"
OWNED_BY = "system"  # OpenAI's owned_by for models that no organization of the caller owns


@dataclass(frozen=True)
class ServedModels:
    names: tuple[str, ...]
    any_name: bool = False

    @classmethod
    def of(cls, configured: Iterable[str] | None) -> ServedModels:
        """From the configured list; None (no configuration) accepts every name."""
        if configured is None:
            return cls((), any_name=True)
        names = tuple(dict.fromkeys(name for name in configured if name != ANY_MODEL))
        return cls(names, any_name=ANY_MODEL in configured)

    def serves(self, model: str) -> bool:
        return self.any_name or model in self.names

    def not_found_message(self, model: str) -> str:
        served = ", ".join(self.names) or "none listed"
        return f"The model `{model}` does not exist or is not served here (served: {served}); see GET /v1/models"
