"""AsyncInferenceService options: defaults, context conversion, and conflicts rejected with their names."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App

from app import props_from_context
from async_inference import settings
from cdk import capacity
from cdk.options import AsyncInferenceServiceProps
from cdk.queue_scaling import CountedQueue, validate
from cdk.result_topics import TopicSubscription
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


def test_default_batch_is_the_sizing_rule_for_the_default_model_and_gpu(worker_context):
    """GIVEN no max_num_seqs WHEN sizing THEN the batch is cdk.capacity's rule at the planned 4,259 tokens (135 for
    Qwen2.5-1.5B on an A10G), and jobs_per_task follows it at one batch."""
    props = _props(worker_context)
    expected = capacity.max_num_seqs(capacity.QWEN2_5_1_5B, capacity.A10G, sequence_tokens=4259)
    assert props.effective_max_num_seqs() == expected == 135
    assert props.effective_jobs_per_task() == expected
    assert _props(worker_context, planned_sequence_tokens=32768).effective_max_num_seqs() == 17


def test_a_given_max_num_seqs_wins_and_sets_jobs_per_task(worker_context):
    props = _props(worker_context, max_num_seqs=16)
    assert (props.effective_max_num_seqs(), props.effective_jobs_per_task()) == (16, 16)
    assert _props(worker_context, max_num_seqs=16, jobs_per_task=40).effective_jobs_per_task() == 40


def test_planned_tokens_with_a_given_batch_are_rejected_naming_both(worker_context):
    with pytest.raises(ValueError, match=r"planned_sequence_tokens \(2000\) conflicts with max_num_seqs \(16\)"):
        _props(worker_context, max_num_seqs=16, planned_sequence_tokens=2000).validate()


def test_a_model_the_rule_cannot_size_asks_for_max_num_seqs(worker_context):
    """GIVEN a model cdk.capacity has no shape for and no max_num_seqs WHEN validating THEN the error says to set it."""
    with pytest.raises(
        ValueError, match=r"max_num_seqs is not set and cannot be sized: .*meta-llama.*set max_num_seqs"
    ):
        _props(worker_context, model="meta-llama/Llama-3.1-8B-Instruct").validate()
    _props(worker_context, model="meta-llama/Llama-3.1-8B-Instruct", max_num_seqs=32).validate()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale_in_fill": 1.5}, r"scale_in_fill \(1.5\) must lie in \(0, 1\]"),
        ({"scale_in_fill": 0}, r"scale_in_fill \(0\)"),
        ({"jobs_per_task": 0.5}, r"jobs_per_task must be at least 1"),
        ({"scale_in_minutes": 0}, r"scale_in_minutes must be at least 1"),
        ({"idle_minutes_before_scale_in": 0}, r"idle_minutes_before_scale_in must be at least 1"),
        ({"wake_check_interval_seconds": 0}, r"wake_check_interval_seconds must be at least 1"),
        ({"scale_in_cooldown_seconds": -1}, r"scale_in_cooldown_seconds must be 0 or more"),
        ({"worker_task_protection": "always"}, r"worker_task_protection \('always'\) must be one of long_jobs, busy"),
        ({"worker_task_protection_tokens_per_s": 0}, r"worker_task_protection_tokens_per_s \(0\) must be positive"),
    ],
)
def test_scaling_options_that_could_not_scale_are_rejected_naming_the_option(worker_context, options, message):
    with pytest.raises(ValueError, match=message):
        _props(worker_context, **options).validate()


def test_more_queues_than_one_alarm_can_read_are_rejected():
    """GIVEN four counted queues (12 metrics and the learned keep-alive's in the keep-alive alarm) WHEN validating
    THEN CloudWatch's 10 is named."""
    queues = [CountedQueue(queue=None) for _ in range(4)]  # type: ignore[arg-type]  # validation reads no queue
    with pytest.raises(ValueError, match=r"queues \(4\) need 13 metrics .* CloudWatch allows 10"):
        validate(queues, jobs_per_task=24, max_tasks=2, scale_in_fill=0.5, scale_in_minutes=3, keep_alive_minutes=3)
    with pytest.raises(ValueError, match="weights"):
        validate(
            [CountedQueue(queue=None, weight=0)],
            jobs_per_task=24,
            max_tasks=2,  # type: ignore[arg-type]
            scale_in_fill=0.5,
            scale_in_minutes=3,
            keep_alive_minutes=3,
        )


def test_the_retired_scale_out_steps_option_is_refused_naming_its_replacement(worker_context):
    """GIVEN a cdk.json that still sets scale_out_steps WHEN reading context THEN it is refused, not ignored."""
    context = {**cdk_json_context(), "worker_image_context": str(worker_context), "scale_out_steps": [[1, 1]]}
    with pytest.raises(ValueError, match="scale_out_steps was removed: .*jobs_per_task"):
        props_from_context(App(context=context))


def test_the_renamed_event_rules_option_is_refused_naming_inbox_rules(worker_context):
    """GIVEN a cdk.json that still sets event_rules WHEN reading context THEN it is refused naming inbox_rules: ignored,
    the stack would drop the rules' notifications and function on the next deploy."""
    rules = [{"prefix": "docs/", "tenant": "demo"}]
    context = {**cdk_json_context(), "worker_image_context": str(worker_context), "event_rules": rules}
    with pytest.raises(ValueError, match="event_rules was removed: .*inbox_rules"):
        props_from_context(App(context=context))


def test_context_strings_from_the_command_line_are_converted(worker_context):
    """GIVEN -c style string values WHEN reading context THEN numbers and JSON options get their types."""
    context = {
        **cdk_json_context(),
        "worker_image_context": str(worker_context),
        "max_gpu_instances": "4",
        "max_worker_tasks": "4",
        "subscriptions": json.dumps([{"protocol": "https", "endpoint": "https://h.example.com"}]),
        "max_num_seqs": "64",
        "scale_in_fill": "0.75",
        "wake_from_zero": "false",
    }
    props = props_from_context(App(context=context))
    assert props.max_gpu_instances == 4
    assert (props.max_num_seqs, props.scale_in_fill, props.wake_from_zero) == (64, 0.75, False)
    assert props.subscriptions == (TopicSubscription(protocol="https", endpoint="https://h.example.com"),)


def test_invalid_context_value_names_the_option(worker_context):
    """GIVEN a non-numeric max_gpu_instances WHEN reading context THEN the error names the option."""
    context = {**cdk_json_context(), "worker_image_context": str(worker_context), "max_gpu_instances": "many"}
    with pytest.raises(ValueError, match="context option max_gpu_instances"):
        props_from_context(App(context=context))
