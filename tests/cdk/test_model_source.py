"""Where the workers get the model: Hugging Face (optionally with a token secret), or an S3 prefix."""

from __future__ import annotations

import pytest

from async_inference import config
from tests.cdk.helpers import denies_insecure_transport, policy_of, role_actions, role_statements

pytestmark = pytest.mark.cdk

MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # cdk.json's
TOKEN_ARN = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-token-AbCdEf"
EXISTING = "s3://team-weights/llm/qwen-1.5b/"


def _task_role_statements(variant, action):
    role = variant.logical_id(variant.stack.service.fleets[0].workers.task_definition.task_role)
    return [s for s in role_statements(variant.template, role) if s["Action"] == action]


def _task_role_resources(variant, action):
    role = variant.logical_id(variant.stack.service.fleets[0].workers.task_definition.task_role)
    return role_actions(variant.template, role).get(action, [])


def _execution_role_statements(variant, action):
    role = variant.logical_id(variant.stack.service.fleets[0].workers.task_definition.execution_role)
    return [
        s
        for s in role_statements(variant.template, role)
        if action in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    ]


def test_default_source_is_hugging_face_without_s3_or_token(synthesized):
    """GIVEN cdk.json's defaults WHEN reading the worker THEN MODEL is the Hub id, with no S3 source, no token secret
    and no model bucket."""
    environment = synthesized.worker_environment()
    assert environment["MODEL"] == MODEL
    assert config.ENV_MODEL_S3_URI not in environment and config.ENV_MODEL_DIR not in environment
    assert "Secrets" not in synthesized.container()
    assert synthesized.stack.service.fleets[0].models is None


def test_hugging_face_token_secret_reaches_the_worker_as_a_container_secret(synth_variant):
    """GIVEN hf_token_secret_arn WHEN synthesized THEN the container gets HF_TOKEN from that secret (not in its
    environment) and only the execution role may read it."""
    variant = synth_variant(hf_token_secret_arn=TOKEN_ARN)
    assert variant.container()["Secrets"] == [{"Name": "HF_TOKEN", "ValueFrom": TOKEN_ARN}]
    assert "HF_TOKEN" not in variant.worker_environment()
    [statement] = _execution_role_statements(variant, "secretsmanager:GetSecretValue")
    assert statement["Resource"] == TOKEN_ARN
    assert not _task_role_statements(variant, "secretsmanager:GetSecretValue")


def test_s3_source_without_a_uri_creates_a_private_encrypted_tls_only_bucket(synth_variant):
    """GIVEN model_source=s3 and no model_s3_uri WHEN synthesized THEN the stack creates the model bucket: public
    access blocked, encrypted, TLS only, access-logged, its name a stack output."""
    variant = synth_variant(model_source="s3")
    bucket = variant.logical_id(variant.stack.service.fleets[0].models.bucket)
    properties = variant.json["Resources"][bucket]["Properties"]
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert properties["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert properties["LoggingConfiguration"]["LogFilePrefix"] == "models/"
    assert denies_insecure_transport(policy_of(variant.template, "AWS::S3::BucketPolicy", bucket))
    variant.template.has_output("ModelBucketName", {"Value": {"Ref": bucket}})


def test_s3_source_tells_the_worker_where_to_sync_from_and_to(synth_variant):
    """GIVEN the created model bucket WHEN reading the worker THEN MODEL_S3_URI is s3://<bucket>/<model>/ and
    MODEL_DIR lies under the /models host volume."""
    variant = synth_variant(model_source="s3")
    bucket = variant.logical_id(variant.stack.service.fleets[0].models.bucket)
    environment = variant.worker_environment()
    assert environment[config.ENV_MODEL_S3_URI] == {"Fn::Join": ["", ["s3://", {"Ref": bucket}, f"/{MODEL}/"]]}
    assert environment[config.ENV_MODEL_DIR] == {"Fn::Join": ["", ["/models/s3/", {"Ref": bucket}, f"/{MODEL}"]]}
    [mount] = variant.container()["MountPoints"]
    assert mount["ContainerPath"] == "/models"


def test_s3_source_lets_the_task_role_read_exactly_the_model_prefix(synth_variant):
    """GIVEN the created model bucket WHEN reading the task role THEN it may get objects and list keys under the
    model's prefix only."""
    variant = synth_variant(model_source="s3")
    bucket = variant.logical_id(variant.stack.service.fleets[0].models.bucket)
    gets = [r for r in _task_role_resources(variant, "s3:GetObject") if bucket in str(r)]
    assert gets == [{"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, f"/{MODEL}/*"]]}]
    lists = [s for s in _task_role_statements(variant, "s3:ListBucket") if bucket in str(s["Resource"])]
    assert [(listing["Resource"], listing["Condition"]) for listing in lists] == [
        ({"Fn::GetAtt": [bucket, "Arn"]}, {"StringLike": {"s3:prefix": [f"{MODEL}/*"]}})
    ]


def test_an_existing_prefix_is_read_in_place_and_no_bucket_is_created(synth_variant):
    """GIVEN model_s3_uri of an existing bucket WHEN synthesized THEN the worker syncs from it into its own
    directory, the task role reads that prefix only, and the stack creates no model bucket."""
    variant = synth_variant(model_source="s3", model_s3_uri=EXISTING)
    environment = variant.worker_environment()
    assert environment[config.ENV_MODEL_S3_URI] == EXISTING
    assert environment[config.ENV_MODEL_DIR] == "/models/s3/team-weights/llm/qwen-1.5b"
    gets = [r for r in _task_role_resources(variant, "s3:GetObject") if "team-weights" in str(r)]
    assert gets == [{"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::team-weights/llm/qwen-1.5b/*"]]}]
    [listing] = [s for s in _task_role_statements(variant, "s3:ListBucket") if "team-weights" in str(s)]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["llm/qwen-1.5b/*"]}}
    assert not variant.stack.service.fleets[0].models.created
    assert "ModelBucketName" not in variant.json.get("Outputs", {})
    variant.template.has_output("ModelS3Uri", {"Value": EXISTING})


@pytest.mark.parametrize("uri", [None, EXISTING])
def test_s3_sources_pass_cdk_nag_in_a_stack_with_account_and_region(synth_variant, uri):
    """GIVEN either S3 source in the environment `cdk deploy` sets WHEN synthesizing with cdk-nag THEN the model
    prefix's acknowledgement matches its finding (literal partition and account)."""
    options = {"model_source": "s3", **({"model_s3_uri": uri} if uri else {})}
    variant = synth_variant(region="eu-west-1", **options)  # raises on an unacknowledged finding
    assert variant.stack.service.fleets[0].models.created is (uri is None)
