"""The API contract's limits that the client needs too; ``async_inference.settings`` imports them from here, so the
two sides share one value."""

from __future__ import annotations

# POST /v1/files carries the file through API Gateway (10 MB) and a synchronous Lambda invocation (6 MB of event,
# the multipart body base64-encoded in it: 4/3 of its size, plus the headers): 4 MiB of file fits both with room. Larger
# files, up to settings.BATCH_MAX_FILE_BYTES, take the presigned-upload path (POST /v1/files/uploads, an extension).
MAX_FILE_INLINE_BYTES = 4 * 1024 * 1024
BATCH_ENDPOINT = "/v1/chat/completions"  # the one endpoint a batch's lines may name
WS_MAX_JOB_IDS_PER_SUBSCRIBE = 100  # one WebSocket subscribe message
