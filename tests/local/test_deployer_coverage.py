"""What the local runtime does with every resource of the synthesized template is said, not skipped silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from local_runtime.resource_types import RESOURCE_TYPES, Skipped, deployable
from local_runtime.template import Assembly, TemplateError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def assembly(local_assembly: Path) -> Assembly:
    return Assembly.load(local_assembly)


def test_every_resource_type_and_property_of_the_template_is_deployed_emulated_or_listed(assembly: Assembly):
    # GIVEN the synthesized template WHEN checking it against the deployer's tables THEN nothing is left unsaid
    deployable(assembly)  # raises, naming every type or property in none of the tables


def test_a_template_with_a_type_in_no_table_is_refused_by_name(assembly: Assembly, tmp_path: Path):
    # GIVEN the template with a resource of a type the deployer has never heard of
    template = json.loads(json.dumps(assembly.template))
    template["Resources"]["NewThing"] = {"Type": "AWS::Pipes::Pipe", "Properties": {}}
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "artifacts": {
                    "S": {"type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}
                }
            }
        )
    )
    (tmp_path / "S.template.json").write_text(json.dumps(template))
    # WHEN the local runtime is asked to deploy it THEN it refuses, naming the resource and its type
    with pytest.raises(TemplateError, match=r"NewThing: resource type AWS::Pipes::Pipe is neither deployed"):
        deployable(Assembly.load(tmp_path))


def test_a_property_the_deployer_does_not_apply_is_refused_by_name(assembly: Assembly, tmp_path: Path):
    template = json.loads(json.dumps(assembly.template))
    queue = next(lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::SQS::Queue")
    template["Resources"][queue]["Properties"]["SomeNewSetting"] = 1
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "artifacts": {
                    "S": {"type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}
                }
            }
        )
    )
    (tmp_path / "S.template.json").write_text(json.dumps(template))
    with pytest.raises(TemplateError, match=rf"{queue}: property AWS::SQS::Queue.SomeNewSetting"):
        deployable(Assembly.load(tmp_path))


@pytest.mark.parametrize("resource_type", sorted(t for t, (kind, _) in RESOURCE_TYPES.items() if kind == "skip"))
def test_each_skipped_type_names_a_reason_and_a_test_that_exists(resource_type: str):
    skipped = RESOURCE_TYPES[resource_type][1]
    assert isinstance(skipped, Skipped) and len(skipped.reason) > 10
    path = ROOT / skipped.checked_by.split("::")[0]
    assert path.is_file(), f"{resource_type}: {skipped.checked_by} does not exist"
    assert re.search(r"^def test_", path.read_text(), re.M), f"{path} holds no test"
