"""The worker's EMF metrics: every worker metric the synthesized dashboard plots is in the worker's stdout records.

The names come from the dashboard in the synthesized template, not from a list here: a widget for a metric that no
worker emits is a graph that stays empty in production.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from async_inference import settings
from async_inference_client import Client
from tests.cdk.conftest import Synthesized, synthesized, worker_context  # noqa: F401 (fixtures)
from tests.faults.fault_stack import FaultStack, chat

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_NAME = "gpu-worker"


def dashboard_metric_names(template: dict[str, Any], namespace: str) -> set[str]:
    """Every metric name in ``namespace`` that the template's dashboards plot, as a metric or inside a SEARCH."""
    names: set[str] = set()
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::CloudWatch::Dashboard":
            continue
        body = resource["Properties"]["DashboardBody"]
        if isinstance(body, dict):  # {"Fn::Join": ["", [text, token, text...]]}: the tokens are resource names
            body = "".join(part if isinstance(part, str) else "TOKEN" for part in body["Fn::Join"][1])
        for widget in json.loads(body)["widgets"]:
            for metric in widget.get("properties", {}).get("metrics", []):
                if metric and metric[0] == namespace:
                    names.add(metric[1])
                for option in (m for m in metric if isinstance(m, dict)):
                    search = re.compile(r"\{" + re.escape(namespace) + r"[^}]*\}[^']*?MetricName=\"(\w+)\"")
                    names.update(search.findall(option.get("expression", "")))
    return names


def emf_records(stdout: str) -> list[dict[str, Any]]:
    records = []
    for line in stdout.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            records.append(json.loads(line))
    return records


def emitted(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every value of every metric in the records, by name."""
    values: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for directive in record["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = record[metric["Name"]]
                values[metric["Name"]].extend(value if isinstance(value, list) else [value])
    return values


def start_worker(stack: FaultStack, stdout: Path, **env: str) -> subprocess.Popen[bytes]:
    """A worker with its own stdout, where its EMF records go (its log lines go to stderr)."""
    environment = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        **stack.env,
        "ENGINE": "echo",
        "RECEIVE_WAIT_S": "1",
        "POWERTOOLS_METRICS_DISABLED": "false",
        "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
        **env,
    }
    with open(stdout, "wb") as out, open(stdout.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gpu_worker"], env=environment, cwd=REPO_ROOT, stdout=out, stderr=log
        )


def wait_final(api: Client, job_ids: list[str], timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {job_id: api.get(job_id) for job_id in job_ids}
        if all(j.status in ("succeeded", "failed") for j in jobs.values()) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.2)


@pytest.mark.cdk
@pytest.mark.e2e
def test_every_worker_metric_on_the_dashboard_is_emitted(
    stack: FaultStack,
    api: Client,
    synthesized: Synthesized,  # noqa: F811 (a fixture)
    tmp_path: Path,
):
    # GIVEN the worker metrics the synthesized dashboard plots (its metrics in the service's namespace, less the API's
    # and the DLQ handler's)
    on_dashboard = (
        dashboard_metric_names(synthesized.json, settings.METRICS_NAMESPACE)
        - set(settings.API_METRICS)
        - set(settings.DEAD_LETTER_METRICS)
    )
    assert on_dashboard, "the dashboard plots no worker metric"
    # AND a worker flushing at each heartbeat, with a 5-word context so that one job fails
    stdout = tmp_path / "worker.out"
    worker = start_worker(stack, stdout, HEARTBEAT_INTERVAL_S="0.5", ECHO_MAX_MODEL_LEN="5")
    try:
        # WHEN it runs three jobs that succeed and one that fails
        good = [api.submit(chat(f"metric job {i}", max_tokens=2)).job_id for i in range(3)]
        bad = api.submit(chat("far too many words for this context", max_tokens=2)).job_id
        jobs = wait_final(api, [*good, bad])
        assert [jobs[j].status for j in good] == ["succeeded"] * 3 and jobs[bad].status == "failed", jobs
        # THEN its records reach stdout while it runs, not only at exit
        deadline = time.monotonic() + 10
        while len(emitted(emf_records(stdout.read_text())).get(settings.METRIC_JOBS_FAILED, [])) < 1:
            assert time.monotonic() < deadline, "no EMF record while the worker runs:\n" + stdout.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    records = emf_records(stdout.read_text())
    values = emitted(records)
    # AND every worker metric the dashboard plots is among them, as is every name the worker owns
    assert on_dashboard <= set(values), (on_dashboard, set(values))
    assert set(settings.WORKER_METRICS) <= set(values)
    # AND they count what happened, in the namespace and with the service dimension the dashboard searches
    assert sum(values[settings.METRIC_JOBS_SUCCEEDED]) == 3 and sum(values[settings.METRIC_JOBS_FAILED]) == 1
    assert sum(values[settings.METRIC_COMPLETION_TOKENS]) == 3 * 2
    assert len(values[settings.METRIC_QUEUE_TIME]) == 4 and len(values[settings.METRIC_PROCESSING_TIME]) == 3
    assert all(v >= 0 for v in values[settings.METRIC_QUEUE_TIME] + values[settings.METRIC_PROCESSING_TIME])
    assert {d["Namespace"] for r in records for d in r["_aws"]["CloudWatchMetrics"]} == {settings.METRICS_NAMESPACE}
    assert {r["service"] for r in records} == {SERVICE_NAME}


@pytest.mark.e2e
def test_what_was_measured_since_the_last_heartbeat_is_flushed_at_exit(stack: FaultStack, api: Client, tmp_path: Path):
    # GIVEN a worker whose first heartbeat would come only after 30 s
    stdout = tmp_path / "worker.out"
    worker = start_worker(stack, stdout, HEARTBEAT_INTERVAL_S="30")
    try:
        # WHEN it runs a job and is stopped at once
        job_id = api.submit(chat("flushed at exit", max_tokens=3)).job_id
        assert wait_final(api, [job_id])[job_id].status == "succeeded"
        assert emf_records(stdout.read_text()) == []
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    # THEN its record was written on the way out
    values = emitted(emf_records(stdout.read_text()))
    assert sum(values[settings.METRIC_JOBS_SUCCEEDED]) == 1
    assert sum(values[settings.METRIC_COMPLETION_TOKENS]) == 3
