"""Deploy day (issue 21): what a first `cdk deploy` into a fresh account needs from the template, one test each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cdk.conftest import TEST_CONTEXT
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

DISPATCHER = "lambdas.webhooks.handler.lambda_handler"


def _joined(value: Any) -> str:
    """A string property as CloudFormation would give it, each Ref written as ``<Ref:LogicalId>``."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<Ref:{value['Ref']}>"
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_joined(part) for part in parts)
    raise AssertionError(f"unexpected intrinsic {value}")


def _dispatcher_env(synthesized) -> dict[str, Any]:
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": DISPATCHER}}
    ).values()
    return function["Properties"]["Environment"]["Variables"]


# --- Defect 2: every tenant's webhook signing secret exists after the deploy ----------------------------------------


def test_each_tenant_gets_a_signing_secret_generated_at_deploy(synthesized):
    """GIVEN two tenants in context WHEN synthesized THEN each has a Secrets Manager secret whose value Secrets
    Manager generates (letters and digits, the base64 of a Standard Webhooks secret), and no secret is deployed empty
    for someone to fill in."""
    secrets = synthesized.resources("AWS::SecretsManager::Secret")
    generated = {lid: r for lid, r in secrets.items() if "GenerateSecretString" in r["Properties"]}
    assert len(generated) == len(TEST_CONTEXT["tenants"])
    for resource in generated.values():
        spec = resource["Properties"]["GenerateSecretString"]
        assert spec["ExcludePunctuation"] is True and spec.get("IncludeSpace", False) is False
        assert spec["PasswordLength"] % 4 == 0 and spec["PasswordLength"] * 3 // 4 >= 24  # >= 24 bytes decoded
        assert "SecretStringTemplate" not in spec
    assert not [lid for lid, r in secrets.items() if "SecretString" in r["Properties"]]


def test_the_dispatcher_finds_each_tenants_secret_and_may_read_exactly_those(synthesized):
    """GIVEN the tenants' secrets WHEN reading the dispatcher THEN WEBHOOK_SECRET_ARNS maps each tenant to its own
    secret, and its role may GetSecretValue on those secrets and nothing else of Secrets Manager."""
    arns = json.loads(_joined(_dispatcher_env(synthesized)["WEBHOOK_SECRET_ARNS"]))
    expected = {tenant: f"<Ref:{synthesized.logical_id(secret)}>"
                for tenant, secret in synthesized.stack.service.webhooks.signing_secrets.items()}
    assert arns == expected and set(arns) == set(TEST_CONTEXT["tenants"])
    actions = role_actions(synthesized.template, function_role(synthesized.template, DISPATCHER))
    assert sorted(a for a in actions if a.startswith("secretsmanager:")) == ["secretsmanager:GetSecretValue"]
    assert sorted(r["Ref"] for r in actions["secretsmanager:GetSecretValue"]) == sorted(
        v.removeprefix("<Ref:").removesuffix(">") for v in expected.values())


def test_the_operator_finds_the_secrets_in_a_stack_output(synthesized):
    """GIVEN the stack's outputs WHEN an operator looks for a tenant's secret THEN WebhookSigningSecretArns holds the
    same tenant -> ARN map the dispatcher reads (what `async-inference webhook-secret --secret-arns` takes)."""
    output = synthesized.json["Outputs"]["WebhookSigningSecretArns"]["Value"]
    assert json.loads(_joined(output)) == json.loads(_joined(_dispatcher_env(synthesized)["WEBHOOK_SECRET_ARNS"]))
