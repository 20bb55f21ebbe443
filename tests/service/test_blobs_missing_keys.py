"""Blobs.get reads a missing key as missing when S3 answers 403, as it does to a caller without s3:ListBucket on it.

moto answers NoSuchKey whatever the caller's permissions, so these tests give a real boto3 S3 client the answers AWS
gives (botocore's Stubber): a 403 for the missing key, then the listing the stack's conditioned ListBucket allows.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from async_inference.aws import Blobs

BUCKET = "claim-checks"
KEY = "requests/tenant-a/job_0123/request.json"


@pytest.fixture
def s3():
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber


def _denied(stubber: Stubber, operation: str) -> None:
    stubber.add_client_error(operation, service_error_code="AccessDenied", http_status_code=403)


def test_a_403_for_a_key_the_listing_does_not_show_is_a_missing_key(s3):
    """GIVEN S3 answers 403 for the GET and the key is not listed WHEN reading it THEN KeyError (the code's missing)."""
    client, stubber = s3
    _denied(stubber, "get_object")
    stubber.add_response("list_objects_v2", {"KeyCount": 0}, {"Bucket": BUCKET, "Prefix": KEY, "MaxKeys": 1})
    with pytest.raises(KeyError):
        Blobs(BUCKET, s3=client).get(KEY, max_bytes=1024)
    stubber.assert_no_pending_responses()


def test_a_403_for_a_listed_key_is_a_real_refusal(s3):
    """GIVEN S3 answers 403 for the GET of a key that exists WHEN reading it THEN the AccessDenied stands."""
    client, stubber = s3
    _denied(stubber, "get_object")
    stubber.add_response(
        "list_objects_v2", {"KeyCount": 1, "Contents": [{"Key": KEY}]}, {"Bucket": BUCKET, "Prefix": KEY, "MaxKeys": 1}
    )
    with pytest.raises(ClientError, match="AccessDenied"):
        Blobs(BUCKET, s3=client).get(KEY, max_bytes=1024)


def test_a_403_for_a_key_that_only_prefixes_others_is_still_missing(s3):
    """GIVEN the listing shows a longer key that starts with the requested one WHEN reading THEN the key is missing."""
    client, stubber = s3
    _denied(stubber, "get_object")
    stubber.add_response(
        "list_objects_v2",
        {"KeyCount": 1, "Contents": [{"Key": KEY + ".bak"}]},
        {"Bucket": BUCKET, "Prefix": KEY, "MaxKeys": 1},
    )
    with pytest.raises(KeyError):
        Blobs(BUCKET, s3=client).get(KEY, max_bytes=1024)


def test_a_403_when_the_listing_is_refused_too_stands(s3):
    """GIVEN S3 refuses the GET and the listing WHEN reading THEN the GET's AccessDenied surfaces (a permission fault)."""
    client, stubber = s3
    _denied(stubber, "get_object")
    _denied(stubber, "list_objects_v2")
    with pytest.raises(ClientError, match="GetObject"):
        Blobs(BUCKET, s3=client).get(KEY, max_bytes=1024)
