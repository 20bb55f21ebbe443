"""AsyncInferenceService: the whole service as one construct: the shared resources and one fleet per model."""

from __future__ import annotations

import json
from collections.abc import Callable

import jsii
from aws_cdk import Duration, IResolvable, IResolveContext, RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from constructs import Construct

from async_inference import settings
from async_inference.config import (
    ENV_BATCH_QUEUE_URL,
    ENV_BATCH_TABLE,
    ENV_MODEL_FLEETS,
    ENV_SERVED_MODELS,
    ENV_TENANT_QUOTAS,
    ServiceConfig,
)
from cdk.batches import Batches
from cdk.claim_check_bucket import ClaimCheckBucket
from cdk.dead_letter_handler import DeadLetterHandler
from cdk.events_in import EventsIn
from cdk.gpu_worker_service import MODELS_CONTAINER_PATH
from cdk.ingestion_api import IngestionApi
from cdk.job_table import JobTable
from cdk.lambda_code import LambdaCode
from cdk.model_fleet import ModelFleet, SharedResources, deployed_names
from cdk.model_store import ModelStore
from cdk.monitoring import MonitoredFleet, Monitoring
from cdk.nag import acknowledge
from cdk.options import PROJECT_ROOT, AsyncInferenceServiceProps
from cdk.result_topics import ResultTopics
from cdk.state_events import StateEvents
from cdk.upload_deadlines import UploadDeadlines
from cdk.upload_intake import UploadIntake
from cdk.webhook_dispatch import WebhookDispatch
from cdk.websocket_push import WebSocketPush
from cdk.worker_cluster import WorkerCluster

# The Responses bodies of background responses (settings.responses_request_key), one per response, under any tenant.
RESPONSES_BODIES = f"{settings.REQUEST_PREFIX}*/{settings.RESPONSES_REQUEST_NAME}"


class AsyncInferenceService(Construct):
    """The asynchronous inference service: API, claim-check bucket, table, topics, webhooks, batches, and one
    :class:`cdk.model_fleet.ModelFleet` per model (its queues, batch lane, GPU workers, scaling and capacity) in one
    VPC and cluster.

    The constructs of each concern are exposed as attributes (``bucket``, ``table``, ``results``, ``webhooks``,
    ``api``, ``uploads``, ``upload_deadlines``, ``dead_letters``, ``batches``, ``cluster``, ``fleets`` (the models'
    fleets, in ``models`` order), ``models`` (their S3 stores by model name, None where the weights come from the Hub),
    ``monitoring``, ``push``: None without ``websocket_push``). Every permission below is a ``grant_*`` on the one
    resource it concerns; the runtime configuration is injected into each function and the worker from
    ``ServiceConfig``, the same class the code reads it with.
    """

    def __init__(self, scope: Construct, id: str, *, props: AsyncInferenceServiceProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or AsyncInferenceServiceProps()
        props.validate()
        removal = RemovalPolicy.DESTROY if props.destroy_data_on_delete else RemovalPolicy.RETAIN
        specs = props.model_specs()
        self.fleets: list[ModelFleet] = []

        self.bucket = ClaimCheckBucket(
            self,
            "ClaimChecks",
            retention_days=props.retention_days,
            cors_allowed_origins=props.cors_allowed_origins,
            removal_policy=removal,
        )
        self.table = JobTable(self, "JobTable", removal_policy=removal)
        self.results = ResultTopics(self, "Results", subscriptions=props.subscriptions, tenants=list(props.tenants))

        # The queues the core falls back to for a model without a route (async_inference.service, the batch
        # controller) are the first model's; its fleet is built once the functions that read them are.
        first = _later(lambda: self.fleets[0])
        runtime = ServiceConfig(
            table_name=self.table.table.table_name,
            bucket_name=self.bucket.bucket.bucket_name,
            queue_url=first(lambda fleet: fleet.jobs.queue.queue_url),
            topic_arn=self.results.topic.topic_arn,
            dlq_url=first(lambda fleet: fleet.jobs.dead_letter_queue.queue_url),
            payload_retention_days=props.retention_days,
        ).to_env()
        # Each fleet's workers serve their model under its name (vLLM's served_model_name defaults to it): every
        # function checks requests against the names, so a job or batch line for another model is a 404.
        environment = {
            **runtime,
            "POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE,
            ENV_SERVED_MODELS: json.dumps([spec.name for spec in specs]),
        }

        code = LambdaCode(self, "LambdaCode", project_root=PROJECT_ROOT, log_retention=props.log_retention)
        self.upload_deadlines = UploadDeadlines(self, "UploadDeadlines", code=code, environment=environment)
        self.batches = Batches(
            self,
            "Batches",
            code=code,
            environment=environment,
            lane_queue_url=first(lambda fleet: fleet.lane_queue.queue_url),
            removal_policy=removal,
        )
        self.api = IngestionApi(
            self,
            "Ingestion",
            code=code,
            # The API schedules each upload's deadline, stores files and batches and sends plan steps.
            environment={**environment, **self.upload_deadlines.environment, **self.batches.environment},
            tenants=props.tenants,
            stage_name=props.api_stage_name,
            log_retention=props.log_retention,
            create_cloudwatch_role=props.create_api_gateway_cloudwatch_role,
            waf_requests_per_5_min_per_ip=props.waf_requests_per_5_min_per_ip,
        )
        self.uploads = UploadIntake(
            self,
            "Uploads",
            code=code,
            bucket=self.bucket.bucket,
            # Upload jobs submitted with priority "batch" are queued on the batch lane once their upload arrives.
            environment={**environment, ENV_BATCH_QUEUE_URL: self.batches.environment[ENV_BATCH_QUEUE_URL]},
        )
        self.dead_letters = DeadLetterHandler(
            self, "DeadLetters", code=code, environment={**environment, **self.batches.environment}
        )
        self.webhooks = WebhookDispatch(
            self,
            "Webhooks",
            code=code,
            topic=self.results.topic,
            tenants=list(props.tenants),
            # Batch webhooks: the dispatcher reads the batch's webhook and records its attempts in the batch table.
            environment={**environment, ENV_BATCH_TABLE: self.batches.table.table_name},
        )
        self.push: WebSocketPush | None = None
        if props.websocket_push:
            self.push = WebSocketPush(
                self,
                "Push",
                code=code,
                result_topic=self.results.topic,
                topic_key=self.results.key,
                api_keys=self.api.api_keys,
                environment={"POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE},
                stage_name=props.api_stage_name,
                log_retention=props.log_retention,
            )
            # Stage access logs need the account's API Gateway logging role, which the REST API sets up.
            self.push.stage.node.add_dependency(self.api.api)

        self.cluster = WorkerCluster(
            self,
            "Workers",
            nat_gateways=props.nat_gateways,
            public_subnets=props.worker_subnets == "public",
            availability_zones=props.availability_zones,
            log_retention=props.log_retention,
        )
        shared = SharedResources(
            cluster=self.cluster,
            code=code,
            worker_environment=environment,
            bucket=self.bucket,
            table=self.table,
            results=self.results,
            webhooks=self.webhooks,
            batches=self.batches,
            push=self.push,
        )
        self.models: dict[str, ModelStore | None] = {}
        for index, spec in enumerate(specs):
            names = deployed_names(index, spec)
            self.models[spec.name] = self._model_store(props.for_model(spec), names.store_id, removal)
            fleet = ModelFleet(
                self,
                names.fleet_id,
                spec=spec,
                ecs_service_name=names.ecs_service_name,
                props=props.for_model(spec),
                shared=shared,
                models=self.models[spec.name],
                # One release function releases the cluster's empty instances, every fleet's group included.
                release_with=self.fleets[0].capacity.release_function if self.fleets else None,
            )
            self.fleets.append(fleet)
            # Their dead letters fail their jobs and end their chunks as error lines.
            self.dead_letters.consume(fleet.jobs.dead_letter_queue)
            self.dead_letters.consume(fleet.lane_dead_letter_queue)

        self.state_events: StateEvents | None = None
        if props.eventbridge_events:
            self.state_events = StateEvents(
                self,
                "StateEvents",
                code=code,
                result_topic=self.results.topic,
                events_topic=self.push.events_topic if self.push else None,
                environment={"POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE},
            )
        self.events_in: EventsIn | None = None
        if props.event_rules:
            self.events_in = EventsIn(
                self,
                "EventsIn",
                code=code,
                bucket=self.bucket.bucket,
                rules=props.event_rules,
                environment={**environment, **self.batches.environment},
            )
        self._route(props.wake_from_zero)
        self.monitoring = self._monitoring(props)
        self._grant()

    def _route(self, wake: bool) -> None:
        """Every function that queues work routes it by its model (async_inference.fleets): the API (jobs,
        responses), the upload handler (uploaded jobs), the batch controller (chunks) and events in (jobs); with
        ``wake``, each may wake any fleet from zero. The wake's cluster, interval and hold are read from the first
        fleet's variables (``async_inference.config.WakeTarget``), each fleet's service and group from its route."""
        queuing = [self.api.handler, self.uploads.handler, self.batches.controller]
        if self.events_in is not None:
            queuing.append(self.events_in.handler)
        routes = {fleet.spec.name: fleet.route(wake=wake) for fleet in self.fleets}
        for function in queuing:
            function.add_environment(ENV_MODEL_FLEETS, Stack.of(self).to_json_string(routes))
            for fleet in self.fleets if wake else ():
                fleet.grant_wake(function, environment=fleet is self.fleets[0])

    def _monitoring(self, props: AsyncInferenceServiceProps) -> Monitoring:
        """Alarms and the dashboard: every DLQ, and each fleet's queue age and workers (``cdk.monitoring``; the first
        fleet's alarms keep the names they were deployed with)."""
        first, others = self.fleets[0], self.fleets[1:]
        return Monitoring(
            self,
            "Monitoring",
            queue=first.jobs.queue,
            dead_letter_queues={
                "JobDeadLetterQueue": first.jobs.dead_letter_queue,
                "WebhookDeadLetterQueue": self.webhooks.dead_letter_queue,
                "SubscriptionDeadLetterQueue": self.results.subscription_dead_letter_queue,
                "UploadFailureQueue": self.uploads.failure_queue,
                "UploadDeadlineDeadLetterQueue": self.upload_deadlines.dead_letter_queue,
                "BatchLaneDeadLetterQueue": first.lane_dead_letter_queue,
                "BatchControlDeadLetterQueue": self.batches.control_dead_letter_queue,
                "UnhandledDeadLetterQueue": self.dead_letters.unhandled_queue,
                **({"EventsInFailureQueue": self.events_in.failure_queue} if self.events_in else {}),
                **{
                    f"{kind}DeadLetterQueue{fleet.spec.construct_id}": queue
                    for fleet in others
                    for kind, queue in (("Job", fleet.jobs.dead_letter_queue), ("Lane", fleet.lane_dead_letter_queue))
                },
            },
            service=first.workers.service,
            fleets=[
                MonitoredFleet(fleet.spec.name, fleet.spec.construct_id, fleet.jobs.queue, fleet.workers.service)
                for fleet in others
            ],
            worker_service_name=first.workers.service_name,
            api_service_name=self.api.service_name,
            dead_letter_service_name=self.dead_letters.service_name,
            oldest_message_alarm_age=Duration.seconds(props.oldest_message_alarm_seconds),
            alarm_topic=sns.Topic.from_topic_arn(self, "AlarmTopic", props.alarm_topic_arn)
            if props.alarm_topic_arn
            else None,
        )

    def _model_store(self, props: AsyncInferenceServiceProps, id: str, removal: RemovalPolicy) -> ModelStore | None:
        """A model's S3 store with ``model_source`` ``"s3"`` (``props`` as ``for_model`` gives them), else None."""
        if props.model_source != "s3":
            return None
        return ModelStore(
            self,
            id,
            model=props.model,
            models_path=MODELS_CONTAINER_PATH,
            existing_uri=props.model_s3_uri,
            access_logs=self.bucket.access_logs,
            removal_policy=removal,
        )

    def _grant(self) -> None:
        """Each principal gets exactly the calls its code makes (async_inference.aws, service.py, lambdas/*,
        gpu_worker/worker.py), on the resources and key prefixes it makes them on."""
        bucket, table, results = self.bucket, self.table, self.results
        self._acknowledge_grant_wildcards()
        requests, uploads, result_objects = settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX

        # The API: submit (get, create, transition on a failed enqueue), get (lazy expiry), list, cancel (notifies).
        api = self.api.handler
        table.grant_items(api, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        table.grant_tenant_listing(api)
        bucket.grant_put(api, requests)  # inline bodies
        bucket.grant_put(api, uploads)  # presigned upload PUTs are signed with the function's role
        bucket.grant_get(api, result_objects, missing_as_404=False)  # presigned result GETs likewise
        # Background responses: the Responses body beside each response's job's request, read and deleted by the API.
        bucket.grant_get(api, RESPONSES_BODIES)
        bucket.grant_delete(api, RESPONSES_BODIES)
        self.upload_deadlines.queue.grant(api, "sqs:SendMessage")  # each upload job's deadline
        results.grant_publish(api)  # cancels and expiries notify

        # The upload handler: check the object, queue its job or fail it, notify.
        upload = self.uploads.handler
        table.grant_items(upload, "dynamodb:GetItem", "dynamodb:UpdateItem")
        bucket.grant_get(upload, uploads)
        bucket.grant_delete(upload, uploads)  # objects no job asked for, oversize bodies, accepted uploads
        bucket.grant_put(upload, requests)  # an accepted upload's checked bytes, out of reach of its presigned URL
        results.grant_publish(upload)

        # The DLQ handler (its event source grants consuming the DLQ): fail the job, notify.
        dead_letters = self.dead_letters.handler
        table.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
        results.grant_publish(dead_letters)

        # The upload-deadline handler (its event source grants consuming, and hiding, its queue's messages).
        deadlines = self.upload_deadlines.handler
        table.grant_items(deadlines, "dynamodb:GetItem", "dynamodb:UpdateItem")
        results.grant_publish(deadlines)

        # The webhook dispatcher (its event source grants consuming, and hiding, its queue's messages).
        webhook = self.webhooks.handler
        table.grant_items(webhook, "dynamodb:GetItem", "dynamodb:UpdateItem")  # record_webhook_attempt
        self.webhooks.grant_read_signing_secrets(webhook)

        # Each model's queues take the API's and the upload handler's jobs (its lane those submitted with priority
        # "batch") and the controller's chunks; each fleet grants its own worker.
        for fleet in self.fleets:
            fleet.grant_send_jobs(api)
            fleet.grant_send_jobs(upload)
            fleet.lane_queue.grant(self.batches.controller, "sqs:SendMessage")
        self._grant_batches()
        if self.events_in is not None:
            self._grant_events_in(self.events_in.handler)

    def _grant_events_in(self, function: lambda_.Function) -> None:
        """The events-in function: read the objects under the inbox, then what the API does to submit a job (its
        record, its body, its claim check on any model's queue, a notification when it cannot be queued) or to
        create a batch (the file copied from the object, the file and batch records, the plan step)."""
        bucket, table, batches = self.bucket, self.table, self.batches
        bucket.grant_get(function, settings.INBOX_PREFIX)
        table.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        bucket.grant_put(function, settings.REQUEST_PREFIX)  # job bodies, and the markers of objects taken in
        bucket.grant_get(function, settings.REQUEST_PREFIX, missing_as_404=False)  # a marker already there
        for fleet in self.fleets:
            fleet.grant_send_jobs(function)
        self.results.grant_publish(function)
        batches.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        bucket.grant_put(function, settings.FILE_PREFIX)
        bucket.grant_get(function, settings.FILE_PREFIX, missing_as_404=False)
        batches.control_queue.grant(function, "sqs:SendMessage")

    def _grant_batches(self) -> None:
        """The Files and Batches APIs' principals (async_inference/batches/*, lambdas/batch_controller, and the
        worker's side of docs/design/batches.md)."""
        bucket, batches, files, parts = self.bucket, self.batches, settings.FILE_PREFIX, settings.BATCH_PREFIX

        # The API: file and batch records (create, read, confirm an upload, delete a file, cancel), the listings,
        # file bytes (inline uploads, presigned PUTs and GETs signed with its role, the HEAD that confirms an upload,
        # DeleteObject), plan steps.
        api = self.api.handler
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
        controller.add_environment(ENV_TENANT_QUOTAS, self.api.tenant_quotas)
        bucket.grant_get(controller, files, parts)
        bucket.grant_put(controller, files)
        bucket.grant_delete(controller, files)  # an output file that came out empty
        iam.Grant.add_to_principal(
            grantee=controller,
            actions=["s3:AbortMultipartUpload"],
            resource_arns=[bucket.bucket.arn_for_objects(f"{files}*")],
        )
        self.results.grant_publish(controller)

        # The workers' side: cdk.model_fleet.ModelFleet.grant_worker.

        # The webhook dispatcher, for batch webhooks: the batch's webhook, and each attempt recorded on it.
        batches.grant_items(self.webhooks.handler, "dynamodb:GetItem", "dynamodb:UpdateItem")

        # The DLQ handler, for dead-lettered chunks (its event source grants consuming the lane's DLQ): the chunk's
        # batch and its count, the input range and any results a worker stored, the parts, the finalize step.
        dead_letters = self.dead_letters.handler
        batches.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
        bucket.grant_get(dead_letters, files, parts)
        bucket.grant_put(dead_letters, parts)
        batches.control_queue.grant(dead_letters, "sqs:SendMessage")

    def _acknowledge_grant_wildcards(self) -> None:
        """The wildcards the grants above write: key prefixes of the claim-check bucket."""
        stack = Stack.of(self)
        bucket = stack.get_logical_id(self.bucket.bucket.node.default_child)
        findings = {
            f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/{prefix}*]": f"Objects under the {prefix} prefix only: keys "
            "hold tenant and job ids assigned at run time."
            for prefix in (
                settings.REQUEST_PREFIX,
                settings.UPLOAD_PREFIX,
                settings.RESULT_PREFIX,
                settings.FILE_PREFIX,
                settings.BATCH_PREFIX,
                RESPONSES_BODIES,
                *((settings.INBOX_PREFIX,) if self.events_in is not None else ()),
            )
        }
        acknowledge(self, findings)


def _later(target: Callable[[], ModelFleet]) -> Callable[[Callable[[ModelFleet], str]], str]:
    """``first(attribute)``: a string token for ``attribute`` of the fleet ``target()`` returns, read at synthesis,
    when that fleet exists."""

    def token(attribute: Callable[[ModelFleet], str]) -> str:
        return Token.as_string(_Resolved(lambda: attribute(target())))

    return token


@jsii.implements(IResolvable)
class _Resolved:
    """A value CDK reads at synthesis (``Lazy.string``'s producer cannot be written in Python: jsii calls it without
    its context)."""

    creation_stack: list[str] = []
    type_hint = None

    def __init__(self, value: Callable[[], str]) -> None:
        self._value = value

    def resolve(self, context: IResolveContext) -> str:  # noqa: ARG002
        return self._value()

    def to_string(self) -> str:
        return Token.as_string(self)
