"""The streaming API function: the API's own handler run under AWS Lambda Web Adapter in response-stream mode, behind
the REST API's ``STREAM`` integrations (docs/streaming.md, "Transport").

Python's managed Lambda runtime cannot stream a response by itself. The adapter (awslabs/aws-lambda-web-adapter, a
Lambda layer AWS publishes) runs the function's start command (``lambdas/api/run.sh``: uvicorn serving
``lambdas.api.streaming_app``, the ASGI app over the API's proxy handler) and streams what it answers to API Gateway,
which sends it on as it comes. The function shares the API function's role (every grant of one is the other's) and
gets the same environment from the ingestion API.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from async_inference.streaming.asgi import ENV_PROXY_HANDLER
from async_inference.streaming.follow import Follow
from cdk.lambda_code import ARCHITECTURE, LambdaCode

# The adapter's layer, published by AWS in each commercial region under this account (AWS China regions publish it
# from other accounts; GovCloud has none): a stack deployed where the layer is not published fails to create the
# function. The version is the adapter's release; raise it here (all architectures at once) to take a new one.
WEB_ADAPTER_ACCOUNT = "753240598075"
WEB_ADAPTER_LAYERS = {
    lambda_.Architecture.X86_64.name: "LambdaAdapterLayerX86:28",
    lambda_.Architecture.ARM_64.name: "LambdaAdapterLayerArm64:28",
}
START_COMMAND = "lambdas/api/run.sh"  # a path under the function's code: the adapter's wrapper executes it
# The adapter's settings (its README): the wrapper that starts it, response streaming, and the app's port.
ADAPTER_ENVIRONMENT = {
    "AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap",
    "AWS_LWA_INVOKE_MODE": "response_stream",
    "PORT": "8080",  # the adapter's readiness check takes any answer under 500 on / (the handler's 404) as ready
}
# API Gateway holds a streamed response 15 minutes at most; a stream ends itself just before (Follow.max_wait_s).
STREAM_TIMEOUT = Duration.seconds(int(Follow().max_wait_s))


def web_adapter_layer_arn(scope: Construct, architecture: lambda_.Architecture = ARCHITECTURE) -> str:
    """The adapter layer's ARN in ``scope``'s region for ``architecture``."""
    stack = Stack.of(scope)
    return (
        f"arn:{stack.partition}:lambda:{stack.region}:{WEB_ADAPTER_ACCOUNT}:layer:"
        + (WEB_ADAPTER_LAYERS[architecture.name])
    )


def new_streaming_function(
    scope: Construct,
    id: str,
    *,
    code: LambdaCode,
    proxy_handler: str,
    role: iam.IRole,
    service_name: str,
    environment: Mapping[str, str],
) -> lambda_.Function:
    """A function that serves ``proxy_handler`` (module.function, a Lambda proxy handler whose body may be an
    iterable) with its answers streamed, on ``code``, with ``role``."""
    function = code.new_function(
        scope,
        id,
        handler=START_COMMAND,
        description="Ingestion API, streamed: OpenAI's routes with stream: true (Lambda Web Adapter)",
        service_name=service_name,
        environment={**environment, **ADAPTER_ENVIRONMENT, ENV_PROXY_HANDLER: proxy_handler},
        timeout=STREAM_TIMEOUT,
        role=role,
    )
    function.add_layers(
        lambda_.LayerVersion.from_layer_version_arn(scope, f"{id}WebAdapter", web_adapter_layer_arn(scope))
    )
    return function
