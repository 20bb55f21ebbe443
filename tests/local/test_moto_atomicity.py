"""DynamoDB applies each write to an item atomically; the local moto server must too.

moto's server answers requests on threads of its own and applies an UpdateItem in steps on the live item (a number
ADD reads, adds and replaces; a set ADD appends in place): two concurrent updates of one item could lose a count while
keeping both set members. The batch lane counts chunks exactly so (``BatchStore.record_chunk``: ADD the counts and
the chunk to the counted set), and a loaded CI run showed a batch ``completed`` with 20 of its 120 lines counted.
``local_runtime.moto_main`` serializes the DynamoDB backend's item operations, as DynamoDB's per-item atomicity
guarantees.
"""

from __future__ import annotations

import concurrent.futures

import boto3
from botocore.config import Config

from local_runtime.moto_server import LOCAL_KEYS, MotoServer

THREADS, UPDATES = 16, 40


def test_concurrent_adds_to_one_item_lose_no_count_and_no_set_member(moto: MotoServer):
    # GIVEN one item, and many clients adding to its counter and to its set at once (as workers count chunks)
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=moto.url,
        region_name="us-east-1",
        **{k.lower(): v for k, v in LOCAL_KEYS.items()},
        config=Config(max_pool_connections=THREADS),
    )
    dynamodb.create_table(
        TableName="counts",
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
    )
    dynamodb.put_item(TableName="counts", Item={"pk": {"S": "batch"}})

    def add(member: int) -> None:
        dynamodb.update_item(
            TableName="counts",
            Key={"pk": {"S": "batch"}},
            UpdateExpression="ADD #n :one, #members :member",
            ConditionExpression="NOT contains(#members, :m)",
            ExpressionAttributeNames={"#n": "n", "#members": "members"},
            ExpressionAttributeValues={":one": {"N": "1"}, ":member": {"NS": [str(member)]}, ":m": {"N": str(member)}},
        )

    # WHEN they all land
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(add, range(THREADS * UPDATES)))
    # THEN every add counted exactly once: the counter equals the set's size
    item = dynamodb.get_item(TableName="counts", Key={"pk": {"S": "batch"}}, ConsistentRead=True)["Item"]
    assert (int(item["n"]["N"]), len(item["members"]["NS"])) == (THREADS * UPDATES, THREADS * UPDATES)
