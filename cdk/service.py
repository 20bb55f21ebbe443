"""AsyncInferenceService: the whole service as one construct: the shared resources and one fleet per model."""

from __future__ import annotations

import json
from dataclasses import replace

from aws_cdk import Duration, NestedStack, RemovalPolicy
from aws_cdk import aws_sns as sns
from constructs import Construct

from async_inference import settings
from async_inference.catalog import MODELS, TENANTS
from async_inference.config import (
    ENV_BATCH_TABLE,
    ENV_REQUEST_LIMITS,
    ENV_SERVED_MODELS,
    ServiceConfig,
    WakeSettings,
)
from async_inference.limits import RequestLimits
from cdk.batches import Batches
from cdk.catalog import DeploymentCatalog
from cdk.claim_check_bucket import ClaimCheckBucket
from cdk.dead_letter_handler import DeadLetterHandler
from cdk.gpu_worker_service import MODELS_CONTAINER_PATH, WORKER_SERVICE_NAME
from cdk.grants import grant_functions
from cdk.inbox import Inbox
from cdk.ingestion_api import IngestionApi
from cdk.job_streams import JobStreams
from cdk.job_table import JobTable
from cdk.lambda_code import LambdaCode
from cdk.model_fleet import ModelFleet, SharedResources, deployed_names
from cdk.model_store import ModelStore
from cdk.monitoring import MonitoredFleet, Monitoring
from cdk.options import PROJECT_ROOT, AsyncInferenceServiceProps
from cdk.result_topics import ResultTopics
from cdk.state_events import StateEvents
from cdk.tenant_stacks import TenantStacks
from cdk.upload_deadlines import UploadDeadlines
from cdk.upload_intake import UploadIntake
from cdk.webhook_dispatch import WebhookDispatch
from cdk.websocket_push import WebSocketPush
from cdk.worker_cluster import FleetCluster, WorkerCluster


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
        self._monitored: list[MonitoredFleet] = []

        self.bucket = ClaimCheckBucket(
            self,
            "ClaimChecks",
            retention_days=props.retention_days,
            cors_allowed_origins=props.cors_allowed_origins,
            removal_policy=removal,
        )
        self.table = JobTable(self, "JobTable", removal_policy=removal)
        self.streams = JobStreams(self, "JobStreams")  # streamed jobs' text (the API reads it): goes with the stack
        self.results = ResultTopics(self, "Results", subscriptions=props.subscriptions, tenants=list(props.tenants))

        # No queue: the functions find each model's queues by its route (``_route``); each worker gets its own.
        runtime = ServiceConfig(
            table_name=self.table.table.table_name,
            bucket_name=self.bucket.bucket.bucket_name,
            queue_url=None,
            topic_arn=self.results.topic.topic_arn,
            payload_retention_days=props.retention_days,
        ).to_env()
        # Each fleet's workers serve their model under its name (vLLM's served_model_name defaults to it): every
        # function that takes requests checks them against the names (SERVED_MODELS, read from the deployment's
        # catalog: ``_route``), so a job or batch line for another model is a 404.
        environment = {**runtime, "POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE}
        if props.request_limits != RequestLimits():  # unset: every process holds requests to the defaults
            environment[ENV_REQUEST_LIMITS] = props.request_limits.model_dump_json()

        code = LambdaCode(self, "LambdaCode", project_root=PROJECT_ROOT, log_retention=props.log_retention)
        # With tenant_stacks, each tenant's own resources are in a nested stack (cdk.tenant_stacks); else here.
        self.tenant_stacks = (
            TenantStacks(self, "Tenants", tenants=list(props.tenants), count=props.tenant_stacks)
            if props.tenant_stacks
            else None
        )
        self.upload_deadlines = UploadDeadlines(self, "UploadDeadlines", code=code, environment=environment)
        self.batches = Batches(
            self,
            "Batches",
            code=code,
            environment=environment,
            removal_policy=removal,
        )
        self.api = IngestionApi(
            self,
            "Ingestion",
            code=code,
            # The API schedules each upload's deadline, stores files and batches and sends plan steps.
            environment={
                **environment,
                **self.upload_deadlines.environment,
                **self.batches.environment,
                **self.streams.environment,
            },
            tenants=props.tenants,
            stage_name=props.api_stage_name,
            log_retention=props.log_retention,
            create_cloudwatch_role=props.create_api_gateway_cloudwatch_role,
            waf_requests_per_5_min_per_ip=props.waf_requests_per_5_min_per_ip,
            tenant_stacks=self.tenant_stacks,
        )
        self.uploads = UploadIntake(
            self,
            "Uploads",
            code=code,
            bucket=self.bucket.bucket,
            # A file upload's bytes are checked against its record in the batch table.
            environment={**environment, **self.batches.environment},
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
            tenant_stacks=self.tenant_stacks,
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
                event_log=self.streams.table,
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
            worker_environment={**environment, ENV_SERVED_MODELS: json.dumps([spec.name for spec in specs])},
            bucket=self.bucket,
            table=self.table,
            results=self.results,
            webhooks=self.webhooks,
            batches=self.batches,
            push=self.push,
            streams=self.streams,
        )
        self.models: dict[str, ModelStore | None] = {}
        for index, spec in enumerate(specs):
            names = deployed_names(index, spec, nested=props.fleet_stacks)
            self.models[spec.name] = self._model_store(props.for_model(spec), names.store_id, removal)
            scope, fleet_shared = self, shared
            if props.fleet_stacks:
                # A nested stack of its own per fleet, with a cluster of its own (cdk.worker_cluster.FleetCluster).
                scope = NestedStack(self, f"{names.fleet_id}Stack", description=f"The fleet of {spec.name}")
                fleet_shared = replace(shared, cluster=FleetCluster(scope, "Cluster", network=self.cluster))
            fleet = ModelFleet(
                scope,
                names.fleet_id,
                spec=spec,
                ecs_service_name=names.ecs_service_name,
                props=props.for_model(spec),
                shared=fleet_shared,
                models=self.models[spec.name],
                # One release function releases the cluster's empty instances, every fleet's group included.
                release_with=self.fleets[0].capacity.release_function if self.fleets and scope is self else None,
            )
            self.fleets.append(fleet)
            self._monitored.append(
                MonitoredFleet(
                    spec.name,
                    names.alarm_key,
                    fleet.jobs.queue,
                    fleet.workers.service,
                    dead_letter_queues={
                        names.job_dead_letters: fleet.jobs.dead_letter_queue,
                        names.lane_dead_letters: fleet.lane_dead_letter_queue,
                    },
                )
            )
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
        self.inbox: Inbox | None = None
        if props.inbox_rules:
            self.inbox = Inbox(
                self,
                "EventsIn",  # the construct id it was deployed with: its failure queue keeps its logical id
                code=code,
                bucket=self.bucket.bucket,
                rules=props.inbox_rules,
                environment={**environment, **self.batches.environment},
            )
        self.catalog = DeploymentCatalog(self, "Catalog")
        self._add_tenants()
        self._route(props)
        self.catalog.seal()
        self.monitoring = self._monitoring(props)
        grant_functions(self)

    def _add_tenants(self) -> None:
        """Each tenant's entry of the catalog (its key ids, quotas and signing secret), and the functions that read
        tenants: the authorizer and WebSocket functions (key ids), the dispatcher (secrets), and the API, upload
        handler and batch controller (quotas; they read the models too: ``_route``)."""
        for tenant, entry in self.api.tenant_entries.items():
            secret, queue = self.webhooks.signing_secrets[tenant], self.webhooks.queues[tenant]
            nested = self.tenant_stacks
            self.catalog.add(
                TENANTS,
                tenant,
                {**entry, "webhook_secret_arn": secret.secret_arn, "webhook_queue_url": queue.queue_url},
                # Beside the tenant's key, secret and queue, in its nested stack if it has one.
                scope=nested.scope(tenant, "Catalog") if nested else None,
                folder=nested.folder(tenant) if nested else None,
            )
        readers = [self.api.authorizer_function, self.webhooks.handler]
        if self.push is not None:
            # The push functions read key ids to close, rather than tell, a connection whose key was revoked since.
            readers += [self.push.routes_handler, self.push.push_handler]
            if self.push.delta_push_handler is not None:
                readers.append(self.push.delta_push_handler)
        for function in readers:
            self.catalog.bind(function, [TENANTS])

    def _route(self, props: AsyncInferenceServiceProps) -> None:
        """Every function that queues work routes it by its model (async_inference.fleets), the only way it finds a
        queue: the API (jobs, responses), the upload handler (uploaded jobs), the batch controller (chunks) and events
        in (jobs). With ``wake_from_zero``, each may wake any fleet from zero: the stack's wake settings in its
        variables (``async_inference.config.WakeSettings``), each fleet's service and group in its route."""
        # The API, upload handler and controller hold requests to their tenant's quotas; the inbox queues on behalf
        # of a rule's tenant and reads none.
        queuing = {function: [TENANTS, MODELS] for function in (*self.api.functions, self.uploads.handler)}
        queuing[self.batches.controller] = [TENANTS, MODELS]
        if self.inbox is not None:
            queuing[self.inbox.handler] = [MODELS]
        wake = props.wake_from_zero
        for fleet in self.fleets:
            self.catalog.add(MODELS, fleet.spec.name, {"route": fleet.route(wake=wake)})
        wake_settings = WakeSettings(
            self.cluster.cluster.cluster_name, props.wake_check_interval_seconds, props.wake_hold_seconds
        )
        for function, parts in queuing.items():
            self.catalog.bind(function, parts)
            for name, value in wake_settings.to_env().items() if wake else ():
                function.add_environment(name, value)
            for fleet in self.fleets if wake else ():
                fleet.grant_wake(function)
        for fleet in self.fleets:
            fleet.capacity.grant_capacity_read(self.api.handler)  # GET /v1/models reports failing launches

    def _monitoring(self, props: AsyncInferenceServiceProps) -> Monitoring:
        """Alarms and the dashboard: every DLQ, and each fleet's queue age and workers (``cdk.monitoring``; each
        fleet's alarms keep the names it was deployed with: ``deployed_names``)."""
        return Monitoring(
            self,
            "Monitoring",
            dead_letter_queues={
                "WebhookDeadLetterQueue": self.webhooks.dead_letter_queue,
                "SubscriptionDeadLetterQueue": self.results.subscription_dead_letter_queue,
                "UploadFailureQueue": self.uploads.failure_queue,
                "UploadDeadlineDeadLetterQueue": self.upload_deadlines.dead_letter_queue,
                "BatchControlDeadLetterQueue": self.batches.control_dead_letter_queue,
                "UnhandledDeadLetterQueue": self.dead_letters.unhandled_queue,
                **({"EventsInFailureQueue": self.inbox.failure_queue} if self.inbox else {}),
            },
            fleets=self._monitored,
            worker_service_name=WORKER_SERVICE_NAME,
            api_service_name=self.api.service_name,
            dead_letter_service_name=self.dead_letters.service_name,
            oldest_message_alarm_age=Duration.seconds(props.oldest_message_alarm_seconds),
            alarm_topic=sns.Topic.from_topic_arn(self, "AlarmTopic", props.alarm_topic_arn)
            if props.alarm_topic_arn
            else None,
            alarm_email=props.alarm_email,
            log_retention=props.log_retention,
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
