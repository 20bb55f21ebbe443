"""The smoke command's reading of a stack's outputs (``async_inference.smoke``); the command itself runs against the
local stack in tests/e2e/test_smoke.py."""

from __future__ import annotations

import pytest

from async_inference.smoke import target_from_outputs
from async_inference_client.cli import CliError

OUTPUTS = {"ApiUrl": "https://x.execute-api.us-east-1.amazonaws.com/v1/", "ApiKeyIdtenanta": "abc123"}


def test_a_tenant_without_a_key_output_is_refused_naming_the_tenants_that_have_one():
    # GIVEN outputs with tenant-a's key only (no AWS call is made before the tenant is found)
    # WHEN another tenant's key is asked for THEN the refusal names the tenants the stack has keys for
    with pytest.raises(CliError, match="no key for tenant 'acme'; its tenants' keys: tenanta"):
        target_from_outputs(OUTPUTS, "acme", apigateway=None)


def test_outputs_without_the_api_url_are_refused_as_another_stack():
    # GIVEN outputs of a stack that is not this service's WHEN read THEN the refusal says so
    with pytest.raises(CliError, match="no ApiUrl output"):
        target_from_outputs({"BucketName": "b"}, None, apigateway=None)
