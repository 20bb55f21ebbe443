"""Secure defaults and shared settings of the bucket, queues, table and topic (one behaviour per test)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from async_inference import config, settings
from tests.cdk.helpers import denies_insecure_transport, policy_of

pytestmark = pytest.mark.cdk


def test_job_queue_redrives_to_its_dlq_after_the_shared_max_receive_count(synthesized):
    """GIVEN the synthesized app WHEN reading the job queue THEN it redrives to the DLQ after MAX_RECEIVE_COUNT."""
    jobs = synthesized.stack.service.fleets[0].jobs
    synthesized.template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "RedrivePolicy": {
                "deadLetterTargetArn": {"Fn::GetAtt": [synthesized.logical_id(jobs.dead_letter_queue), "Arn"]},
                "maxReceiveCount": settings.MAX_RECEIVE_COUNT,
            }
        },
    )


def test_job_queue_long_polls_and_its_visibility_outlives_a_heartbeat(synthesized):
    """GIVEN the job queue WHEN reading its timing THEN long polling is on and visibility is the shared value."""
    assert settings.VISIBILITY_TIMEOUT_S > settings.HEARTBEAT_INTERVAL_S
    synthesized.template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "ReceiveMessageWaitTimeSeconds": settings.RECEIVE_WAIT_TIME_S,
            "VisibilityTimeout": settings.VISIBILITY_TIMEOUT_S,
            "RedrivePolicy": Match.any_value(),
        },
    )


def test_every_queue_is_encrypted(synthesized):
    """GIVEN all SQS queues WHEN reading their properties THEN each has server-side encryption."""
    queues = synthesized.resources("AWS::SQS::Queue")
    assert len(queues) >= 5
    unencrypted = [q for q, r in queues.items() if not r["Properties"].get("SqsManagedSseEnabled")]
    assert unencrypted == []


@pytest.mark.parametrize("attribute", ["queue", "dead_letter_queue"])
def test_job_queues_refuse_requests_without_tls(synthesized, attribute):
    """GIVEN the job queue and its DLQ WHEN reading their queue policies THEN non-TLS requests are denied."""
    queue = getattr(synthesized.stack.service.fleets[0].jobs, attribute)
    statements = policy_of(synthesized.template, "AWS::SQS::QueuePolicy", synthesized.logical_id(queue))
    assert denies_insecure_transport(statements)


def test_bucket_blocks_public_access_and_encrypts(synthesized):
    """GIVEN the claim-check bucket WHEN reading it THEN public access is blocked and objects are encrypted."""
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "VersioningConfiguration": {"Status": "Enabled"},
        },
    )


def test_bucket_refuses_requests_without_tls(synthesized):
    """GIVEN the claim-check bucket WHEN reading its bucket policy THEN non-TLS requests are denied."""
    bucket = synthesized.logical_id(synthesized.stack.service.bucket.bucket)
    assert denies_insecure_transport(policy_of(synthesized.template, "AWS::S3::BucketPolicy", bucket))


@pytest.mark.parametrize(
    ("prefix", "action", "expiry_s"),
    [
        (settings.UPLOAD_PREFIX, "s3:PutObject", settings.PRESIGNED_UPLOAD_EXPIRY_S),
        (settings.RESULT_PREFIX, "s3:GetObject", settings.PRESIGNED_RESULT_EXPIRY_S),
    ],
)
def test_bucket_refuses_presigned_urls_older_than_the_shared_expiry(synthesized, prefix, action, expiry_s):
    """GIVEN the bucket policy WHEN a signature is older than the presign expiry THEN the request is denied."""
    bucket = synthesized.logical_id(synthesized.stack.service.bucket.bucket)
    statements = policy_of(synthesized.template, "AWS::S3::BucketPolicy", bucket)
    matching = [
        s
        for s in statements
        if s["Effect"] == "Deny"
        and s["Action"] == action
        and s.get("Condition") == {"NumericGreaterThan": {"s3:signatureAge": expiry_s * 1000}}
        and s["Resource"]["Fn::Join"][1][-1] == f"/{prefix}*"
    ]
    assert len(matching) == 1


@pytest.mark.parametrize("prefix", [settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX])
def test_payloads_expire_after_the_configured_retention(synthesized, prefix):
    """GIVEN cdk.json's retention_days WHEN reading the lifecycle rules THEN each prefix expires after it."""
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [Match.object_like({"Prefix": prefix, "ExpirationInDays": 7, "Status": "Enabled"})]
                )
            }
        },
    )


def test_functions_and_workers_read_the_retention_the_bucket_expires_results_after(synthesized):
    """GIVEN the results' lifecycle rule WHEN reading every function's and the worker's environment THEN they carry its
    days, from which a job records when its result expires (and a GET after that is a 410)."""
    [bucket] = [b for b in synthesized.resources("AWS::S3::Bucket").values() if "CorsConfiguration" in b["Properties"]]
    [days] = [
        rule["ExpirationInDays"]
        for rule in bucket["Properties"]["LifecycleConfiguration"]["Rules"]
        if rule.get("Prefix") == settings.RESULT_PREFIX
    ]
    functions = synthesized.resources("AWS::Lambda::Function").values()
    # every function that reads jobs (the authorizer reads API keys, the WebSocket functions connections: neither
    # reads a job)
    service_functions = [
        f for f in functions if config.ENV_TABLE in f["Properties"].get("Environment", {}).get("Variables", {})
    ]
    assert {f["Properties"]["Handler"].split(".")[1] for f in service_functions} >= {
        "api",
        "upload",
        "dlq",
        "batch_controller",
        "webhooks",
        "upload_deadlines",
    }
    for function in service_functions:
        assert function["Properties"]["Environment"]["Variables"][config.ENV_PAYLOAD_RETENTION_DAYS] == str(days)
    assert synthesized.worker_environment()[config.ENV_PAYLOAD_RETENTION_DAYS] == str(days)


def test_bucket_allows_browser_puts_of_presigned_uploads(synthesized):
    """GIVEN the default CORS options WHEN reading the bucket THEN PUT is allowed cross-origin."""
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {"CorsConfiguration": {"CorsRules": [Match.object_like({"AllowedMethods": ["PUT"]})]}},
    )


def test_uploads_prefix_notifies_the_upload_function(synthesized):
    """GIVEN the bucket notification WHEN an object is created under uploads/, or a Files API upload's object lands
    (files/.../upload) THEN the upload Lambda is invoked, and for nothing else."""
    upload = synthesized.logical_id(synthesized.stack.service.uploads.handler)
    [notifications] = synthesized.resources("Custom::S3BucketNotifications").values()
    configurations = notifications["Properties"]["NotificationConfiguration"]["LambdaFunctionConfigurations"]
    filters = [
        {rule["Name"]: rule["Value"] for rule in entry["Filter"]["Key"]["FilterRules"]}
        for entry in configurations
        if entry["LambdaFunctionArn"] == {"Fn::GetAtt": [upload, "Arn"]} and entry["Events"] == ["s3:ObjectCreated:*"]
    ]
    assert len(filters) == 2 and {frozenset(f.items()) for f in filters} == {
        frozenset({("prefix", settings.UPLOAD_PREFIX)}),
        frozenset({("prefix", settings.FILE_PREFIX), ("suffix", "/" + settings.FILE_UPLOAD_NAME)}),
    }


def test_job_table_is_on_demand_with_pitr_ttl_and_the_tenant_index(synthesized):
    """GIVEN the job table WHEN reading it THEN billing, PITR, TTL and the list index match the shared settings."""
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "TimeToLiveSpecification": {"AttributeName": settings.TABLE_TTL_ATTRIBUTE, "Enabled": True},
            "KeySchema": [{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
            "GlobalSecondaryIndexes": [
                Match.object_like(
                    {
                        "IndexName": settings.TENANT_INDEX_NAME,
                        "KeySchema": [
                            {"AttributeName": settings.TENANT_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                            {"AttributeName": settings.TENANT_INDEX_SORT_KEY, "KeyType": "RANGE"},
                        ],
                    }
                ),
                Match.object_like(
                    {"IndexName": settings.ACTIVE_JOBS_INDEX_NAME}
                ),  # quotas (tests/cdk/test_security.py)
            ],
        },
    )


def test_result_topic_is_encrypted_with_its_own_key(synthesized):
    """GIVEN the result topic WHEN reading it THEN a KMS key encrypts it."""
    key = synthesized.logical_id(synthesized.stack.service.results.key)
    synthesized.template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key, "Arn"]}})


def test_result_topic_refuses_requests_without_tls(synthesized):
    """GIVEN the result topic WHEN reading its topic policy THEN non-TLS requests are denied."""
    topic = synthesized.logical_id(synthesized.stack.service.results.topic)
    assert denies_insecure_transport(policy_of(synthesized.template, "AWS::SNS::TopicPolicy", topic))


def test_failed_upload_events_go_to_a_failure_queue_after_two_retries(synthesized):
    """GIVEN S3 invokes the upload function asynchronously WHEN an event fails its invocations THEN Lambda retries it
    twice and then sends it to the upload failure queue instead of dropping it."""
    uploads = synthesized.stack.service.uploads
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": synthesized.logical_id(uploads.handler)},
            "MaximumRetryAttempts": 2,
            "MaximumEventAgeInSeconds": 3600,
            "DestinationConfig": {
                "OnFailure": {"Destination": {"Fn::GetAtt": [synthesized.logical_id(uploads.failure_queue), "Arn"]}}
            },
        },
    )


def test_upload_failure_queue_is_encrypted_and_refuses_requests_without_tls(synthesized):
    """GIVEN the upload failure queue WHEN reading it and its policy THEN it is encrypted and TLS-only."""
    queue = synthesized.logical_id(synthesized.stack.service.uploads.failure_queue)
    assert synthesized.json["Resources"][queue]["Properties"]["SqsManagedSseEnabled"] is True
    assert denies_insecure_transport(policy_of(synthesized.template, "AWS::SQS::QueuePolicy", queue))


def test_upload_deadline_queue_is_encrypted_tls_only_and_redrives_to_its_dlq(synthesized):
    """GIVEN the upload-deadline queue WHEN reading it THEN it is encrypted, refuses non-TLS requests and moves a
    deadline that keeps failing to its DLQ after the shared receive count."""
    deadlines = synthesized.stack.service.upload_deadlines
    queue = synthesized.logical_id(deadlines.queue)
    properties = synthesized.json["Resources"][queue]["Properties"]
    assert properties["SqsManagedSseEnabled"] is True
    assert properties["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": [synthesized.logical_id(deadlines.dead_letter_queue), "Arn"]},
        "maxReceiveCount": settings.UPLOAD_DEADLINE_MAX_RECEIVE_COUNT,
    }
    assert denies_insecure_transport(policy_of(synthesized.template, "AWS::SQS::QueuePolicy", queue))


def test_a_presign_window_fits_in_one_sqs_delay(synthesized):
    """GIVEN SQS delays a message at most 900 s WHEN the API schedules a deadline THEN the longest presign window fits
    in one delay, and the grace leaves the upload function its two retries (1 + 2 minutes)."""
    assert settings.PRESIGNED_UPLOAD_EXPIRY_S <= 900
    assert settings.UPLOAD_GRACE_S >= 3 * 60


def test_upload_deadline_function_consumes_its_queue_reporting_item_failures(synthesized):
    """GIVEN the upload-deadline function WHEN a deadline comes before its grace is over THEN only that message is
    handed back (ReportBatchItemFailures), and the queue's visibility outlasts the function."""
    deadlines = synthesized.stack.service.upload_deadlines
    queue = synthesized.logical_id(deadlines.queue)
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
            "FunctionName": {"Ref": synthesized.logical_id(deadlines.handler)},
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        },
    )
    function = synthesized.json["Resources"][synthesized.logical_id(deadlines.handler)]["Properties"]
    assert synthesized.json["Resources"][queue]["Properties"]["VisibilityTimeout"] >= function["Timeout"]
    assert function["Handler"] == "lambdas.upload_deadlines.handler.lambda_handler"


@pytest.mark.parametrize(
    "handler", ["lambdas.api.handler.lambda_handler", "lambdas.upload_deadlines.handler.lambda_handler"]
)
def test_the_api_and_the_deadline_function_know_the_deadline_queue(synthesized, handler):
    """GIVEN the API schedules deadlines and the function hides early ones WHEN reading their environment THEN both
    have the upload-deadline queue's URL."""
    from async_inference.config import ENV_UPLOAD_DEADLINES_QUEUE_URL

    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    queue = synthesized.logical_id(synthesized.stack.service.upload_deadlines.queue)
    assert function["Properties"]["Environment"]["Variables"][ENV_UPLOAD_DEADLINES_QUEUE_URL] == {"Ref": queue}
