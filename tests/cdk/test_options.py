"""AsyncInferenceService options: defaults, context conversion, and conflicts rejected with their names."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App

from app import props_from_context
from async_inference import settings
from cdk.queue_scaling import validate_scale_out_steps
from cdk.result_topics import TopicSubscription
from cdk.service import AsyncInferenceServiceProps
from tests.cdk.conftest import cdk_json_context

pytestmark = pytest.mark.cdk


def _props(worker_context, **options):
    return AsyncInferenceServiceProps(worker_image_context=worker_context, **options)


def test_defaults_are_valid(worker_context):
    """GIVEN no options WHEN validating THEN the defaults hold together (g5.xlarge, shared retention)."""
    props = _props(worker_context)
    props.validate()
    assert props.gpu_instance_type == "g5.xlarge"
    assert props.retention_days == settings.PAYLOAD_RETENTION_DAYS


def test_more_tasks_than_gpus_is_rejected_naming_the_options(worker_context):
    """GIVEN max_worker_tasks above the GPUs available WHEN validating THEN the error names all three options."""
    with pytest.raises(ValueError, match=r"max_worker_tasks \(3\).*max_gpu_instances \(1\).*gpus_per_instance \(2\)"):
        _props(worker_context, max_worker_tasks=3, max_gpu_instances=1, gpus_per_instance=2).validate()


@pytest.mark.parametrize(("instances", "tasks", "gpus"), [(2, 2, 1), (2, 3, 2), (3, 5, 2)])
def test_spare_deployment_instances_without_a_spare_gpu_are_rejected_naming_the_options(
    worker_context, instances, tasks, gpus
):
    """GIVEN start-before-stop deployments but no instance beyond those the most tasks fill WHEN validating THEN the
    error names deployment_spare_instances, max_worker_tasks, max_gpu_instances and gpus_per_instance."""
    with pytest.raises(
        ValueError,
        match=rf"deployment_spare_instances \(1\).*max_worker_tasks \({tasks}\).*max_gpu_instances \({instances}\)"
        rf".*gpus_per_instance \({gpus}\)",
    ):
        _props(
            worker_context,
            max_gpu_instances=instances,
            max_worker_tasks=tasks,
            gpus_per_instance=gpus,
            deployment_spare_instances=1,
        ).validate()


def test_spare_deployment_instance_beyond_the_tasks_is_accepted(worker_context):
    """GIVEN a third instance beyond two one-GPU tasks WHEN validating deployment_spare_instances=1 THEN it holds."""
    _props(worker_context, max_gpu_instances=3, max_worker_tasks=2, deployment_spare_instances=1).validate()


def test_graviton_gpu_type_without_an_ami_is_rejected_naming_both_options(worker_context):
    """GIVEN g5g.xlarge (arm64) and no AMI WHEN validating THEN the error names gpu_instance_type and
    gpu_ami_parameter_name (ECS publishes its GPU AMI for x86_64 only)."""
    with pytest.raises(ValueError, match=r"gpu_instance_type \(g5g.xlarge\) is arm64.*gpu_ami_parameter_name"):
        _props(worker_context, gpu_instance_type="g5g.xlarge").validate()


def test_an_s3_uri_with_the_hugging_face_source_is_rejected_naming_both(worker_context):
    """GIVEN model_s3_uri while model_source stays huggingface WHEN validating THEN the error names both options."""
    with pytest.raises(ValueError, match=r"model_s3_uri \(s3://w/m/\) conflicts with model_source \('huggingface'\)"):
        _props(worker_context, model_s3_uri="s3://w/m/").validate()


def test_a_token_with_the_s3_source_is_rejected_naming_both(worker_context):
    """GIVEN hf_token_secret_arn with model_source=s3 WHEN validating THEN the error names both options."""
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf"
    with pytest.raises(ValueError, match=r"hf_token_secret_arn conflicts with model_source \('s3'\)"):
        _props(worker_context, model_source="s3", hf_token_secret_arn=arn).validate()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model_source": "hub"}, r"model_source \('hub'\) must be one of huggingface, s3"),
        ({"model_source": "s3", "model_s3_uri": "s3://weights/qwen"}, r"model_s3_uri: .* prefix that ends with '/'"),
        ({"model_source": "s3", "model_s3_uri": "https://weights/qwen/"}, r"model_s3_uri: .*s3://<bucket>"),
        ({"hf_token_secret_arn": "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf"}, r"complete .* ARN"),
    ],
)
def test_malformed_model_options_are_rejected_naming_the_option(worker_context, options, message):
    """GIVEN an unknown source, a URI that is not s3://bucket/prefix/, or a partial secret ARN WHEN validating THEN
    the error names the option and the expected form."""
    with pytest.raises(ValueError, match=message):
        _props(worker_context, **options).validate()


def test_model_source_options_from_the_command_line(worker_context):
    """GIVEN -c model_source=s3 -c model_s3_uri=... WHEN reading context THEN both reach the props."""
    context = {
        **cdk_json_context(),
        "worker_image_context": str(worker_context),
        "model_source": "s3",
        "model_s3_uri": "s3://team-weights/llm/",
    }
    props = props_from_context(App(context=context))
    assert (props.model_source, props.model_s3_uri, props.hf_token_secret_arn) == ("s3", "s3://team-weights/llm/", None)


def test_retention_shorter_than_a_job_ttl_is_rejected(worker_context):
    """GIVEN payloads that would expire before a queued job does WHEN validating THEN the error says so."""
    with pytest.raises(ValueError, match=r"retention_days \(3\).*MAX_TTL_S"):
        _props(worker_context, retention_days=3).validate()


def test_raw_delivery_to_email_is_rejected_naming_both():
    """GIVEN an email subscription with raw delivery WHEN constructing it THEN the conflict is named."""
    with pytest.raises(ValueError, match="raw_message_delivery conflicts with protocol 'email'"):
        TopicSubscription(protocol="email", endpoint="ops@example.com", raw_message_delivery=True)


def test_unknown_status_in_a_filter_is_rejected():
    """GIVEN a filter on a status jobs never have WHEN constructing the subscription THEN it is rejected."""
    with pytest.raises(ValueError, match="done"):
        TopicSubscription(protocol="https", endpoint="https://x.example.com", statuses=["done"])


@pytest.mark.parametrize("steps", [[], [(5, 1)], [(1, 1), (1, 2)], [(1, 0)]])
def test_scale_out_steps_that_cannot_start_from_zero_are_rejected(steps):
    """GIVEN steps that are empty, start above 1, repeat a threshold or add nothing WHEN validating THEN rejected."""
    with pytest.raises(ValueError, match="scale_out_steps"):
        validate_scale_out_steps(steps)


def test_context_strings_from_the_command_line_are_converted(worker_context):
    """GIVEN -c style string values WHEN reading context THEN numbers and JSON options get their types."""
    context = {
        **cdk_json_context(),
        "worker_image_context": str(worker_context),
        "max_gpu_instances": "4",
        "max_worker_tasks": "4",
        "subscriptions": json.dumps([{"protocol": "https", "endpoint": "https://h.example.com"}]),
    }
    props = props_from_context(App(context=context))
    assert props.max_gpu_instances == 4
    assert props.subscriptions == (TopicSubscription(protocol="https", endpoint="https://h.example.com"),)


def test_invalid_context_value_names_the_option(worker_context):
    """GIVEN a non-numeric max_gpu_instances WHEN reading context THEN the error names the option."""
    context = {**cdk_json_context(), "worker_image_context": str(worker_context), "max_gpu_instances": "many"}
    with pytest.raises(ValueError, match="context option max_gpu_instances"):
        props_from_context(App(context=context))
