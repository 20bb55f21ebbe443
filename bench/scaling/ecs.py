"""ECS on EC2: the service's tasks, the Auto Scaling group of GPU instances and capacity provider managed scaling.

* The service keeps ``desired`` tasks. A new task waits (PROVISIONING) for an instance with a free GPU, then starts:
  on an instance's first task it pulls the image and downloads the weights, later tasks only start the engine (and
  download the weights again unless the task definition keeps them on a host volume). When desired falls, ECS stops
  tasks not yet running first, then running ones, never one that holds task protection; those wait until their
  protection clears. A stopped task drains (the worker's SIGTERM handling) before its GPU is free.
* Managed scaling (ECS Developer Guide, "Amazon ECS cluster auto scaling"): every minute ECS computes
  CapacityProviderReservation = 100 x instances needed / instances in the group (200 when the group is empty and a task
  waits); one datapoint above ``target_capacity`` sets the group's desired capacity to the instances needed, unless an
  instance launched within the warm-up period (300 s) blocks further scale-out; 15 datapoints below it terminate the
  empty instances (managed termination protection keeps the others). An instance bills from its launch request to
  its termination: that is a GPU hour, whether or not a task runs on it.
* The stack's capacity choices, when its template has them: a warm pool of stopped instances (``warm_pool``) that
  start in ``ColdStart.warm_pool_start_s``; and the instance release (``release_empty``), which every
  ``INSTANCE_RELEASE_CHECK_S`` terminates the instances that run no task, never one that runs a task. A pool instance
  holds the image and the weights when the pool pre-initializes it (``pool_pre_initialized``: the template's launch
  lifecycle hook, whose user data pulls them before the instance is stopped); otherwise its first task pulls and
  downloads like a fresh instance's. Either way it holds no vLLM compile cache. The pool holds MAX(MinSize,
  ``warm_pool`` - instances in service) (``pool_min_size``; PutWarmPool, EC2 Auto Scaling API Reference): with a
  MinSize of ``warm_pool`` an instance that leaves it is replaced at once, with none only when the group scales back
  in. A replacement is billed while it initializes (``ColdStart.pool_init_s``) and is in the pool once stopped. The first task after a start from stopped
  reads the weights from the root volume (its page cache is empty).
* The wake's instance start (``start_instance``): the API raises the group from 0 to 1 itself, before managed scaling's
  next minute; managed scaling then counts that instance as the one it needs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from bench.scaling.cloudwatch import Alarm, MetricId, MetricQuery, MetricStat, MetricStore, Sources
from bench.scaling.figures import (
    INSTANCE_WARMUP_S,
    MANAGED_SCALING_IN_DATAPOINTS,
    MANAGED_SCALING_OUT_DATAPOINTS,
    MANAGED_SCALING_PERIOD_S,
    ColdStart,
)
from bench.scaling.worker import Worker

CPR = MetricId("AWS/ECS/ManagedScaling", "CapacityProviderReservation")
# ECS's managed scaling minute is not CloudWatch's alarm minute; half a minute apart keeps the simulation from lining
# up a scale-out alarm and an instance launch by accident.
MANAGED_SCALING_PHASE_S = 30.0


@dataclass
class Instance:
    index: int
    requested_s: float
    gpus: int
    ready_s: float | None = None
    terminated_s: float | None = None
    image_cached: bool = False
    weights_cached: bool = False
    from_pool: bool = False
    page_cache_cold: bool = False  # just started from stopped: cached weights come from the root volume
    compile_cached: bool = False  # vLLM's compile cache on the host volume (written by the instance's first task)
    tasks: list[Task] = field(default_factory=list)

    @property
    def free_gpus(self) -> int:
        return self.gpus - len(self.tasks)


@dataclass
class Task:
    index: int
    created_s: float
    state: str = "PROVISIONING"  # PROVISIONING -> STARTING -> RUNNING -> STOPPING -> STOPPED
    instance: Instance | None = None
    worker: Worker | None = None
    running_s: float | None = None
    stopped_s: float | None = None
    stop_requested: bool = False


@dataclass(frozen=True)
class ClusterConfig:
    """What the template says about capacity: the group's maximum, GPUs per instance, managed scaling's target."""

    max_instances: int
    gpus_per_instance: int = 1
    target_capacity: float = 100.0
    weights_on_host: bool = True
    uses_task_protection: bool = True
    instance_warmup_s: float = INSTANCE_WARMUP_S
    warm_pool: int = 0  # stopped, pre-initialized instances kept beside the group while it is at zero
    # The pool's MinSize (None: warm_pool, a pool of fixed size). The pool holds MAX(MinSize, warm_pool - instances in
    # service): warm_pool is its MaxGroupPreparedCapacity, or the group's MaxSize where the template sets none.
    pool_min_size: int | None = None
    pool_pre_initialized: bool = True  # the pool's launch hook holds an instance until it pulled the image and weights
    release_empty: bool = False  # the stack's instance release instead of managed scaling's 15-minute scale-in


class Cluster:
    """One ECS service on one capacity provider's Auto Scaling group."""

    def __init__(
        self,
        env: simpy.Environment,
        config: ClusterConfig,
        cold: ColdStart,
        make_worker: Callable[[Task], Worker],
        on_change: Callable[[], None],
    ) -> None:
        self.env = env
        self.config = config
        self.cold = cold
        self.make_worker = make_worker
        self.on_change = on_change
        self.desired = 0
        self.tasks: list[Task] = []
        self.instances: list[Instance] = []
        self.desired_log: list[tuple[float, int]] = [(0.0, 0)]
        self.running_log: list[tuple[float, int]] = [(0.0, 0)]
        self.instance_log: list[tuple[float, int]] = [(0.0, 0)]
        self.task_requests: list[float] = []  # times the desired count rose from zero
        self._task_ids = itertools.count()
        self._instance_ids = itertools.count()
        # Stopped instances ready to start, each with whether its volume holds the image and the weights (initialized
        # before the run starts, so not billed in it).
        self.pool: list[bool] = [config.pool_pre_initialized] * config.warm_pool
        self.pool_starts = 0
        self.pool_initializations = 0  # instances launched into the pool during the run (to replace one that left)
        self._pool_initializing = 0
        self.releases = 0
        self._cpr = 100.0
        self._store = MetricStore(Sources({CPR: lambda: self._cpr}))
        query = MetricQuery({"cpr": MetricStat(CPR, "Average", MANAGED_SCALING_PERIOD_S)})
        self.scale_out_alarm = Alarm(
            "ManagedScalingHigh",
            query,
            config.target_capacity,
            "GreaterThanThreshold",
            MANAGED_SCALING_OUT_DATAPOINTS,
            MANAGED_SCALING_OUT_DATAPOINTS,
            actions=("out",),
        )
        self.scale_in_alarm = Alarm(
            "ManagedScalingLow",
            query,
            config.target_capacity,
            "LessThanThreshold",
            MANAGED_SCALING_IN_DATAPOINTS,
            MANAGED_SCALING_IN_DATAPOINTS,
            actions=("in",),
        )

    # --- counts ---------------------------------------------------------------------------------------------------

    def live_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.state != "STOPPED"]

    def running_count(self) -> int:
        return sum(1 for t in self.tasks if t.state == "RUNNING" and not t.stop_requested)

    def live_instances(self) -> list[Instance]:
        return [i for i in self.instances if i.terminated_s is None]

    def _log(self) -> None:
        now = self.env.now
        for log, value in (
            (self.desired_log, self.desired),
            (self.running_log, self.running_count()),
            (self.instance_log, len(self.live_instances())),
        ):
            if log[-1][1] != value:
                log.append((now, value))

    # --- the service ----------------------------------------------------------------------------------------------

    def set_desired(self, count: int, cause: str = "") -> None:
        if count == self.desired:
            return
        if self.desired == 0 and count > 0:
            self.task_requests.append(self.env.now)
        self.desired = count
        self.reconcile()

    def reconcile(self) -> None:
        """Start or stop tasks toward the desired count; place waiting tasks on free GPUs."""
        live = [t for t in self.live_tasks() if not t.stop_requested]
        if len(live) < self.desired:
            for _ in range(self.desired - len(live)):
                self.tasks.append(Task(next(self._task_ids), self.env.now))
        elif len(live) > self.desired:
            surplus = len(live) - self.desired
            order = {"PROVISIONING": 0, "STARTING": 1, "RUNNING": 2}
            candidates = sorted(live, key=lambda t: (order[t.state], t.worker.held if t.worker else 0, -t.created_s))
            for task in candidates:
                if surplus == 0:
                    break
                if task.state == "RUNNING" and self.config.uses_task_protection and task.worker.protected:
                    continue
                self._stop(task)
                surplus -= 1
        self._place()
        self._log()

    def _stop(self, task: Task) -> None:
        task.stop_requested = True
        if task.state == "PROVISIONING":
            self._stopped(task)
        elif task.state == "RUNNING":
            task.state = "STOPPING"
            task.worker.stop()
        # STARTING: stopped when the start completes

    def _stopped(self, task: Task) -> None:
        task.state = "STOPPED"
        task.stopped_s = self.env.now
        if task.instance is not None:
            task.instance.tasks.remove(task)
        self._place()
        self._log()
        self.on_change()

    def _place(self) -> None:
        for task in self.tasks:
            if task.state != "PROVISIONING" or task.stop_requested:
                continue
            instance = next((i for i in self.live_instances() if i.ready_s is not None and i.free_gpus > 0), None)
            if instance is None:
                return
            task.state = "STARTING"
            task.instance = instance
            instance.tasks.append(task)
            self.env.process(self._start(task))

    def _start(self, task: Task):
        instance = task.instance
        if not instance.image_cached:
            seconds = self.cold.fresh_task_s()
        else:
            seconds = self.cold.warm_task_s(
                weights_cached=instance.weights_cached,
                page_cache_cold=instance.page_cache_cold,
                compile_cached=instance.compile_cached,
            )
        instance.page_cache_cold = False
        yield self.env.timeout(seconds)
        instance.image_cached = True
        instance.weights_cached = self.config.weights_on_host
        instance.compile_cached = self.config.weights_on_host  # VLLM_CACHE_ROOT lies under the weights' volume
        if task.stop_requested:
            self._stopped(task)
            return
        task.state = "RUNNING"
        task.running_s = self.env.now
        task.worker = self.make_worker(task)
        self._log()
        self.on_change()

    def prewarm(self, count: int) -> None:
        """Start the run with ``count`` tasks running on ready instances that hold the image and the weights."""
        for _ in range(count):
            instance = Instance(
                next(self._instance_ids),
                self.env.now,
                self.config.gpus_per_instance,
                ready_s=self.env.now,
                image_cached=True,
                weights_cached=True,
                compile_cached=True,
            )
            self.instances.append(instance)
            task = Task(next(self._task_ids), self.env.now, state="RUNNING", instance=instance, running_s=self.env.now)
            instance.tasks.append(task)
            self.tasks.append(task)
            task.worker = self.make_worker(task)
        self.desired = count
        self.desired_log = [(self.env.now, count)]
        self._log()

    def worker_stopped(self, task: Task) -> None:
        self._stopped(task)

    def protection_changed(self) -> None:
        if len([t for t in self.live_tasks() if not t.stop_requested]) > self.desired:
            self.reconcile()

    # --- managed scaling ------------------------------------------------------------------------------------------

    def _instances_needed(self) -> int:
        waiting = sum(1 for t in self.tasks if t.state == "PROVISIONING" and not t.stop_requested)
        busy = sum(1 for i in self.live_instances() if i.tasks)
        free = sum(i.free_gpus for i in self.live_instances() if i.tasks)
        return busy + math.ceil(max(0, waiting - free) / self.config.gpus_per_instance)

    def managed_scaling_tick(self, now: float) -> None:
        """Once a minute (ECS's own minute, ``MANAGED_SCALING_PHASE_S`` after CloudWatch's): publish
        CapacityProviderReservation and act on its two alarms."""
        clock = now - MANAGED_SCALING_PHASE_S
        needed = self._instances_needed()
        current = len(self.live_instances())
        if current == 0:
            self._cpr = 200.0 if needed > 0 else 100.0
        else:
            self._cpr = 100.0 * needed / current
        self._store.sample(clock)
        fire, _ = self.scale_out_alarm.evaluate(self._store, clock)
        if fire:
            warming = any(now - i.requested_s < self.config.instance_warmup_s for i in self.live_instances())
            target = min(self.config.max_instances, needed)
            if not warming and target > current:
                for _ in range(target - current):
                    self._launch()
        fire, _ = self.scale_in_alarm.evaluate(self._store, clock)
        if fire:
            for instance in self.live_instances():
                if not instance.tasks and instance.ready_s is not None:
                    instance.terminated_s = now
            self._refill_pool(now)
        self._log()

    def release_tick(self, now: float) -> None:
        """The stack's instance release: drain every ready instance that runs no task, check again, release it (the
        group terminates it: no ReuseOnScaleIn for a group used by ECS). An instance with a task is never released, and
        nothing is while a task waits to be placed."""
        if not self.config.release_empty:
            return
        if any(t.state == "PROVISIONING" and not t.stop_requested for t in self.tasks):
            return  # a task waits to be placed (async_inference.instance_release: nothing is released then)
        for instance in self.live_instances():
            if instance.ready_s is not None and not instance.tasks:
                instance.terminated_s = now
                self.releases += 1
        self._refill_pool(now)
        self._log()

    def pool_target(self) -> int:
        """The instances the warm pool keeps now: MAX(MinSize, prepared capacity - instances in service) (PutWarmPool,
        EC2 Auto Scaling API Reference)."""
        if not self.config.warm_pool:
            return 0
        min_size = self.config.warm_pool if self.config.pool_min_size is None else self.config.pool_min_size
        return max(min_size, self.config.warm_pool - len(self.live_instances()))

    def _refill_pool(self, now: float) -> None:
        """Launch replacements until the pool, counting those initializing, holds ``pool_target``: each billed while
        it initializes (boot, and with pre-initialization the image pull and the download), in the pool once
        stopped."""
        pre_initialized = self.config.pool_pre_initialized
        init_s = self.cold.pool_init_s(pre_initialized=pre_initialized)
        while len(self.pool) + self._pool_initializing < self.pool_target():
            self.instances.append(
                Instance(
                    next(self._instance_ids),
                    now,
                    self.config.gpus_per_instance,
                    ready_s=now + init_s,
                    terminated_s=now + init_s,  # stopped: its bill ends (its volume is in the idle floor)
                )
            )
            self.pool_initializations += 1
            self._pool_initializing += 1

            def joins():
                yield self.env.timeout(init_s)
                self._pool_initializing -= 1
                self.pool.append(pre_initialized)

            self.env.process(joins())

    def start_instance(self) -> bool:
        """The wake's SetDesiredCapacity: from 0 instances to 1 (from the pool when it has one). True if it launched."""
        if self.live_instances() or self.config.max_instances < 1:
            return False
        self._launch()
        self._log()
        return True

    def _launch(self) -> None:
        from_pool = bool(self.pool)
        holds = self.pool.pop(0) if from_pool else False
        instance = Instance(
            next(self._instance_ids),
            self.env.now,
            self.config.gpus_per_instance,
            image_cached=holds,
            weights_cached=holds,
            from_pool=from_pool,
            page_cache_cold=from_pool,
        )
        self.instances.append(instance)
        if from_pool:
            self.pool_starts += 1
        self._refill_pool(self.env.now)
        self.env.process(self._boot(instance))

    def _boot(self, instance: Instance):
        yield self.env.timeout(self.cold.warm_pool_start_s if instance.from_pool else self.cold.instance_boot_s)
        instance.ready_s = self.env.now
        self._place()

    def gpu_hours(self, end_s: float) -> float:
        return (
            sum(((i.terminated_s if i.terminated_s is not None else end_s) - i.requested_s) for i in self.instances)
            / 3600.0
        )
