"""Functions run from their synthesized asset, with the import path and environment the deployed function has."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_runtime.deployer import Deployment
from local_runtime.functions import LocalFunction
from local_runtime.template import Assembly
from tests.local.assemblies import python_function, write_assembly

HANDLERS = {
    "handler.py": (
        "import os\n"
        "def env(event, context):\n"
        "    return dict(os.environ)\n"
        "def boom(event, context):\n"
        "    raise ValueError('bad event ' + str(event))\n"
        "def slow(event, context):\n"
        "    import time; time.sleep(5)\n"
    ),
    "needs_requests.py": "import requests\ndef handler(event, context):\n    return 1\n",
}


def deploy(tmp_path: Path, resources: dict) -> Deployment:
    assembly = write_assembly(tmp_path / "cdk.out", resources, {"asset.code": HANDLERS})
    return Deployment(Assembly.load(assembly), clients=lambda service: None, api_key_values={}).deploy()


def started(deployment: Deployment, logical_id: str, **extra_env: str) -> LocalFunction:
    return LocalFunction(deployment, logical_id, extra_env=extra_env).start().wait_ready()


def test_a_function_gets_its_template_environment_lambdas_own_variables_and_nothing_else(tmp_path, monkeypatch):
    # GIVEN a function whose Environment refers to another resource, and a variable in the starting process's env
    monkeypatch.setenv("SHOULD_NOT_LEAK", "1")
    deployment = deploy(
        tmp_path,
        {
            "Fn": python_function("asset.code", "handler.env", environment={"WHERE": {"Fn::GetAtt": ["Other", "Arn"]}}),
            "Other": python_function("asset.code", "handler.env"),
        },
    )
    function = started(deployment, "Fn", LOCAL_OVERRIDE="yes")
    try:
        # WHEN it runs
        env = function({})
    finally:
        function.stop()
    # THEN it sees the resolved template value, what Lambda sets, the listed override, and nothing inherited
    assert env["WHERE"] == deployment.resources["Other"].attributes["Arn"]
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == function.name and env["AWS_REGION"] and env["_HANDLER"] == "handler.env"
    assert env["LOCAL_OVERRIDE"] == "yes"
    assert "SHOULD_NOT_LEAK" not in env and "VIRTUAL_ENV" not in env


def test_an_import_the_deployment_package_lacks_fails_the_init_as_in_lambda(tmp_path):
    # GIVEN a handler importing requests, which is in this virtualenv but in neither its asset nor a layer
    import requests  # noqa: F401 - proves the package is here, so only the isolation can make the init fail

    deployment = deploy(tmp_path, {"Fn": python_function("asset.code", "needs_requests.handler")})
    # WHEN the function starts THEN its init fails
    with pytest.raises(RuntimeError, match="exited during init"):
        started(deployment, "Fn")


def test_an_error_and_a_timeout_come_back_as_lambda_reports_them(tmp_path):
    deployment = deploy(
        tmp_path,
        {
            "Boom": python_function("asset.code", "handler.boom"),
            "Slow": python_function("asset.code", "handler.slow", timeout=1),
        },
    )
    boom, slow = started(deployment, "Boom"), started(deployment, "Slow")
    try:
        failed = boom.invoke({"x": 1})
        timed_out = slow.invoke({})
        after = boom.invoke({"x": 2})  # the environment survives its function's error
    finally:
        boom.stop()
        slow.stop()
    assert (
        failed.error and failed.payload["errorType"] == "ValueError" and "bad event" in failed.payload["errorMessage"]
    )
    assert timed_out.error and timed_out.payload["errorMessage"] == "Task timed out after 1.00 seconds"
    assert after.error and "'x': 2" in after.payload["errorMessage"]
