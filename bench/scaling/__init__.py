"""A discrete-event simulator of the GPU workers' whole scaling loop, driven by a request trace (``make simulate``).

Modules, in the order a job meets them:

- ``trace``: the request trace (arrivals and token counts).
- ``queue``: the SQS queue (visible and in-flight messages, activity for the metric pause).
- ``cloudwatch``: metric publication (periods, delay, the idle-queue pause) and alarm evaluation.
- ``autoscaling``: Application Auto Scaling step and target tracking semantics.
- ``ecs``: the ECS service, task protection, capacity provider managed scaling, instances and cold starts, the warm
  pool and the release of empty instances.
- ``engine``: vLLM's throughput as a function of batch and context (a roofline), one engine per task.
- ``worker``: the worker's receive loop, prefetch and drain.
- ``keda``: KEDA's aws-sqs-queue scaler and the HPA it drives.
- ``template``: the scaling policy read from a synthesized CloudFormation template.
- ``policies``: the policies compared (deployed; aws-cdk-lib's QueueProcessingEc2Service, SageMaker Async and KEDA,
  each at its default and its tuning).
- ``hazards``: the three scale-to-zero hazards, each a scenario run on the deployed template and with its fix undone.
- ``simulation``: one run of one policy; ``costs`` and ``report`` turn runs into figures and a plot.
- ``figures``: every default that is not read from the template, with its source.
"""
