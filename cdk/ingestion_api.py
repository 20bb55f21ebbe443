"""The ingestion API: a REST API with one API key and usage plan per tenant, a REQUEST authorizer that accepts the key
as `Authorization: Bearer` or `x-api-key`, in front of the API Lambda."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from async_inference import settings
from async_inference.limits import LimitOverrides
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge
from cdk.responses_routes import add_responses_routes
from cdk.streaming_function import STREAM_TIMEOUT, new_streaming_function
from cdk.tenant_stacks import TenantStacks

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"  # it becomes an S3 key segment and an API key name
MAX_KEYS_PER_TENANT = 2  # the old and the new key while a rotation is under way
# The API function's Powertools service name: the ``service`` dimension of JobsSubmitted.
API_SERVICE_NAME = "async-inference-api"


@dataclass(frozen=True, kw_only=True)
class TenantPlan:
    """Throttling and quotas of one tenant: its usage plan's, and the API's own, checked at submit.

    :param rate_limit: steady requests per second. Default: 10.
    :param burst_limit: requests allowed in a burst. Default: 20.
    :param quota_per_day: requests per day. Default: 10000.
    :param max_active_jobs: jobs awaiting upload, queued or running at once; a submit over it is a 429
        ``quota_exceeded`` (``async_inference.quotas``). Default: ``settings.DEFAULT_MAX_ACTIVE_JOBS`` (1000).
    :param max_batch_lines_in_flight: lines of the tenant's batches not yet final; ``POST /v1/batches`` is a 429
        ``quota_exceeded`` when they are at it, and a batch whose lines would pass it fails validation with an error
        naming it. Default: ``settings.DEFAULT_MAX_BATCH_LINES_IN_FLIGHT`` (200,000).
    :param max_stored_bytes: bytes of the tenant's files; an upload that would pass it is a 429 ``quota_exceeded``.
        Default: ``settings.DEFAULT_MAX_STORED_BYTES`` (10 GiB).
    :param request_limits: the plan's changes to the deployment's bounds on one request's cost
        (``async_inference.limits.LimitOverrides`` fields, e.g. ``{"max_request_tokens": 32768}``; docs/limits.md).
        Default: none (the deployment's ``request_limits``).
    :param api_keys: the names of the tenant's API keys, one or two (two while rotating: add the new name, deploy,
        move the clients, remove the old name, deploy). Each is in the tenant's usage plan, and the plan's limits apply
        per key. Default: one key named by the tenant id.
    """

    rate_limit: float = 10
    burst_limit: int = 20
    quota_per_day: int = 10_000
    max_active_jobs: int = settings.DEFAULT_MAX_ACTIVE_JOBS
    max_batch_lines_in_flight: int = settings.DEFAULT_MAX_BATCH_LINES_IN_FLIGHT
    max_stored_bytes: int = settings.DEFAULT_MAX_STORED_BYTES
    request_limits: Mapping[str, Any] | None = None
    api_keys: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.request_limits is not None:
            LimitOverrides.model_validate(self.request_limits)  # a misspelt or negative limit fails the synth
        if isinstance(self.api_keys, str) or len(self.api_keys) > MAX_KEYS_PER_TENANT:
            raise ValueError(f"api_keys is a list of at most {MAX_KEYS_PER_TENANT} key names, got {self.api_keys!r}")
        for name in self.api_keys:
            validate_tenant_id(name)  # a key name follows the tenant id's rules (it names an API Gateway key)
        if self.rate_limit <= 0 or self.burst_limit < 1 or self.quota_per_day < 1 or self.max_active_jobs < 1:
            raise ValueError(f"rate_limit, burst_limit, quota_per_day and max_active_jobs must be positive, got {self}")
        if self.max_batch_lines_in_flight < 1 or self.max_stored_bytes < 1:
            raise ValueError(f"max_batch_lines_in_flight and max_stored_bytes must be positive, got {self}")
        if self.burst_limit < self.rate_limit:
            raise ValueError(f"burst_limit ({self.burst_limit}) is below rate_limit ({self.rate_limit})")


def validate_tenant_id(tenant: str) -> str:
    if not re.match(TENANT_ID_PATTERN, tenant):
        raise ValueError(f"tenant id {tenant!r} must match {TENANT_ID_PATTERN}")
    return tenant


# Gateway-generated errors in the same shape as the Lambda's ErrorResponse: {"error": {"code", "message", "details"}}.
_GATEWAY_ERRORS = {
    apigw.ResponseType.INVALID_API_KEY: "invalid_api_key",
    apigw.ResponseType.UNAUTHORIZED: "invalid_api_key",
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
# "Unauthorized" from the authorizer, "Forbidden" for a refused key) would puzzle a client. The other types keep API
# Gateway's message.
_KEY_HINT = "send your API key as 'Authorization: Bearer <key>' or as 'x-api-key: <key>'"
_GATEWAY_MESSAGES = {
    "UNAUTHORIZED": f"a valid API key is required: {_KEY_HINT}",
    "INVALID_API_KEY": f"the API key is missing or not a key of this API: {_KEY_HINT}",
    "MISSING_AUTHENTICATION_TOKEN": "no route serves this method and path; GET /v1/openapi.json lists the routes",
    "THROTTLED": "over your usage plan's request rate; retry after a moment",
    "QUOTA_EXCEEDED": "over your usage plan's daily quota; it resets at the start of the next day (UTC)",
    "REQUEST_TOO_LARGE": "the body is over API Gateway's 10 MB limit; use an upload job for large requests",
}
# Only multipart bodies (POST /v1/files) reach the function base64-encoded; JSON stays text. CloudFormation wants the
# slash escaped as ~1 (its AWS::ApiGateway::RestApi reference: an unescaped one breaks the update's patch path).
BINARY_MEDIA_TYPES = ("multipart~1form-data",)


class IngestionApi(Construct):
    """REST API (API keys, usage plans, validation, access logs, X-Ray) proxying every route to the API Lambda.

    Every method requires an API key, as ``Authorization: Bearer <key>`` (the openai SDK) or ``x-api-key``. Each tenant
    gets an API key named exactly its tenant id and its own usage plan. A REQUEST authorizer (``authorizer``) maps the
    key to the tenant: the tenant reaches the API Lambda in the authorizer context, and the key goes back to API Gateway
    as ``usageIdentifierKey`` (the API's key source is AUTHORIZER), so the usage plan still throttles the tenant.

    The authorizer's results are not cached by API Gateway (TTL 0): with caching on, API Gateway requires *every*
    identity source in every request and answers 401 without calling the authorizer when one is missing, and a request
    carries one of two headers. The authorizer function caches the tenants' keys itself
    (``async_inference.authorizer``), so a request costs an invocation but no API Gateway read; a refresh is one
    ``GetApiKeys`` call (``grant_read_api_keys``).

    :param code: the shared Lambda code.
    :param environment: the service's runtime configuration and Powertools settings.
    :param tenants: tenant id -> its usage plan.
    :param stage_name: API stage. Default: ``"prod"``.
    :param log_retention: access log retention. Default: one month.
    :param create_cloudwatch_role: create the account-wide role API Gateway logs with (it replaces the account's
        own, for every API of the region); only for an account that has none. Default: False.
    :param waf_requests_per_5_min_per_ip: associate a WAF web ACL (``web_acl``) with the stage: a rate-based rule
        blocking an IP address over this many requests in 5 minutes (WAF's minimum is 10), AWS's IP reputation list
        and known-bad-inputs rule groups. Not AWS's common rule set: its 8 KB body limit would block job requests.
        None: no web ACL. Default: None.
    :param tenant_stacks: the nested stacks that hold the tenants' keys and usage plans (``cdk.tenant_stacks``).
        Default: None (this construct holds them).
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
        create_cloudwatch_role: bool = False,
        waf_requests_per_5_min_per_ip: int | None = None,
        tenant_stacks: TenantStacks | None = None,
    ) -> None:
        super().__init__(scope, id)
        self._tenant_stacks = tenant_stacks
        if waf_requests_per_5_min_per_ip is not None and waf_requests_per_5_min_per_ip < 10:
            raise ValueError(
                f"waf_requests_per_5_min_per_ip must be at least 10 (WAF's minimum), got "
                f"{waf_requests_per_5_min_per_ip}"
            )
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
        assert self.handler.role is not None  # new_function makes one
        # The OpenAI routes that may stream run on the same handler under Lambda Web Adapter (docs/streaming.md).
        self.stream_handler = new_streaming_function(
            self,
            "StreamHandler",
            code=code,
            proxy_handler="lambdas.api.handler.lambda_handler",
            role=self.handler.role,
            service_name=self.service_name,
            environment=environment,
        )
        self.functions = (self.handler, self.stream_handler)  # the same code, role and environment
        self.authorizer_function = code.new_function(
            self,
            "Authorizer",
            handler="lambdas.authorizer.handler.lambda_handler",
            description="Ingestion API authorizer: API key (Bearer or x-api-key) to tenant",
            service_name="async-inference-authorizer",
            environment={},  # the tenants' key ids: its catalog's (cdk.catalog), bound by the service
            timeout=Duration.seconds(10),
            memory_size=256,
        )
        self.authorizer = apigw.RequestAuthorizer(
            self,
            "KeyAuthorizer",
            handler=self.authorizer_function,
            identity_sources=[],
            results_cache_ttl=Duration.seconds(0),
        )
        # No identity source at all (CDK writes an empty one): with caching off none is needed, and API Gateway would
        # answer 401 to a request missing a listed one without calling the authorizer.
        authorizer_resource = self.authorizer.node.default_child
        assert isinstance(authorizer_resource, apigw.CfnAuthorizer)
        authorizer_resource.add_property_deletion_override("IdentitySource")
        access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        self.api = apigw.RestApi(
            self,
            "Api",
            description="Asynchronous LLM inference: submit jobs, poll their status, fetch results",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            api_key_source_type=apigw.ApiKeySourceType.AUTHORIZER,
            default_method_options=apigw.MethodOptions(
                api_key_required=True, authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
            ),
            binary_media_types=list(BINARY_MEDIA_TYPES),
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
        # tenant -> its keys (one, or two during a rotation)
        self.api_keys: dict[str, list[apigw.IApiKey]] = {}
        names = [name for tenant, plan in tenants.items() for name in (plan.api_keys or (tenant,))]
        if len(names) != len(set(names)):
            raise ValueError(f"API key names must be unique across tenants, got {sorted(names)}")
        for tenant, plan in tenants.items():
            self._add_tenant(validate_tenant_id(tenant), plan)
        # Each tenant's entry of the deployment's catalog (cdk.catalog): its quotas (TENANT_QUOTAS, which the API,
        # the upload handler and the batch controller check) and its key ids (TENANT_API_KEY_IDS, the authorizer's).
        self.tenant_entries: dict[str, dict[str, Any]] = {
            tenant: {
                "api_key_ids": [key.key_id for key in self.api_keys[tenant]],
                "quota": {
                    "max_active_jobs": plan.max_active_jobs,
                    "max_batch_lines_in_flight": plan.max_batch_lines_in_flight,
                    "max_stored_bytes": plan.max_stored_bytes,
                    **({"request_limits": dict(plan.request_limits)} if plan.request_limits else {}),
                },
            }
            for tenant, plan in tenants.items()
        }
        grant_read_api_keys(self.authorizer_function)
        self.web_acl = self._add_web_acl(waf_requests_per_5_min_per_ip) if waf_requests_per_5_min_per_ip else None

    def _add_web_acl(self, limit: int) -> wafv2.CfnWebACL:
        def managed(name: str, priority: int) -> wafv2.CfnWebACL.RuleProperty:
            return wafv2.CfnWebACL.RuleProperty(
                name=name,
                priority=priority,
                override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
                statement=wafv2.CfnWebACL.StatementProperty(
                    managed_rule_group_statement=(
                        wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(vendor_name="AWS", name=name)
                    )
                ),
                visibility_config=_visibility(name),
            )

        web_acl = wafv2.CfnWebACL(
            self,
            "WebAcl",
            scope="REGIONAL",
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=_visibility("AsyncInferenceApi"),
            rules=[
                wafv2.CfnWebACL.RuleProperty(
                    name="RequestsPerIp",
                    priority=0,
                    action=wafv2.CfnWebACL.RuleActionProperty(block={}),
                    statement=wafv2.CfnWebACL.StatementProperty(
                        rate_based_statement=(
                            wafv2.CfnWebACL.RateBasedStatementProperty(limit=limit, aggregate_key_type="IP")
                        )
                    ),
                    visibility_config=_visibility("RequestsPerIp"),
                ),
                managed("AWSManagedRulesAmazonIpReputationList", 1),
                managed("AWSManagedRulesKnownBadInputsRuleSet", 2),
            ],
        )
        wafv2.CfnWebACLAssociation(
            self, "WebAclAssociation", resource_arn=self.api.deployment_stage.stage_arn, web_acl_arn=web_acl.attr_arn
        )
        return web_acl

    def _add_routes(self) -> None:
        integration = apigw.LambdaIntegration(self.handler, allow_test_invoke=False)
        # API Gateway invokes the streaming function with InvokeWithResponseStream and sends its answer as it comes.
        # Its timeout may be up to 15 minutes for a streamed integration (without a quota increase): the stream's own.
        streamed = apigw.LambdaIntegration(
            self.stream_handler,
            allow_test_invoke=False,
            response_transfer_mode=apigw.ResponseTransferMode.STREAM,
            timeout=STREAM_TIMEOUT,
        )
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
        self._add_openai_routes(v1, integration, validator)
        add_responses_routes(v1, integration, validator, streamed=streamed)
        self._add_held_routes(v1, integration, streamed, validator)

    @staticmethod
    def _add_held_routes(
        v1: apigw.IResource,
        integration: apigw.Integration,
        streamed: apigw.Integration,
        validator: apigw.IRequestValidator,
    ) -> None:
        """OpenAI's request routes, each held until its job ends or streamed as it decodes
        (lambdas/api/openai_routes.py): POST /v1/chat/completions and /v1/completions on the streaming function,
        /v1/embeddings (never streamed) on the API function."""
        idempotency_key = {"method.request.header.idempotency-key": False}
        chat = v1.add_resource("chat").add_resource("completions")
        for resource, target in (
            (chat, streamed),
            (v1.add_resource("completions"), streamed),
            (v1.add_resource("embeddings"), integration),
        ):
            resource.add_method("POST", target, request_validator=validator, request_parameters=idempotency_key)

    def _add_openai_routes(
        self, v1: apigw.IResource, integration: apigw.Integration, validator: apigw.IRequestValidator
    ) -> None:
        """/v1/models, the Files API and the Batches API (lambdas/api/batch_routes.py)."""
        models = v1.add_resource("models")
        models.add_method("GET", integration)
        models.add_resource("{model_id}").add_method(
            "GET", integration, request_validator=validator, request_parameters={"method.request.path.model_id": True}
        )
        file_id = {"method.request.path.file_id": True}
        files = v1.add_resource("files")
        files.add_method("POST", integration)
        files.add_method("GET", integration)
        files.add_resource("uploads").add_method("POST", integration)
        file = files.add_resource("{file_id}")
        file.add_method("GET", integration, request_validator=validator, request_parameters=file_id)
        file.add_method("DELETE", integration, request_validator=validator, request_parameters=file_id)
        file.add_resource("content").add_method(
            "GET", integration, request_validator=validator, request_parameters=file_id
        )
        batch_id = {"method.request.path.batch_id": True}
        batches = v1.add_resource("batches")
        batches.add_method("POST", integration)
        batches.add_method("GET", integration)
        batch = batches.add_resource("{batch_id}")
        batch.add_method("GET", integration, request_validator=validator, request_parameters=batch_id)
        batch.add_resource("cancel").add_method(
            "POST", integration, request_validator=validator, request_parameters=batch_id
        )

    def _add_tenant(self, tenant: str, plan: TenantPlan) -> None:
        # Not api.add_api_key: that also ties the key to the stage (StageKeys, which usage plans replace), and the
        # authorizer reads the keys' ids (its catalog's parameters), so a key depending on the stage would be a
        # dependency cycle.
        # In the root stack, under the API, where they were always deployed; else in the tenant's nested stack.
        scope = self._tenant_stacks.scope(tenant, "Ingestion") if self._tenant_stacks else self.api
        keys = [
            # The key named by the tenant keeps the logical id it always had: a rotation never replaces it by accident.
            apigw.ApiKey(
                scope,
                f"ApiKey-{tenant}" if name == tenant else f"ApiKey-{tenant}-{name}",
                api_key_name=name,
                description=f"API key of tenant {tenant}",
            )
            for name in (plan.api_keys or (tenant,))
        ]
        options: dict[str, Any] = {
            "name": tenant,
            "description": f"Throttling and quota of tenant {tenant}",
            "throttle": apigw.ThrottleSettings(rate_limit=plan.rate_limit, burst_limit=plan.burst_limit),
            "quota": apigw.QuotaSettings(limit=plan.quota_per_day, period=apigw.Period.DAY),
            "api_stages": [apigw.UsagePlanPerApiStage(api=self.api, stage=self.api.deployment_stage)],
        }
        usage_plan = (
            apigw.UsagePlan(scope, f"UsagePlan-{tenant}", **options)
            if self._tenant_stacks
            else self.api.add_usage_plan(f"UsagePlan-{tenant}", **options)
        )
        for key in keys:
            usage_plan.add_api_key(key)
        self.api_keys[tenant] = keys

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
            "has a usage plan with throttling and a daily quota; waf_requests_per_5_min_per_ip adds a web ACL, or a "
            "platform team associates its own.",
            "AwsSolutions-APIG4": "Every method has the REQUEST authorizer, which maps the caller's API key (one "
            "per tenant, named by tenant id) to its tenant; the API Lambda scopes every read and write to it.",
            "AwsSolutions-COG4": "Machine-to-machine API for tenants' back ends, identified by API keys; no end-user "
            "pool to authorize against.",
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]": "The account-level role API Gateway writes access and execution "
            "logs with; this AWS managed policy is the documented one and grants only CloudWatch Logs writes.",
        }
        acknowledge(self.api, findings)


def grant_read_api_keys(function: lambda_.Function) -> iam.Grant:
    """apigateway:GET on the region's API key collection: ``GetApiKeys`` with ``includeValues`` reads every tenant's key
    in one call (``async_inference.aws.ApiKeyValues``). The collection is the only resource GetApiKeys takes, so the
    role could read the values of other APIs' keys of the account in the region too; the code trusts only the key ids
    its stack names. A ``GetApiKey`` per key id, on each key's ARN, kept the role to this stack's keys at the price of
    one control-plane call per key every refresh (docs/deploying.md, "Tenants")."""
    collection = Stack.of(function).format_arn(service="apigateway", account="", resource="/apikeys")
    return iam.Grant.add_to_principal(grantee=function, actions=["apigateway:GET"], resource_arns=[collection])


def _visibility(name: str) -> wafv2.CfnWebACL.VisibilityConfigProperty:
    return wafv2.CfnWebACL.VisibilityConfigProperty(
        cloud_watch_metrics_enabled=True, metric_name=name, sampled_requests_enabled=True
    )
