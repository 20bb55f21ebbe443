"""Job events pushed to clients: an API Gateway WebSocket API, its connection table, and the function that pushes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jsii
from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from async_inference import config, settings
from async_inference.streaming import log
from cdk.ingestion_api import grant_read_api_keys
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix

ROUTES_SERVICE_NAME = "async-inference-websocket"
PUSH_SERVICE_NAME = "async-inference-push"
# An event is worth pushing for a few minutes at most: a client that missed it reads the job at its next check.
PUSH_MAX_EVENT_AGE = Duration.minutes(5)
DELTA_PUSH_SERVICE_NAME = "async-inference-delta-push"
# A text delta is worth pushing while its job is decoding; one a minute old (the least Lambda allows) is dropped, and
# a client that missed it resumes with "starting_after".
DELTA_MAX_RECORD_AGE = Duration.minutes(1)
# Segments of several jobs written at about the same time reach the function in one invocation; Lambda reads each
# shard about 4 times a second, so the invocations are bounded by the shards, not by the segments.
DELTA_BATCH_SIZE = 100


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogs:
    """The stage's access log settings (``IAccessLogSettings`` is an interface, not a struct, in Python)."""

    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._destination = apigwv2.LogGroupLogDestination(log_group)

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat | None:
        return None  # the stage's default: source IP, caller, event type, route, connection, status, request id


class WebSocketPush(Construct):
    """An API Gateway WebSocket API that tells subscribed clients about their jobs as they start, progress and end.

    Protocol: connect with a tenant's API key (header ``x-api-key``, or the ``api_key`` query parameter: a browser's
    WebSocket cannot set headers; an unknown key is refused at ``$connect``), send ``{"action": "subscribe",
    "job_ids": [...]}`` (or ``"batch_id": ...``, or ``"all": true``), and receive ``{"type": "job.started" |
    "job.progress" | "job.completed" | "job.failed" | "job.cancelled" | "job.expired", "job_id": ..., ...}`` for the
    connection's tenant's jobs only (``async_inference.push``); with ``event_log``, a job submitted with ``stream:
    true`` also sends its text as ``{"type": "job.delta", "job_id": ..., "seq": ..., "deltas": [...], ...}``, and
    ``{"action": "subscribe", "job_ids": [id], "starting_after": seq}`` resumes it (docs/streaming.md).

    Connections and their subscriptions live in ``connections`` (TTL ``settings.CONNECTION_TTL_ATTRIBUTE``, API
    Gateway's 2-hour connection limit; a tenant index for the push). The push function is subscribed to the result
    topic and to ``events_topic`` (job.started and job.progress, published by the workers), each filtered on the
    ``event`` message attribute so only job events invoke it; it posts through the stage's management API (the one
    permission it has on this API: ``execute-api:ManageConnections`` on this stage's connections) and deletes the
    connections that are gone.

    :param code: the shared Lambda code.
    :param result_topic: the result topic (final states).
    :param topic_key: the KMS key of the result topic; the job event topic is encrypted with it too.
    :param api_keys: tenant -> its REST API keys (two during a rotation): the keys ``$connect`` accepts (their ids
        are read from the deployment's catalog, ``cdk.catalog``: the functions may read their values).
    :param environment: Powertools settings for the functions.
    :param event_log: the job event log table (``JobStreams.table``, its stream of new images on): each segment the
        workers write to it is pushed as a ``job.delta`` to the job's tenant's connections that follow the job, by the
        delta push function, fed by the table's stream (an event source mapping: no request of the workers); the
        routes function may Query it, to answer a subscription's ``starting_after`` with the deltas since. Default:
        None, no deltas pushed.
    :param stage_name: the WebSocket stage. Default: ``"prod"``.
    :param throttle_rate_limit: messages per second the stage accepts (all clients together). Default: 100.
    :param throttle_burst_limit: burst of messages the stage accepts. Default: 200.
    :param log_retention: access log retention. Default: one month.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        result_topic: sns.ITopic,
        topic_key: kms.IKey,
        api_keys: Mapping[str, Sequence[apigw.IApiKey]],
        environment: Mapping[str, str],
        event_log: dynamodb.ITable | None = None,
        stage_name: str = "prod",
        throttle_rate_limit: float = 100,
        throttle_burst_limit: int = 200,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        if not api_keys:
            raise ValueError("api_keys is empty: with no tenant key, every WebSocket connection would be refused")
        if throttle_burst_limit < throttle_rate_limit:
            raise ValueError(
                f"throttle_burst_limit ({throttle_burst_limit}) is below throttle_rate_limit ({throttle_rate_limit})"
            )
        self.connections = self._connection_table()
        self.events_topic = sns.Topic(
            self,
            "JobEventTopic",
            display_name="Inference job events: started, progress",
            master_key=topic_key,
            enforce_ssl=True,
        )
        self._topic_key = topic_key

        self.routes_handler = code.new_function(
            self,
            "RoutesHandler",
            handler="lambdas.websocket.handler.lambda_handler",
            description="WebSocket API routes: $connect (tenant API key), $disconnect, subscribe, $default",
            service_name=ROUTES_SERVICE_NAME,
            environment={
                **environment,
                config.ENV_CONNECTIONS_TABLE: self.connections.table_name,
                # A subscription with starting_after is answered with the job's deltas since, from the log.
                **({config.ENV_STREAM_TABLE: event_log.table_name} if event_log is not None else {}),
            },
            timeout=Duration.seconds(10),
        )
        if event_log is not None:
            iam.Grant.add_to_principal(
                grantee=self.routes_handler, actions=["dynamodb:Query"], resource_arns=[event_log.table_arn]
            )
        self.api = apigwv2.WebSocketApi(
            self,
            "Api",
            description="Asynchronous LLM inference: job events pushed to subscribed clients",
            connect_route_options=self._route("Connect"),
            disconnect_route_options=self._route("Disconnect"),
            default_route_options=self._route("Default", return_response=True),
        )
        subscribe = self._route("Subscribe", return_response=True)
        self.api.add_route(settings.WS_ROUTE_SUBSCRIBE, integration=subscribe.integration, return_response=True)
        access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        self.stage = apigwv2.WebSocketStage(
            self,
            "Stage",
            web_socket_api=self.api,
            stage_name=stage_name,
            auto_deploy=True,
            throttle=apigwv2.ThrottleSettings(rate_limit=throttle_rate_limit, burst_limit=throttle_burst_limit),
            access_log_settings=_AccessLogs(access_logs),
        )
        self.url = self.stage.url

        push_environment = {
            **environment,
            config.ENV_CONNECTIONS_TABLE: self.connections.table_name,
            config.ENV_WEBSOCKET_CALLBACK_URL: self.stage.callback_url,
        }
        self.push_handler = code.new_function(
            self,
            "PushHandler",
            handler="lambdas.push.handler.lambda_handler",
            description="Pushes job events to the WebSocket connections subscribed to them",
            service_name=PUSH_SERVICE_NAME,
            environment=push_environment,
            timeout=Duration.seconds(30),
        )
        self.push_handler.configure_async_invoke(retry_attempts=2, max_event_age=PUSH_MAX_EVENT_AGE)
        self._subscribe(result_topic, [settings.RESULT_EVENT, *settings.BATCH_RESULT_EVENTS])
        self._subscribe(self.events_topic, list(settings.ACTIVITY_EVENTS))
        # The connection table: the workers publish job.progress only for jobs a connection follows.
        self.worker_environment = {
            config.ENV_JOB_EVENTS_TOPIC_ARN: self.events_topic.topic_arn,
            config.ENV_CONNECTIONS_TABLE: self.connections.table_name,
        }
        self._grant(api_keys)
        self.delta_push_handler = (
            self._push_deltas(code, event_log, push_environment) if event_log is not None else None
        )

    def _push_deltas(
        self, code: LambdaCode, event_log: dynamodb.ITable, environment: Mapping[str, str]
    ) -> lambda_.Function:
        """The function the event log's stream invokes with its new segments; it posts each as a ``job.delta`` to the
        connections that follow its job. Its grants are the push function's, and the stream's reads (the event
        source's grant)."""
        function = code.new_function(
            self,
            "DeltaPushHandler",
            handler="lambdas.push.deltas.lambda_handler",
            description="Pushes streamed jobs' text, from the job event log's stream, to the WebSocket connections",
            service_name=DELTA_PUSH_SERVICE_NAME,
            environment=environment,
            timeout=Duration.seconds(30),
        )
        self._grant_push(function)
        function.add_event_source(
            event_sources.DynamoEventSource(
                event_log,
                starting_position=lambda_.StartingPosition.LATEST,
                batch_size=DELTA_BATCH_SIZE,
                max_record_age=DELTA_MAX_RECORD_AGE,
                retry_attempts=2,
                # Written segments only: the TTL's deletions (REMOVE records) and items without a tenant invoke nothing.
                filters=[
                    lambda_.FilterCriteria.filter(
                        {
                            "eventName": lambda_.FilterRule.is_equal("INSERT"),
                            "dynamodb": {"NewImage": {log.TENANT_ATTRIBUTE: {"S": lambda_.FilterRule.exists()}}},
                        }
                    )
                ],
            )
        )
        return function

    def _connection_table(self) -> dynamodb.Table:
        string = dynamodb.AttributeType.STRING
        table = dynamodb.Table(
            self,
            "Connections",
            partition_key=dynamodb.Attribute(name=settings.CONNECTION_TABLE_PARTITION_KEY, type=string),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=settings.CONNECTION_TTL_ATTRIBUTE,
            # Open connections only: nothing to keep once the stack is gone.
            removal_policy=RemovalPolicy.DESTROY,
        )
        table.add_global_secondary_index(
            index_name=settings.CONNECTION_TENANT_INDEX_NAME,
            partition_key=dynamodb.Attribute(name=settings.CONNECTION_TENANT_KEY, type=string),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        return table

    def _route(self, name: str, *, return_response: bool = False) -> apigwv2.WebSocketRouteOptions:
        return apigwv2.WebSocketRouteOptions(
            integration=integrations.WebSocketLambdaIntegration(f"{name}Integration", self.routes_handler),
            return_response=return_response or None,
        )

    def _subscribe(self, topic: sns.ITopic, events: list[str]) -> None:
        only = {settings.EVENT_ATTRIBUTE: sns.SubscriptionFilter.string_filter(allowlist=events)}
        topic.add_subscription(subscriptions.LambdaSubscription(self.push_handler, filter_policy=only))

    def _grant(self, api_keys: Mapping[str, Sequence[apigw.IApiKey]]) -> None:
        """Each function gets exactly the calls its code makes (async_inference.aws: ConnectionStore, ApiKeyValues,
        ConnectionPoster) on the one resource it makes them on."""
        table = self.connections.table_arn
        iam.Grant.add_to_principal(
            grantee=self.routes_handler,
            actions=["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:GetItem"],
            resource_arns=[table],
        )
        # $connect counts the tenant's open connections (settings.WS_MAX_CONNECTIONS_PER_TENANT).
        iam.Grant.add_to_principal(
            grantee=self.routes_handler,
            actions=["dynamodb:Query"],
            resource_arns=[f"{table}/index/{settings.CONNECTION_TENANT_INDEX_NAME}"],
        )
        # The tenant keys' values: which tenant a key sent at $connect belongs to.
        grant_read_api_keys(self.routes_handler)
        self._grant_push(self.push_handler)
        acknowledge(
            self.api,
            {
                "AwsSolutions-APIG4": "API Gateway allows an authorizer on $connect only; $connect is authenticated by "
                "the routes function against the tenants' API keys (header or query parameter) and refuses any other "
                "key, and every other route runs on a connection that passed it.",
            },
        )

    def _grant_push(self, function: lambda_.Function) -> None:
        """What a pushing function calls: the tenant index (who follows), DeleteItem (gone connections), the tenant
        keys' values (whether a connection's key still holds), and the stage's connections (post, close)."""
        table = self.connections.table_arn
        grant_read_api_keys(function)
        iam.Grant.add_to_principal(
            grantee=function,
            actions=["dynamodb:Query"],
            resource_arns=[f"{table}/index/{settings.CONNECTION_TENANT_INDEX_NAME}"],
        )
        iam.Grant.add_to_principal(grantee=function, actions=["dynamodb:DeleteItem"], resource_arns=[table])
        self.stage.grant_management_api_access(function)
        stack = Stack.of(self)
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'execute-api')}:{rendered_account(stack)}:"
                f"<{stack.get_logical_id(self.api.node.default_child)}>/{self.stage.stage_name}/*/@connections/*]": "Connections of this API's stage only: their ids are assigned by API Gateway at run time.",
            },
        )

    def grant_publish_events(self, grantee: iam.IGrantable) -> None:
        """sns:Publish (PublishBatch) on the job event topic, the two calls SNS makes on its key, and dynamodb:Query
        on the connection table's tenant index (which jobs a connection follows: ``ConnectionStore.followed``)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["sns:Publish"], resource_arns=[self.events_topic.topic_arn]
        )
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["dynamodb:Query"],
            resource_arns=[f"{self.connections.table_arn}/index/{settings.CONNECTION_TENANT_INDEX_NAME}"],
        )
        self._topic_key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")
