"""The whole service on 127.0.0.1, started and stopped as one."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from async_inference import config as runtime_config
from async_inference import webhooks
from async_inference.aws import client
from local_runtime.gateway import ApiKeys, make_server
from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer
from local_runtime.pollers import QueuePoller, s3_events_to, sqs_batches_to
from local_runtime.resources import LocalResources, create_resources

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_API_KEYS = {"local-demo-key-0123456789": "demo"}
MIN_API_KEY_CHARS = 20  # API Gateway's own minimum
# Locally a failed webhook is retried every second, so a receiver that never answers reaches the webhook DLQ in
# seconds, not hours; export WEBHOOK_BACKOFF_BASE_S / WEBHOOK_BACKOFF_MAX_S to try the deployed schedule.
LOCAL_WEBHOOK_BACKOFF = {webhooks.ENV_BACKOFF_BASE_S: "1", webhooks.ENV_BACKOFF_MAX_S: "1"}
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


def _queue_arn(url: str | None) -> str:
    return client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


class LocalStack:
    """moto server, the service's resources, the API gateway, the event pollers and ``workers`` worker processes."""

    def __init__(
        self,
        *,
        api_port: int = 8000,
        moto_port: int = 5000,
        api_keys: dict[str, str] | None = None,
        workers: int = 1,
        engine: str = "cpu",
        worker_env: dict[str, str] | None = None,
        worker_log: IO[bytes] | int | None = None,
    ) -> None:
        self.api_port = api_port
        self.moto = MotoServer(moto_port)
        self.api_keys = api_keys or dict(DEFAULT_API_KEYS)
        self.worker_count = workers
        self.engine = engine
        self.worker_env = worker_env or {}
        self.worker_log = worker_log
        self.workers: list[subprocess.Popen[bytes]] = []
        self.resources: LocalResources | None = None
        self._threads: list[QueuePoller] = []
        self._server = None
        # One Standard Webhooks signing secret per tenant, made at start-up (in AWS: a Secrets Manager secret).
        self.webhook_secrets = {tenant: webhooks.new_secret() for tenant in sorted(set(self.api_keys.values()))}

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a process needs to talk to this stack (the same variables the CDK stack sets)."""
        assert self.resources is not None, "start() first"
        return {
            **LOCAL_CREDENTIALS,
            "AWS_ENDPOINT_URL": self.moto.url,
            **self.resources.config.to_env(),
            "POWERTOOLS_SERVICE_NAME": "async-inference",
            "POWERTOOLS_METRICS_NAMESPACE": "AsyncInference",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            runtime_config.ENV_ALLOW_LOCAL_WEBHOOKS: "1",
            runtime_config.ENV_WEBHOOK_QUEUE_URL: self.resources.webhook_queue_url,
            runtime_config.ENV_WEBHOOK_SECRETS_JSON: json.dumps(self.webhook_secrets),
            **{name: os.environ.get(name, value) for name, value in LOCAL_WEBHOOK_BACKOFF.items()},
        }

    def start(self) -> LocalStack:
        self.moto.start()
        try:
            os.environ.update({**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": self.moto.url})
            self.resources = create_resources(self.api_keys)
            os.environ.update(self.env)
            # The handlers read their configuration at import, as in Lambda: import them only now.
            api = importlib.import_module("lambdas.api.handler")
            upload = importlib.import_module("lambdas.upload.handler")
            dlq = importlib.import_module("lambdas.dlq.handler")
            dispatcher = importlib.import_module("lambdas.webhooks.handler")
            self._server = make_server("127.0.0.1", self.api_port, api.lambda_handler, ApiKeys(client("apigateway")))
            threading.Thread(target=self._server.serve_forever, name="gateway", daemon=True).start()
            dlq_arn = _queue_arn(self.resources.config.dlq_url)
            self._threads = [
                QueuePoller("upload-events", self.resources.upload_events_queue_url, s3_events_to(upload.lambda_handler)),
                QueuePoller("dlq", self.resources.config.dlq_url, sqs_batches_to(dlq.lambda_handler, dlq_arn)),
                QueuePoller(
                    "webhooks",
                    self.resources.webhook_queue_url,
                    sqs_batches_to(dispatcher.lambda_handler, _queue_arn(self.resources.webhook_queue_url)),
                ),
            ]
            for thread in self._threads:
                thread.start()
            for _ in range(self.worker_count):
                self.start_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, "ENGINE": self.engine, **self.worker_env, **extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        process = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker"], env=env, cwd=REPO_ROOT, stdout=self.worker_log, stderr=subprocess.STDOUT
        )
        self.workers.append(process)
        return process

    def stop(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.terminate()
        for process in self.workers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for thread in self._threads:
            thread.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.moto.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
