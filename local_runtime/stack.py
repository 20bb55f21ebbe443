"""The whole service on 127.0.0.1, deployed from its synthesized template and started and stopped as one.

``LocalDeployment.start`` starts moto server, deploys the cloud assembly into it (``local_runtime.deployer``), starts
every Python function of the template from its assets (``local_runtime.functions``) with its event sources
(``local_runtime.pollers``), serves the REST API (``local_runtime.rest_api``) and the WebSocket API with its
management API (``local_runtime.websocket_api``), and runs the workers from the task definition under a supervisor
(``local_runtime.workers``). Nothing here declares a resource: what differs from AWS is
the list of overrides below, each with its reason.

Local overrides, on top of what the template gives:

* every function and worker: the moto endpoint (``AWS_ENDPOINT_URL``) and moto's credentials (in AWS: the role's);
* functions: ``POWERTOOLS_TRACE_DISABLED`` (no X-Ray daemon here), ``ALLOW_LOCAL_WEBHOOKS=1`` (webhooks may target
  127.0.0.1), webhook retries after 1 s instead of 30 s and up (``WEBHOOK_BACKOFF_*``; export them to try the
  deployed schedule); the push function's ``WEBSOCKET_CALLBACK_URL`` (in AWS the stage's management API,
  ``https://{api}.execute-api.{region}.amazonaws.com/{stage}``) is the local management API,
  ``http://127.0.0.1:{management port}/{stage}`` (a port of its own: ``websockets`` serves GET handshakes only);
* workers: ``ENGINE`` (``cpu``, ``echo``...: this machine has no GPU for vLLM), and for any engine but vllm no
  ``MODEL``/``MODEL_S3_URI`` (the local engines serve their own model); ``MODEL_CACHE_DIR`` for the CPU engine.
  Every ECS service of the template (one per model, ``cdk.model_fleet``) runs its own workers from its own task
  definition; the engine of each follows its model's kind (``MODEL_KIND``) through ``local_engine``;
* functions: ``SERVED_MODELS``, the model names requests may ask for (``served_models``, or ``LOCAL_SERVED_MODELS``
  comma-separated): the template names the model the GPU workers serve, and the local engines serve another. By
  default the CPU engine's ``SmolLM2-135M-Instruct``; ``*`` (any name) for the echo and simulated engines, which
  answer whatever model a request names; the template's own for vllm. The template's embedding models stay served
  beside them: their local engine runs the real all-MiniLM-L6-v2; and ``MODEL_FLEETS``, the routes by which work
  finds its queue: each served name the template's routes (the deployed catalog's, ``async_inference.catalog``) lack
  gets the first model's route with its own kind, and with ``*`` served, the ``*`` route
  (``async_inference.fleets.ANY_MODEL``, either kind) is the first model's (the catalog stays as it is); both set in
  the environment, where they win over the catalog;
* the API keys' values (``api_keys``): API Gateway generates them at deploy; locally they are given, so that a test
  or a user knows them. Each tenant must be one the template has a key for.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import boto3
from botocore.config import Config

from async_inference import catalog, fleets
from async_inference import config as runtime_config
from async_inference.config import ENV_MODEL_KIND, ServiceConfig
from async_inference.fleets import CHAT, EMBEDDING
from async_inference.webhooks.secrets import read_tenant_secrets
from gpu_worker.engines.cpu_embedding import MINILM_NAME
from local_runtime.deployer import Deployment
from local_runtime.functions import LocalFunction, environment_of, function_ids
from local_runtime.moto_server import LOCAL_CREDENTIALS, LOCAL_KEYS, MotoServer, free_port
from local_runtime.pollers import SqsEventSource, event_sources
from local_runtime.resource_types import deployable
from local_runtime.rest_api import RestApi, serve
from local_runtime.template import LOCAL_REGION, Assembly, TemplateError
from local_runtime.websocket_api import WebSocketApi
from local_runtime.workers import TaskDefinition, WorkerFleet, service_task_definitions

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ASSEMBLY = REPO_ROOT / "cdk.out"
DEFAULT_API_KEYS = {"local-demo-key-0123456789": "demo"}
# What each local engine answers to (see the overrides above); vllm serves the template's model.
LOCAL_ENGINE_SERVED_MODELS: dict[str, tuple[str, ...]] = {"cpu": ("SmolLM2-135M-Instruct",)}
ANY_MODEL = ("*",)
MIN_API_KEY_CHARS = 20  # API Gateway's own minimum
LOCAL_WEBHOOK_BACKOFF = {runtime_config.ENV_BACKOFF_BASE_S: "1", runtime_config.ENV_BACKOFF_MAX_S: "1"}
LOCAL_ENGINE_MODEL_VARIABLES = (runtime_config.ENV_MODEL, runtime_config.ENV_MODEL_S3_URI)
# Functions behind the REST API, and those invoked asynchronously (SNS, S3), get this many execution environments
# (Lambda scales them with concurrent requests and events); the others, fed by one SQS poller each, one.
API_FUNCTION_INSTANCES = 2
# How long ``stop`` waits for an event source's delivery under way before it stops the functions anyway.
POLLER_STOP_S = 10.0
# How long ``stop`` lets the workers drain before it kills them. The whole stack is going, moto's in-memory queues and
# tables with it, so a drain would hand messages back to a queue about to vanish; an idle worker would still wait out
# its long poll (RECEIVE_WAIT_S, 20 s). A scale-in (``stop_worker``) gets the container's full stop timeout.
WORKER_STOP_GRACE_S = 3.0
logger = logging.getLogger("local_runtime")


def parse_api_keys(value: str | None) -> dict[str, str]:
    """``LOCAL_API_KEYS``: comma-separated ``key=tenant`` pairs; one default pair when unset."""
    if not value:
        return dict(DEFAULT_API_KEYS)
    keys = {}
    for pair in value.split(","):
        key, sep, tenant = pair.strip().partition("=")
        if not sep or not key or not tenant:
            raise ValueError(f"LOCAL_API_KEYS: {pair!r} is not of the form key=tenant")
        if len(key) < MIN_API_KEY_CHARS:
            raise ValueError(f"LOCAL_API_KEYS: the key for {tenant!r} must be at least {MIN_API_KEY_CHARS} characters")
        keys[key] = tenant
    return keys


# The local engine of an embedding model's fleet: the CPU embedding engine (gpu_worker.engines.cpu_embedding, the
# packaged all-MiniLM-L6-v2), chosen by the task definition's MODEL_KIND, whatever engine the chat fleets run (echo
# and simulated have no embedding flavour).
LOCAL_EMBEDDING_ENGINE = "cpu"


def local_engine(kind: str, engine: str) -> str:
    """The engine a fleet of model ``kind`` runs locally: ``engine`` (the one asked for) for chat models, the
    embedding engine for embedding models (``vllm`` stays ``vllm`` for both: it runs either kind)."""
    if kind == EMBEDDING and engine != "vllm":
        return LOCAL_EMBEDDING_ENGINE
    return engine


def served_models_for(engine: str, given: tuple[str, ...] | list[str] | None) -> tuple[str, ...] | None:
    """The SERVED_MODELS override for ``engine``: ``given``, else LOCAL_SERVED_MODELS, else the engine's default
    (None: the template's value stands)."""
    if given is not None:
        return tuple(given)
    if os.environ.get("LOCAL_SERVED_MODELS"):
        return tuple(name.strip() for name in os.environ["LOCAL_SERVED_MODELS"].split(",") if name.strip())
    if engine == "vllm":
        return None
    return LOCAL_ENGINE_SERVED_MODELS.get(engine, ANY_MODEL)


@dataclass(frozen=True)
class LocalResources:
    """Where the deployed resources are, from the stack's outputs (as ``aws cloudformation describe-stacks`` gives)."""

    config: ServiceConfig
    outputs: dict[str, Any]

    @property
    def webhook_dlq_url(self) -> str:
        return self.outputs["WebhookDeadLetterQueueUrl"]

    @property
    def webhook_secret_arns(self) -> dict[str, str]:
        """Tenant -> the ARN of its signing secret, which the deploy created (the output is a JSON object)."""
        return json.loads(self.outputs["WebhookSigningSecretArns"])

    @property
    def batch_table_name(self) -> str:
        return self.outputs["BatchTableName"]

    @property
    def batch_queue_url(self) -> str:
        return self.outputs["BatchQueueUrl"]

    @property
    def batch_control_queue_url(self) -> str:
        return self.outputs["BatchControlQueueUrl"]


class LocalDeployment:
    """moto server, the template deployed into it, its functions and event sources, the REST API and the workers."""

    def __init__(
        self,
        *,
        assembly: Path | str = DEFAULT_ASSEMBLY,
        api_port: int = 8000,
        moto_port: int = 5000,
        ws_port: int | None = None,
        api_keys: dict[str, str] | None = None,
        workers: int | Mapping[str, int] = 1,
        engine: str = "cpu",
        worker_env: dict[str, str] | None = None,
        worker_log: IO[bytes] | int | None = None,
        log_dir: Path | str | None = None,
        served_models: tuple[str, ...] | list[str] | None = None,
    ) -> None:
        self.assembly_dir = Path(assembly).resolve()  # the functions run from other directories
        self.api_port = api_port
        # None: any free port (tests); `make up` gives WS_PORT. The management API always gets a free one.
        self.ws_port = ws_port or free_port()
        self.ws_management_port = free_port()
        self.websocket: WebSocketApi | None = None
        self.moto = MotoServer(moto_port)
        self.api_keys = api_keys or dict(DEFAULT_API_KEYS)
        # The workers each model's ECS service starts: one count for every service, or counts by service name (a
        # service not named starts none; tests start them).
        self.worker_counts = workers
        self.engine = engine
        self.worker_env = worker_env or {}
        self.worker_log = worker_log
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="local-stack-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)  # LOCAL_LOG_DIR may name a folder not made yet
        self.served_models = served_models_for(engine, served_models)
        self.deployment: Deployment | None = None
        self.resources: LocalResources | None = None
        self.functions: dict[str, LocalFunction] = {}
        self.fleet: WorkerFleet | None = None  # the default of ``start_worker``: a one-model stack's, ``fleets``' first
        self.fleets: dict[str, WorkerFleet] = {}  # ECS service name -> its workers
        self._pollers: list[Any] = []
        self._servers: list[Any] = []
        self._function_log: IO[bytes] | None = None

    @classmethod
    def with_tenants(cls, api_keys: dict[str, str], **options: Any) -> LocalDeployment:
        """A stack of the app synthesized for exactly the tenants of ``api_keys`` (key -> tenant), as
        ``cdk synth -c tenants=...`` would build it, in a temporary assembly directory (benchmarks, tools)."""
        from local_runtime.synth import synthesize

        outdir = Path(tempfile.mkdtemp(prefix="cdk.out-"))
        synthesize(outdir, {"tenants": {tenant: {} for tenant in sorted(set(api_keys.values()))}})
        return cls(assembly=outdir, api_keys=api_keys, **options)

    def export_env(self) -> None:
        """Make this process a client of the stack: boto3 clients built without an endpoint talk to its moto."""
        os.environ.update(self.env)

    # --- what clients need ------------------------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ws_url(self) -> str | None:
        """The WebSocket API's URL (None when the template has none): ``ws://127.0.0.1:{ws_port}/{stage}``."""
        return self.websocket.url if self.websocket else None

    @property
    def env(self) -> dict[str, str]:
        """The environment a client process needs to use this stack (the CLI, a test, a benchmark)."""
        assert self.resources is not None, "start() first"
        return {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": self.moto.url, **self.resources.config.to_env()}

    @property
    def webhook_secrets(self) -> dict[str, str]:
        """Each tenant's current signing secret, read from the Secrets Manager secret the deploy generated for it (as
        ``python -m async_inference.cli webhook-secret`` reads it): what a tenant verifies its webhooks with."""
        assert self.resources is not None, "start() first"
        arns, secretsmanager = self.resources.webhook_secret_arns, self.client("secretsmanager")
        return {tenant: read_tenant_secrets(arns, tenant, secretsmanager)[0] for tenant in sorted(arns)}

    def client(self, service: str) -> Any:
        """A boto3 client of this stack's moto server."""
        config = Config(s3={"addressing_style": "path"}, signature_version="s3v4") if service == "s3" else None
        return boto3.client(
            service,
            endpoint_url=self.moto.url,
            region_name=LOCAL_REGION,
            config=config,
            **{k.lower(): v for k, v in LOCAL_KEYS.items()},
        )

    # --- start and stop ---------------------------------------------------------------------------------------------

    def start(self) -> LocalDeployment:
        assembly = Assembly.load(self.assembly_dir)
        deployable(assembly)
        self.moto.start()
        try:
            self._deploy(assembly)
            self._start_functions()
            assert self.deployment is not None
            self._pollers = self._event_sources()
            for poller in self._pollers:
                poller.start()
            self._serve_api()
            self._serve_websocket()
            for name, task in service_task_definitions(self.deployment).items():
                self.fleets[name] = self._fleet(name, task).start(self.worker_count(name))
            self.fleet = next(iter(self.fleets.values()), None)
        except BaseException:
            self.stop()
            raise
        return self

    def _deploy(self, assembly: Assembly) -> None:
        keys_by_tenant = {tenant: key for key, tenant in self.api_keys.items()}
        template_tenants = {r["Properties"].get("Name") for r in assembly.of_type("AWS::ApiGateway::ApiKey").values()}
        unknown = sorted(set(keys_by_tenant) - template_tenants)
        if unknown:
            raise TemplateError(
                f"tenants {unknown} have no API key in {self.assembly_dir} (it has {sorted(template_tenants)}): "
                "add them to the `tenants` context and synthesize again (the README's 'More tenants')"
            )
        self.deployment = Deployment(assembly, self.client, api_key_values=keys_by_tenant).deploy()
        outputs = self.deployment.outputs
        self.resources = LocalResources(
            config=ServiceConfig(
                table_name=outputs["TableName"],
                bucket_name=outputs["BucketName"],
                queue_url=outputs["QueueUrl"],
                topic_arn=outputs["ResultTopicArn"],
                dlq_url=outputs["DeadLetterQueueUrl"],
            ),
            outputs=outputs,
        )

    def _function_overrides(self, logical_id: str) -> dict[str, str]:
        overrides = {
            **LOCAL_KEYS,
            "AWS_ENDPOINT_URL": self.moto.url,
            "POWERTOOLS_TRACE_DISABLED": "true",
            runtime_config.ENV_ALLOW_LOCAL_WEBHOOKS: "1",
            **{name: os.environ.get(name, value) for name, value in LOCAL_WEBHOOK_BACKOFF.items()},
            **self._model_overrides(logical_id),
        }
        assert self.deployment is not None
        if runtime_config.ENV_WEBSOCKET_CALLBACK_URL in environment_of(self.deployment, logical_id):
            stage = next(iter(self.deployment.of_type("AWS::ApiGatewayV2::Stage").values())).ref
            overrides[runtime_config.ENV_WEBSOCKET_CALLBACK_URL] = f"http://127.0.0.1:{self.ws_management_port}/{stage}"
        return overrides

    def worker_count(self, service: str) -> int:
        """How many workers the ECS service named ``service`` starts with."""
        if isinstance(self.worker_counts, int):
            return self.worker_counts
        return self.worker_counts.get(service, 0)

    def _fleet(self, name: str, task: TaskDefinition) -> WorkerFleet:
        """The workers of one ECS service, on the local engine of its model's kind, with host volumes of their own."""
        engine = local_engine(task.environment.get(ENV_MODEL_KIND, CHAT), self.engine)
        return WorkerFleet(
            task,
            environment=self._worker_overrides(engine),
            unset=() if engine == "vllm" else LOCAL_ENGINE_MODEL_VARIABLES,
            volumes_dir=self.log_dir / "volumes" / name,
            log=self.worker_log,
            secretsmanager=self.client("secretsmanager"),
        )

    def _model_overrides(self, logical_id: str) -> dict[str, str]:
        """SERVED_MODELS for a function: the local chat engine's names in place of the template's chat models, and the
        template's embedding models kept, since the local embedding engine runs the real one (all-MiniLM-L6-v2).

        Each local name gets the first model's route (its queue, lane and service) with its own kind, so that the API
        refuses a request of the other kind at once, as it does on AWS: the local embedding engine's model is an
        embedding model, every other name a chat model. With ``*`` served (the engines that answer any name), the
        ``*`` route (``async_inference.fleets.ANY_MODEL``, of either kind) is the first model's."""
        if not self.served_models:
            return {}
        served = list(self.served_models)
        assert self.deployment is not None
        root = environment_of(self.deployment, logical_id).get(catalog.ENV_CATALOG_PATH)
        models = catalog.read_part(self.client("ssm"), root, catalog.MODELS) if root else {}
        routes = {name: entry["route"] for name, entry in models.items()}
        if not routes:
            return {runtime_config.ENV_SERVED_MODELS: json.dumps(served)}
        first = next(iter(routes.values()))
        if ANY_MODEL[0] in served:
            routes[fleets.ANY_MODEL] = first
        else:
            served += [name for name, route in routes.items() if route.get("kind") == EMBEDDING and name not in served]
            for name in [name for name in served if name not in routes]:
                routes[name] = {**first, "kind": EMBEDDING if name == MINILM_NAME else CHAT}
        return {
            runtime_config.ENV_SERVED_MODELS: json.dumps(served),
            runtime_config.ENV_MODEL_FLEETS: json.dumps(routes),
        }

    def _worker_overrides(self, engine: str | None = None) -> dict[str, str]:
        """A worker's overrides, on ``engine`` (default: the one asked for)."""
        overrides = {
            **LOCAL_KEYS,
            "AWS_ENDPOINT_URL": self.moto.url,
            runtime_config.ENV_ENGINE: engine or self.engine,
            "MODEL_CACHE_DIR": str(REPO_ROOT / ".model-cache"),
            **self.worker_env,
        }
        return overrides

    def _start_functions(self) -> None:
        assert self.deployment is not None
        self._function_log = open(self.log_dir / "functions.log", "ab")
        scaled = self._api_function_ids() | set(self.deployment.async_event_queues)
        self.functions = {
            logical_id: LocalFunction(
                self.deployment,
                logical_id,
                extra_env=self._function_overrides(logical_id),
                log=self._function_log,
                instances=API_FUNCTION_INSTANCES if logical_id in scaled else self._event_sources_of(logical_id),
            ).start()
            for logical_id in function_ids(self.deployment)
        }
        with concurrent.futures.ThreadPoolExecutor() as pool:
            list(pool.map(LocalFunction.wait_ready, self.functions.values()))

    def _event_sources_of(self, logical_id: str) -> int:
        """Execution environments for a function not behind the API: one per SQS event source mapping of it (at least
        one). Each mapping's poller invokes one batch at a time, and on AWS the mappings' invocations run beside each
        other: with one environment, a tenant's webhook batch waited for another tenant's slowest delivery
        (cdk/webhook_dispatch.py gives each tenant a queue and a mapping of its own)."""
        assert self.deployment is not None
        mappings = self.deployment.of_type("AWS::Lambda::EventSourceMapping").values()
        return max(
            1, sum(self.deployment.function_by_arn(m.properties["FunctionName"]) == logical_id for m in mappings)
        )

    def _api_function_ids(self) -> set[str]:
        assert self.deployment is not None
        ids = set()
        for method in self.deployment.assembly.of_type("AWS::ApiGateway::Method").values():
            uri = json.dumps(method["Properties"].get("Integration", {}).get("Uri", ""))
            ids |= {lid for lid in self.deployment.of_type("AWS::Lambda::Function") if lid in uri}
        return ids

    def _serve_api(self) -> None:
        assert self.deployment is not None
        apis = list(self.deployment.of_type("AWS::ApiGateway::RestApi"))
        if len(apis) != 1:
            raise TemplateError(f"the local runtime serves one REST API; the template has {len(apis)}")
        server = serve(RestApi(self.deployment, apis[0], self.functions), "127.0.0.1", self.api_port)
        threading.Thread(target=server.serve_forever, name="rest-api", daemon=True).start()
        self._servers.append(server)

    def _serve_websocket(self) -> None:
        assert self.deployment is not None
        apis = [
            lid
            for lid, p in self.deployment.of_type("AWS::ApiGatewayV2::Api").items()
            if p.properties.get("ProtocolType") == "WEBSOCKET"
        ]
        if len(apis) > 1:
            raise TemplateError(f"the local runtime serves one WebSocket API; the template has {len(apis)}")
        if apis:
            self.websocket = WebSocketApi(
                self.deployment,
                apis[0],
                self.functions,
                host="127.0.0.1",
                port=self.ws_port,
                management_port=self.ws_management_port,
            ).start()

    # --- event sources ----------------------------------------------------------------------------------------------

    def event_source_function(self, queue_url: str) -> LocalFunction:
        """The function the template's event source mapping on ``queue_url`` delivers to (its ``environment`` is the
        one its process runs with)."""
        assert self.deployment is not None, "start() first"
        queues = {q.attributes["Arn"]: q.ref for q in self.deployment.of_type("AWS::SQS::Queue").values()}
        for mapping in self.deployment.of_type("AWS::Lambda::EventSourceMapping").values():
            if queues.get(mapping.properties["EventSourceArn"]) == queue_url:
                return self.functions[self.deployment.function_by_arn(mapping.properties["FunctionName"])]
        raise ValueError(f"no event source mapping of the template polls {queue_url}")

    @contextmanager
    def event_source_paused(self, queue_url: str) -> Iterator[LocalFunction]:
        """The event source mapping on ``queue_url`` stopped meanwhile, as ``aws lambda update-event-source-mapping
        --no-enabled`` stops it: its messages wait on the queue, for a test or a benchmark that runs that function's
        code in its own process (to read its messages, or to count its requests). Yields the function; the mapping
        runs again afterwards. A batch the poller had received when paused is handled before this returns."""
        function = self.event_source_function(queue_url)
        paused = [p for p in self._pollers if isinstance(p, SqsEventSource) and p.queue_url == queue_url]
        for poller in paused:
            poller.stop()
        for poller in paused:
            poller.join()
        self._pollers = [p for p in self._pollers if p not in paused]
        try:
            yield function
        finally:
            assert self.deployment is not None
            fresh = [p for p in self._event_sources() if isinstance(p, SqsEventSource) and p.queue_url == queue_url]
            for poller in fresh:
                poller.start()
            self._pollers.extend(fresh)

    def _event_sources(self) -> list[Any]:
        """Every event source of the template's functions, queues', topics' and tables' streams alike, not started."""
        assert self.deployment is not None
        return event_sources(
            self.deployment,
            self.functions,
            self.client("sqs"),
            self.client("sns"),
            self.client("dynamodbstreams"),
        )

    # --- workers ----------------------------------------------------------------------------------------------------

    @property
    def workers(self) -> list[subprocess.Popen[bytes]]:
        return self.fleet.processes if self.fleet else []

    def start_worker(
        self,
        *,
        supervised: bool = False,
        log: IO[bytes] | int | None = None,
        unset: tuple[str, ...] = (),
        python: str | None = None,
        service: str | None = None,
        **extra_env: str,
    ) -> subprocess.Popen[bytes]:
        """One more worker from the task definition (plus ``extra_env``); tests stop it themselves unless it is
        ``supervised`` (then it is replaced whenever it exits, as ECS replaces a task). ``service``: the ECS service
        whose task it is (``fleets``' keys; default: the first model's)."""
        assert self.fleet is not None, "start() first"
        fleet = self.fleets[service] if service is not None else self.fleet
        return fleet.add(supervised=supervised, log=log, unset=unset, python=python, **extra_env)

    def stop_worker(self, process: subprocess.Popen[bytes]) -> None:
        for fleet in self.fleets.values():
            if process in fleet.processes:
                fleet.remove(process)

    def stop(self) -> None:
        """Stops everything in the order that leaves nothing talking to a stopped part: the workers' supervisor, the
        workers (SIGTERM, then SIGKILL after ``WORKER_STOP_GRACE_S``), the event sources (a delivery under way
        finishes), the APIs, the functions, and moto last."""
        for fleet in self.fleets.values():
            fleet.stop(grace_s=WORKER_STOP_GRACE_S)
        for poller in self._pollers:
            poller.stop()
        for poller in self._pollers:
            if poller.is_alive():
                poller.join(timeout=POLLER_STOP_S)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        if self.websocket is not None:
            self.websocket.stop()
        for function in self.functions.values():
            function.terminate()  # all at once: each takes most of a second to exit
        for function in self.functions.values():
            function.stop()
        if self._function_log is not None:
            self._function_log.close()
        self.moto.stop()

    def kill(self) -> None:
        """SIGKILL every process of the stack now (a second Ctrl-C while ``stop`` waits on a drain)."""
        for fleet in list(self.fleets.values()):
            fleet.kill()
        for function in self.functions.values():
            function.kill()
        self.moto.kill()

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
