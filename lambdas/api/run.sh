#!/bin/sh
# The streaming API function's start command: Lambda Web Adapter (AWS_LAMBDA_EXEC_WRAPPER=/opt/bootstrap) executes it
# and forwards each invocation to the server on $PORT as HTTP (docs/streaming.md, "Transport"). The layers' packages
# and the function's code go on the path as the Python runtime would put them for a handler.
export PYTHONPATH="/opt/python:${LAMBDA_TASK_ROOT}:${PYTHONPATH}"
exec python3 -m uvicorn --host 127.0.0.1 --port "${PORT:-8080}" --no-access-log lambdas.api.streaming_app:app
