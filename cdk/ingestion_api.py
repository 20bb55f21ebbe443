"""The ingestion API: a REST API with one API key and usage plan per tenant, in front of the API Lambda."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from async_inference import settings
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"  # it becomes an S3 key segment and an API key name
# The API function's Powertools service name: the ``service`` dimension of JobsSubmitted.
API_SERVICE_NAME = "async-inference-api"


@dataclass(frozen=True, kw_only=True)
class TenantPlan:
    """Throttling and quota of one tenant's usage plan.

    :param rate_limit: steady requests per second. Default: 10.
    :param burst_limit: requests allowed in a burst. Default: 20.
    :param quota_per_day: requests per day. Default: 10000.
    """

    rate_limit: float = 10
    burst_limit: int = 20
    quota_per_day: int = 10_000

    def __post_init__(self) -> None:
        if self.rate_limit <= 0 or self.burst_limit < 1 or self.quota_per_day < 1:
            raise ValueError(f"rate_limit, burst_limit and quota_per_day must be positive, got {self}")
        if self.burst_limit < self.rate_limit:
            raise ValueError(f"burst_limit ({self.burst_limit}) is below rate_limit ({self.rate_limit})")


def validate_tenant_id(tenant: str) -> str:
    if not re.match(TENANT_ID_PATTERN, tenant):
        raise ValueError(f"tenant id {tenant!r} must match {TENANT_ID_PATTERN}")
    return tenant


# Gateway-generated errors in the same shape as the Lambda's ErrorResponse: {"error": {"code", "message", "details"}}.
_GATEWAY_ERRORS = {
    apigw.ResponseType.INVALID_API_KEY: "invalid_api_key",
    apigw.ResponseType.ACCESS_DENIED: "forbidden",
    apigw.ResponseType.MISSING_AUTHENTICATION_TOKEN: "not_found",
    apigw.ResponseType.THROTTLED: "throttled",
    apigw.ResponseType.QUOTA_EXCEEDED: "quota_exceeded",
    apigw.ResponseType.BAD_REQUEST_BODY: "invalid_request",
    apigw.ResponseType.BAD_REQUEST_PARAMETERS: "invalid_request",
    apigw.ResponseType.REQUEST_TOO_LARGE: "payload_too_large",
    apigw.ResponseType.DEFAULT_4_XX: "client_error",
    apigw.ResponseType.DEFAULT_5_XX: "server_error",
}
# API Gateway answers a path no method serves with MISSING_AUTHENTICATION_TOKEN, 403 (this API has no IAM-authorized
# methods, the other case of that response): a client that mistyped a path gets the 404 it expects instead.
_GATEWAY_STATUS = {"MISSING_AUTHENTICATION_TOKEN": "404"}  # by response type name: jsii objects do not hash alike
# Messages that say what to do, where API Gateway's own ("Missing Authentication Token" for an unknown path,
# "Forbidden" for a missing key) would puzzle a client. The other types keep API Gateway's message.
_GATEWAY_MESSAGES = {
    "INVALID_API_KEY": "send your API key in the x-api-key header: it is missing or not a key of this API",
    "MISSING_AUTHENTICATION_TOKEN": "no route serves this method and path; GET /v1/openapi.json lists the routes",
    "THROTTLED": "over your usage plan's request rate; retry after a moment",
    "QUOTA_EXCEEDED": "over your usage plan's daily quota; it resets at the start of the next day (UTC)",
    "REQUEST_TOO_LARGE": "the body is over API Gateway's 10 MB limit; use an upload job for large requests",
}


class IngestionApi(Construct):
    """REST API (API keys, usage plans, validation, access logs, X-Ray) proxying every route to the API Lambda.

    Every method requires an API key (header ``x-api-key``). Each tenant gets an API key named exactly its tenant id
    and its own usage plan; the Lambda resolves the caller's key id to that name to learn the tenant.

    :param code: the shared Lambda code.
    :param environment: the service's runtime configuration and Powertools settings.
    :param tenants: tenant id -> its usage plan.
    :param stage_name: API stage. Default: ``"prod"``.
    :param log_retention: access log retention. Default: one month.
    :param create_cloudwatch_role: create the account-wide role API Gateway logs with; set False when the account
        already has one configured. Default: True.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        environment: Mapping[str, str],
        tenants: Mapping[str, TenantPlan],
        stage_name: str = "prod",
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        create_cloudwatch_role: bool = True,
    ) -> None:
        super().__init__(scope, id)
        if not tenants:
            raise ValueError("tenants is empty: with API keys required on every method, nobody could call the API")
        self.service_name = API_SERVICE_NAME
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.api.handler.lambda_handler",
            description="Ingestion API: submit, get, list and cancel jobs",
            service_name=self.service_name,
            environment=environment,
            timeout=Duration.seconds(settings.API_FUNCTION_TIMEOUT_S),  # API Gateway's integration timeout
        )
        access_logs = logs.LogGroup(
            self, "AccessLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        self.api = apigw.RestApi(
            self,
            "Api",
            description="Asynchronous LLM inference: submit jobs, poll their status, fetch results",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            api_key_source_type=apigw.ApiKeySourceType.HEADER,
            default_method_options=apigw.MethodOptions(api_key_required=True),
            cloud_watch_role=create_cloudwatch_role,
            deploy_options=apigw.StageOptions(
                stage_name=stage_name,
                tracing_enabled=True,
                metrics_enabled=True,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
            ),
        )
        self._acknowledge_api_findings()
        self._add_gateway_responses()
        self._add_routes()
        self.api_keys: dict[str, apigw.IApiKey] = {}
        for tenant, plan in tenants.items():
            self._add_tenant(validate_tenant_id(tenant), plan)

    def _add_routes(self) -> None:
        integration = apigw.LambdaIntegration(self.handler, allow_test_invoke=False)
        # Parameters only. The body is validated once, by the function, with the pydantic models that also write the
        # OpenAPI document: a second schema here (API Gateway's draft-4 model) answered "Invalid request body" for
        # inputs whose function error names the field to fix, and drifted from the models.
        validator = self.api.add_request_validator(
            "Validator", validate_request_body=False, validate_request_parameters=True
        )
        job_id = {"method.request.path.job_id": True}
        v1 = self.api.root.add_resource("v1")
        jobs = v1.add_resource("jobs")
        jobs.add_method(
            "POST",
            integration,
            request_validator=validator,
            request_parameters={"method.request.header.idempotency-key": False},
        )
        jobs.add_method("GET", integration, request_validator=validator)
        job = jobs.add_resource("{job_id}")
        job.add_method("GET", integration, request_validator=validator, request_parameters=job_id)
        job.add_resource("cancel").add_method(
            "POST", integration, request_validator=validator, request_parameters=job_id
        )
        v1.add_resource("openapi.json").add_method("GET", integration)

    def grant_read_api_keys(self, role: iam.IRole) -> iam.Policy:
        """apigateway:GET on this API's tenant keys, to resolve a caller's key id to its name (the tenant).

        The keys depend on the stage, the stage on the methods, the methods on the function, and the function on its
        role's default policy: naming the keys there would be a dependency cycle. So the statement lives in a policy
        of its own, attached to the role, that the function does not depend on. CloudFormation creates it after the
        keys, so until then (during the first deployment only) a call is refused.
        """
        policy = iam.Policy(
            self,
            "ReadApiKeys",
            statements=[
                iam.PolicyStatement(
                    actions=["apigateway:GET"], resources=[key.key_arn for key in self.api_keys.values()]
                )
            ],
        )
        policy.attach_to_role(role)
        return policy

    def _add_tenant(self, tenant: str, plan: TenantPlan) -> None:
        key = self.api.add_api_key(f"ApiKey-{tenant}", api_key_name=tenant, description=f"API key of tenant {tenant}")
        usage_plan = self.api.add_usage_plan(
            f"UsagePlan-{tenant}",
            name=f"{tenant}",
            description=f"Throttling and quota of tenant {tenant}",
            throttle=apigw.ThrottleSettings(rate_limit=plan.rate_limit, burst_limit=plan.burst_limit),
            quota=apigw.QuotaSettings(limit=plan.quota_per_day, period=apigw.Period.DAY),
            api_stages=[apigw.UsagePlanPerApiStage(api=self.api, stage=self.api.deployment_stage)],
        )
        usage_plan.add_api_key(key)
        self.api_keys[tenant] = key

    def _add_gateway_responses(self) -> None:
        for response_type, code in _GATEWAY_ERRORS.items():
            message = _GATEWAY_MESSAGES.get(response_type.response_type)
            body = {"error": {"code": code, "message": message or "__MESSAGE__", "details": []}}
            template = json.dumps(body).replace('"__MESSAGE__"', "$context.error.messageString")
            self.api.add_gateway_response(
                f"{code}-{response_type.response_type}",
                type=response_type,
                status_code=_GATEWAY_STATUS.get(response_type.response_type),
                templates={"application/json": template},
            )

    def _acknowledge_api_findings(self) -> None:
        findings = {
            "AwsSolutions-APIG2": "The gateway validates required parameters; request bodies are validated by the "
            "function against the service's pydantic models (the one schema, also behind the OpenAPI document), "
            "whose 400s name the field to fix. A second, draft-4 model here answered 'Invalid request body' instead.",
            "AwsSolutions-APIG3": "No WAF in the default deployment: every method needs an API key and each tenant "
            "has a usage plan with throttling and a daily quota; a platform team can associate its own web ACL.",
            "AwsSolutions-APIG4": "Callers are identified by API keys (one per tenant, named by tenant id); the "
            "Lambda resolves the key to the tenant and scopes every read and write to it.",
            "AwsSolutions-COG4": "Machine-to-machine API for tenants' back ends, identified by API keys; no end-user "
            "pool to authorize against.",
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]": "The account-level role API Gateway writes access and execution "
            "logs with; this AWS managed policy is the documented one and grants only CloudWatch Logs writes.",
        }
        acknowledge(self.api, findings)
