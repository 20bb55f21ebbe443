"""Several models, each its own fleet (async_inference.fleets): a job goes to its model's queue and wakes its model's
service, against moto over HTTP, with the settings built from the variables the stack sets (MODEL_FLEETS)."""

from __future__ import annotations

import json

import pytest

from async_inference.aws import client
from async_inference.config import ENV_MODEL_FLEETS, ENV_SERVED_MODELS, ServiceConfig, ServiceSettings, WakeSettings
from async_inference.fleets import ANY_MODEL
from async_inference.jobs_service import ErrorKind, JobService, ServiceError
from async_inference.schemas import ChatCompletionRequest, JobSubmission
from local_runtime.moto_server import MotoServer

CHAT, SECOND, EMBEDDING = "org/chat-model", "org/second-chat-model", "org/embedding-model"
UNROUTED = "org/served-without-a-route"


def _service(ecs, cluster: str, name: str) -> str:
    definition = ecs.register_task_definition(
        family=name, containerDefinitions=[{"name": "worker", "image": "worker:latest", "memoryReservation": 512}]
    )["taskDefinition"]["taskDefinitionArn"]
    return ecs.create_service(cluster=cluster, serviceName=name, taskDefinition=definition, desiredCount=0)["service"][
        "serviceArn"
    ]


def _desired(cluster: str, arn: str) -> int:
    return client("ecs").describe_services(cluster=cluster, services=[arn])["services"][0]["desiredCount"]


def _depth(url: str) -> int:
    attributes = client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


@pytest.fixture(scope="module")
def stack(moto: MotoServer) -> dict:
    """Two fleets' queues and services, the table and bucket, and the settings an API function reads."""
    sqs, ecs = client("sqs"), client("ecs")
    names = ("chat", "chat-lane", "second", "second-lane", "emb", "emb-lane")
    queues = {name: sqs.create_queue(QueueName=name)["QueueUrl"] for name in names}
    ecs.create_cluster(clusterName="routing")
    services = {name: _service(ecs, "routing", f"gpu-workers-{name}") for name in ("chat", "second", "emb")}
    client("s3").create_bucket(Bucket="routing-claims")
    client("dynamodb").create_table(
        TableName="routing-jobs",
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
    )
    routes = {
        CHAT: {"kind": "chat", "queue_url": queues["chat"], "batch_queue_url": queues["chat-lane"],
               "worker_service": services["chat"]},
        SECOND: {"kind": "chat", "queue_url": queues["second"], "batch_queue_url": queues["second-lane"],
                 "worker_service": services["second"]},
        EMBEDDING: {"kind": "embedding", "queue_url": queues["emb"], "batch_queue_url": queues["emb-lane"],
                    "worker_service": services["emb"]},
    }  # fmt: skip
    env = {
        **ServiceConfig(
            table_name="routing-jobs",
            bucket_name="routing-claims",
            topic_arn=client("sns").create_topic(Name="routing-results")["TopicArn"],
            queue_url=None,
            wake=WakeSettings("routing", 60),
        ).to_env(),
        ENV_MODEL_FLEETS: json.dumps(routes),
        ENV_SERVED_MODELS: json.dumps([CHAT, SECOND, EMBEDDING, UNROUTED]),
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        config = ServiceSettings.load()
    return {"config": config, "queues": queues, "services": services}


def _submission(model: str, priority: str = "interactive") -> JobSubmission:
    request = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": "hi"}])
    return JobSubmission(request=request, priority=priority)


def test_a_job_goes_to_its_models_queue_and_wakes_its_models_service_only(stack):
    # GIVEN the API's service over two fleets, both at zero tasks
    config = stack["config"]
    service = JobService.from_config(config.service, served_models=config.served_models)
    queues, services = stack["queues"], stack["services"]
    # WHEN a job for the second model is submitted
    service.api.submit("tenant-a", _submission(SECOND), None)
    # THEN its claim check is on the second model's queue, and only the second model's service is woken
    assert [_depth(queues[name]) for name in ("chat", "second")] == [0, 1]
    assert [_desired("routing", services[name]) for name in ("chat", "second", "emb")] == [0, 1, 0]
    # WHEN a job for the first model and a batch-priority job for the second are submitted
    service.api.submit("tenant-a", _submission(CHAT), None)
    service.api.submit("tenant-a", _submission(SECOND, priority="batch"), None)
    # THEN each is on its own model's queue (the batch-priority one on the second model's lane)
    assert [_depth(queues[name]) for name in ("chat", "chat-lane", "second", "second-lane")] == [1, 0, 1, 1]
    assert [_desired("routing", services[name]) for name in ("chat", "second", "emb")] == [1, 1, 0]


def test_a_chat_job_for_an_embedding_model_is_a_400_naming_its_endpoint(stack):
    # GIVEN the API's service over a chat and an embedding fleet
    config = stack["config"]
    service = JobService.from_config(config.service, served_models=config.served_models)
    # WHEN a chat job names the embedding model
    with pytest.raises(ServiceError) as raised:
        service.api.submit("tenant-a", _submission(EMBEDDING), None)
    # THEN it is a 400 on request.model that says where embedding requests go, and nothing is queued
    assert (raised.value.kind, raised.value.code) == (ErrorKind.INVALID, "model_kind_mismatch")
    assert "/v1/embeddings" in raised.value.message and raised.value.details[0]["field"] == "request.model"
    assert _depth(stack["queues"]["emb"]) == 0


def test_a_model_not_served_is_a_404_naming_it_and_queues_nothing(stack):
    # GIVEN the API's service over two fleets
    config = stack["config"]
    service = JobService.from_config(config.service, served_models=config.served_models)
    before = {name: _depth(url) for name, url in stack["queues"].items()}
    # WHEN a job names a model the stack does not serve
    with pytest.raises(ServiceError) as raised:
        service.api.submit("tenant-a", _submission("org/unknown"), None)
    # THEN it is a 404 model_not_found naming the model and the served ones, on request.model
    assert (raised.value.kind, raised.value.code) == (ErrorKind.NOT_FOUND, "model_not_found")
    assert "`org/unknown`" in raised.value.message and CHAT in raised.value.message and SECOND in raised.value.message
    assert raised.value.details[0]["field"] == "request.model"
    assert {name: _depth(url) for name, url in stack["queues"].items()} == before


def test_models_lists_every_model_of_every_fleet(stack):
    # GIVEN the settings the stack sets WHEN reading what GET /v1/models lists THEN both models, in order
    assert stack["config"].served_models == [CHAT, SECOND, EMBEDDING, UNROUTED]
    assert list(stack["config"].model_fleets) == [CHAT, SECOND, EMBEDDING]


def test_an_uploaded_job_goes_to_the_queue_of_the_model_its_upload_names(stack):
    # GIVEN an upload job (its model unknown until its body lands) of the API's service over the fleets
    config = stack["config"]
    service = JobService.from_config(config.service, served_models=config.served_models)
    queues = stack["queues"]
    before = _depth(queues["second"])
    body = _submission(SECOND).request.model_dump_json(exclude_none=True).encode()
    submitted = service.api.submit("tenant-a", JobSubmission(upload={"size_bytes": len(body)}), None)
    # WHEN its body, for the second model, lands and the upload handler takes it in
    client("s3").put_object(Bucket="routing-claims", Key=submitted.job.request_key, Body=body)
    job = service.uploads.accept_upload(submitted.job.request_key, len(body))
    # THEN the job is queued on the second model's queue
    assert job is not None and (job.status.value, job.model, job.error) == ("queued", SECOND, None)
    assert _depth(queues["second"]) == before + 1


def test_a_served_model_without_a_route_is_a_404_and_queues_nothing(stack):
    # GIVEN the API's service whose SERVED_MODELS names a model that MODEL_FLEETS has no route for (the routes are the
    # only way to a queue: there is no configured queue to fall back to)
    config = stack["config"]
    service = JobService.from_config(config.service, served_models=config.served_models)
    before = {name: _depth(url) for name, url in stack["queues"].items()}
    # WHEN a job names that model
    with pytest.raises(ServiceError) as raised:
        service.api.submit("tenant-a", _submission(UNROUTED), None)
    # THEN it is a 404 model_not_found on request.model, and no queue got it
    assert (raised.value.kind, raised.value.code) == (ErrorKind.NOT_FOUND, "model_not_found")
    assert raised.value.details[0]["field"] == "request.model"
    assert {name: _depth(url) for name, url in stack["queues"].items()} == before


def test_the_any_model_route_takes_a_model_no_other_route_names_of_either_kind(stack):
    # GIVEN the API's service whose routes add the any-model route ("*", as the local runtime sets for its engines
    # that answer any name) to the second model's fleet
    config = stack["config"]
    routes = {**config.model_fleets, ANY_MODEL: config.model_fleets[SECOND]}
    base = JobService.from_config(config.service)
    service = JobService(store=base.store, blobs=base.blobs, notifier=base.notifier, fleets=routes)
    queues = stack["queues"]
    before = [_depth(queues[name]) for name in ("chat", "second")]
    # WHEN a chat job and an embeddings job name models no route names
    service.api.submit("tenant-a", _submission("any-name"), None)
    embedding = JobSubmission(endpoint="/v1/embeddings", request={"model": "any-embedder", "input": "hi"})
    service.api.submit("tenant-a", embedding, None)
    # THEN both are on the second model's queue, and a routed model still goes to its own
    service.api.submit("tenant-a", _submission(CHAT), None)
    assert [_depth(queues[name]) for name in ("chat", "second")] == [before[0] + 1, before[1] + 2]


def test_a_fleet_with_a_cluster_of_its_own_is_woken_in_its_cluster(stack, monkeypatch):
    # GIVEN a model whose fleet has a cluster of its own (fleet_stacks: its route names it), its service there at zero
    ecs = client("ecs")
    ecs.create_cluster(clusterName="own-fleet")
    arn = _service(ecs, "own-fleet", "gpu-workers-own")
    queue = client("sqs").create_queue(QueueName="own")["QueueUrl"]
    route = {"kind": "chat", "queue_url": queue, "worker_service": arn, "worker_cluster": "own-fleet"}
    env = {
        **ServiceConfig(
            table_name="routing-jobs",
            bucket_name="routing-claims",
            topic_arn=client("sns").create_topic(Name="routing-results")["TopicArn"],
            queue_url=None,
            wake=WakeSettings("routing", 60),  # the stack's cluster, which does not hold this service
        ).to_env(),
        ENV_MODEL_FLEETS: json.dumps({CHAT: route}),
        ENV_SERVED_MODELS: json.dumps([CHAT]),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = ServiceSettings.load()
    service = JobService.from_config(config.service, served_models=config.served_models)
    # WHEN a job for it is submitted
    service.api.submit("tenant-a", _submission(CHAT), None)
    # THEN its service is woken in its own cluster
    assert _depth(queue) == 1
    assert _desired("own-fleet", arn) == 1
