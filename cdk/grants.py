"""The permissions of the service's functions: each principal gets exactly the calls its code makes, as
``grant_*`` on the one resource it concerns (each fleet grants its own worker: cdk.model_fleet.ModelFleet)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_

from async_inference import settings
from cdk.nag import acknowledge, rendered_reference

if TYPE_CHECKING:
    from cdk.service import AsyncInferenceService

# The Responses bodies of background responses (settings.responses_request_key), one per response, under any tenant.
RESPONSES_BODIES = f"{settings.REQUEST_PREFIX}*/{settings.RESPONSES_REQUEST_NAME}"
# The Files API's presigned uploads (settings.file_upload_key), under any tenant and file.
FILE_UPLOADS = f"{settings.FILE_PREFIX}*/{settings.FILE_UPLOAD_NAME}"


def grant_functions(service: AsyncInferenceService) -> None:
    """Each principal gets exactly the calls its code makes (async_inference.aws, async_inference/jobs_service, lambdas/*,
    gpu_worker/worker.py), on the resources and key prefixes it makes them on."""
    bucket, table, results = service.bucket, service.table, service.results
    _acknowledge_grant_wildcards(service)
    requests, uploads, result_objects = settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX

    # The API: submit (get, create, transition on a failed enqueue), get (lazy expiry), list, cancel (notifies).
    api = service.api.handler
    table.grant_items(api, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
    table.grant_tenant_listing(api)
    service.streams.grant_follow(api)  # streams a job from its event log
    bucket.grant_put(api, requests)  # inline bodies
    bucket.grant_put(api, uploads)  # presigned upload PUTs are signed with the function's role
    bucket.grant_get(api, result_objects, missing_as_404=False)  # presigned result GETs likewise
    # Background responses: the Responses body beside each response's job's request, read and deleted by the API.
    # Deleting a response deletes its job too (its record, request and result).
    bucket.grant_get(api, RESPONSES_BODIES)
    bucket.grant_delete(api, RESPONSES_BODIES, requests, result_objects)
    table.grant_items(api, "dynamodb:DeleteItem")
    service.upload_deadlines.queue.grant(api, "sqs:SendMessage")  # each upload job's deadline
    results.grant_publish(api)  # cancels and expiries notify

    # The upload handler: check the object, queue its job or fail it, notify.
    upload = service.uploads.handler
    table.grant_items(upload, "dynamodb:GetItem", "dynamodb:UpdateItem")
    bucket.grant_get(upload, uploads)
    bucket.grant_delete(upload, uploads)  # objects no job asked for, oversize bodies, accepted uploads
    bucket.grant_put(upload, requests)  # an accepted upload's checked bytes, out of reach of its presigned URL
    results.grant_publish(upload)
    # A file upload whose file was deleted before its bytes arrived: its record read, its object deleted.
    service.batches.grant_items(upload, "dynamodb:GetItem")
    bucket.grant_delete(upload, FILE_UPLOADS)

    # The DLQ handler (its event source grants consuming the DLQ): fail the job, notify.
    dead_letters = service.dead_letters.handler
    table.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
    results.grant_publish(dead_letters)

    # The upload-deadline handler (its event source grants consuming, and hiding, its queue's messages).
    deadlines = service.upload_deadlines.handler
    table.grant_items(deadlines, "dynamodb:GetItem", "dynamodb:UpdateItem")
    results.grant_publish(deadlines)

    # The webhook dispatcher (its event source grants consuming, and hiding, its queue's messages).
    webhook = service.webhooks.handler
    table.grant_items(webhook, "dynamodb:GetItem", "dynamodb:UpdateItem")  # record_webhook_attempt
    service.webhooks.grant_read_signing_secrets(webhook)

    # Each model's queues take the API's and the upload handler's jobs (its lane those submitted with priority
    # "batch") and the controller's chunks; each fleet grants its own worker.
    for fleet in service.fleets:
        fleet.grant_send_jobs(api)
        fleet.grant_send_jobs(upload)
        fleet.lane_queue.grant(service.batches.controller, "sqs:SendMessage")
    _grant_batches(service)
    if service.inbox is not None:
        _grant_inbox(service, service.inbox.handler)


def _grant_inbox(service: AsyncInferenceService, function: lambda_.Function) -> None:
    """The inbox function: read the objects under the inbox, then what the API does to submit a job (its
    record, its body, its claim check on any model's queue, a notification when it cannot be queued) or to
    create a batch (the file copied from the object, the file and batch records, the plan step)."""
    bucket, table, batches = service.bucket, service.table, service.batches
    bucket.grant_get(function, settings.INBOX_PREFIX)
    table.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
    bucket.grant_put(function, settings.REQUEST_PREFIX)  # job bodies, and the markers of objects taken in
    bucket.grant_get(function, settings.REQUEST_PREFIX, missing_as_404=False)  # a marker already there
    for fleet in service.fleets:
        fleet.grant_send_jobs(function)
    service.results.grant_publish(function)
    batches.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
    bucket.grant_put(function, settings.FILE_PREFIX)
    bucket.grant_get(function, settings.FILE_PREFIX, missing_as_404=False)
    batches.control_queue.grant(function, "sqs:SendMessage")


def _grant_batches(service: AsyncInferenceService) -> None:
    """The Files and Batches APIs' principals (async_inference/batches/*, lambdas/batch_controller, and the
    worker's side of docs/design/batches.md)."""
    bucket, batches, files, parts = service.bucket, service.batches, settings.FILE_PREFIX, settings.BATCH_PREFIX

    # The API: file and batch records (create, read, confirm an upload, delete a file, cancel), the listings,
    # file bytes (inline uploads, presigned PUTs and GETs signed with its role, the HEAD that confirms an upload,
    # DeleteObject), plan steps.
    api = service.api.handler
    batches.grant_items(api, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
    batches.grant_listing(api)
    batches.grant_quota_counts(api)
    bucket.grant_put(api, files)
    bucket.grant_get(api, files, missing_as_404=False)
    bucket.grant_delete(api, files)
    batches.control_queue.grant(api, "sqs:SendMessage")

    # The controller (its event source grants consuming the control queue): read inputs and parts, write output
    # and error files (multipart uploads: AbortMultipartUpload when one fails), notify (its chunks: _grant).
    controller = batches.controller
    batches.grant_items(controller, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
    batches.grant_quota_counts(controller)  # a planned batch's lines against max_batch_lines_in_flight
    bucket.grant_get(controller, files, parts)
    bucket.grant_put(controller, files)
    bucket.grant_delete(controller, files)  # an output file that came out empty
    iam.Grant.add_to_principal(
        grantee=controller,
        actions=["s3:AbortMultipartUpload"],
        resource_arns=[bucket.bucket.arn_for_objects(f"{files}*")],
    )
    service.results.grant_publish(controller)

    # The workers' side: cdk.model_fleet.ModelFleet.grant_worker.

    # The webhook dispatcher, for batch webhooks: the batch's webhook, and each attempt recorded on it.
    batches.grant_items(service.webhooks.handler, "dynamodb:GetItem", "dynamodb:UpdateItem")

    # The DLQ handler, for dead-lettered chunks (its event source grants consuming the lane's DLQ): the chunk's
    # batch and its count, the input range and any results a worker stored, the parts, the finalize step.
    dead_letters = service.dead_letters.handler
    batches.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
    bucket.grant_get(dead_letters, files, parts)
    bucket.grant_put(dead_letters, parts)
    batches.control_queue.grant(dead_letters, "sqs:SendMessage")


def _acknowledge_grant_wildcards(service: AsyncInferenceService) -> None:
    """The wildcards the grants above write: key prefixes of the claim-check bucket."""
    bucket = service.bucket.bucket.node.default_child
    findings = {
        prefix: f"Objects under the {prefix} prefix only: keys hold tenant and job ids assigned at run time."
        for prefix in (
            settings.REQUEST_PREFIX,
            settings.UPLOAD_PREFIX,
            settings.RESULT_PREFIX,
            settings.FILE_PREFIX,
            settings.BATCH_PREFIX,
            RESPONSES_BODIES,
            FILE_UPLOADS,
            *((settings.INBOX_PREFIX,) if service.inbox is not None else ()),
        )
    }
    # A fleet in a nested stack (fleet_stacks) refers to the bucket by a parameter of its stack (cdk.nag).
    for scope in (service, *(fleet for fleet in service.fleets if Stack.of(fleet) is not Stack.of(service))):
        arn = rendered_reference(scope, bucket, "Arn")
        acknowledge(scope, {f"AwsSolutions-IAM5[Resource::{arn}/{prefix}*]": why for prefix, why in findings.items()})
