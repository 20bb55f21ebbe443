"""Core of the asynchronous LLM inference service.

Imported by the Lambdas, the GPU worker, the CLI, the local runtime and the CDK stack. Nothing here needs AWS to
import: the job model, its state machine, the wire schemas and the settings shared by code and infrastructure live in
plain modules; the AWS adapters (``async_inference.aws``) import boto3 only when used.
"""
