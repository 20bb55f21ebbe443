"""The Lambdas' settings: read once from the environment the stack sets, failing at start with the variable named."""

from __future__ import annotations

import pytest

from async_inference.config import ServiceConfig, ServiceSettings, SettingsError

CONFIG = ServiceConfig(
    table_name="jobs",
    bucket_name="claim-checks",
    queue_url="https://sqs.us-east-1.amazonaws.com/1/jobs",
    topic_arn="arn:aws:sns:us-east-1:1:results",
    dlq_url="https://sqs.us-east-1.amazonaws.com/1/jobs-dlq",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [*CONFIG.to_env(), "ALLOW_LOCAL_WEBHOOKS"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_what_the_stack_sets_is_what_the_functions_read(clean_env: pytest.MonkeyPatch):
    # GIVEN the environment the stack sets from a ServiceConfig (built there from CDK tokens, which are strings)
    for name, value in CONFIG.to_env().items():
        clean_env.setenv(name, value)
    # WHEN a function reads its settings
    loaded = ServiceSettings.load()
    # THEN it finds the same resources, and local-only webhooks stay off
    assert loaded.service == CONFIG
    assert loaded.allow_local_webhooks is False


def test_every_missing_variable_is_named_at_start(clean_env: pytest.MonkeyPatch):
    # GIVEN only the table name
    clean_env.setenv("JOBS_TABLE_NAME", "jobs")
    # WHEN the settings are read THEN the error names each missing variable and what it is
    with pytest.raises(SettingsError) as raised:
        ServiceSettings.load()
    message = str(raised.value)
    for name in ("JOBS_BUCKET_NAME", "RESULT_TOPIC_ARN"):
        assert f"{name} is not set" in message
    # set, and optional: a function finds each model's queues by its route, only a worker reads its own queue
    assert "JOBS_TABLE_NAME" not in message and "JOBS_DLQ_URL" not in message and "JOBS_QUEUE_URL" not in message
    assert "the claim-check bucket's name" in message


def test_a_malformed_flag_is_refused_not_read_as_false(clean_env: pytest.MonkeyPatch):
    for name, value in CONFIG.to_env().items():
        clean_env.setenv(name, value)
    clean_env.setenv("ALLOW_LOCAL_WEBHOOKS", "sometimes")
    with pytest.raises(SettingsError, match="ALLOW_LOCAL_WEBHOOKS='sometimes': Input should be a valid boolean"):
        ServiceSettings.load()


def test_an_empty_variable_counts_as_unset(clean_env: pytest.MonkeyPatch):
    for name, value in CONFIG.to_env().items():
        clean_env.setenv(name, value)
    clean_env.setenv("JOBS_DLQ_URL", "")
    assert ServiceSettings.load().dlq_url is None
    clean_env.setenv("JOBS_TABLE_NAME", "")
    with pytest.raises(SettingsError, match="JOBS_TABLE_NAME is not set"):
        ServiceSettings.load()
