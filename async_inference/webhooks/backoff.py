"""The retry schedule of a failed delivery: how long its message stays hidden before the next receive."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from async_inference import settings
from async_inference.config import DispatcherSettings

# Jitter is added on top of the schedule, never taken off, so the retries span at least webhook_retry_span_s().
JITTER_FRACTION = 0.1
SQS_MAX_VISIBILITY_S = 12 * 60 * 60  # ChangeMessageVisibility's upper limit


@dataclass(frozen=True)
class Backoff:
    """Seconds to hide a message after its n-th failed receive: min(base * 2**(n-1), max), plus up to 10% jitter so
    that receivers that failed together are not retried together."""

    base_s: int = settings.WEBHOOK_BACKOFF_BASE_S
    max_s: int = settings.WEBHOOK_BACKOFF_MAX_S

    def delay_s(self, receive_count: int, rand: Callable[[], float] = random.random) -> int:
        n = min(max(receive_count, 1), 32)  # 2**31 * base is past any max already
        ceiling = min(self.base_s * 2 ** (n - 1), self.max_s)
        return min(int(round(ceiling * (1 + JITTER_FRACTION * rand()))), SQS_MAX_VISIBILITY_S)

    @classmethod
    def from_settings(cls, config: DispatcherSettings) -> Backoff:
        return cls(base_s=config.webhook_backoff_base_s, max_s=config.webhook_backoff_max_s)
