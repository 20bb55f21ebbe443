"""The deployment's catalog (async_inference.catalog): the tenants and models a function reads at start, from the SSM
parameters its stack writes, as the settings variables they once were."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from async_inference import catalog
from async_inference.config import AuthorizerSettings, DispatcherSettings, ServiceSettings

ROOT = "/Stack/catalog/"
ROUTE = {"kind": "chat", "queue_url": "https://sqs/jobs"}


@pytest.fixture
def ssm(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # moto's mock answers AWS's own endpoints only
    for name in ("TENANT_API_KEY_IDS", "TENANT_QUOTAS", "WEBHOOK_SECRET_ARNS", "MODEL_FLEETS", "SERVED_MODELS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(catalog.ENV_CATALOG_PATH, ROOT)
    catalog._deployed_part.cache_clear()
    with mock_aws():
        yield boto3.client("ssm")
    catalog._deployed_part.cache_clear()


def _put(ssm, part: str, index: int, entry: dict) -> None:
    ssm.put_parameter(Name=f"{ROOT}{part}/{index}", Value=json.dumps(entry), Type="String")


def test_every_tenant_and_model_is_read_past_a_page_of_parameters(ssm):
    # GIVEN 12 tenants (GetParametersByPath answers 10 a page) and a model whose name holds a slash
    for n in range(12):
        _put(ssm, "tenants", n, {"name": f"t{n}", "api_key_ids": [f"k{n}"], "quota": {"max_active_jobs": n}})
    _put(ssm, "models", 0, {"name": "org/chat", "route": ROUTE})
    # WHEN each part is read
    tenants = catalog.read_part(ssm, ROOT, catalog.TENANTS)
    models = catalog.read_part(ssm, ROOT, catalog.MODELS)
    # THEN every entry is there by its name, its name taken out of its value
    assert sorted(tenants) == sorted(f"t{n}" for n in range(12))
    assert tenants["t11"] == {"api_key_ids": ["k11"], "quota": {"max_active_jobs": 11}}
    assert models == {"org/chat": {"route": ROUTE}}


def test_the_settings_read_the_catalog_as_the_variables_the_stack_once_set(ssm):
    # GIVEN a tenant and a model in the catalog CATALOG_PATH names
    tenant = {"name": "acme", "api_key_ids": ["k1", "k2"], "quota": {"max_active_jobs": 3}, "webhook_secret_arn": "a"}
    _put(ssm, "tenants", 0, tenant)
    _put(ssm, "models", 0, {"name": "org/chat", "route": ROUTE})
    # WHEN the authorizer's, the dispatcher's and the API's settings load
    keys = AuthorizerSettings.load().tenant_api_key_ids
    secrets = DispatcherSettings.load(webhook_queue_url="q", table_name="t").webhook_secret_arns
    api = ServiceSettings.load(table_name="t", bucket_name="b", topic_arn="arn")
    # THEN each has what the catalog holds
    assert keys == {"acme": ["k1", "k2"]} and secrets == {"acme": "a"}
    assert api.served_models == ["org/chat"] and api.model_fleets is not None
    assert api.model_fleets["org/chat"].queue_url == ROUTE["queue_url"]
    assert api.tenant_quotas is not None and api.tenant_quotas["acme"].max_active_jobs == 3


def test_a_variable_the_environment_sets_wins_over_the_catalog(ssm, monkeypatch):
    # GIVEN a model in the catalog, and the routes and names the local runtime sets in the environment
    _put(ssm, "models", 0, {"name": "org/chat", "route": ROUTE})
    monkeypatch.setenv("SERVED_MODELS", '["local"]')
    monkeypatch.setenv("MODEL_FLEETS", json.dumps({"local": ROUTE}))
    # WHEN the API's settings load THEN the environment's are used
    api = ServiceSettings.load(table_name="t", bucket_name="b", topic_arn="arn")
    assert api.served_models == ["local"] and api.model_fleets is not None and list(api.model_fleets) == ["local"]
