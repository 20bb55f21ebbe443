"""What the local gateway does not emulate is refused by name, never served differently from API Gateway.

It used to route an ``ANY`` method and tell the function and the authorizer the request was a ``GET`` whatever it was,
and to validate bodies against models: paths no template of this app uses and no test covered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from local_runtime.deployer import Deployment
from local_runtime.moto_server import LOCAL_KEYS, MotoServer
from local_runtime.rest_api import RestApi
from local_runtime.template import Assembly, TemplateError
from tests.local.assemblies import python_function, write_assembly

HANDLER = {"handler.py": "def handle(event, context):\n    return {'statusCode': 200, 'body': event['httpMethod']}\n"}
URI = {
    "Fn::Join": [
        "",
        [
            "arn:aws:apigateway:us-east-1:lambda:path/2015-03-31/functions/",
            {"Fn::GetAtt": ["Fn", "Arn"]},
            "/invocations",
        ],
    ]
}


def api_with(tmp_path: Path, moto: MotoServer, method: dict[str, Any], **extra: Any) -> tuple[Deployment, str]:
    """A REST API whose root has one Lambda proxy ``method`` (plus ``extra`` resources), deployed into ``moto``."""

    def clients(service: str) -> Any:
        return boto3.client(
            service, endpoint_url=moto.url, region_name="us-east-1", **{k.lower(): v for k, v in LOCAL_KEYS.items()}
        )

    resources = {
        "Fn": python_function("asset.code", "handler.handle"),
        "Api": {"Type": "AWS::ApiGateway::RestApi", "Properties": {"Name": "api"}},
        "Method": {
            "Type": "AWS::ApiGateway::Method",
            "Properties": {
                "RestApiId": {"Ref": "Api"},
                "ResourceId": {"Fn::GetAtt": ["Api", "RootResourceId"]},
                "AuthorizationType": "NONE",
                "Integration": {"Type": "AWS_PROXY", "IntegrationHttpMethod": "POST", "Uri": URI},
                **method,
            },
        },
        **extra,
    }
    assembly = Assembly.load(write_assembly(tmp_path / "cdk.out", resources, {"asset.code": HANDLER}))
    return Deployment(assembly, clients, api_key_values={}).deploy(), "Api"


def test_an_any_method_is_refused_by_name(moto: MotoServer, tmp_path: Path):
    # GIVEN a template whose REST API has an ANY method
    deployment, api = api_with(tmp_path, moto, {"HttpMethod": "ANY"})

    # WHEN the local gateway is built from it
    # THEN it refuses, naming the method, instead of telling the function every request was a GET
    with pytest.raises(TemplateError, match="Method: an ANY method"):
        RestApi(deployment, api, functions={"Fn": None})  # type: ignore[dict-item]


def test_body_validation_against_a_model_is_refused_by_name(moto: MotoServer, tmp_path: Path):
    # GIVEN a POST whose request validator validates its body against a model
    validator = {
        "Type": "AWS::ApiGateway::RequestValidator",
        "Properties": {"RestApiId": {"Ref": "Api"}, "ValidateRequestBody": True},
    }
    model = {
        "Type": "AWS::ApiGateway::Model",
        "Properties": {"RestApiId": {"Ref": "Api"}, "ContentType": "application/json", "Schema": {"type": "object"}},
    }
    deployment, api = api_with(
        tmp_path,
        moto,
        {
            "HttpMethod": "POST",
            "RequestValidatorId": {"Ref": "Validator"},
            "RequestModels": {"application/json": {"Ref": "Model"}},
        },
        Validator=validator,
        Model=model,
    )

    # WHEN the local gateway is built from it
    # THEN it refuses, naming the method, instead of serving it unvalidated or validated unlike API Gateway
    with pytest.raises(TemplateError, match="Method: request body validation"):
        RestApi(deployment, api, functions={"Fn": None})  # type: ignore[dict-item]
