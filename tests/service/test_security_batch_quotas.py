"""Per-tenant quotas of the Files and Batches APIs, against a real moto server over HTTP (issue #16, finding 3):
``max_stored_bytes`` (the bytes of a tenant's files) and ``max_batch_lines_in_flight`` (the lines of its batches not
yet final), each a 429 that names the limit at submit, given back when a file is deleted or a batch ends.

The batch table is created as the template declares it: the owner index and the sparse index of batches in flight
(cdk/batches.py), from the same settings.
"""

from __future__ import annotations

import json

import pytest

from async_inference import settings
from async_inference.aws import client
from async_inference.batches.aws import BatchNotifier, ControlQueue, FileObjects
from async_inference.batches.controller import BatchController
from async_inference.batches.models import BatchCreate, BatchStatus, FileUploadRequest
from async_inference.batches.service import BatchService
from async_inference.batches.store import BatchStore
from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs_service import ErrorKind, ServiceError
from async_inference.quotas import TenantQuota
from async_inference.served_models import ServedModels
from local_runtime.moto_server import MotoServer, free_port

BYTES, LINES, OTHER = "tenant-bytes", "tenant-lines", "tenant-other"
QUOTAS = {BYTES: TenantQuota(max_stored_bytes=100), LINES: TenantQuota(max_batch_lines_in_flight=5)}


def batch_file(lines: int) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return b"".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()
        + b"\n"
        for i in range(lines)
    )


@pytest.fixture(scope="module")
def apis(moto: MotoServer) -> tuple[BatchService, BatchController]:
    string = "S"
    client("s3").create_bucket(Bucket="files")
    client("dynamodb").create_table(
        TableName="batches",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": string}
            for name in (
                settings.BATCH_TABLE_PARTITION_KEY,
                settings.BATCH_OWNER_ATTRIBUTE,
                settings.BATCH_CREATED_KEY_ATTRIBUTE,
                settings.BATCH_ACTIVE_ATTRIBUTE,
            )
        ],
        KeySchema=[{"AttributeName": settings.BATCH_TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": settings.BATCH_OWNER_INDEX_NAME,
                "Projection": {"ProjectionType": "ALL"},
                "KeySchema": [
                    {"AttributeName": settings.BATCH_OWNER_ATTRIBUTE, "KeyType": "HASH"},
                    {"AttributeName": settings.BATCH_CREATED_KEY_ATTRIBUTE, "KeyType": "RANGE"},
                ],
            },
            {
                "IndexName": settings.BATCH_ACTIVE_INDEX_NAME,
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["total"]},
                "KeySchema": [{"AttributeName": settings.BATCH_ACTIVE_ATTRIBUTE, "KeyType": "HASH"}],
            },
        ],
    )
    sqs = client("sqs")
    control = sqs.create_queue(QueueName=f"control-{free_port()}")["QueueUrl"]
    lane = sqs.create_queue(QueueName=f"lane-{free_port()}")["QueueUrl"]
    topic = client("sns").create_topic(Name="results")["TopicArn"]
    store, files, served = BatchStore("batches"), FileObjects("files"), ServedModels.of(None)
    service = BatchService(store=store, files=files, control=ControlQueue(control), served=served, quotas=QUOTAS)
    controller = BatchController(
        store=store,
        files=files,
        notifier=BatchNotifier(topic),
        served=served,
        fleets={ANY_MODEL: FleetRoute(queue_url=lane, batch_queue_url=lane)},
        quotas=QUOTAS,
    )
    return service, controller


def test_a_tenant_at_its_stored_bytes_gets_a_429_naming_the_limit_until_it_deletes_a_file(apis):
    service, _ = apis
    # GIVEN a tenant limited to 100 stored bytes, storing a 60-byte file
    first = service.create_file(BYTES, filename="a.jsonl", purpose="batch", data=b"x" * 60)
    # WHEN it sends a 50-byte file, or announces a 50-byte upload
    with pytest.raises(ServiceError) as inline:
        service.create_file(BYTES, filename="b.jsonl", purpose="batch", data=b"x" * 50)
    with pytest.raises(ServiceError) as upload:
        service.create_upload(BYTES, FileUploadRequest(filename="b.jsonl", purpose="batch", bytes=50))
    # THEN each is a 429 quota_exceeded naming max_stored_bytes, what is stored and the limit
    for refused in (inline.value, upload.value):
        assert refused.kind is ErrorKind.QUOTA and refused.code == "quota_exceeded"
        assert refused.message.startswith("max_stored_bytes:") and "60 bytes" in refused.message
        assert "limit of 100" in refused.message
    # and 40 bytes more still fit (an announced upload counts its announced size)
    service.create_upload(BYTES, FileUploadRequest(filename="c.jsonl", purpose="batch", bytes=40))
    # WHEN it deletes the 60-byte file THEN the 50-byte file fits
    service.delete_file(BYTES, first.id)
    assert service.create_file(BYTES, filename="b.jsonl", purpose="batch", data=b"x" * 50).bytes == 50
    # and another tenant was never limited by it
    assert service.create_file(OTHER, filename="o.jsonl", purpose="batch", data=b"x" * 500).bytes == 500


def _batch(service: BatchService, controller: BatchController, tenant: str, lines: int):
    source = service.create_file(tenant, filename="in.jsonl", purpose="batch", data=batch_file(lines))
    created = service.create_batch(
        tenant, BatchCreate(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    )
    planned = controller.plan(created.id)
    assert planned is not None
    return planned


def test_batch_lines_in_flight_are_limited_at_creation_and_once_counted(apis):
    service, controller = apis
    # GIVEN a tenant limited to 5 batch lines in flight, with a batch of 3 lines in progress
    first = _batch(service, controller, LINES, 3)
    assert first.status is BatchStatus.IN_PROGRESS and first.total == 3
    # WHEN it creates a batch of 3 lines more
    second = _batch(service, controller, LINES, 3)
    # THEN the controller fails it once it has counted them, the error naming the limit
    assert second.status is BatchStatus.FAILED
    assert second.errors is not None and second.errors[0].code == "quota_exceeded"
    assert second.errors[0].message is not None
    assert second.errors[0].message.startswith("max_batch_lines_in_flight:")
    assert "limit of 5" in second.errors[0].message
    # WHEN a batch of 2 lines brings it to its limit, and it creates one more
    assert _batch(service, controller, LINES, 2).status is BatchStatus.IN_PROGRESS
    source = service.create_file(LINES, filename="in.jsonl", purpose="batch", data=batch_file(1))
    request = BatchCreate(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(ServiceError) as refused:
        service.create_batch(LINES, request)
    # THEN that is a 429 quota_exceeded at once, naming the limit and the lines in flight
    assert refused.value.kind is ErrorKind.QUOTA and refused.value.code == "quota_exceeded"
    assert refused.value.message.startswith("max_batch_lines_in_flight:") and "5 batch lines" in refused.value.message
    # WHEN the first batch ends (cancelled; its one chunk counted as a worker counts it, none of its lines run;
    # finalized) THEN its lines are given back: the batch is created
    service.cancel_batch(LINES, first.id)
    assert controller.store.record_chunk(first.id, 0, completed=0, failed=0).all_counted
    controller.finalize(first.id)
    assert service.get_batch(LINES, first.id).status is BatchStatus.CANCELLED
    assert controller.plan(service.create_batch(LINES, request).id).status is BatchStatus.IN_PROGRESS
