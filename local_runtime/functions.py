"""The template's Lambda functions, run locally from their synthesized assets.

Each function runs in its own process (``local_runtime/lambda_host.py``) whose import path is what the deployed
function's is: its code asset, the ``python/`` directory of each layer it names, and what the Lambda runtime itself
provides (boto3 and its dependencies). Its environment is the function's ``Environment`` from the template, with
the intrinsics resolved to the local resources, plus what Lambda sets in every execution environment
(``LAMBDA_PROVIDED``) and the local runtime's own overrides (the moto endpoint and credentials; see
``local_runtime.stack``).

The layer is built for Lambda's platform: manylinux x86_64 and the CPython of the function's ``Runtime``
(``python3.12``: ``cdk.lambda_code.RUNTIME``). On another machine or Python its compiled wheels cannot load; the
function then imports its dependencies from this virtualenv instead, with a warning: the code asset is still the
deployed one, the dependency set is no longer checked.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import platform
import site
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import IO, Any

from async_inference.streaming.asgi import ENV_PROXY_HANDLER
from local_runtime.deployer import Deployment
from local_runtime.moto_server import free_port
from local_runtime.template import LOCAL_REGION, TemplateError

logger = logging.getLogger("local_runtime.functions")
HOST = Path(__file__).with_name("lambda_host.py")
# What the Python Lambda runtime puts on every function's import path besides the function's own code and layers.
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")
LAYER_MACHINE = "x86_64"
_WARNED_RUNTIMES: set[str] = set()


@dataclass(frozen=True)
class InvokeResult:
    payload: Any
    error: bool  # the function raised (Lambda's X-Amz-Function-Error: Unhandled)


@dataclass(frozen=True)
class StreamedInvoke:
    """An InvokeWithResponseStream: ``error`` when the function failed before its stream began, else its bytes as
    they come (``chunks``; the execution environment is busy until they are read to the end or closed)."""

    error: InvokeResult | None
    chunks: Iterator[bytes]


WEB_ADAPTER_WRAPPER = ("AWS_LAMBDA_EXEC_WRAPPER", "/opt/bootstrap")


class FunctionError(RuntimeError):
    """A synchronous invocation whose function raised; the message is Lambda's errorMessage."""


def lambda_provided(name: str, props: dict[str, Any], code_dir: Path) -> dict[str, str]:
    """The variables Lambda sets in every execution environment (besides the function's Environment)."""
    log_group = props.get("LoggingConfig", {}).get("LogGroup") or f"/aws/lambda/{name}"
    return {
        "AWS_REGION": LOCAL_REGION,
        "AWS_DEFAULT_REGION": LOCAL_REGION,
        "AWS_LAMBDA_FUNCTION_NAME": name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(props.get("MemorySize", 128)),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_GROUP_NAME": str(log_group),
        "AWS_LAMBDA_LOG_STREAM_NAME": "local",
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{props['Runtime']}",
        "LAMBDA_TASK_ROOT": str(code_dir),
        "_HANDLER": props["Handler"],
        "TZ": ":UTC",
        "LANG": "en_US.UTF-8",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }


def is_web_adapter(environment: dict[str, str]) -> bool:
    """Whether a function runs under Lambda Web Adapter (its wrapper starts the adapter: cdk/streaming_function.py)."""
    return environment.get(WEB_ADAPTER_WRAPPER[0]) == WEB_ADAPTER_WRAPPER[1]


def local_handler(handler: str, environment: dict[str, str]) -> str:
    """The Python handler a function runs locally: its ``Handler``; for a Web Adapter function (whose ``Handler`` is
    the start command of an ASGI server), the proxy handler its ASGI app serves, named by ``PROXY_HANDLER``. The local
    host's stream invocation writes what the adapter would stream from that app's answer."""
    if not is_web_adapter(environment):
        return handler
    try:
        return environment[ENV_PROXY_HANDLER]
    except KeyError:
        raise TemplateError(
            f"a Web Adapter function (handler {handler!r}) runs locally only with {ENV_PROXY_HANDLER} naming the "
            "proxy handler its ASGI app serves"
        ) from None


def runtime_packages_dir(root: Path) -> Path:
    """A directory holding (links to) the packages the Lambda runtime provides, taken from this virtualenv."""
    target = root / "python"
    target.mkdir(parents=True, exist_ok=True)
    for package in RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"the local Lambda runtime needs {package} installed in this virtualenv")
        source = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
        link = target / source.name
        if not link.exists():
            link.symlink_to(source)
    return target


def runtime_python(runtime: str) -> tuple[int, int]:
    """The CPython version of a Lambda runtime name (``python3.12`` -> (3, 12))."""
    major, _, minor = runtime.removeprefix("python").partition(".")
    return int(major), int(minor)


def layers_run_here(runtime: str) -> bool:
    """Whether layers built for ``runtime`` (manylinux x86_64 wheels of its CPython) load in this process's Python."""
    return (
        platform.machine() == LAYER_MACHINE
        and sys.version_info[:2] == runtime_python(runtime)
        and sys.platform == "linux"
    )


class LocalFunction:
    """One function of the template: ``instances`` execution environments, each a host process, one event each at
    a time."""

    def __init__(
        self,
        deployment: Deployment,
        logical_id: str,
        *,
        extra_env: dict[str, str],
        instances: int = 1,
        log: IO[bytes] | int | None = None,
    ) -> None:
        physical = deployment.resources[logical_id]
        props = physical.properties
        runtime = props.get("Runtime", "")
        if not runtime.startswith("python"):
            raise TemplateError(f"{logical_id}: runtime {runtime!r} does not run locally (Python functions only)")
        self.logical_id = logical_id
        self.name: str = physical.ref
        self.arn: str = physical.attributes["Arn"]
        template_env = {k: str(v) for k, v in props.get("Environment", {}).get("Variables", {}).items()}
        self.handler: str = local_handler(props["Handler"], template_env)
        self.timeout_s = float(props.get("Timeout", 3))
        self.code_dir = deployment.assembly.asset_path(logical_id)
        paths = [str(self.code_dir)]
        if layers_run_here(runtime):
            for layer_arn in props.get("Layers", []):
                if is_web_adapter(template_env) and not deployment.has_ref("AWS::Lambda::LayerVersion", layer_arn):
                    continue  # the adapter's own layer (published by AWS): the host's /invoke-stream stands in for it
                layer = deployment.by_ref("AWS::Lambda::LayerVersion", layer_arn)
                paths.append(str(deployment.assembly.asset_path(layer.logical_id) / "python"))
            paths.append(str(runtime_packages_dir(deployment.assembly.directory / ".local-lambda-runtime")))
        else:
            if runtime not in _WARNED_RUNTIMES:  # once per runtime, not once per function
                _WARNED_RUNTIMES.add(runtime)
                logger.warning(
                    "the functions' layers are built for Lambda (manylinux x86_64, %s), not this "
                    "machine's Python %d.%d; the functions use this virtualenv's packages instead",
                    runtime,
                    *sys.version_info[:2],
                )
            paths.extend(site.getsitepackages())
        self.paths = paths
        self.environment = {**lambda_provided(self.name, props, self.code_dir), **template_env, **extra_env}
        self._log = log
        self.instances = instances
        self._hosts: list[_Host] = []
        self._free: Queue[_Host] = Queue()

    def start(self) -> LocalFunction:
        """Start the execution environments; ``wait_ready`` waits for their init (start several, then wait)."""
        self._hosts = [_Host(self) for _ in range(self.instances)]
        return self

    def wait_ready(self) -> LocalFunction:
        for host in self._hosts:
            host.wait_ready()
            self._free.put(host)
        return self

    def invoke(self, event: Any) -> InvokeResult:
        host = self._free.get()
        try:
            return host.invoke(event)
        finally:
            self._free.put(host)

    def invoke_stream(self, event: Any) -> StreamedInvoke:
        """Invoke with a response stream (``lambda_host.py``'s ``/invoke-stream``)."""
        host = self._free.get()
        try:
            response = host.open_stream(event)
        except BaseException:
            self._free.put(host)
            raise
        if response.getheader("X-Amz-Function-Error") is not None:
            payload = json.loads(response.read() or b"null")
            self._free.put(host)
            return StreamedInvoke(error=InvokeResult(payload=payload, error=True), chunks=iter(()))

        def chunks() -> Iterator[bytes]:
            try:
                while data := response.read1(65536):
                    yield data
            finally:
                response.close()
                self._free.put(host)

        return StreamedInvoke(error=None, chunks=chunks())

    def __call__(self, event: Any) -> Any:
        """Invoke and return the payload, raising FunctionError when the function raised (synchronous callers)."""
        result = self.invoke(event)
        if result.error:
            raise FunctionError(f"{self.logical_id}: {result.payload.get('errorMessage')}")
        return result.payload

    def terminate(self) -> None:
        """SIGTERM every execution environment without waiting (``stop`` waits): stopping many at once."""
        for host in self._hosts:
            host.terminate()

    def stop(self) -> None:
        self.terminate()
        for host in self._hosts:
            host.stop()

    def kill(self) -> None:
        for host in self._hosts:
            host.kill()


class _Host:
    """One execution environment: a ``lambda_host.py`` process, restarted if it dies (Lambda starts a new one)."""

    def __init__(self, function: LocalFunction) -> None:
        self._function = function
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        f = self._function
        self.port = free_port()
        command = [
            sys.executable,
            "-I",
            "-S",
            "-u",
            str(HOST),
            "--port",
            str(self.port),
            "--handler",
            f.handler,
            "--timeout",
            str(f.timeout_s),
        ]
        for path in f.paths:
            command += ["--path", path]
        # A process group of its own: a terminal's Ctrl-C reaches only the local runtime, which stops it in order.
        self.process = subprocess.Popen(
            command, env=f.environment, stdout=f._log, stderr=subprocess.STDOUT, process_group=0
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"function {self._function.logical_id} exited during init "
                    f"(code {self.process.returncode}); its log has the error"
                )
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                connection.request("GET", "/ready")
                connection.getresponse().read()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"function {self._function.logical_id} did not finish its init within {timeout_s} s")

    def invoke(self, event: Any) -> InvokeResult:
        with self._lock:
            if self.process.poll() is not None:
                logger.warning(
                    "%s: execution environment exited (code %s); starting a new one",
                    self._function.logical_id,
                    self.process.returncode,
                )
                self._start()
                self.wait_ready()
            body = json.dumps(event).encode()
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self._function.timeout_s + 30)
            try:
                connection.request("POST", "/invoke", body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = json.loads(response.read() or b"null")
                return InvokeResult(payload=payload, error=response.getheader("X-Amz-Function-Error") is not None)
            except (OSError, http.client.HTTPException) as exc:
                return InvokeResult(
                    payload={
                        "errorMessage": f"the execution environment failed: {exc}",
                        "errorType": "Runtime.ExitError",
                    },
                    error=True,
                )
            finally:
                connection.close()

    def open_stream(self, event: Any) -> http.client.HTTPResponse:
        """The response of ``/invoke-stream`` for ``event``, its body not read yet."""
        if self.process.poll() is not None:  # as ``invoke``: Lambda starts a new execution environment
            self._start()
            self.wait_ready()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self._function.timeout_s + 30)
        connection.request("POST", "/invoke-stream", body=json.dumps(event).encode())
        return connection.getresponse()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def function_ids(deployment: Deployment) -> list[str]:
    """The template's functions that run locally: those with a Python runtime and a code asset (CDK's own
    custom-resource handlers, inline or Node.js, are applied by the deployer instead)."""
    found = []
    for logical_id, physical in deployment.of_type("AWS::Lambda::Function").items():
        resource = deployment.assembly.resources[logical_id]
        if (
            str(physical.properties.get("Runtime", "")).startswith("python")
            and "aws:asset:path" in resource.get("Metadata", {})
            and not _is_custom_resource_handler(deployment, logical_id)
        ):
            found.append(logical_id)
    return sorted(found)


def _is_custom_resource_handler(deployment: Deployment, logical_id: str) -> bool:
    """True for functions that serve a Custom:: resource's ServiceToken (their work is done by the deployer)."""
    arn = deployment.resources[logical_id].attributes["Arn"]
    for resource in deployment.resources.values():
        if resource.type.startswith("Custom::") and resource.properties.get("ServiceToken") == arn:
            return True
    return False


def environment_of(deployment: Deployment, logical_id: str) -> dict[str, str]:
    """A function's Environment from the template, resolved (for tests and tools)."""
    props = deployment.resources[logical_id].properties
    return {k: str(v) for k, v in props.get("Environment", {}).get("Variables", {}).items()}
