"""The CDK app that deploys the asynchronous inference service to AWS.

One construct per concern, each in its own module; :class:`cdk.service.AsyncInferenceService` composes them and wires
permissions with ``grant_*``; :mod:`cdk.stack` places that one construct in a stack with its outputs.
"""
