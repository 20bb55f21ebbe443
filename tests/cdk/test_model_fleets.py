"""Several models, each its own fleet (issue 20): the template of a two-model ``models`` context."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App

from app import props_from_context
from async_inference import config, settings
from cdk.queue_scaling import JOBS_PER_TASK_IN_BATCHES
from tests.cdk.helpers import dashboard_widgets, role_actions

CHAT = "Qwen/Qwen2.5-1.5B-Instruct"
EMBEDDING = "sentence-transformers/all-MiniLM-L6-v2"
MODELS = [
    {"name": CHAT},
    {
        "name": EMBEDDING,
        "kind": "embedding",
        "instance_type": "g6.xlarge",
        "max_num_seqs": 64,
        "max_worker_tasks": 1,
        "max_gpu_instances": 1,
    },
]
API = "lambdas.api.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"
CONTROLLER = "lambdas.batch_controller.handler.lambda_handler"
DLQ = "lambdas.dlq.handler.lambda_handler"


@pytest.fixture(scope="module")
def two(synth_variant):
    return synth_variant(models=json.dumps(MODELS))


def _function(synthesized, handler):
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    return function


def _container_environment(synthesized, workers):
    definition = synthesized.json["Resources"][synthesized.logical_id(workers.task_definition)]
    [container] = definition["Properties"]["ContainerDefinitions"]
    return {e["Name"]: e["Value"] for e in container["Environment"]}


def _ref(synthesized, construct):
    return {"Ref": synthesized.logical_id(construct)}


def test_each_model_gets_its_worker_service_task_definition_and_gpu_group(two):
    """GIVEN a chat and an embedding model WHEN synthesized THEN there are two task definitions, two services with
    distinct names in one cluster, and two GPU groups of each model's instance type and limits."""
    service = two.stack.service
    first, fleet = service.fleets
    assert len(two.resources("AWS::ECS::TaskDefinition")) == 2
    assert len(two.resources("AWS::ECS::Cluster")) == 1 and len(two.resources("AWS::EC2::VPC")) == 1
    names = {s["Properties"]["ServiceName"] for s in two.resources("AWS::ECS::Service").values()}
    assert names == {"gpu-workers", "gpu-workers-all-minilm-l6-v2"}
    cluster = _ref(two, first.workers.cluster)
    assert all(s["Properties"]["Cluster"] == cluster for s in two.resources("AWS::ECS::Service").values())
    groups = {lid: g["Properties"]["MaxSize"] for lid, g in two.resources("AWS::AutoScaling::AutoScalingGroup").items()}
    assert groups == {
        two.logical_id(first.workers.auto_scaling_group): "2",
        two.logical_id(fleet.workers.auto_scaling_group): "1",
    }
    templates = two.resources("AWS::EC2::LaunchTemplate").values()
    types = {t["Properties"]["LaunchTemplateData"]["InstanceType"] for t in templates}
    assert types == {"g5.xlarge", "g6.xlarge"}


def test_each_worker_runs_its_model_on_its_own_queues(two):
    """GIVEN the two task definitions WHEN reading their environments THEN each names its model, kind and batch size
    and reads its own job queue, DLQ and batch lane (the first model the one-model stack's)."""
    service = two.stack.service
    chat, embedding = service.fleets
    first = _container_environment(two, chat.workers)
    second = _container_environment(two, embedding.workers)
    assert (first["MODEL"], first[config.ENV_MODEL_KIND], first["MAX_NUM_SEQS"]) == (CHAT, "chat", "135")
    assert (second["MODEL"], second[config.ENV_MODEL_KIND], second["MAX_NUM_SEQS"]) == (EMBEDDING, "embedding", "64")
    assert json.loads(first[config.ENV_SERVED_MODELS]) == [CHAT]
    assert json.loads(second[config.ENV_SERVED_MODELS]) == [EMBEDDING]
    assert first[config.ENV_QUEUE_URL] == _ref(two, chat.jobs.queue)
    assert first[config.ENV_BATCH_QUEUE_URL] == _ref(two, chat.lane_queue)
    assert second[config.ENV_QUEUE_URL] == _ref(two, embedding.jobs.queue)
    assert second[config.ENV_DLQ_URL] == _ref(two, embedding.jobs.dead_letter_queue)
    assert second[config.ENV_BATCH_QUEUE_URL] == _ref(two, embedding.lane_queue)
    # The control queue and the batch table are shared: a batch is finalized by the one controller.
    assert second[config.ENV_BATCH_CONTROL_QUEUE_URL] == first[config.ENV_BATCH_CONTROL_QUEUE_URL]


def test_each_model_queue_dead_letters_into_its_own_dlq_which_the_dlq_handler_consumes(two):
    """GIVEN the further model's job queue and lane WHEN reading their redrive policies and the event sources THEN each
    moves to its own DLQ after MAX_RECEIVE_COUNT receives, and the DLQ handler consumes both DLQs."""
    _, fleet = two.stack.service.fleets
    resources = two.json["Resources"]
    pairs = ((fleet.jobs.queue, fleet.jobs.dead_letter_queue), (fleet.lane_queue, fleet.lane_dead_letter_queue))
    for queue, dlq in pairs:
        policy = resources[two.logical_id(queue)]["Properties"]["RedrivePolicy"]
        assert policy == {
            "deadLetterTargetArn": {"Fn::GetAtt": [two.logical_id(dlq), "Arn"]},
            "maxReceiveCount": settings.MAX_RECEIVE_COUNT,
        }
    functions = two.resources("AWS::Lambda::Function").items()
    dlq_function = next(lid for lid, f in functions if f["Properties"]["Handler"] == DLQ)
    consumed = {
        m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
        for m in two.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": dlq_function}
    }
    assert {two.logical_id(fleet.jobs.dead_letter_queue), two.logical_id(fleet.lane_dead_letter_queue)} <= consumed


def test_each_model_scales_on_its_own_queues_between_zero_and_its_limit(two):
    """GIVEN the two scalable targets WHEN reading them and the further model's scale-out alarm THEN each targets its
    own service with its own maximum, and the alarm reads the further model's queues only."""
    service = two.stack.service
    first, fleet = service.fleets
    targets = sorted(
        (t["Properties"]["MaxCapacity"], json.dumps(t["Properties"]["ResourceId"]))
        for t in two.resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    )
    assert [maximum for maximum, _ in targets] == [1, 2]
    assert two.logical_id(fleet.workers.service) in targets[0][1]
    assert two.logical_id(first.workers.service) in targets[1][1]
    alarm = two.json["Resources"][two.logical_id(fleet.scaling.scale_out_alarm)]["Properties"]
    queues = {
        m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
        for m in alarm["Metrics"]
        if "MetricStat" in m and m["MetricStat"]["Metric"]["Namespace"] == "AWS/SQS"
    }
    assert queues == {two.logical_id(fleet.jobs.queue), two.logical_id(fleet.lane_queue)}
    # JOBS_PER_TASK_IN_BATCHES x its own batch of 64 (not the first model's): its own jobs_per_task.
    per_task = round(JOBS_PER_TASK_IN_BATCHES * 64)
    assert f"/ {per_task})" in [m["Expression"] for m in alarm["Metrics"] if m.get("ReturnData")][0]


@pytest.mark.parametrize("handler", [API, UPLOAD, CONTROLLER])
def test_the_functions_that_queue_work_route_each_model_to_its_fleet(two, handler):
    """GIVEN the API, upload and controller functions WHEN reading MODEL_FLEETS THEN each model's route names its
    kind, job queue, batch lane and service to wake; SERVED_MODELS lists both models (GET /v1/models)."""
    service = two.stack.service
    first, fleet = service.fleets
    env = two.variables(handler)
    assert json.loads(env[config.ENV_SERVED_MODELS]) == [CHAT, EMBEDDING]
    rendered = json.dumps(env[config.ENV_MODEL_FLEETS])
    parts = env[config.ENV_MODEL_FLEETS]["Fn::Join"][1]
    first_at, second_at = rendered.index(json.dumps(CHAT)[1:-1]), rendered.index(json.dumps(EMBEDDING)[1:-1])
    assert first_at < rendered.index(two.logical_id(first.jobs.queue)) < second_at
    assert second_at < rendered.index(two.logical_id(fleet.jobs.queue))
    assert second_at < rendered.index(two.logical_id(fleet.lane_queue))
    assert '\\"kind\\":\\"embedding\\"' in rendered and "gpu-workers-all-minilm-l6-v2" in rendered
    assert parts[0].startswith("{")


@pytest.mark.parametrize("handler", [API, UPLOAD, CONTROLLER])
def test_a_wake_of_the_further_fleet_starts_an_instance_in_its_own_gpu_group(two, handler):
    """GIVEN a function that queues work WHEN reading its route for the further model and its role THEN the route
    names the further fleet's GPU group, and the function may set that group's desired capacity, as it may the first's
    (whose group is in the first model's route)."""
    service = two.stack.service
    first, fleet = service.fleets
    function = _function(two, handler)
    rendered = json.dumps(two.variables(handler)[config.ENV_MODEL_FLEETS])
    further_group = two.logical_id(fleet.capacity.auto_scaling_group)
    assert (
        rendered.index(json.dumps(EMBEDDING)[1:-1]) < rendered.rindex("worker_group") < rendered.rindex(further_group)
    )
    actions = role_actions(two.template, function["Properties"]["Role"]["Fn::GetAtt"][0])
    groups = json.dumps(actions["autoscaling:SetDesiredCapacity"])
    assert further_group in groups
    assert two.logical_id(first.capacity.auto_scaling_group) in groups


def test_each_models_queue_has_its_own_oldest_job_alarm_and_dashboard_row(two):
    """GIVEN a chat and an embedding model WHEN synthesized THEN each model's job queue has an age alarm (a further
    model's jobs stuck behind a fleet that cannot start alarm too), and the dashboard has each fleet's queue depth,
    oldest job and running tasks, each fleet's row titled with its model, the first's as the others'."""
    service = two.stack.service
    first, fleet = service.fleets
    for queue in (first.jobs.queue, fleet.jobs.queue):
        two.template.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {
                "MetricName": "ApproximateAgeOfOldestMessage",
                "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": [two.logical_id(queue), "QueueName"]}}],
                "Threshold": 900,
            },
        )
    assert set(service.monitoring.alarms) >= {"OldestJob", f"OldestJob{fleet.spec.construct_id}"}
    titles = [w["properties"].get("title") for w in dashboard_widgets(two.template)]
    for title in ("Queue depth and in-flight jobs", "Age of oldest job (s)", "Running worker tasks"):
        assert f"{first.spec.name}: {title}" in titles and f"{EMBEDDING}: {title}" in titles


def test_the_further_workers_may_take_from_their_own_queues_only(two):
    """GIVEN the further model's task role WHEN reading its SQS receives THEN it receives from its own job queue and
    lane, not from the first model's; the API may send to both models' queues."""
    service = two.stack.service
    first, fleet = service.fleets
    actions = role_actions(two.template, two.logical_id(fleet.workers.task_definition.task_role))
    received = {r["Fn::GetAtt"][0] for r in actions["sqs:ReceiveMessage"]}
    assert received == {two.logical_id(fleet.jobs.queue), two.logical_id(fleet.lane_queue)}
    api_role = _function(two, API)["Properties"]["Role"]["Fn::GetAtt"][0]
    sent = {r["Fn::GetAtt"][0] for r in role_actions(two.template, api_role)["sqs:SendMessage"]}
    assert {two.logical_id(q) for q in (first.jobs.queue, fleet.jobs.queue, fleet.lane_queue)} <= sent


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "other/model", "max_num_seqs": 8}, {"name": CHAT}], "the first model is the one `model` names"),
        ([{"name": CHAT}, {"name": CHAT}], "names a model twice"),
        ([{"name": CHAT}, {"name": "x/e", "kind": "rerank", "max_num_seqs": 8}], "kind 'rerank'"),
        ([{"name": CHAT}, {"name": "x/unknown"}], "max_num_seqs is not set"),
        ([{"name": CHAT}, {"name": "x/e", "colour": "red"}], "colour"),
        ([{"name": CHAT}, *({"name": f"x/m{n}", "max_num_seqs": 8} for n in range(4))], "set fleet_stacks"),
        ([{"name": CHAT}, *({"name": f"x/m{n}", "max_num_seqs": 8} for n in range(8))], "at most 8 fit"),
    ],
)
def test_models_that_cannot_be_deployed_are_refused_naming_the_problem(models, message):
    """GIVEN a models context that cannot hold WHEN the app reads it THEN a ValueError names what to fix."""
    app = App(context={"models": json.dumps(models)})
    with pytest.raises(ValueError, match="models") as raised:
        props_from_context(app)
    assert message in str(raised.value)
