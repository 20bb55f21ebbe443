"""A Lambda Web Adapter function locally (local_runtime/functions.py): the local host runs the proxy handler its ASGI
app serves, as the template names it, and the adapter's own layer (AWS's, not in the template) is not looked for."""

from __future__ import annotations

import pytest

from async_inference.streaming.asgi import ENV_PROXY_HANDLER
from local_runtime.functions import local_handler
from local_runtime.template import TemplateError

ADAPTER = {"AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap", "AWS_LWA_INVOKE_MODE": "response_stream"}


def test_a_web_adapter_function_runs_the_proxy_handler_its_template_names():
    # GIVEN a function whose wrapper starts the adapter and whose Handler is its start command
    environment = {**ADAPTER, ENV_PROXY_HANDLER: "lambdas.api.handler.lambda_handler"}
    # WHEN the local runtime picks what to run THEN it is the proxy handler the ASGI app serves
    assert local_handler("lambdas/api/run.sh", environment) == "lambdas.api.handler.lambda_handler"


def test_another_function_runs_its_handler():
    # GIVEN an ordinary function WHEN the local runtime picks what to run THEN it is its Handler
    assert local_handler("lambdas.dlq.handler.lambda_handler", {"X": "1"}) == "lambdas.dlq.handler.lambda_handler"


def test_a_web_adapter_function_without_its_proxy_handler_is_a_template_error_naming_it():
    # GIVEN an adapter function whose template names no proxy handler WHEN started locally THEN the error says what
    # to add, rather than running a shell script as a Python handler
    with pytest.raises(TemplateError, match=ENV_PROXY_HANDLER):
        local_handler("run.sh", ADAPTER)
