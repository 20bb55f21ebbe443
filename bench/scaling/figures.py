"""Every default the simulator uses that is not read from the template or the manifests, each with where it comes from.

A figure is either published (the document is named) or reported (an issue thread that measured it); none is
measured on this project's machines, which have no GPU. Those that decide a result can be overridden from the command
line (``python -m bench.scaling --help``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from async_inference import settings
from cdk.capacity import QWEN2_5_1_5B

# --- CloudWatch and SQS ---------------------------------------------------------------------------------------------
# SQS pushes its metrics to CloudWatch at one-minute intervals, for queues CloudWatch considers active: for up to six
# hours after the queue held a message or any API action touched it (SQS Developer Guide, "Monitoring Amazon SQS queues
# using CloudWatch"; "All metrics emit non-negative values only when the queue is active", "Available CloudWatch
# metrics for Amazon SQS").
SQS_METRIC_PERIOD_S = 60
SQS_INACTIVE_AFTER_S = 6 * 3600
# How long after a period ends its SQS datapoint is there for alarms. Not published; 0 is the most favourable value
# for every policy that waits on CloudWatch (copilot-cli#3376 reports about 3 minutes to scale out on a 3-datapoint
# alarm, which 0 reproduces). Sensitivity rows run 60 and 120 s.
SQS_PUBLICATION_DELAY_S = 0.0
# Extra time before metrics resume once an inactive queue (six hours without activity) is used again: "up to 15
# minutes" (SQS Developer Guide, "Monitoring Amazon SQS queues using CloudWatch", the note on inactive queues). The
# fair table uses 0, the value most favourable to the CloudWatch-driven anchors; the hazard scenarios and a
# sensitivity row use the documented 900 s.
SQS_RESUME_DELAY_S = 0.0
SQS_RESUME_DELAY_DOCUMENTED_S = 900.0
# Container Insights (ECS/ContainerInsights DesiredTaskCount, RunningTaskCount) arrives from the ECS agent's performance
# log events, one log stream per container instance ("AgentTelemetry-<container instance id>", CloudWatch User Guide,
# "Container Insights performance log events for Amazon ECS"), aggregated per minute. How long after the minute it is
# there for alarms is not published: 0 here, 60 and 120 s as sensitivity rows.
CONTAINER_INSIGHTS_DELAY_S = 0.0
# Whether DesiredTaskCount is published while the service's only task is still starting (no container instance yet
# runs a task, so no agent writes a performance event for it). The documentation does not say; the simulator runs both,
# and the fair table takes the unfavourable reading (not published) for every policy that reads it.
DESIRED_PUBLISHED_WHILE_STARTING = False
# CloudWatch fetches more datapoints than the alarm's evaluation periods when some are missing (its "evaluation
# range"); for one-minute alarms with 3 evaluation periods it retrieves 5 (CloudWatch User Guide, "Using Amazon
# CloudWatch alarms", how alarm state is evaluated when data is missing).
EVALUATION_RANGE_EXTRA_PERIODS = 2
# Alarms with Auto Scaling actions invoke them again every period the alarm stays in the state (same page).

# --- Application Auto Scaling ---------------------------------------------------------------------------------------
# Target tracking: the policy's alarms scale out after 3 one-minute datapoints above the target and in after 15 below
# 90 % of it (the "AlarmHigh"/"AlarmLow" alarms App Auto Scaling creates: "CPUUtilization > 50 for 3 datapoints within
# 3 minutes", "< 45 for 15 datapoints within 15 minutes"; scale-in only "when utilization passes a threshold ... usually
# more than 10% lower", Application Auto Scaling User Guide, "Target tracking scaling policies").
TARGET_TRACKING_OUT_DATAPOINTS = 3
TARGET_TRACKING_IN_DATAPOINTS = 15
TARGET_TRACKING_IN_FRACTION = 0.9
# Cooldown when a policy gives none: 300 s for ECS services and SageMaker variants (TargetTrackingScalingPolicyConfig
# and StepScalingPolicyConfiguration, Application Auto Scaling API Reference).
DEFAULT_COOLDOWN_S = 300

# --- ECS cluster auto scaling (capacity provider managed scaling) ----------------------------------------------------
# ECS computes CapacityProviderReservation every minute; scale-out follows from one datapoint above the target capacity
# ("Deep dive on Amazon ECS cluster auto scaling", AWS Containers blog); scale-in needs 15 datapoints (15 minutes);
# a new scale-out waits until every launched instance is past instanceWarmupPeriod, 300 s by default (ECS Developer
# Guide, "Amazon ECS cluster auto scaling").
MANAGED_SCALING_PERIOD_S = 60
MANAGED_SCALING_OUT_DATAPOINTS = 1
MANAGED_SCALING_IN_DATAPOINTS = 15
INSTANCE_WARMUP_S = 300

# --- Cold start ------------------------------------------------------------------------------------------------------
# A GPU VM takes 2-5 minutes to be provisioned and boot with drivers (vllm-project/vllm#41893); the lower end.
INSTANCE_BOOT_S = 120.0
# vLLM's image is about 12 GB compressed (vllm-project/vllm#27154); pulling and extracting it takes about 5 minutes
# (vllm-project/vllm#41893).
IMAGE_PULL_S = 300.0
# The instance's root volume, which holds the image, the weights (the task's host volume) and vLLM's compile cache: the
# template's gp3 sets no throughput, so it has gp3's baseline of 125 MiB/s (EBS User Guide, "General Purpose SSD
# volumes": gp3 "a consistent baseline throughput performance of 125 MiB/s"). It caps what is written to it and, on an
# instance just started from stopped (its page cache empty), what is read from it.
VOLUME_BYTES_PER_S = 125 * 2**20
# g5.xlarge: "up to 10 Gbps", 2.5 Gbps baseline (EC2 instance network specifications); the weights download from the
# hub at the baseline rate, written to the root volume at its rate: seconds = weight bytes / the slower of the two.
MODEL_DOWNLOAD_BYTES_PER_S = min(2.5e9 / 8, VOLUME_BYTES_PER_S)
# Engine start once the weights are on disk: 59 s from start to first response for a 3.4 GiB model with a warm
# torch.compile cache (load 0.9 s, compile 7.5 s, CUDA graphs 17 s, engine init 34 s; vllm-project/vllm#20264). The
# 0.9 s load read the weights from memory or a fast disk; an instance just started from the warm pool reads them from
# its root volume instead (ColdStart.volume_read_s replaces the load).
ENGINE_START_S = 59.0
ENGINE_LOAD_S = 0.9
# The API's wake: DescribeServices and UpdateService, then DescribeAutoScalingGroups and SetDesiredCapacity, each a
# regional API call the ECS / Auto Scaling client makes once (no retry, 1 s connect and 2 s read timeouts: the
# adapter's). No latency is published for them; 0.1 s each is an assumption, and it is small beside every other step.
API_CALL_S = 0.1

# A warm pool's instance is pre-initialized before it is stopped (cdk/gpu_capacity.py: a launch lifecycle hook holds it
# while its user data pulls the image and fetches the weights onto the task's host volume), so its stopped EBS volume
# holds both ("Warm pools for Amazon EC2 Auto Scaling": instances in a Stopped pool pay only for their volumes); not
# vLLM's compile cache (no engine ran). Initializing one costs a fresh instance's boot, image pull and download, billed.
# Starting one from the pool: 36 s from the scale-out to InService, the one published measurement of a start from a
# Stopped warm pool (AWS's own example, aws-samples/amazon-ec2-auto-scaling-group-examples, features/warm-pools/
# README.md: "Launching a new EC2 instance from warm pool ... Duration: 36s", against 243 s for a launch into the group
# with its bootstrap), with a per-boot user-data script that completes the launch hook, as here. It is a t2.micro, not
# a g5 with its NVIDIA driver; the sensitivity rows run 80 s (keikoproj/instance-manager#277: an EKS node of unstated
# type joined its cluster 80 s after a stopped warm-pool start, 110 s after a fresh launch) and 120 s (a fresh GPU
# instance's boot, INSTANCE_BOOT_S).
WARM_POOL_START_S = 36.0
WARM_POOL_START_SENSITIVITY_S = (80.0, INSTANCE_BOOT_S)
# vLLM's torch.compile on an instance whose compile cache (VLLM_CACHE_ROOT on the host volume) is empty: a fresh
# instance, or one started from the pool (pre-initialization runs no engine). ENGINE_START_S was measured with the cache
# warm. For Meta-Llama-3-8B, compiling the graph took 14.77 s cold (vllm-project/vllm#11005) against 4.19 s loading it
# from the cache (vllm-project/vllm#16848), and Triton's kernel compilation added 5 s to the CUDA graph capture
# (vllm-project/vllm#11005), which the cache also holds: 15.6 s more without the cache. An 8B model's figure; the
# 1.5B model has as many distinct graphs per layer and fewer layers (28 against 32), so it is not smaller by much.
COMPILE_CACHE_MISS_S = (14.77 - 4.19) + 5.0
# gp3 storage for a stopped instance's root volume (Amazon EBS pricing, us-east-1): $0.08 per GiB-month.
EBS_GP3_GIB_MONTH_USD = 0.08
# ECS managed scaling keeps an empty instance until 15 CapacityProviderReservation datapoints fall below the target;
# the stack's instance release (cdk/instance_release.py) instead checks every minute and releases an instance that
# runs no task (after draining it and checking again). Seconds between two checks:
INSTANCE_RELEASE_CHECK_S = 60.0

# --- Engine (roofline plus a per-step overhead, calibrated) ---------------------------------------------------------
# A vLLM step = the bytes it reads (weights + KV cache) at a fraction e of peak bandwidth, or its FLOPs at a fraction
# of peak compute when that is slower, plus a fixed per-step overhead c (scheduling, sampling, kernel launches: the
# part that does not shrink with the model). e and c are fitted to two published vLLM serving runs at concurrency 1
# (a decode step then reads the weights and little else), on GPUs of the A10G's class (GDDR6, 24-48 GB), both vLLM
# 0.23.0, BF16, Qwen2.5 models (the deployed model's family):
# * NVIDIA RTX A6000 (GA102, the A10G's chip family; 768 GB/s), Qwen2.5-7B-Instruct (7.62B parameters): TPOT p50
#   21.9 ms at concurrency 1 ("Inference Benchmark Report", ld-singh.github.io/ai-factory-ops-lab, 2026-06-27);
# * NVIDIA L4 (300 GB/s), Qwen2.5-0.5B-Instruct (0.494B parameters): ITL p50 5.1 ms at concurrency 1 (ai.wmx.dev
#   "benchmarks", vllm bench serve, 256 tokens in, 128 out).
# No published vLLM figure for Qwen2.5-1.5B on an A10G itself was found. The fit gives e = 0.98 and c = 1.75 ms; on
# the A10G a batch-1 step of Qwen2.5-1.5B is then 7.0 ms (143 tokens/s). The two points fix the weight-read part and
# the overhead; the KV-cache read at large batches gets the same e (unchecked: no published run gives its context).
CALIBRATION_RUNS = (
    # (label, parameters, peak bandwidth bytes/s, published seconds per decode step at concurrency 1)
    ("RTX A6000, Qwen2.5-7B-Instruct, vLLM 0.23.0", 7.62e9, 768e9, 0.0219),
    ("L4, Qwen2.5-0.5B-Instruct, vLLM 0.23.0", 0.494e9, 300e9, 0.0051),
)


def calibrate(runs=CALIBRATION_RUNS) -> tuple[float, float]:
    """(bandwidth efficiency e, per-step overhead c in s) from two concurrency-1 decode steps: step = 2 P / (B e) + c
    (BF16 weights, 2 bytes a parameter)."""
    (_, p1, b1, t1), (_, p2, b2, t2) = runs
    x1, x2 = 2 * p1 / b1, 2 * p2 / b2  # seconds to read the weights at peak bandwidth
    inverse_e = (t1 - t2) / (x1 - x2)
    return 1 / inverse_e, t1 - x1 * inverse_e


BANDWIDTH_EFFICIENCY, STEP_OVERHEAD_S = calibrate()
# Compute (prefill) is not calibrated on this class: no published run separates prefill time from the serving
# overheads in its time to first token. The fraction of peak compute vLLM reaches comes from one published serving
# table of a larger model on another GPU (tenstorrent/tt-inference-server#143, Qwen2.5-72B on 2xH100: 1,024-token
# prefill at 7,924 tokens/s against 2 x 989 dense TFLOPS: 0.58). The "engine at half efficiency" row halves both
# fractions and doubles the overhead (every step twice as long).
COMPUTE_EFFICIENCY = 0.58
# Tokens vLLM schedules in one step (chunked prefill budget): SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS, what
# an engine built outside the OpenAI server gets on GPUs under 70 GiB (vllm/engine/arg_utils.py).
MAX_NUM_BATCHED_TOKENS = 2048

# --- The worker (gpu_worker/worker.py) -----------------------------------------------------------------------------
# Messages held beyond the engine's batch: max(10, capacity // 2) (WorkerConfig.held_messages).
RECEIVE_BATCH = settings.RECEIVE_BATCH_SIZE
RECEIVE_WAIT_S = settings.RECEIVE_WAIT_TIME_S
DRAIN_TIMEOUT_S = 90.0  # WorkerConfig.drain_timeout_s
RECEIVERS_MAX = 4  # Worker.run: min(4, ceil(capacity / 10)) receive loops
# A task's CPU use, for CPU target tracking: vLLM's engine core is one busy-looping process while it has work
# (1 vCPU), the worker's asyncio loop a fraction of another. Not published; stated here so it can be argued with.
CPU_VCPUS_BUSY = 1.2
CPU_VCPUS_IDLE = 0.1

# --- KEDA and the HPA ------------------------------------------------------------------------------------------------
# HPA: sync every 15 s, 10 % tolerance, scale-down stabilization 300 s, scale-up at most max(4 pods, 100 %) per 15 s
# (Kubernetes "Horizontal Pod Autoscaling" docs; kube-controller-manager defaults).
HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1
HPA_SCALE_DOWN_STABILIZATION_S = 300.0
HPA_SCALE_UP_PODS = 4
HPA_SCALE_UP_PERCENT = 100

# --- Prices (USD, us-east-1, list prices as published on 2025-01-01; re-check before quoting) ------------------------
PRICE_DATE = "2025-01-01"
GPU_HOURLY_USD = {"g5.xlarge": 1.006, "g5.2xlarge": 1.212}  # Amazon EC2 On-Demand pricing, Linux
SQS_PER_MILLION = 0.40  # standard queue requests, after the free tier
SNS_PUBLISH_PER_MILLION = 0.50
S3_PUT_PER_MILLION = 5.00  # S3 Standard PUT/COPY/POST/LIST, $0.005 per 1,000
S3_GET_PER_MILLION = 0.40  # S3 Standard GET, $0.0004 per 1,000
DYNAMODB_WRITE_PER_MILLION = 0.625  # on-demand write request units (price since 2024-11-01)
API_GATEWAY_REST_PER_MILLION = 3.50  # REST API, first 333 million
LAMBDA_REQUEST_PER_MILLION = 0.20  # requests only; duration is compute and not counted here
CLOUDWATCH_ALARM_METRIC_MONTH = 0.10  # standard-resolution alarm, per metric in it
CLOUDWATCH_CUSTOM_METRIC_MONTH = 0.30
CLOUDWATCH_PUT_PER_THOUSAND = 0.01
# The idle floor: what the stack costs per hour with no job at all, the same for every policy on ECS (us-east-1):
# one NAT gateway $0.045/h (Amazon VPC pricing), three interface endpoints (ECR API, ECR Docker, Logs) in two zones at
# $0.01/h each (AWS PrivateLink pricing), and CloudWatch Logs for the flow logs and idle Lambda/worker logs, taken as
# 1 GiB a day at $0.50/GiB ingested (0.021 $/h). KEDA on EKS pays the EKS control plane, $0.10/h (Amazon EKS pricing).
NAT_GATEWAY_HOURLY_USD = 0.045
INTERFACE_ENDPOINT_HOURLY_USD = 0.01
INTERFACE_ENDPOINTS = 3 * 2
LOGS_HOURLY_USD = 0.5 / 24
EKS_CONTROL_PLANE_HOURLY_USD = 0.10


def idle_floor_hourly_usd(*, eks: bool = False) -> float:
    """The stack's cost per hour without a job (network and logs), plus EKS's control plane for the KEDA policy."""
    floor = NAT_GATEWAY_HOURLY_USD + INTERFACE_ENDPOINT_HOURLY_USD * INTERFACE_ENDPOINTS + LOGS_HOURLY_USD
    return floor + (EKS_CONTROL_PLANE_HOURLY_USD if eks else 0.0)


HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class ColdStart:
    """Seconds from an instance launch request to a task that serves: boot, image pull, weights, engine start (and
    vLLM's compile when the instance's compile cache is empty).

    ``total_s`` (a measured cold start, ``--cold-start-s``) replaces the sum for a task on a fresh instance; a task
    on an instance that already pulled the image and keeps the weights on its host volume pays only the engine start.
    """

    instance_boot_s: float = INSTANCE_BOOT_S
    image_pull_s: float = IMAGE_PULL_S
    model_download_s: float = QWEN2_5_1_5B.weight_bytes() / MODEL_DOWNLOAD_BYTES_PER_S
    engine_start_s: float = ENGINE_START_S
    total_s: float | None = None
    warm_pool_start_s: float = WARM_POOL_START_S  # a stopped warm-pool instance's start (its volume holds the rest)
    compile_miss_s: float = COMPILE_CACHE_MISS_S  # the first task on an instance without vLLM's compile cache
    # The weights read from the root volume by the first task after a start from stopped (replacing the engine's own
    # 0.9 s load, which read them from memory).
    volume_read_s: float = QWEN2_5_1_5B.weight_bytes() / VOLUME_BYTES_PER_S
    engine_load_s: float = ENGINE_LOAD_S

    def fresh_task_s(self) -> float:
        """A task on a new instance, after the instance booted."""
        if self.total_s is not None:
            return max(0.0, self.total_s - self.instance_boot_s)
        return self.image_pull_s + self.model_download_s + self.engine_start_s + self.compile_miss_s

    def pool_init_s(self, *, pre_initialized: bool) -> float:
        """An instance launched into the warm pool, running (billed) until it is stopped: its boot, and with
        pre-initialization the image pull and the weights' download its launch hook waits for."""
        return self.instance_boot_s + (self.image_pull_s + self.model_download_s if pre_initialized else 0.0)

    def warm_task_s(self, *, weights_cached: bool, page_cache_cold: bool = False, compile_cached: bool = True) -> float:
        """A task on an instance whose volume holds the image (it ran a task, or a pre-initialized pool instance);
        the weights too when the host volume keeps them. On an instance just started from stopped
        (``page_cache_cold``) cached weights are read from the root volume; without vLLM's compile cache
        (``compile_cached`` False: no engine ran on the instance yet) the engine compiles."""
        compile_s = 0.0 if compile_cached else self.compile_miss_s
        if not weights_cached:
            return self.engine_start_s + self.model_download_s + compile_s
        if page_cache_cold:
            return self.engine_start_s - self.engine_load_s + self.volume_read_s + compile_s
        return self.engine_start_s + compile_s


@dataclass(frozen=True)
class RequestCounts:
    """AWS requests one job makes outside the GPU, by price class (from the design of the API and the worker, with
    the batches ``make bench`` measured: receive, delete and visibility in tens)."""

    api_gateway: float = 1.0
    lambda_invocations: float = 1.0
    s3_put: float = 2.0  # request body (API), result (worker)
    s3_get: float = 1.0  # request body (worker)
    dynamodb_writes: float = 4.0  # create (API); running, final state, notified (worker)
    sqs: float = 1.0 + 0.1 + 0.1 + 0.1  # send; receive, delete, visibility in batches of 10
    sns: float = 1.0  # the result notification (PublishBatch bills per message)
    extra: dict[str, float] = field(default_factory=dict)

    def cost_usd(self) -> float:
        return (
            self.api_gateway * API_GATEWAY_REST_PER_MILLION
            + self.lambda_invocations * LAMBDA_REQUEST_PER_MILLION
            + self.s3_put * S3_PUT_PER_MILLION
            + self.s3_get * S3_GET_PER_MILLION
            + self.dynamodb_writes * DYNAMODB_WRITE_PER_MILLION
            + self.sqs * SQS_PER_MILLION
            + self.sns * SNS_PUBLISH_PER_MILLION
        ) / 1e6
