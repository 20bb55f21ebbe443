"""DeploymentCatalog: the tenants' and models' settings as one SSM parameter each, which the functions read at start.

Lambda allows 4 KB of environment per function; the tenants' key ids, quotas and signing-secret ARNs and the models'
routes, once set in the environments, reached it at about 20 tenants with one model. Here each function gets two
variables of a constant size whatever the number of tenants and models: ``CATALOG_PATH`` and ``CATALOG_DIGEST``
(``async_inference.catalog``), and reads the catalog with one ``GetParametersByPath`` a page of ten parameters.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from async_inference import catalog
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class DeploymentCatalog(Construct):
    """One String parameter per tenant and per model under ``/<stack name>/catalog/`` (``path``), and the functions
    bound to it (``bind``): each gets the path and, once every entry is added (``seal``), the digest, and may read the
    parts it is bound to, nothing else.

    ``entries``: part -> name -> what its parameter holds (for tests and the digest)."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self.path = f"/{Stack.of(self).stack_name}/catalog/"
        self.entries: dict[str, dict[str, Mapping[str, Any]]] = {catalog.TENANTS: {}, catalog.MODELS: {}}
        self.parameters: dict[str, dict[str, ssm.StringParameter]] = {catalog.TENANTS: {}, catalog.MODELS: {}}
        self._bound: list[lambda_.Function] = []

    def add(
        self,
        part: catalog.Part,
        name: str,
        entry: Mapping[str, Any],
        *,
        scope: Construct | None = None,
        folder: str | None = None,
    ) -> ssm.StringParameter:
        """The parameter holding ``entry`` for the tenant or model ``name``: named after ``name`` made safe plus a
        short hash of it, since a model name may hold characters (``:``, ``@``) a parameter name may not.

        :param scope: where the parameter is made (a nested stack's construct). Default: this construct.
        :param folder: a path segment between the part's path and the name (the readers read the part's path
            recursively). Default: none."""
        if name in self.entries[part]:
            raise ValueError(f"{part} {name!r} is in the catalog twice")
        safe = f"{_UNSAFE.sub('-', name)[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        within = f"{folder}/{safe}" if folder else safe
        parameter = ssm.StringParameter(
            scope or self,
            f"{part}-{safe}",
            parameter_name=f"{catalog.part_path(self.path, part)}/{within}",
            string_value=Stack.of(scope or self).to_json_string({"name": name, **entry}),
            description=f"{part[:-1]} {name}: read at start by the functions of this stack (async_inference.catalog)",
            tier=ssm.ParameterTier.STANDARD,
        )
        self.entries[part][name] = entry
        self.parameters[part][name] = parameter
        return parameter

    def bind(self, function: lambda_.Function, parts: Sequence[catalog.Part]) -> None:
        """``function`` reads ``parts`` of the catalog: its path and digest in the environment, and
        ssm:GetParametersByPath on those parts' paths only."""
        function.add_environment(catalog.ENV_CATALOG_PATH, self.path)
        self._bound.append(function)
        stack = Stack.of(self)
        arns = []
        for part in parts:
            name = catalog.part_path(self.path, part).lstrip("/")
            arns += [
                stack.format_arn(service="ssm", resource="parameter", resource_name=name),
                stack.format_arn(service="ssm", resource="parameter", resource_name=f"{name}/*"),
            ]
        iam.Grant.add_to_principal(grantee=function, actions=["ssm:GetParametersByPath"], resource_arns=arns)
        prefix = f"{rendered_arn_prefix(stack, 'ssm')}:{rendered_account(stack)}:parameter"
        reason = (
            "GetParametersByPath reads every parameter under this stack's catalog path, one per tenant or model, "
            "each written by the stack: the path is the scope"
        )
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{prefix}/{catalog.part_path(self.path, part).lstrip('/')}/*]": reason
                for part in parts
            },
        )

    def seal(self) -> None:
        """Every bound function gets ``CATALOG_DIGEST``: a hash of every entry as the template holds it, so a deploy
        that changes one changes the functions too, and Lambda starts environments that read the new catalog."""
        resolved = Stack.of(self).resolve(self.entries)
        digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:32]
        for function in self._bound:
            function.add_environment(catalog.ENV_CATALOG_DIGEST, digest)
