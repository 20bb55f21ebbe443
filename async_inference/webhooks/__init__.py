"""Per-job webhooks, one module per job:

* ``url_safety``: which URLs may be called (SSRF checks, at submit time and before every delivery);
* ``signing``: Standard Webhooks signatures, made and verified; fresh secrets;
* ``secrets``: each tenant's signing secrets (Secrets Manager in AWS, inline JSON locally);
* ``backoff``: how long a failed delivery waits before its next try;
* ``events``: the messages on the webhook queue (``started`` from the worker, ``completed`` from the result topic);
* ``delivery``: one signed POST to a checked address;
* ``dispatch``: the dispatcher that turns a message on the webhook queue into a delivery and records it on the job;
* ``receiver``: a small receiving endpoint for local runs, demos and tests;
* ``__main__``: ``python -m async_inference.webhooks verify|receive|new-secret`` (see ``docs/notifications.md``).

How a delivery travels: the result topic feeds the webhook queue (raw delivery), and the worker sends a "started"
event to the same queue. The dispatcher Lambda reads a batch, and for each message whose job asked for that event it
checks the URL again, signs the body with the tenant's secret and POSTs it. A failed POST hides the message for the
backoff of its receive count and reports it failed; SQS redelivers it, and after ``WEBHOOK_MAX_RECEIVE_COUNT``
receives moves it to the webhook DLQ. The result never depends on the webhook: it stays in S3 and on the job.
"""
