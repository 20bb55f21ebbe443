"""The service's SNS topics: results go to the result topic (``Notifier``), running jobs' news to the job event topic
(``JobEvents``), each message with the attributes subscriptions filter on, in PublishBatch requests within SNS's
limits."""

from __future__ import annotations

from typing import Any

from async_inference import settings
from async_inference.aws.clients import client
from async_inference.schemas import JobActivity, ResultNotification


class Notifier:
    """Publishes result notifications with the attributes subscriptions filter on."""

    def __init__(self, topic_arn: str, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self._sns = sns or client("sns")

    def publish(self, notification: ResultNotification, *, has_webhook: bool = False) -> None:
        self._sns.publish(
            TopicArn=self.topic_arn,
            Message=notification.model_dump_json(exclude_none=True),
            MessageAttributes=notification_attributes(notification, has_webhook=has_webhook),
            # The tenant as message group: SNS forwards it to the SQS standard queues subscribed (the webhook queue),
            # where it makes them fair queues: one tenant's backlog of events does not hold another's back.
            MessageGroupId=notification.tenant,
        )

    def publish_batch(self, notifications: list[tuple[ResultNotification, bool]]) -> list[bool]:
        """Publish (notification, has_webhook) pairs in as few PublishBatch requests as SNS allows (10 entries and
        256 KB a request); whether each one was published, in order."""
        published = [False] * len(notifications)
        chunk: list[int] = []
        size = 0
        bodies = [n.model_dump_json(exclude_none=True) for n, _ in notifications]
        for index, body in enumerate(bodies):
            # Attributes count towards the limit too; 1 KB a message covers them.
            entry_size = len(body.encode()) + 1024
            if chunk and (len(chunk) == SNS_BATCH_ENTRIES or size + entry_size > SNS_BATCH_BYTES):
                self._publish_chunk(chunk, notifications, bodies, published)
                chunk, size = [], 0
            chunk.append(index)
            size += entry_size
        if chunk:
            self._publish_chunk(chunk, notifications, bodies, published)
        return published

    def _publish_chunk(
        self,
        chunk: list[int],
        notifications: list[tuple[ResultNotification, bool]],
        bodies: list[str],
        published: list[bool],
    ) -> None:
        entries = [
            {
                "Id": str(i),
                "Message": bodies[i],
                "MessageAttributes": notification_attributes(notifications[i][0], has_webhook=notifications[i][1]),
                "MessageGroupId": notifications[i][0].tenant,  # as publish's
            }
            for i in chunk
        ]
        response = self._sns.publish_batch(TopicArn=self.topic_arn, PublishBatchRequestEntries=entries)
        for success in response.get("Successful", []):
            published[int(success["Id"])] = True


# SNS PublishBatch limits.
SNS_BATCH_ENTRIES = 10
SNS_BATCH_BYTES = 256 * 1024


def notification_attributes(
    notification: ResultNotification, *, has_webhook: bool = False
) -> dict[str, dict[str, str]]:
    attributes = {
        "status": {"DataType": "String", "StringValue": notification.status.value},
        settings.TENANT_ATTRIBUTE: {"DataType": "String", "StringValue": notification.tenant},
        settings.WEBHOOK_ATTRIBUTE: {"DataType": "String", "StringValue": "true" if has_webhook else "false"},
        settings.EVENT_ATTRIBUTE: {"DataType": "String", "StringValue": notification.event},
    }
    if notification.model:
        attributes["model"] = {"DataType": "String", "StringValue": notification.model}
    return attributes


def activity_attributes(activity: JobActivity) -> dict[str, dict[str, str]]:
    return {
        settings.EVENT_ATTRIBUTE: {"DataType": "String", "StringValue": activity.event},
        "tenant": {"DataType": "String", "StringValue": activity.tenant},
    }


class JobEvents:
    """Publishes running jobs' news (``JobActivity``: job.started, job.progress) to the job event topic, up to ten
    messages per PublishBatch request (each is well under 1 KB, so ten never reach the 256 KB limit)."""

    def __init__(self, topic_arn: str, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self._sns = sns or client("sns")

    def publish_batch(self, activities: list[JobActivity]) -> list[bool]:
        """Whether each one was published, in order."""
        published = [False] * len(activities)
        for start in range(0, len(activities), SNS_BATCH_ENTRIES):
            entries = [
                {
                    "Id": str(i),
                    "Message": a.model_dump_json(exclude_none=True),
                    "MessageAttributes": activity_attributes(a),
                }
                for i, a in enumerate(activities[start : start + SNS_BATCH_ENTRIES])
            ]
            response = self._sns.publish_batch(TopicArn=self.topic_arn, PublishBatchRequestEntries=entries)
            for success in response.get("Successful", []):
                published[start + int(success["Id"])] = True
        return published
