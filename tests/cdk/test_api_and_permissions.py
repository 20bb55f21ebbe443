"""The ingestion API's tenancy and the least-privilege permissions of every role."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest
from aws_cdk.assertions import Match

from async_inference import config, settings
from async_inference.schemas import ErrorResponse
from cdk.lambda_code import RUNTIME
from tests.cdk.helpers import dependency_cycle, function_role, role_actions, role_statements

pytestmark = pytest.mark.cdk

API = "lambdas.api.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"
DLQ = "lambdas.dlq.handler.lambda_handler"
DEADLINES = "lambdas.upload_deadlines.handler.lambda_handler"
WEBHOOKS = "lambdas.webhooks.handler.lambda_handler"
AUTHORIZER = "lambdas.authorizer.handler.lambda_handler"


def test_every_method_requires_an_api_key_checked_by_the_authorizer(synthesized):
    """GIVEN the REST API WHEN listing its methods THEN each one requires an API key and runs the REQUEST authorizer,
    which gives API Gateway the key (key source AUTHORIZER), so usage plans still throttle per tenant."""
    methods = synthesized.resources("AWS::ApiGateway::Method")
    [authorizer] = synthesized.resources("AWS::ApiGateway::Authorizer")
    assert len(methods) == 25  # 17, the 5 of the Responses API and the 3 held OpenAI routes
    assert all(m["Properties"]["ApiKeyRequired"] is True for m in methods.values())
    assert all(
        m["Properties"]["AuthorizationType"] == "CUSTOM" and m["Properties"]["AuthorizerId"] == {"Ref": authorizer}
        for m in methods.values()
    )
    synthesized.template.has_resource_properties("AWS::ApiGateway::RestApi", {"ApiKeySourceType": "AUTHORIZER"})


@pytest.mark.parametrize(("tenant", "rate", "burst", "quota"), [("demo", 10, 20, 10000), ("acme", 5, 5, 500)])
def test_each_tenant_gets_a_named_key_and_its_own_usage_plan(synthesized, tenant, rate, burst, quota):
    """GIVEN tenants in context WHEN synthesized THEN each has a key named by its id and a plan with its limits."""
    synthesized.template.has_resource_properties("AWS::ApiGateway::ApiKey", {"Name": tenant, "Enabled": True})
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::UsagePlan",
        {
            "UsagePlanName": tenant,
            "Throttle": {"RateLimit": rate, "BurstLimit": burst},
            "Quota": {"Limit": quota, "Period": "DAY"},
        },
    )


def test_submission_body_has_one_schema_the_functions(synthesized):
    """GIVEN POST /v1/jobs WHEN reading the API THEN the gateway validates parameters only and holds no body model:
    the function validates the body with the pydantic models, whose errors name the field to fix."""
    synthesized.template.resource_count_is("AWS::ApiGateway::Model", 0)
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::RequestValidator", {"ValidateRequestBody": False, "ValidateRequestParameters": True}
    )
    for method in synthesized.template.find_resources("AWS::ApiGateway::Method").values():
        assert "RequestModels" not in method["Properties"]


@pytest.mark.parametrize(
    "response_type",
    [
        "INVALID_API_KEY",
        "MISSING_AUTHENTICATION_TOKEN",
        "THROTTLED",
        "QUOTA_EXCEEDED",
        "REQUEST_TOO_LARGE",
        "BAD_REQUEST_PARAMETERS",
        "ACCESS_DENIED",
        "DEFAULT_4XX",
        "DEFAULT_5XX",
    ],
)
def test_gateway_errors_are_json_in_the_api_error_shape(synthesized, response_type):
    """GIVEN a missing/invalid key, throttling, a quota, an unknown route or a body too large WHEN API Gateway answers
    THEN the body, rendered with a message, is exactly the API's {"error": {"code", "message", "details"}}."""
    [response] = [
        r["Properties"]
        for r in synthesized.template.find_resources("AWS::ApiGateway::GatewayResponse").values()
        if r["Properties"]["ResponseType"] == response_type
    ]
    rendered = response["ResponseTemplates"]["application/json"].replace("$context.error.messageString", '"Forbidden"')
    assert json.loads(rendered) == {"error": {"code": ANY, "message": ANY, "details": []}}
    assert ErrorResponse.model_validate_json(rendered).error.message


def test_stage_has_access_logging_and_tracing(synthesized):
    """GIVEN the API stage WHEN reading it THEN access logs go to CloudWatch and X-Ray tracing is on."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {"TracingEnabled": True, "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()})},
    )


@pytest.mark.parametrize("handler", [API, UPLOAD, DLQ, WEBHOOKS, DEADLINES])
def test_functions_get_the_shared_runtime_configuration(synthesized, handler):
    """GIVEN each function WHEN reading its environment THEN it has ServiceConfig's names and the metrics namespace,
    and no job queue: the functions that queue work find each model's by its route (MODEL_FLEETS) only."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    variables = function["Properties"]["Environment"]["Variables"]
    expected = {config.ENV_TABLE, config.ENV_BUCKET, config.ENV_TOPIC_ARN}
    assert expected <= set(variables)
    assert not {config.ENV_QUEUE_URL, config.ENV_DLQ_URL, config.ENV_BATCH_QUEUE_URL} & set(variables)
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == settings.METRICS_NAMESPACE
    assert function["Properties"]["Runtime"] == RUNTIME.name
    assert function["Properties"]["TracingConfig"] == {"Mode": "Active"}


def _prefixes(resources):
    """The key prefixes (e.g. 'uploads/*') of the bucket object ARNs among ``resources``."""
    return {r["Fn::Join"][1][-1].lstrip("/") for r in resources if isinstance(r, dict) and "Fn::Join" in r}


XRAY = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}  # Tracing.ACTIVE, on every function
CATALOG = "ssm:GetParametersByPath"  # its parts of the deployment's catalog (cdk.catalog)
PUBLISH = {"sns:Publish", "kms:GenerateDataKey", "kms:Decrypt"}  # an encrypted topic
WAKE = ("ecs:DescribeServices", "ecs:UpdateService")  # async_inference.wake, on the worker service only
# The wake's hold of the scaling minimum (tests/cdk/test_scaling_hazards.py checks the statement).
WAKE_HOLD = ("application-autoscaling:RegisterScalableTarget", "application-autoscaling:PutScheduledAction")
# The wake's instance start: the GPU group's desired capacity, read and raised (cdk.gpu_capacity.grant_instance_start).
WAKE_INSTANCE = ("autoscaling:DescribeAutoScalingGroups", "autoscaling:SetDesiredCapacity")
# GET /v1/models reads each GPU group's latest scaling activity (async_inference.capacity_state): the API only.
CAPACITY_READ = ("autoscaling:DescribeScalingActivities",)
# What a Lambda SQS event source grants its function on the queue (aws-cdk-lib's SqsEventSource).
EVENT_SOURCE = {
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueUrl",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
}

# What aws-cdk-lib's SqsDestination grants a function on its on-failure queue (Lambda itself needs SendMessage).
DESTINATION = {"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}


def _function_actions(synthesized, handler):
    return role_actions(synthesized.template, function_role(synthesized.template, handler))


def _worker_actions(synthesized):
    return role_actions(
        synthesized.template,
        synthesized.logical_id(synthesized.stack.service.fleets[0].workers.task_definition.task_role),
    )


def test_api_role_has_exactly_the_calls_the_api_makes(synthesized):
    """GIVEN the API function's role WHEN listing its actions THEN they are exactly the API's calls: job, file and
    batch items and their tenant indexes, request/upload/file writes, result and file reads (presigned), file deletes,
    sends, notifications; no API key reads (the authorizer gives it the tenant)."""
    actions = _function_actions(synthesized, API)
    assert set(actions) == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:Query",
        "s3:PutObject",
        "s3:GetObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        "sqs:SendMessage",
        *PUBLISH,
        *XRAY,
        CATALOG,
        *WAKE,
        *WAKE_HOLD,
        *WAKE_INSTANCE,
        *CAPACITY_READ,
    }
    assert _prefixes(actions["s3:PutObject"]) == {
        f"{settings.REQUEST_PREFIX}*",
        f"{settings.UPLOAD_PREFIX}*",
        f"{settings.FILE_PREFIX}*",
    }
    responses = f"{settings.REQUEST_PREFIX}*/{settings.RESPONSES_REQUEST_NAME}*"  # background responses' bodies
    assert _prefixes(actions["s3:GetObject"]) == {f"{settings.RESULT_PREFIX}*", f"{settings.FILE_PREFIX}*", responses}
    # A deleted background response's job goes with it: its request and its result.
    assert _prefixes(actions["s3:DeleteObject"]) == {
        f"{settings.FILE_PREFIX}*",
        responses,
        f"{settings.REQUEST_PREFIX}*",
        f"{settings.RESULT_PREFIX}*",
    }


def test_api_queries_only_the_tenant_index(synthesized):
    """GIVEN the list endpoints and the quota checks WHEN reading the API role's Query grants THEN they name the two
    tenant indexes (jobs; files and batches), the unfinished-jobs index and the batches-in-flight index, and the job
    event log a stream is read from; no wildcard."""
    table = synthesized.logical_id(synthesized.stack.service.table.table)
    streams = synthesized.logical_id(synthesized.stack.service.streams.table)
    batch_table = synthesized.logical_id(synthesized.stack.service.batches.table)
    resources = _function_actions(synthesized, API)["dynamodb:Query"]
    in_flight = f"/index/{settings.BATCH_ACTIVE_INDEX_NAME}"
    assert sorted(map(str, resources)) == sorted(
        map(
            str,
            [
                {"Fn::Join": ["", [{"Fn::GetAtt": [table, "Arn"]}, f"/index/{settings.TENANT_INDEX_NAME}"]]},
                {"Fn::Join": ["", [{"Fn::GetAtt": [table, "Arn"]}, f"/index/{settings.ACTIVE_JOBS_INDEX_NAME}"]]},
                {"Fn::Join": ["", [{"Fn::GetAtt": [batch_table, "Arn"]}, f"/index/{settings.BATCH_OWNER_INDEX_NAME}"]]},
                {"Fn::Join": ["", [{"Fn::GetAtt": [batch_table, "Arn"]}, in_flight]]},
                {"Fn::GetAtt": [streams, "Arn"]},
            ],
        )
    )


def test_the_authorizer_reads_the_api_key_collection_in_one_call_and_nothing_else_of_api_gateway(synthesized):
    """GIVEN the authorizer's key lookup (one GetApiKeys call for every tenant's key) WHEN reading its role's
    apigateway:GET THEN it names the region's key collection only (GetApiKeys' one resource), no other API Gateway
    path."""
    [resource] = _function_actions(synthesized, AUTHORIZER)["apigateway:GET"]
    assert resource["Fn::Join"][1][-1] == "::/apikeys"


def test_the_authorizer_role_has_only_the_key_reads(synthesized):
    """GIVEN the authorizer WHEN listing its role's actions THEN it reads API keys and traces, nothing else."""
    assert set(_function_actions(synthesized, AUTHORIZER)) == {"apigateway:GET", CATALOG, *XRAY}


def test_the_keys_do_not_depend_on_the_stage_so_the_template_has_no_cycle(synthesized):
    """GIVEN the authorizer's environment names the tenants' keys, and the methods depend on the authorizer WHEN
    reading the keys THEN they are not tied to the stage (StageKeys; the usage plans do that), and there is no cycle."""
    for key in synthesized.resources("AWS::ApiGateway::ApiKey").values():
        assert "StageKeys" not in key["Properties"] and "DependsOn" not in key
    assert dependency_cycle(synthesized.json) is None


def test_upload_role_reads_and_deletes_uploads_only(synthesized):
    """GIVEN the upload function's role WHEN listing its actions THEN it reads and deletes under uploads/, lists only
    that prefix (so a missing key reads as 404), writes an accepted upload under requests/ only, queues, notifies,
    touches job items, and reads file records and deletes file uploads (a file deleted before its bytes arrived)."""
    actions = _function_actions(synthesized, UPLOAD)
    assert set(actions) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "s3:GetObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        "s3:PutObject",
        "sqs:SendMessage",
        *PUBLISH,
        *DESTINATION,
        *XRAY,
        CATALOG,
        *WAKE,
        *WAKE_HOLD,
        *WAKE_INSTANCE,
    }
    assert _prefixes(actions["s3:GetObject"]) == {f"{settings.UPLOAD_PREFIX}*"}
    assert _prefixes(actions["s3:DeleteObject"]) == {
        f"{settings.UPLOAD_PREFIX}*",
        f"{settings.FILE_PREFIX}*/{settings.FILE_UPLOAD_NAME}*",
    }
    assert _prefixes(actions["s3:PutObject"]) == {f"{settings.REQUEST_PREFIX}*"}


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_may_wake_the_worker_service_and_nothing_else_in_ecs(synthesized, handler):
    """GIVEN the API and upload functions (both queue jobs) WHEN reading their ECS statements THEN they may describe
    and update exactly the worker service, by its ARN (built from the service's name: tests/cdk/test_deploy_day.py),
    and make no other ECS call."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    cluster = synthesized.logical_id(synthesized.stack.service.fleets[0].workers.cluster)
    statements = [
        s
        for s in role_statements(synthesized.template, function_role(synthesized.template, handler))
        if any(str(a).startswith("ecs:") for a in _as_list(s["Action"]))
    ]
    assert [(s["Action"], s["Effect"]) for s in statements] == [(list(WAKE), "Allow")]
    service_arn = statements[0]["Resource"]
    assert {"Ref": cluster} in service_arn["Fn::Join"][1] and service_arn["Fn::Join"][1][-1].endswith("/gpu-workers")
    assert "service/" in json.dumps(service_arn)


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_know_the_service_to_wake(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their environment THEN the stack's wake settings (cluster,
    interval, hold) are set by the names async_inference.config reads, and the service to wake only in the model's
    MODEL_FLEETS route (async_inference.fleets), as every model's is."""
    workers = synthesized.stack.service.fleets[0].workers
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    env = synthesized.variables(handler)
    assert env[config.ENV_WORKER_CLUSTER] == {"Ref": synthesized.logical_id(workers.cluster)}
    assert (env[config.ENV_WAKE_CHECK_INTERVAL_S], env[config.ENV_WAKE_HOLD_S]) == ("60", "420")
    assert "WORKER_SERVICE_ARN" not in env and "WORKER_AUTO_SCALING_GROUP" not in env
    # The service's ARN from its cluster's name and its own, fixed at synth: no reference to the service resource.
    parts = env[config.ENV_MODEL_FLEETS]["Fn::Join"][1]
    assert synthesized.logical_id(workers.service) not in json.dumps(parts)
    assert any(
        part == {"Ref": synthesized.logical_id(workers.cluster)} and str(after).startswith('/gpu-workers"')
        for part, after in zip(parts, parts[1:], strict=False)
    )


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_may_start_a_gpu_instance_in_the_one_group(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their environment and Auto Scaling statements THEN they know
    the GPU group by name, may raise its desired capacity (on that group's ARN only) and read it (DescribeAutoScaling
    Groups, which takes no resource), and may do nothing else in Auto Scaling."""
    group_id = synthesized.logical_id(synthesized.stack.service.fleets[0].workers.auto_scaling_group)
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    parts = synthesized.variables(handler)[config.ENV_MODEL_FLEETS]["Fn::Join"][1]
    assert any(
        str(before).endswith('"worker_group":"') and part == {"Ref": group_id}
        for before, part in zip(parts, parts[1:], strict=False)
    )
    statements = [
        s
        for s in role_statements(synthesized.template, function_role(synthesized.template, handler))
        if any(str(a).startswith("autoscaling:") for a in _as_list(s["Action"]))
    ]
    # (CDK merges statements on the same resource: DescribeAutoScalingGroups shares "*" with X-Ray and the hold.)
    by_action = {a: s["Resource"] for s in statements for a in _as_list(s["Action"]) if a.startswith("autoscaling:")}
    assert set(by_action) == set(WAKE_INSTANCE) | (set(CAPACITY_READ) if handler == API else set())
    assert by_action["autoscaling:DescribeAutoScalingGroups"] == "*"
    arn = json.dumps(by_action["autoscaling:SetDesiredCapacity"])
    assert "autoScalingGroupName/" in arn and group_id in arn and "*" not in arn.replace(":*:", ":")


def test_without_wake_from_zero_no_function_gets_ecs_permissions_or_the_service(synth_variant):
    """GIVEN wake_from_zero=False WHEN synthesized THEN no function may call ECS nor names the worker service, and
    none but the instance release may set the GPU group's capacity (the API may read the group's scaling activities,
    for GET /v1/models to say why nothing runs)."""
    variant = synth_variant(wake_from_zero=False)
    for handler in (API, UPLOAD):
        role = function_role(variant.template, handler)
        actions = role_actions(variant.template, role)
        assert not [a for a in actions if a.startswith(("ecs:", "autoscaling:")) and a not in CAPACITY_READ]
    for function in variant.resources("AWS::Lambda::Function").values():
        variables = function["Properties"].get("Environment", {}).get("Variables", {})
        assert '"worker_service"' not in json.dumps(variables) and '"worker_group"' not in json.dumps(variables)


def _as_list(value):
    return value if isinstance(value, list) else [value]


def test_upload_role_sends_to_the_job_queue_and_its_failure_queue_only(synthesized):
    """GIVEN the upload function WHEN reading its sends THEN they go to the job queue (claim checks), the batch lane
    (claim checks of jobs with priority "batch") and to its on-failure queue (Lambda delivers failed events with the
    function's role)."""
    service = synthesized.stack.service
    queues = {
        synthesized.logical_id(service.fleets[0].jobs.queue),
        synthesized.logical_id(service.uploads.failure_queue),
        synthesized.logical_id(service.fleets[0].lane_queue),
    }
    sends = _function_actions(synthesized, UPLOAD)["sqs:SendMessage"]
    assert {resource["Fn::GetAtt"][0] for resource in sends} == queues


def test_dlq_role_touches_no_job_payloads(synthesized):
    """GIVEN the DLQ handler's role WHEN listing its actions THEN it consumes its queues, updates jobs and batches,
    notifies, and for dead-lettered chunks reads and writes batch objects (sends their finalize step) only: no job
    request or result."""
    actions = _function_actions(synthesized, DLQ)
    assert set(actions) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        *PUBLISH,
        *EVENT_SOURCE,
        *XRAY,
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "sqs:SendMessage",
    }
    objects = {r["Fn::Join"][1][-1].lstrip("/") for r in actions["s3:GetObject"] + actions["s3:PutObject"]}
    assert objects == {f"{settings.FILE_PREFIX}*", f"{settings.BATCH_PREFIX}*"}


def test_api_sends_to_the_job_queues_the_deadline_queue_and_the_control_queue_only(synthesized):
    """GIVEN the API WHEN reading its sends THEN they go to the job queue (inline jobs), the upload-deadline queue
    (each upload job's deadline), the batch control queue (plan steps) and the batch lane (jobs with priority
    "batch")."""
    service = synthesized.stack.service
    queues = {
        synthesized.logical_id(service.fleets[0].jobs.queue),
        synthesized.logical_id(service.upload_deadlines.queue),
        synthesized.logical_id(service.batches.control_queue),
        synthesized.logical_id(service.fleets[0].lane_queue),
    }
    assert {r["Fn::GetAtt"][0] for r in _function_actions(synthesized, API)["sqs:SendMessage"]} == queues


def test_deadline_role_expires_jobs_and_notifies_only(synthesized):
    """GIVEN the upload-deadline function WHEN listing its actions THEN it consumes (and hides) its queue's messages,
    reads and updates job items and notifies; no S3."""
    assert set(_function_actions(synthesized, DEADLINES)) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        *PUBLISH,
        *EVENT_SOURCE,
        *XRAY,
    }


def test_webhook_role_reads_its_secret_and_publishes_nothing(synthesized):
    """GIVEN the webhook function's role WHEN listing its actions THEN it reads the secret's value (only), records
    attempts on jobs, consumes its queue; no S3, no publish."""
    assert set(_function_actions(synthesized, WEBHOOKS)) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "secretsmanager:GetSecretValue",
        *EVENT_SOURCE,
        *XRAY,
        CATALOG,
    }


def test_worker_role_has_exactly_the_calls_the_worker_makes(synthesized):
    """GIVEN the worker task role WHEN listing its actions THEN they are the worker's calls, and no Scan, DeleteItem,
    BatchWriteItem, DeleteObject or queue-wide reads."""
    assert set(_worker_actions(synthesized)) == {
        "sqs:ReceiveMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
        "s3:GetObject",
        "s3:PutObject",
        "s3:ListBucket",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:BatchGetItem",
        "ecs:UpdateTaskProtection",
        "ecs:GetTaskProtection",
        *PUBLISH,
        "dynamodb:Query",  # the WebSocket connections' tenant index: which jobs a connection follows
        "dynamodb:PutItem",  # streamed jobs' text, appended to the job event log (gpu_worker.deltas)
        "ecs:DescribeServices",  # whether a newer deployment waits (gpu_worker.deployments)
    }


def test_worker_reads_payloads_and_results_and_writes_results_only(synthesized):
    """GIVEN the worker WHEN reading its S3 grants THEN it reads requests, uploads, results (a result an earlier
    run wrote is read back) and batch input files, and writes under results/ and batch parts only."""
    actions = _worker_actions(synthesized)
    assert _prefixes(actions["s3:GetObject"]) == {
        f"{settings.REQUEST_PREFIX}*",
        f"{settings.UPLOAD_PREFIX}*",
        f"{settings.RESULT_PREFIX}*",
        f"{settings.FILE_PREFIX}*",
    }
    assert _prefixes(actions["s3:PutObject"]) == {f"{settings.RESULT_PREFIX}*", f"{settings.BATCH_PREFIX}*"}


def test_worker_consumes_the_job_queue_and_sends_only_to_the_webhook_queues(synthesized):
    """GIVEN the worker's SQS grants WHEN reading their resources THEN it consumes the job queue and the batch lane,
    and sends only "started" events to the webhook queues, finalize steps to the batch control queue, and claim
    checks of a tenant at its share back to the job queue and the batch lane (gpu_worker.fairness)."""
    actions = _worker_actions(synthesized)
    service = synthesized.stack.service
    jobs, lane = (
        synthesized.logical_id(service.fleets[0].jobs.queue),
        synthesized.logical_id(service.fleets[0].lane_queue),
    )
    webhook_queues = {synthesized.logical_id(queue) for queue in service.webhooks.queues.values()}
    control = synthesized.logical_id(service.batches.control_queue)
    for action in ("sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage"):
        assert {r["Fn::GetAtt"][0] for r in actions[action]} == {jobs, lane}
    assert {r["Fn::GetAtt"][0] for r in actions["sqs:SendMessage"]} == {*webhook_queues, control, jobs, lane}


@pytest.mark.parametrize(
    ("principal", "prefixes"),
    [
        ("upload", [f"{settings.UPLOAD_PREFIX}*"]),
        ("api", [f"{settings.REQUEST_PREFIX}*/{settings.RESPONSES_REQUEST_NAME}*"]),
        (
            "worker",
            [
                f"{settings.REQUEST_PREFIX}*",
                f"{settings.UPLOAD_PREFIX}*",
                f"{settings.RESULT_PREFIX}*",
                f"{settings.FILE_PREFIX}*",
            ],
        ),
    ],
)
def test_listing_is_confined_to_the_prefixes_a_principal_reads(synthesized, principal, prefixes):
    """GIVEN s3:ListBucket (what makes a missing key a 404, not a 403) WHEN reading its statement THEN it is on the
    claim-check bucket and only for keys under the prefixes the principal reads."""
    role = (
        function_role(synthesized.template, {"upload": UPLOAD, "api": API}[principal])
        if principal in ("upload", "api")
        else synthesized.logical_id(synthesized.stack.service.fleets[0].workers.task_definition.task_role)
    )
    bucket = synthesized.logical_id(synthesized.stack.service.bucket.bucket)
    statements = [s for s in role_statements(synthesized.template, role) if s["Action"] == "s3:ListBucket"]
    assert statements and all(s["Resource"] == {"Fn::GetAtt": [bucket, "Arn"]} for s in statements)
    listed = [p for s in statements for p in s["Condition"]["StringLike"]["s3:prefix"]]
    assert sorted(listed) == sorted(prefixes) and all(set(s["Condition"]) == {"StringLike"} for s in statements)


def test_no_role_has_an_aws_managed_full_access_policy(synthesized):
    """GIVEN every IAM role WHEN reading its managed policies THEN none is a *FullAccess policy."""
    for role in synthesized.resources("AWS::IAM::Role").values():
        assert "FullAccess" not in str(role["Properties"].get("ManagedPolicyArns", []))


@pytest.mark.parametrize(
    "output", ["ApiUrl", "BucketName", "QueueUrl", "DeadLetterQueueUrl", "TableName", "ResultTopicArn"]
)
def test_stack_outputs_where_the_service_is(synthesized, output):
    """GIVEN the stack WHEN deployed THEN it outputs the API URL and the resources operators need."""
    synthesized.template.has_output(output, {"Value": Match.any_value()})


def test_a_path_no_method_serves_is_a_404_not_found(synthesized):
    """GIVEN API Gateway's MISSING_AUTHENTICATION_TOKEN (its answer to an unknown path, 403 by default) WHEN reading the
    gateway responses THEN it answers 404 with the not_found code."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::GatewayResponse",
        {
            "ResponseType": "MISSING_AUTHENTICATION_TOKEN",
            "StatusCode": "404",
            "ResponseTemplates": {"application/json": Match.string_like_regexp('"code": "not_found"')},
        },
    )


def test_the_cycle_check_finds_a_cycle():
    """GIVEN two resources that refer to each other WHEN checking the template THEN the cycle is found (the check
    above is not vacuous)."""
    template = {"Resources": {"A": {"Properties": {"Role": {"Ref": "B"}}}, "B": {"DependsOn": "A"}, "C": {}}}
    assert set(dependency_cycle(template) or []) == {"A", "B"}
