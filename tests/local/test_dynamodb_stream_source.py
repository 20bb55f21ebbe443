"""An event source mapping on a DynamoDB table's stream, as the local runtime runs it from the template: the records
written after the mapping started reach the function in the table's order, and only those its filter lets through."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from local_runtime.deployer import Deployment
from local_runtime.dynamodb_streams import DynamoDbStreamSource, filter_matches
from local_runtime.functions import LocalFunction
from local_runtime.moto_server import LOCAL_CREDENTIALS, LOCAL_KEYS, MotoServer
from local_runtime.pollers import event_sources
from local_runtime.template import Assembly
from tests.local.assemblies import python_function, write_assembly

# What the function was given: each record's event name and sort key, one message per invocation.
HANDLER = {
    "handler.py": (
        "import json, os, boto3\n"
        "def seen(event, context):\n"
        "    got = [[r['eventName'], r['dynamodb']['Keys']['seq']['N']] for r in event['Records']]\n"
        "    boto3.client('sqs').send_message(QueueUrl=os.environ['SEEN'], MessageBody=json.dumps(got))\n"
    )
}
INSERTED_WITH_A_TENANT = {"eventName": ["INSERT"], "dynamodb": {"NewImage": {"tenant": {"S": [{"exists": True}]}}}}


def test_a_tables_stream_delivers_the_filtered_records_in_order(moto: MotoServer, tmp_path: Path):
    def clients(service: str):
        return boto3.client(
            service, endpoint_url=moto.url, region_name="us-east-1", **{k.lower(): v for k, v in LOCAL_KEYS.items()}
        )

    # GIVEN a table with a stream of new images, mapped to a function with a filter on inserted items with a tenant
    resources = {
        "Seen": {"Type": "AWS::SQS::Queue", "Properties": {}},
        "Fn": python_function("asset.code", "handler.seen", environment={"SEEN": {"Ref": "Seen"}}),
        "Log": {
            "Type": "AWS::DynamoDB::Table",
            "Properties": {
                "KeySchema": [
                    {"AttributeName": "job_id", "KeyType": "HASH"},
                    {"AttributeName": "seq", "KeyType": "RANGE"},
                ],
                "AttributeDefinitions": [
                    {"AttributeName": "job_id", "AttributeType": "S"},
                    {"AttributeName": "seq", "AttributeType": "N"},
                ],
                "BillingMode": "PAY_PER_REQUEST",
                "StreamSpecification": {"StreamViewType": "NEW_IMAGE"},
            },
        },
        "Mapping": {
            "Type": "AWS::Lambda::EventSourceMapping",
            "Properties": {
                "FunctionName": {"Ref": "Fn"},
                "EventSourceArn": {"Fn::GetAtt": ["Log", "StreamArn"]},
                "StartingPosition": "LATEST",
                "BatchSize": 100,
                "FilterCriteria": {"Filters": [{"Pattern": json.dumps(INSERTED_WITH_A_TENANT)}]},
            },
        },
    }
    assembly = Assembly.load(write_assembly(tmp_path / "cdk.out", resources, {"asset.code": HANDLER}))
    deployment = Deployment(assembly, clients, api_key_values={}).deploy()
    table = deployment.resources["Log"].ref
    dynamodb = clients("dynamodb")
    dynamodb.put_item(TableName=table, Item={"job_id": {"S": "j"}, "seq": {"N": "0"}, "tenant": {"S": "a"}})
    reach_moto = {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": moto.url}
    function = LocalFunction(deployment, "Fn", extra_env=reach_moto).start().wait_ready()
    (source,) = event_sources(deployment, {"Fn": function}, clients("sqs"), clients("sns"), clients("dynamodbstreams"))
    source.start()
    try:
        # WHEN items are written after it started: with a tenant, without one, with one; and one is deleted
        for seq, tenant in ((1, "a"), (2, None), (3, "a")):
            item = {"job_id": {"S": "j"}, "seq": {"N": str(seq)}, **({"tenant": {"S": tenant}} if tenant else {})}
            dynamodb.put_item(TableName=table, Item=item)
        dynamodb.delete_item(TableName=table, Key={"job_id": {"S": "j"}, "seq": {"N": "1"}})
        sqs, seen, deadline = clients("sqs"), [], time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 2:
            messages = sqs.receive_message(QueueUrl=deployment.resources["Seen"].ref, WaitTimeSeconds=1)
            seen += [record for m in messages.get("Messages", []) for record in json.loads(m["Body"])]
        time.sleep(1.0)  # a record delivered late would arrive by now
        seen += [
            record
            for m in sqs.receive_message(QueueUrl=deployment.resources["Seen"].ref).get("Messages", [])
            for record in json.loads(m["Body"])
        ]
    finally:
        source.stop()
        function.stop()
    # THEN the function got the inserted items with a tenant, in order: not the one written before it started (LATEST),
    # not the one without a tenant, not the deletion
    assert seen == [["INSERT", "1"], ["INSERT", "3"]]


@pytest.mark.parametrize(
    ("record", "matches"),
    [
        ({"eventName": "INSERT", "dynamodb": {"NewImage": {"tenant": {"S": "a"}}}}, True),
        ({"eventName": "MODIFY", "dynamodb": {"NewImage": {"tenant": {"S": "a"}}}}, False),
        ({"eventName": "INSERT", "dynamodb": {"NewImage": {"other": {"S": "a"}}}}, False),
        ({"eventName": "REMOVE", "dynamodb": {"OldImage": {"tenant": {"S": "a"}}}}, False),
    ],
)
def test_a_filter_of_values_and_exists_matches_as_lambdas_does(record, matches):
    assert filter_matches(INSERTED_WITH_A_TENANT, record) is matches


@pytest.mark.parametrize(
    ("mapping", "named"),
    [
        ({"FilterCriteria": {"Filters": [{"Pattern": json.dumps({"eventName": [{"prefix": "IN"}]})}]}}, "prefix"),
        ({"DestinationConfig": {"OnFailure": {"Destination": "arn:aws:sqs:us-east-1:1:q"}}}, "DestinationConfig"),
    ],
)
def test_what_the_local_stream_source_does_not_run_is_refused_by_name(mapping, named):
    # GIVEN a mapping with a filter operator or a setting the local runtime does not apply WHEN it is read
    # THEN it is refused with an error that names it, rather than run without it
    with pytest.raises(ValueError, match=named):
        DynamoDbStreamSource(None, SimpleNamespace(logical_id="Fn"), stream_arn="arn:stream", mapping=mapping)  # type: ignore[arg-type]
