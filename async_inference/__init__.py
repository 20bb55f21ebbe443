"""Core of the asynchronous LLM inference service.

Imported by the Lambdas, the GPU worker, the operator CLI, the local runtime and the CDK stack. Nothing here but the
AWS adapters needs AWS to import: the job model, its state machine, the wire schemas and the settings shared by code
and infrastructure live in plain modules; the adapters (``aws.py``, ``batches/aws.py``, ``batches/store.py``) import
boto3. The wire objects a client reads come from the client package, ``async_inference_client``.
"""
