"""One run of one scaling policy over a trace: the queue, CloudWatch, the scaler, ECS and the workers together.

Each minute, in this order: every gauge is sampled (SQS visible and in flight, the service's desired and running
counts, CPU), every alarm is evaluated and the policies it invokes propose capacities (the largest wins), then ECS
managed scaling runs. Messages are delivered to workers with room the moment they are visible. The run ends
``tail_s`` after the last submission, so a fleet that stays up pays for staying up.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass, field

import simpy

from async_inference import settings
from async_inference.keep_alive import METRIC_KEEP_WARM, KeepAlivePolicy, decide
from bench.scaling.autoscaling import ScalableTarget, StepPolicy, TargetTrackingPolicy
from bench.scaling.cloudwatch import MetricId, MetricStat, MetricStore, Sources
from bench.scaling.ecs import MANAGED_SCALING_PHASE_S, Cluster, ClusterConfig, Task
from bench.scaling.engine import EngineModel
from bench.scaling.figures import (
    API_CALL_S,
    CONTAINER_INSIGHTS_DELAY_S,
    CPU_VCPUS_BUSY,
    CPU_VCPUS_IDLE,
    DESIRED_PUBLISHED_WHILE_STARTING,
    DRAIN_TIMEOUT_S,
    INSTANCE_RELEASE_CHECK_S,
    RECEIVE_BATCH,
    SQS_INACTIVE_AFTER_S,
    SQS_PUBLICATION_DELAY_S,
    SQS_RESUME_DELAY_S,
    ColdStart,
)
from bench.scaling.keda import KedaController, KedaSpec
from bench.scaling.queue import Job, Queue
from bench.scaling.template import PolicySpec
from bench.scaling.trace import Request
from bench.scaling.worker import Worker

VISIBLE = MetricId("AWS/SQS", "ApproximateNumberOfMessagesVisible")
NOT_VISIBLE = MetricId("AWS/SQS", "ApproximateNumberOfMessagesNotVisible")
SENT = MetricId("AWS/SQS", "NumberOfMessagesSent")
DESIRED = MetricId("ECS/ContainerInsights", "DesiredTaskCount")
RUNNING = MetricId("ECS/ContainerInsights", "RunningTaskCount")
CPU = MetricId("AWS/ECS", "CPUUtilization")
KEEP_WARM = MetricId(settings.METRICS_NAMESPACE, METRIC_KEEP_WARM)
SENT_PER_MINUTE = MetricStat(SENT, "Sum", 60)


@dataclass(frozen=True)
class ApiWake:
    """The API's wake from zero: on accepting a job, if the service's desired count is 0, set it to 1 at once; each
    API instance checks at most once per ``check_interval_s`` (one call per burst, not per job). With ``hold_s`` the
    wake also raises the scalable target's minimum to 1 for that long (RegisterScalableTarget, and a scheduled action
    that puts it back), so that no alarm re-invoking a scale-to-zero undoes it; with ``hold_max_tasks`` the maximum is
    that too (after a wake from zero), so that no scale-out adds a task beyond it while the first starts. With
    ``starts_instance`` a wake from zero also raises the GPU group from 0 instances to 1 (two more calls), so the
    instance does not wait for managed scaling's next minute."""

    latency_s: float = 2 * API_CALL_S  # DescribeServices, UpdateService
    check_interval_s: float = 60.0
    hold_s: float = 0.0
    starts_instance: bool = False
    hold_max_tasks: int | None = None


@dataclass(frozen=True)
class Delays:
    """When CloudWatch has what: SQS and Container Insights publication delays, the inactive queue's resume delay,
    whether DesiredTaskCount is published while the only task starts, and how long the queue sat idle before the
    trace (over six hours: inactive, its metrics resume ``sqs_resume_s`` after the first message)."""

    sqs_publication_s: float = SQS_PUBLICATION_DELAY_S
    sqs_resume_s: float = SQS_RESUME_DELAY_S
    insights_publication_s: float = CONTAINER_INSIGHTS_DELAY_S
    desired_while_starting: bool = DESIRED_PUBLISHED_WHILE_STARTING
    queue_idle_before_s: float = math.inf


@dataclass(frozen=True)
class Scenario:
    """A policy to simulate: App Auto Scaling (``policy``) or KEDA (``keda``), plus the worker's scale-in behaviour:
    ``task_protection`` busy, long_jobs (jobs longer than the drain at ``protection_tokens_per_s``) or off."""

    name: str
    policy: PolicySpec | None = None
    keda: KedaSpec | None = None
    api_wake: ApiWake | None = None
    task_protection: str = "busy"
    protection_tokens_per_s: float = math.inf
    initial_tasks: int = 0
    cpu_vcpus: float = 4.0
    instance_warmup_s: float | None = None  # the capacity provider's InstanceWarmupPeriod, when the policy sets it
    warm_pool: int | None = None  # stopped pre-initialized instances (None: the cluster config's)
    release_empty: bool | None = None  # the stack's instance release (None: the cluster config's)
    pool_pre_initialized: bool | None = None  # the pool's launch hook pulls image and weights (None: the cluster's)
    eks: bool = False  # runs on EKS (its control plane is part of the idle floor)
    # The learned keep-alive's function (async_inference.keep_alive), run every minute on the published minutes of
    # NumberOfMessagesSent; its decision is the KeepWarm metric.
    keep_alive: KeepAlivePolicy | None = None


@dataclass
class Run:
    scenario: str
    jobs: list[Job]
    end_s: float
    gpu_hours: float
    activities: int
    max_tasks: int
    wakes_s: list[float]
    receives: float
    timeline: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)
    keda_polls: int = 0
    api_wake_calls: int = 0
    zeroed_while_waiting: int = 0  # times the desired count went to 0 with jobs visible or in flight
    most_desired_before_first_task: int = 0  # the desired count's peak before any task served
    pool_starts: int = 0
    pool_initializations: int = 0  # instances launched into the pool to replace one that left (billed while they init)
    releases: int = 0
    warm_pool: int = 0
    instance_starts_by_wake: int = 0  # instances the API's wake launched itself (not managed scaling)
    keep_alive_log: list[tuple[float, float, bool]] = field(default_factory=list)  # (minute, keep-alive s, keep warm)


def simulate(
    scenario: Scenario,
    requests: list[Request],
    engine: EngineModel,
    cluster_config: ClusterConfig,
    cold: ColdStart,
    *,
    ttl_s: float,
    tail_s: float = 3600.0,
    resume_delay_s: float | None = None,
    delays: Delays = Delays(),
) -> Run:
    if resume_delay_s is not None:
        delays = dataclasses.replace(delays, sqs_resume_s=resume_delay_s)
    env = simpy.Environment()
    queue = Queue()
    lane = Queue()  # the other counted queues (the batch lane): empty in the trace, polled by every running worker
    if delays.queue_idle_before_s < SQS_INACTIVE_AFTER_S:
        for q in (queue, lane):
            q.last_access_s = -delays.queue_idle_before_s
            q.became_active_s = -SQS_INACTIVE_AFTER_S - delays.queue_idle_before_s
    jobs: list[Job] = []
    sent_times: list[float] = []
    workers: dict[int, Worker] = {}
    order = itertools.count()
    end_s = (requests[-1].arrival_s if requests else 0.0) + tail_s

    def dispatch() -> None:
        while queue.visible:
            ready = [w for w in workers.values() if w.free > 0]
            if not ready:
                return
            worker = min(ready, key=lambda w: (w.held, w.name))
            worker.take(queue.take(min(RECEIVE_BATCH, worker.free), env.now))
        for worker in workers.values():
            worker.waiting_for_messages()

    def changed() -> None:
        dispatch()
        cluster.protection_changed()

    def make_worker(task: Task) -> Worker:
        def stopped(worker: Worker) -> None:
            worker.close_accounting()
            finished_receives.append(worker.receives)
            workers.pop(task.index, None)
            cluster.worker_stopped(task)

        def started(job: Job, now: float) -> None:
            if job.started_s is None:
                job.started_s = now

        def done(job: Job, now: float) -> None:
            job.finished_s = now

        worker = Worker(
            env,
            f"task-{task.index:04d}",
            queue,
            engine,
            changed,
            stopped,
            started,
            done,
            protection=scenario.task_protection,
            long_job_tokens=scenario.protection_tokens_per_s * DRAIN_TIMEOUT_S,
        )
        workers[task.index] = worker
        return worker

    finished_receives: list[float] = []
    if scenario.task_protection not in ("busy", "long_jobs", "off"):
        raise ValueError(f"{scenario.name}: task_protection {scenario.task_protection!r} is not busy, long_jobs or off")
    config = dataclasses.replace(cluster_config, uses_task_protection=scenario.task_protection != "off")
    if scenario.instance_warmup_s is not None:
        config = dataclasses.replace(config, instance_warmup_s=scenario.instance_warmup_s)
    if scenario.warm_pool is not None:
        config = dataclasses.replace(config, warm_pool=scenario.warm_pool)
    if scenario.release_empty is not None:
        config = dataclasses.replace(config, release_empty=scenario.release_empty)
    if scenario.pool_pre_initialized is not None:
        config = dataclasses.replace(config, pool_pre_initialized=scenario.pool_pre_initialized)
    cluster = Cluster(env, config, cold, make_worker, changed)

    # --- metrics ---------------------------------------------------------------------------------------------------
    def queue_published(now: float, q: Queue = queue) -> bool:
        if workers:
            q.touch(now)  # the workers' long polls are API actions on every counted queue
        return q.active(now) and now - q.became_active_s >= delays.sqs_resume_s

    def desired_published() -> float | None:
        # Container Insights publishes nothing for a service without tasks; while the only tasks start, it publishes
        # the desired count or not as ``delays.desired_while_starting`` says.
        if cluster.running_count() > 0 or (delays.desired_while_starting and cluster.desired > 0):
            return cluster.desired
        return None

    busy_mark: dict[int, float] = {}

    def cpu() -> float | None:
        running = [w for w in workers.values() if not w.stopping]
        if not running:
            return None
        total = 0.0
        for key, worker in ((k, w) for k, w in workers.items() if not w.stopping):
            busy = worker.engine.busy_s - busy_mark.get(key, 0.0)
            busy_mark[key] = worker.engine.busy_s
            fraction = min(1.0, busy / 60.0)
            total += (CPU_VCPUS_BUSY * fraction + CPU_VCPUS_IDLE) / scenario.cpu_vcpus * 100
        return total / len(running)

    def sent(start: float, end: float) -> float | None:
        if not queue_published(end):
            return None
        return float(bisect.bisect_left(sent_times, end) - bisect.bisect_left(sent_times, start))

    def keep_warm() -> float | None:
        # The function runs at the minute's end and reads what CloudWatch has published of the job queue's sends.
        if scenario.keep_alive is None:
            return None
        end = math.floor(env.now / 60.0) * 60.0
        window = scenario.keep_alive.window_minutes
        minutes = [store.datapoint(SENT_PER_MINUTE, end - 60.0 * k, env.now) for k in range(window - 1, -1, -1)]
        decision = decide(scenario.keep_alive, minutes)
        keep_alive_log.append((env.now, decision.keep_alive_s, decision.keep_warm))
        return float(decision.keep_warm)

    keep_alive_log: list[tuple[float, float, bool]] = []
    sources = Sources(
        gauges={
            KEEP_WARM: keep_warm,
            VISIBLE: lambda: len(queue.visible) if queue_published(env.now) else None,
            NOT_VISIBLE: lambda: queue.in_flight if queue_published(env.now) else None,
            DESIRED: desired_published,
            RUNNING: lambda: cluster.running_count() or None,
            CPU: cpu,
        },
        counters={SENT: sent},
        publication_delay_s=lambda m: (
            delays.sqs_publication_s
            if m.namespace == "AWS/SQS"
            else delays.insights_publication_s
            if m.namespace == "ECS/ContainerInsights"
            else 0.0
        ),
    )
    policy = scenario.policy
    # Queues other than the job queue (the batch lane): the trace sends them nothing; they publish zeros while the
    # workers poll them (and for six hours after), nothing before.
    for alarm in policy.alarms if policy is not None else []:
        for metric in alarm.query.metrics():
            if metric.namespace == "AWS/SQS" and metric.resource:
                if metric == MetricId(SENT.namespace, SENT.name, metric.resource):
                    sources.counters[metric] = lambda start, end: 0.0 if queue_published(end, lane) else None
                else:
                    sources.gauges[metric] = lambda: 0.0 if queue_published(env.now, lane) else None
    store = MetricStore(sources)
    zeroed = 0
    peak_before_first = 0

    def set_desired(count: int, cause: str = "") -> None:
        nonlocal zeroed, peak_before_first
        if count == 0 and cluster.desired > 0 and queue.outstanding > 0:
            zeroed += 1
        cluster.set_desired(count, cause)
        if not any(t.running_s is not None for t in cluster.tasks):
            peak_before_first = max(peak_before_first, cluster.desired)

    target = None
    if policy is not None:
        for alarm in policy.alarms:
            for metric in alarm.query.metrics():
                if not sources.knows(metric):
                    raise ValueError(
                        f"{scenario.name}: alarm {alarm.name} reads {metric.namespace}/{metric.name}, "
                        "which the simulator has no source for"
                    )
        target = ScalableTarget(policy.minimum, policy.maximum, lambda: cluster.desired, set_desired)
    tracking = {p.name: p for p in (policy.tracking if policy else [])}
    keda = KedaController(scenario.keda) if scenario.keda else None
    timeline: list[tuple[float, int, int, int, int, int]] = []
    activities = 0

    def minute():
        nonlocal activities
        while True:
            yield env.timeout(60.0 - (env.now % 60.0) if env.now % 60.0 else 60.0)
            now = env.now
            store.sample(now)
            if policy is not None:
                proposals = []
                for alarm in policy.alarms:
                    fire, window = alarm.evaluate(store, now)
                    if not fire:
                        continue
                    for action in alarm.actions:
                        if "#" in action:
                            name, direction = action.split("#")
                            tt: TargetTrackingPolicy = tracking[name]
                            capacity = tt.propose(direction, window, cluster.desired, now)
                            owner: object = tt
                        else:
                            step: StepPolicy = policy.steps[action]
                            capacity = step.propose(
                                window,
                                alarm.threshold,
                                cluster.desired,
                                now,
                                upper_alarm=alarm.comparison.startswith("Greater"),
                            )
                            owner = step
                        if capacity is not None:
                            proposals.append((owner, capacity, f"{alarm.name} -> {action}"))
                before = len(target.activities)
                target.apply(proposals, now)
                activities += len(target.activities) - before
            timeline.append(
                (
                    now,
                    cluster.desired,
                    cluster.running_count(),
                    len(queue.visible),
                    queue.in_flight,
                    len(cluster.live_instances()),
                )
            )

    def managed_scaling():
        yield env.timeout(MANAGED_SCALING_PHASE_S)
        while True:
            cluster.managed_scaling_tick(env.now)
            yield env.timeout(60.0)

    def instance_release():
        yield env.timeout(MANAGED_SCALING_PHASE_S + INSTANCE_RELEASE_CHECK_S / 2)
        while True:
            cluster.release_tick(env.now)
            yield env.timeout(INSTANCE_RELEASE_CHECK_S)

    def keda_loop():
        nonlocal activities
        spec = scenario.keda
        while True:
            yield env.timeout(spec.polling_interval_s)
            queue.touch(env.now)  # GetQueueAttributes is an API action: the queue stays active
            # The aws-cloudwatch trigger reads the decision last published (one a minute; no publication delay here).
            warm = bool(keep_alive_log and keep_alive_log[-1][2])
            replicas = keda.tick(env.now, len(queue.visible), queue.in_flight, cluster.desired, keep_warm=warm)
            if replicas is not None:
                set_desired(replicas, "keda")
                activities += 1

    wake_calls = 0
    last_wake_check = -math.inf

    def arrivals():
        nonlocal wake_calls, last_wake_check
        for request in requests:
            delay = request.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            job = Job(next(order), env.now, request.context_tokens, request.generated_tokens, env.now + ttl_s)
            jobs.append(job)
            queue.send(job, env.now)
            sent_times.append(env.now)
            if scenario.api_wake is not None and env.now - last_wake_check >= scenario.api_wake.check_interval_s:
                last_wake_check = env.now
                if cluster.desired == 0:
                    wake_calls += 1
                    env.process(wake(scenario.api_wake.latency_s))
            dispatch()

    hold_until = -math.inf
    instance_starts = 0

    def wake(latency: float):
        nonlocal hold_until, instance_starts
        yield env.timeout(latency)
        woke = cluster.desired == 0
        if woke:
            set_desired(1, "api wake")
        if woke and scenario.api_wake.starts_instance:
            yield env.timeout(2 * API_CALL_S)  # DescribeAutoScalingGroups, SetDesiredCapacity
            instance_starts += cluster.start_instance()
        if scenario.api_wake.hold_s and target is not None:
            hold_until = env.now + scenario.api_wake.hold_s
            target.minimum = max(policy.minimum, 1)
            if woke and scenario.api_wake.hold_max_tasks is not None:
                target.maximum = scenario.api_wake.hold_max_tasks
            env.process(release_hold(hold_until))

    def release_hold(at: float):
        yield env.timeout(at - env.now)
        if env.now >= hold_until:
            target.minimum = policy.minimum
            target.maximum = policy.maximum

    if scenario.initial_tasks:
        # A policy with a minimum above zero has that many warm tasks running when the trace starts, whose polls kept
        # the queues active.
        cluster.prewarm(scenario.initial_tasks)
        for q in (queue, lane):
            q.last_access_s, q.became_active_s = 0.0, -math.inf

    env.process(arrivals())
    env.process(minute())
    env.process(managed_scaling())
    env.process(instance_release())
    if keda is not None:
        env.process(keda_loop())
    env.run(until=end_s)

    for worker in list(workers.values()):
        worker.close_accounting()
        finished_receives.append(worker.receives)
    wakes = _wakes(jobs, cluster.desired_log)
    return Run(
        scenario=scenario.name,
        jobs=jobs,
        end_s=end_s,
        gpu_hours=cluster.gpu_hours(end_s),
        activities=activities,
        max_tasks=max(v for _, v in cluster.desired_log),
        wakes_s=wakes,
        receives=sum(finished_receives),
        timeline=timeline,
        keda_polls=keda.polls if keda else 0,
        api_wake_calls=wake_calls,
        zeroed_while_waiting=zeroed,
        most_desired_before_first_task=peak_before_first,
        pool_starts=cluster.pool_starts,
        pool_initializations=cluster.pool_initializations,
        releases=cluster.releases,
        warm_pool=config.warm_pool,
        instance_starts_by_wake=instance_starts,
        keep_alive_log=keep_alive_log,
    )


def _wakes(jobs: list[Job], desired_log: list[tuple[float, int]]) -> list[float]:
    """For each time the service sat at zero and a job came: seconds from that job's submission to the desired count
    leaving zero (the first submit to task requested)."""
    wakes = []
    zero_since = 0.0 if desired_log and desired_log[0][1] == 0 else None
    log = list(desired_log)
    cursor = 0
    for job in sorted(jobs, key=lambda j: j.submitted_s):
        while cursor < len(log) and log[cursor][0] <= job.submitted_s:
            zero_since = log[cursor][0] if log[cursor][1] == 0 else None
            cursor += 1
        if zero_since is None:
            continue
        rise = next((t for t, v in log[cursor:] if v > 0), None)
        if rise is None:
            wakes.append(math.inf)
            break
        wakes.append(rise - job.submitted_s)
        zero_since = None
        while cursor < len(log) and log[cursor][0] <= rise:
            cursor += 1
    return wakes
