"""An ``AWS::Lambda::EventSourceMapping`` on a DynamoDB table's stream, as the local runtime runs it from the template.

Lambda reads each shard of the stream about four times a second and invokes the function with the records read, in
the shard's order, one batch at a time per shard: here one thread reads moto's stream (``dynamodbstreams``:
DescribeStream, GetShardIterator, GetRecords) every ``POLL_S`` while it finds nothing. What the mapping says is
honoured: ``StartingPosition`` (``LATEST``, ``TRIM_HORIZON``), ``BatchSize``, ``FilterCriteria`` (records that match
no filter are dropped without an invocation; the patterns' exact values and ``exists``, ``filter_matches``),
``MaximumRetryAttempts`` (a failed batch is invoked again that many times, then skipped), and
``MaximumRecordAgeInSeconds``. What is not supported is refused when the mapping is read: another filter operator
(prefix, numeric, anything-but, ...), an on-failure destination, tumbling windows. The shards are those the stream
has when the mapping starts: moto's table has one, and never splits it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from local_runtime.functions import LocalFunction
from local_runtime.template import LOCAL_REGION

logger = logging.getLogger("local_runtime")
POLL_S = 0.25  # Lambda polls each shard about 4 times a second
UNSUPPORTED = ("DestinationConfig", "TumblingWindowInSeconds")


def _check_pattern(pattern: Any, where: str) -> None:
    """Refuse a filter pattern with an operator this runtime does not apply."""
    if isinstance(pattern, dict):
        for key, value in pattern.items():
            _check_pattern(value, f"{where}.{key}")
        return
    if not isinstance(pattern, list):
        raise ValueError(f"filter pattern {where}: {pattern!r} is neither a list of values nor a nested pattern")
    for rule in pattern:
        if isinstance(rule, dict) and set(rule) != {"exists"}:
            raise ValueError(f"filter pattern {where}: operator {sorted(rule)} does not run locally (values, exists)")


def filter_matches(pattern: dict[str, Any], record: Any) -> bool:
    """Whether a record matches a Lambda event filter pattern of exact values and ``exists``."""
    if not isinstance(record, dict):
        return False
    for key, rules in pattern.items():
        if isinstance(rules, dict):
            if not filter_matches(rules, record.get(key)):
                return False
            continue
        present = key in record
        if not any(
            (present is rule["exists"]) if isinstance(rule, dict) else (present and record[key] == rule)
            for rule in rules
        ):
            return False
    return True


def lambda_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A record as GetRecords returned it (through boto3), as Lambda delivers it: the creation time in epoch seconds,
    the stream's ARN."""
    dynamodb = dict(record["dynamodb"])
    created = dynamodb.get("ApproximateCreationDateTime")
    if created is not None and not isinstance(created, int | float):
        dynamodb["ApproximateCreationDateTime"] = created.timestamp()
    return {**record, "dynamodb": dynamodb, "eventSourceARN": stream_arn, "awsRegion": LOCAL_REGION}


class DynamoDbStreamSource(threading.Thread):
    """Reads a table's stream and invokes ``function`` with its records, shard by shard, until stopped."""

    def __init__(self, streams: Any, function: LocalFunction, *, stream_arn: str, mapping: dict[str, Any]) -> None:
        super().__init__(name=f"esm-{function.logical_id}", daemon=True)
        for name in UNSUPPORTED:
            if name in mapping:
                raise ValueError(f"event source {stream_arn} of {function.logical_id}: {name} does not run locally")
        self.function = function
        self.stream_arn = stream_arn
        self.batch_size = int(mapping.get("BatchSize", 100))
        self.starting_position = mapping.get("StartingPosition", "LATEST")
        self.max_retries = int(mapping.get("MaximumRetryAttempts", -1))  # -1: until the record expires, as Lambda
        self.max_age_s = int(mapping.get("MaximumRecordAgeInSeconds", -1))
        self.patterns = [json.loads(f["Pattern"]) for f in mapping.get("FilterCriteria", {}).get("Filters", [])]
        for pattern in self.patterns:
            _check_pattern(pattern, "")
        self._streams = streams
        self._stopping = threading.Event()
        # Taken now, as the mapping's creation does: LATEST means what is written from here on.
        self._iterators = {
            shard["ShardId"]: streams.get_shard_iterator(
                StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType=self.starting_position
            )["ShardIterator"]
            for shard in streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
        }

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                found = sum(self._read(shard) for shard in list(self._iterators))
            except Exception:
                if self._stopping.is_set():
                    return
                logger.exception("%s: reading %s failed; reading again", self.name, self.stream_arn)
                found = 0
            if not found:
                self._stopping.wait(POLL_S)

    def _read(self, shard: str) -> int:
        """One GetRecords on ``shard`` and its batch delivered; the records read."""
        iterator = self._iterators.get(shard)
        if iterator is None:
            return 0
        answer = self._streams.get_records(ShardIterator=iterator, Limit=self.batch_size)
        records = answer.get("Records", [])
        self._iterators[shard] = answer.get("NextShardIterator")
        batch = [lambda_record(r, self.stream_arn) for r in records]
        if self.max_age_s >= 0:
            oldest = time.time() - self.max_age_s
            batch = [r for r in batch if r["dynamodb"].get("ApproximateCreationDateTime", oldest) >= oldest]
        if self.patterns:
            batch = [r for r in batch if any(filter_matches(p, r) for p in self.patterns)]
        if batch:
            self._deliver(batch)
        return len(records)

    def _deliver(self, batch: list[dict[str, Any]]) -> None:
        attempt = 0
        while not self._stopping.is_set():
            result = self.function.invoke({"Records": batch})
            if not result.error:
                return
            attempt += 1
            if 0 <= self.max_retries < attempt:
                logger.error(
                    "%s failed on %d records %d times; they are skipped, as Lambda skips them",
                    self.function.logical_id,
                    len(batch),
                    attempt,
                )
                return
            logger.warning(
                "%s failed (%s); invoking the batch again",
                self.function.logical_id,
                result.payload.get("errorMessage") if isinstance(result.payload, dict) else result.payload,
            )
            self._stopping.wait(1)

    def stop(self) -> None:
        self._stopping.set()
