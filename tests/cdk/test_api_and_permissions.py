"""The ingestion API's tenancy and the least-privilege permissions of every role."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from async_inference import config, settings
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

API = "lambdas.api.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"
DLQ = "lambdas.dlq.handler.lambda_handler"
WEBHOOKS = "lambdas.webhooks.handler.lambda_handler"


def test_every_method_requires_an_api_key(synthesized):
    """GIVEN the REST API WHEN listing its methods THEN each one requires an API key."""
    methods = synthesized.resources("AWS::ApiGateway::Method")
    assert len(methods) == 5
    assert all(m["Properties"]["ApiKeyRequired"] is True for m in methods.values())
    synthesized.template.has_resource_properties("AWS::ApiGateway::RestApi", {"ApiKeySourceType": "HEADER"})


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


@pytest.mark.parametrize("response_type", ["INVALID_API_KEY", "THROTTLED", "QUOTA_EXCEEDED"])
def test_gateway_errors_are_json_in_the_api_error_shape(synthesized, response_type):
    """GIVEN a missing/invalid key or throttling WHEN API Gateway answers THEN the body is {"error": {...}} JSON."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::GatewayResponse",
        {
            "ResponseType": response_type,
            "ResponseTemplates": {"application/json": Match.string_like_regexp(r'^\{"error": \{"code": ')},
        },
    )


def test_stage_has_access_logging_and_tracing(synthesized):
    """GIVEN the API stage WHEN reading it THEN access logs go to CloudWatch and X-Ray tracing is on."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {"TracingEnabled": True, "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()})},
    )


@pytest.mark.parametrize("handler", [API, UPLOAD, DLQ, WEBHOOKS])
def test_functions_get_the_shared_runtime_configuration(synthesized, handler):
    """GIVEN each function WHEN reading its environment THEN it has ServiceConfig's names and the metrics namespace."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    variables = function["Properties"]["Environment"]["Variables"]
    expected = {config.ENV_TABLE, config.ENV_BUCKET, config.ENV_QUEUE_URL, config.ENV_TOPIC_ARN, config.ENV_DLQ_URL}
    assert expected <= set(variables)
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == settings.METRICS_NAMESPACE
    assert function["Properties"]["Runtime"] == "python3.11"
    assert function["Properties"]["TracingConfig"] == {"Mode": "Active"}


def _prefixes(resources):
    """The key prefixes (e.g. 'uploads/*') of the bucket object ARNs among ``resources``."""
    return {r["Fn::Join"][1][-1].lstrip("/") for r in resources if isinstance(r, dict) and "Fn::Join" in r}


def test_api_role_writes_requests_presigns_uploads_and_results_and_sends_jobs(synthesized):
    """GIVEN the API function's role WHEN listing its actions THEN it only has what the API uses."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, API))
    assert "sqs:SendMessage" in actions and "apigateway:GET" in actions
    assert _prefixes(actions["s3:PutObject"]) == {f"{settings.REQUEST_PREFIX}*", f"{settings.UPLOAD_PREFIX}*"}
    assert _prefixes(actions["s3:GetObject*"]) == {f"{settings.REQUEST_PREFIX}*", f"{settings.RESULT_PREFIX}*"}
    assert not {"sns:Publish", "sqs:ReceiveMessage", "secretsmanager:GetSecretValue"} & set(actions)


def test_upload_role_reads_and_deletes_uploads_only(synthesized):
    """GIVEN the upload function's role WHEN listing its actions THEN S3 access is read/delete under uploads/."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, UPLOAD))
    assert _prefixes(actions["s3:GetObject*"]) == {f"{settings.UPLOAD_PREFIX}*"}
    assert _prefixes(actions["s3:DeleteObject*"]) == {f"{settings.UPLOAD_PREFIX}*"}
    assert "s3:PutObject" not in actions
    assert {"sqs:SendMessage", "sns:Publish", "dynamodb:UpdateItem"} <= set(actions)


def test_dlq_role_touches_no_payloads(synthesized):
    """GIVEN the DLQ handler's role WHEN listing its actions THEN it has no S3 and no send to the job queue."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, DLQ))
    assert not [a for a in actions if a.startswith("s3:")]
    assert "sqs:SendMessage" not in actions
    assert {"sqs:ReceiveMessage", "sns:Publish", "dynamodb:UpdateItem"} <= set(actions)


def test_webhook_role_reads_its_secret_and_publishes_nothing(synthesized):
    """GIVEN the webhook function's role WHEN listing its actions THEN it reads the secret, no S3, no publish."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, WEBHOOKS))
    assert "secretsmanager:GetSecretValue" in actions
    assert not [a for a in actions if a.startswith("s3:")]
    assert "sns:Publish" not in actions


def test_worker_role_consumes_jobs_writes_results_and_protects_its_tasks(synthesized):
    """GIVEN the worker task role WHEN listing its actions THEN it reads requests/uploads and writes results only."""
    role = synthesized.logical_id(synthesized.stack.service.workers.task_definition.task_role)
    actions = role_actions(synthesized.template, role)
    assert {"sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sns:Publish"} <= set(actions)
    assert {"ecs:UpdateTaskProtection", "ecs:GetTaskProtection"} <= set(actions)
    assert _prefixes(actions["s3:GetObject*"]) == {f"{settings.REQUEST_PREFIX}*", f"{settings.UPLOAD_PREFIX}*"}
    assert _prefixes(actions["s3:PutObject"]) == {f"{settings.RESULT_PREFIX}*"}
    assert "s3:DeleteObject*" not in actions
    # It sends to one queue only: the webhook queue, for "started" events (never to the job queue).
    webhook_queue = synthesized.logical_id(synthesized.stack.service.webhooks.queue)
    assert actions["sqs:SendMessage"] == [{"Fn::GetAtt": [webhook_queue, "Arn"]}]


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
        {"ResponseType": "MISSING_AUTHENTICATION_TOKEN", "StatusCode": "404",
         "ResponseTemplates": {"application/json": Match.string_like_regexp('"code": "not_found"')}},
    )
