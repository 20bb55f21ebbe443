"""The S3 key layout is one definition, read back by the upload handler."""

import datetime as dt

from async_inference import settings


def test_upload_keys_round_trip_and_other_keys_are_not_uploads():
    assert settings.parse_upload_key(settings.upload_key("acme", "job_1")) == ("acme", "job_1")
    assert settings.parse_upload_key(settings.request_key("acme", "job_1")) is None
    assert settings.parse_upload_key("uploads/acme/job_1/other.json") is None


def test_inline_requests_uploads_and_results_live_under_distinct_prefixes():
    prefixes = {settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX}
    assert len(prefixes) == 3
    assert settings.result_key("t", "j").startswith(settings.RESULT_PREFIX)


def test_presigned_upload_expiry_is_at_most_15_minutes():
    assert settings.PRESIGNED_UPLOAD_EXPIRY_S <= 15 * 60


def test_heartbeat_renews_visibility_well_before_it_lapses():
    assert settings.HEARTBEAT_INTERVAL_S * 3 <= settings.VISIBILITY_TIMEOUT_S


def test_the_table_keys_the_stack_declares_are_fields_of_the_stored_job():
    from async_inference.schemas import Job

    assert {settings.TABLE_PARTITION_KEY, settings.TENANT_INDEX_PARTITION_KEY} <= set(Job.model_fields)


def test_lifecycle_expiry_rounds_up_to_the_next_midnight_utc_as_s3_does():
    # AWS's own example: created 2014-01-15 10:30 UTC, a 3-day expiration rule -> expires 2014-01-19 00:00 UTC.
    written = dt.datetime(2014, 1, 15, 10, 30, tzinfo=dt.UTC)
    assert settings.lifecycle_expiry(written, 3) == dt.datetime(2014, 1, 19, tzinfo=dt.UTC)
    # The same instant in another offset is the same expiry.
    assert settings.lifecycle_expiry(written.astimezone(dt.timezone(dt.timedelta(hours=-8))), 3) == dt.datetime(
        2014, 1, 19, tzinfo=dt.UTC
    )
