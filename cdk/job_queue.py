"""The job queue: claim checks for the GPU workers, and the dead-letter queue for jobs that keep failing."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings


class JobQueue(Construct):
    """An encrypted, TLS-only SQS queue with long polling and a redrive policy to a DLQ.

    The visibility timeout only has to outlive a stalled heartbeat: the worker extends the visibility of every message
    it holds each ``settings.HEARTBEAT_INTERVAL_S``, so a long generation never makes its message reappear.

    :param visibility_timeout: Default: ``settings.VISIBILITY_TIMEOUT_S``.
    :param max_receive_count: receives before a message moves to the DLQ. Default: ``settings.MAX_RECEIVE_COUNT``.
    :param retention: how long an unclaimed job message is kept. Default: the maximum, 14 days (a job's own deadline,
        at most ``settings.MAX_TTL_S``, expires it long before).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        visibility_timeout: Duration = Duration.seconds(settings.VISIBILITY_TIMEOUT_S),
        max_receive_count: int = settings.MAX_RECEIVE_COUNT,
        retention: Duration = Duration.days(14),
    ) -> None:
        super().__init__(scope, id)
        if visibility_timeout.to_seconds() <= settings.HEARTBEAT_INTERVAL_S:
            raise ValueError(
                f"visibility_timeout ({visibility_timeout.to_seconds()} s) must exceed settings.HEARTBEAT_INTERVAL_S "
                f"({settings.HEARTBEAT_INTERVAL_S} s), or held jobs reappear between heartbeats"
            )
        self.dead_letter_queue = secure_dead_letter_queue(self, "DeadLetterQueue")
        self.queue = secure_queue(
            self,
            "Queue",
            dead_letter_queue=self.dead_letter_queue,
            max_receive_count=max_receive_count,
            visibility_timeout=visibility_timeout,
            receive_message_wait_time=Duration.seconds(settings.RECEIVE_WAIT_TIME_S),
            retention_period=retention,
        )


def secure_queue(
    scope: Construct, id: str, *, dead_letter_queue: sqs.IQueue, max_receive_count: int, **options: Any
) -> sqs.Queue:
    """A queue with the service's defaults (SSE-SQS, TLS only) that moves a message to ``dead_letter_queue`` after
    ``max_receive_count`` receives; ``options`` are ``sqs.Queue``'s (visibility timeout, long polling, retention)."""
    return sqs.Queue(
        scope,
        id,
        # SSE-SQS rather than a KMS key: producers and consumers need no key grants, and SNS could deliver to it.
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        dead_letter_queue=sqs.DeadLetterQueue(queue=dead_letter_queue, max_receive_count=max_receive_count),
        **options,
    )


def secure_dead_letter_queue(scope: Construct, id: str) -> sqs.Queue:
    """A DLQ with the service's defaults: encrypted (SSE-SQS), TLS only, kept for the shared retention."""
    return sqs.Queue(
        scope,
        id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.days(settings.DLQ_RETENTION_DAYS),
    )
