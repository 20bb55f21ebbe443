"""The fault tests' own exactly-once check must be able to fail: it counts writes, not keys."""

from __future__ import annotations

import json

from async_inference import settings
from tests.faults.fault_stack import TENANT, FaultStack


def test_result_objects_sees_a_second_write_of_the_same_key(fstack: FaultStack):
    # GIVEN a versioned bucket, as the deployed one is, where a job's result key was written twice
    bucket, job_id = "versioned-results-check", "job_" + "0" * 32
    s3 = fstack.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for run in (1, 2):
        s3.put_object(Bucket=bucket, Key=settings.result_key(TENANT, job_id), Body=json.dumps({"run": run}).encode())
    # WHEN the tests count the job's results THEN they see both writes, in order
    assert fstack.result_objects(job_id, bucket=bucket) == [{"run": 1}, {"run": 2}]


def test_result_objects_of_an_unversioned_bucket_is_the_current_object(fstack: FaultStack):
    bucket, job_id = "unversioned-results-check", "job_" + "1" * 32
    s3 = fstack.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=settings.result_key(TENANT, job_id), Body=b'{"run": 1}')
    assert fstack.result_objects(job_id, bucket=bucket) == [{"run": 1}]
    assert fstack.result_objects("job_" + "2" * 32, bucket=bucket) == []
