"""Lambda's asynchronous invocation, as the local runtime runs it from the template: an S3 event for a function that
keeps failing is retried MaximumRetryAttempts times, then lands in the on-failure destination."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import unquote_plus

import boto3
from botocore.config import Config

from local_runtime.deployer import Deployment
from local_runtime.functions import LocalFunction
from local_runtime.moto_server import LOCAL_KEYS, MotoServer
from local_runtime.pollers import event_sources
from local_runtime.template import Assembly
from tests.local.assemblies import python_function, write_assembly

HANDLER = {
    "handler.py": "def boom(event, context):\n    raise RuntimeError('cannot handle ' + event['Records'][0]['s3']['object']['key'])\n"
}


def test_a_failing_s3_invocation_is_retried_then_sent_to_its_on_failure_destination(moto: MotoServer, tmp_path: Path):
    def clients(service: str):
        return boto3.client(
            service,
            endpoint_url=moto.url,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}) if service == "s3" else None,
            **{k.lower(): v for k, v in LOCAL_KEYS.items()},
        )

    # GIVEN a bucket notifying a function that always fails, with one retry and an on-failure queue
    resources = {
        "Fn": python_function("asset.code", "handler.boom"),
        "Failures": {"Type": "AWS::SQS::Queue", "Properties": {}},
        "Bucket": {"Type": "AWS::S3::Bucket", "Properties": {}},
        "Notify": {
            "Type": "Custom::S3BucketNotifications",
            "Properties": {
                "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:cdk-handler",
                "BucketName": {"Ref": "Bucket"},
                "NotificationConfiguration": {
                    "LambdaFunctionConfigurations": [
                        {"Events": ["s3:ObjectCreated:*"], "LambdaFunctionArn": {"Fn::GetAtt": ["Fn", "Arn"]}}
                    ]
                },
            },
        },
        "InvokeConfig": {
            "Type": "AWS::Lambda::EventInvokeConfig",
            "Properties": {
                "FunctionName": {"Ref": "Fn"},
                "Qualifier": "$LATEST",
                "MaximumRetryAttempts": 1,
                "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": ["Failures", "Arn"]}}},
            },
        },
    }
    assembly = Assembly.load(write_assembly(tmp_path / "cdk.out", resources, {"asset.code": HANDLER}))
    deployment = Deployment(assembly, clients, api_key_values={}).deploy()
    function = LocalFunction(deployment, "Fn", extra_env={}).start().wait_ready()
    pollers = event_sources(deployment, {"Fn": function}, clients("sqs"), clients("sns"))
    for poller in pollers:
        poller.start()
    try:
        # WHEN an object lands
        clients("s3").put_object(Bucket=deployment.resources["Bucket"].ref, Key="uploads/x.json", Body=b"{}")
        # THEN after the first attempt and its one retry, the event is in the on-failure queue as Lambda records it
        sqs, records, deadline = clients("sqs"), [], time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            messages = sqs.receive_message(QueueUrl=deployment.resources["Failures"].ref, WaitTimeSeconds=1)
            records = [json.loads(m["Body"]) for m in messages.get("Messages", [])]
    finally:
        for poller in pollers:
            poller.stop()
        function.stop()
    (record,) = records
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 2
    key = record["requestPayload"]["Records"][0]["s3"]["object"]["key"]
    assert unquote_plus(key) == "uploads/x.json"  # event keys are URL-encoded (moto encodes the slash too)
    assert f"cannot handle {key}" in record["responsePayload"]["errorMessage"]


def test_a_stopped_sqs_event_source_can_be_joined_and_leaves_later_messages_on_the_queue(
    moto: MotoServer, tmp_path: Path
):
    def clients(service: str):
        return boto3.client(
            service, endpoint_url=moto.url, region_name="us-east-1", **{k.lower(): v for k, v in LOCAL_KEYS.items()}
        )

    # GIVEN a queue mapped to a function, its event source running
    resources = {
        "Fn": python_function("asset.code", "handler.ok"),
        "Queue": {"Type": "AWS::SQS::Queue", "Properties": {}},
        "Mapping": {
            "Type": "AWS::Lambda::EventSourceMapping",
            "Properties": {
                "FunctionName": {"Ref": "Fn"},
                "EventSourceArn": {"Fn::GetAtt": ["Queue", "Arn"]},
                "BatchSize": 10,
            },
        },
    }
    code = {"handler.py": "def ok(event, context):\n    return None\n"}
    assembly = Assembly.load(write_assembly(tmp_path / "cdk.out", resources, {"asset.code": code}))
    deployment = Deployment(assembly, clients, api_key_values={}).deploy()
    function = LocalFunction(deployment, "Fn", extra_env={}).start().wait_ready()
    (poller,) = event_sources(deployment, {"Fn": function}, clients("sqs"), clients("sns"))
    poller.start()
    try:
        # WHEN it is stopped and joined (what LocalDeployment.event_source_paused does; joining raised TypeError while
        # the poller's stop flag shadowed Thread._stop)
        poller.stop()
        poller.join(timeout=10)
        # THEN it has ended, and a message sent afterwards waits on the queue
        assert not poller.is_alive()
        sqs, url = clients("sqs"), deployment.resources["Queue"].ref
        sqs.send_message(QueueUrl=url, MessageBody="{}")
        time.sleep(1.5)
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
        assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "1"
    finally:
        poller.stop()
        function.stop()
