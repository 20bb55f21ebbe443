"""The REST resources of OpenAI's Responses API (lambdas/api/response_routes.py), on the ingestion API's ``/v1``."""

from __future__ import annotations

from aws_cdk import aws_apigateway as apigw


def add_responses_routes(
    v1: apigw.IResource,
    integration: apigw.Integration,
    validator: apigw.IRequestValidator,
    *,
    streamed: apigw.Integration | None = None,
) -> apigw.IResource:
    """``POST /v1/responses``; ``GET`` and ``DELETE /v1/responses/{response_id}``, its ``cancel`` (POST) and its
    ``input_items`` (GET), each proxied to the API function (the create and the GET, which may stream, to
    ``streamed`` when given); the ``/v1/responses`` resource."""
    streamed = streamed or integration
    response_id = {"method.request.path.response_id": True}
    responses = v1.add_resource("responses")
    responses.add_method(
        "POST",
        streamed,
        request_validator=validator,
        request_parameters={"method.request.header.idempotency-key": False},
    )
    response = responses.add_resource("{response_id}")
    response.add_method("GET", streamed, request_validator=validator, request_parameters=response_id)
    response.add_method("DELETE", integration, request_validator=validator, request_parameters=response_id)
    response.add_resource("cancel").add_method(
        "POST", integration, request_validator=validator, request_parameters=response_id
    )
    response.add_resource("input_items").add_method(
        "GET", integration, request_validator=validator, request_parameters=response_id
    )
    return responses
