"""Result topic subscriptions from context and the webhook dispatch path."""

from __future__ import annotations

import pytest

from async_inference import settings
from tests.cdk.helpers import dashboard_metrics

pytestmark = pytest.mark.cdk


def _subscription(template, protocol):
    found = template.find_resources("AWS::SNS::Subscription", {"Properties": {"Protocol": protocol}})
    return [r["Properties"] for r in found.values()]


def test_email_subscription_from_context_filters_on_status(synthesized):
    """GIVEN an email subscription with statuses in context WHEN synthesized THEN it filters on `status`."""
    [email] = _subscription(synthesized.template, "email")
    assert email["Endpoint"] == "ops@example.com"
    assert email["FilterPolicy"] == {"status": ["failed", "expired"]}


def test_https_subscription_from_context_has_a_dead_letter_queue(synthesized):
    """GIVEN an https subscription WHEN its deliveries exhaust retries THEN they go to the subscription DLQ."""
    dlq = synthesized.logical_id(synthesized.stack.service.results.subscription_dead_letter_queue)
    [https] = _subscription(synthesized.template, "https")
    assert https["FilterPolicy"] == {"status": ["succeeded"]}
    assert https["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}}


def test_sqs_arn_subscription_from_context_needs_no_filter(synthesized):
    """GIVEN an sqs subscription without statuses WHEN synthesized THEN it has raw delivery and no filter policy."""
    external = [
        s
        for s in _subscription(synthesized.template, "sqs")
        if s["Endpoint"] == "arn:aws:sqs:us-east-1:111122223333:downstream"
    ]
    assert len(external) == 1
    assert external[0]["RawMessageDelivery"] is True
    assert "FilterPolicy" not in external[0]


def _webhook_queues(synthesized) -> dict[str, str]:
    """Each tenant's webhook queue, by logical id."""
    return {t: synthesized.logical_id(q) for t, q in synthesized.stack.service.webhooks.queues.items()}


def test_webhook_queues_receive_raw_result_notifications(synthesized):
    """GIVEN the webhook dispatcher WHEN results are published THEN its queues get them raw."""
    for queue in _webhook_queues(synthesized).values():
        synthesized.template.has_resource_properties(
            "AWS::SNS::Subscription",
            {"Protocol": "sqs", "Endpoint": {"Fn::GetAtt": [queue, "Arn"]}, "RawMessageDelivery": True},
        )


def test_each_tenant_has_its_own_webhook_queue_and_event_source_fed_only_its_own_events(synthesized):
    """GIVEN the tenants of the context WHEN their jobs' events are published THEN each tenant's reach only its own
    queue, which its own event source reads with its own concurrency: one tenant's slow receivers, holding an
    invocation to its deadline, hold back no other tenant's delivery."""
    queues = _webhook_queues(synthesized)
    assert set(queues) == {"demo", "acme"}
    for tenant, queue in queues.items():
        synthesized.template.has_resource_properties(
            "AWS::SNS::Subscription",
            {"Endpoint": {"Fn::GetAtt": [queue, "Arn"]}, "FilterPolicy": settings.webhook_filter_policy(tenant)},
        )
        synthesized.template.has_resource_properties(
            "AWS::Lambda::EventSourceMapping",
            {"EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]}, "ScalingConfig": {"MaximumConcurrency": 2}},
        )


def test_webhook_retries_span_over_an_hour_before_the_dlq(synthesized):
    """GIVEN the backoff settings WHEN summing the schedule THEN retries last over an hour, then the DLQ takes over."""
    assert settings.webhook_retry_span_s() > 3600
    dlq = synthesized.logical_id(synthesized.stack.service.webhooks.dead_letter_queue)
    synthesized.template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "RedrivePolicy": {
                "deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]},
                "maxReceiveCount": settings.WEBHOOK_MAX_RECEIVE_COUNT,
            }
        },
    )


def test_webhook_function_reports_batch_item_failures(synthesized):
    """GIVEN the webhook event sources WHEN a delivery fails THEN only that message is retried."""
    for queue in _webhook_queues(synthesized).values():
        synthesized.template.has_resource_properties(
            "AWS::Lambda::EventSourceMapping",
            {"EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]}, "FunctionResponseTypes": ["ReportBatchItemFailures"]},
        )


def test_webhook_function_runs_outside_any_vpc(synthesized):
    """GIVEN the webhook function WHEN reading it THEN it has no VPC config (its secrets: tests/cdk/test_deploy_day.py)."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "lambdas.webhooks.handler.lambda_handler"}}
    ).values()
    assert "VpcConfig" not in function["Properties"]


def test_dlq_handler_consumes_the_job_dlq_with_batch_item_failures(synthesized):
    """GIVEN the DLQ handler WHEN messages reach the job DLQ THEN it consumes them, reporting item failures."""
    dlq = synthesized.logical_id(synthesized.stack.service.fleets[0].jobs.dead_letter_queue)
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {"EventSourceArn": {"Fn::GetAtt": [dlq, "Arn"]}, "FunctionResponseTypes": ["ReportBatchItemFailures"]},
    )


def test_dashboard_plots_exactly_the_metrics_the_api_the_dlq_handler_and_the_worker_emit(synthesized):
    """GIVEN the metric names in settings (WORKER_METRICS, API_METRICS, DEAD_LETTER_METRICS) WHEN reading the
    dashboard body THEN it plots exactly those names from the shared namespace, and nothing that no process emits."""
    plotted = {name for name, _, _ in dashboard_metrics(synthesized.template, settings.METRICS_NAMESPACE)}
    assert plotted == set(settings.WORKER_METRICS) | set(settings.API_METRICS) | set(settings.DEAD_LETTER_METRICS)


@pytest.mark.parametrize(
    ("names", "service"),
    [
        (settings.WORKER_METRICS, "async-inference-worker"),
        (settings.API_METRICS, "async-inference-api"),
        (settings.DEAD_LETTER_METRICS, "async-inference-dlq"),
    ],
)
def test_dashboard_reads_each_metric_under_its_emitters_service_dimension(synthesized, names, service):
    """GIVEN Powertools adds the dimension service=POWERTOOLS_SERVICE_NAME WHEN reading the dashboard THEN each
    metric is read under the service name of the process that emits it."""
    dimensions = {
        (name, tuple(sorted(dims.items())))
        for name, dims, _ in dashboard_metrics(synthesized.template, settings.METRICS_NAMESPACE)
        if name in names
    }
    assert dimensions == {(name, (("service", service),)) for name in names}


def test_a_metric_named_in_settings_without_a_plot_is_refused(monkeypatch):
    """GIVEN a metric added to settings.WORKER_METRICS without a dashboard plot WHEN building the dashboard THEN the
    synth fails naming it, so no emitted metric goes unplotted."""
    from cdk.monitoring import Monitoring

    monkeypatch.setattr(settings, "WORKER_METRICS", (*settings.WORKER_METRICS, "TokensPerSecond"))
    with pytest.raises(ValueError, match=r"\['TokensPerSecond'\].*METRIC_PLOTS"):
        Monitoring._service_metric_widgets("async-inference-worker", "async-inference-api")


@pytest.mark.parametrize(
    ("name", "statistics"),
    [
        (settings.METRIC_JOBS_SUBMITTED, {"Sum"}),
        (settings.METRIC_JOBS_SUCCEEDED, {"Sum"}),
        (settings.METRIC_JOBS_FAILED, {"Sum"}),
        (settings.METRIC_COMPLETION_TOKENS, {"Sum"}),
        (settings.METRIC_QUEUE_TIME, {"Average", "p90"}),
        (settings.METRIC_PROCESSING_TIME, {"Average", "p90"}),
        (settings.METRIC_DEAD_LETTERS_UNPROCESSABLE, {"Sum"}),
    ],
)
def test_counts_are_summed_and_times_shown_as_mean_and_tail(synthesized, name, statistics):
    """GIVEN a count or a duration WHEN reading its plots THEN counts are summed and durations show mean and p90."""
    found = {
        stat
        for plotted, _, stat in dashboard_metrics(synthesized.template, settings.METRICS_NAMESPACE)
        if plotted == name
    }
    assert found == statistics


@pytest.mark.parametrize(
    "attribute",
    [
        "jobs.dead_letter_queue",
        "webhooks.dead_letter_queue",
        "results.subscription_dead_letter_queue",
        "uploads.failure_queue",
        "upload_deadlines.dead_letter_queue",
    ],
)
def test_a_message_in_a_dlq_raises_an_alarm(synthesized, attribute):
    """GIVEN a DLQ WHEN it holds one message THEN an alarm fires (depth > 0)."""
    owner, name = attribute.split(".")
    service = synthesized.stack.service
    dlq = synthesized.logical_id(getattr(getattr(service.fleets[0] if owner == "jobs" else service, owner), name))
    synthesized.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "Dimensions": [{"Name": "QueueName", "Value": {"Fn::GetAtt": [dlq, "QueueName"]}}],
            "ComparisonOperator": "GreaterThanThreshold",
            "Threshold": 0,
        },
    )


def test_oldest_job_alarm_uses_the_threshold_from_context(synthesized):
    """GIVEN oldest_message_alarm_seconds in cdk.json WHEN synthesized THEN the age alarm uses it."""
    synthesized.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {"MetricName": "ApproximateAgeOfOldestMessage", "Threshold": 900, "ComparisonOperator": "GreaterThanThreshold"},
    )


def test_only_notifications_of_jobs_with_a_webhook_reach_the_dispatcher(synthesized):
    """GIVEN the dispatcher's subscription WHEN a job without a webhook finishes THEN the filter keeps it away."""
    for tenant, queue in _webhook_queues(synthesized).items():
        policy = synthesized.template.find_resources(
            "AWS::SNS::Subscription", {"Properties": {"Endpoint": {"Fn::GetAtt": [queue, "Arn"]}}}
        )
        [subscription] = policy.values()
        assert subscription["Properties"]["FilterPolicy"][settings.WEBHOOK_ATTRIBUTE] == ["true"], tenant


def test_dispatcher_has_time_for_a_full_batch_of_slow_receivers(synthesized):
    """GIVEN the dispatcher, which delivers a batch at once WHEN every receiver of a full batch takes its whole
    delivery timeout THEN the function's timeout covers that several times over, and the queue's visibility outlives
    the function six times (AWS's guidance for SQS event sources)."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "lambdas.webhooks.handler.lambda_handler"}}
    ).values()
    timeout = function["Properties"]["Timeout"]
    assert timeout == settings.WEBHOOK_DISPATCHER_TIMEOUT_S
    assert timeout >= 3 * (settings.WEBHOOK_CONNECT_TIMEOUT_S + settings.WEBHOOK_DELIVERY_TIMEOUT_S)
    mappings = [
        m["Properties"]
        for m in synthesized.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"]
        == {"Ref": synthesized.logical_id(synthesized.stack.service.webhooks.handler)}
    ]
    assert [m["BatchSize"] for m in mappings] == [settings.WEBHOOK_BATCH_SIZE] * len(_webhook_queues(synthesized))
    for queue in _webhook_queues(synthesized).values():
        visibility = synthesized.template.to_json()["Resources"][queue]["Properties"]["VisibilityTimeout"]
        assert visibility >= 6 * timeout


def test_workers_know_the_webhook_queues_for_started_events(synthesized):
    """GIVEN the worker task WHEN a job starts THEN the worker can find its tenant's webhook queue."""
    [task] = synthesized.template.find_resources("AWS::ECS::TaskDefinition").values()
    [container] = task["Properties"]["ContainerDefinitions"]
    names = {variable["Name"] for variable in container["Environment"]}
    assert "WEBHOOK_QUEUE_URLS" in names
