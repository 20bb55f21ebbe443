"""The OpenAI Batch and Files APIs on this service (docs/design/batches.md, docs/batches.md).

``models`` (wire objects and records), ``store`` (the batch table), ``aws`` (S3, SQS, SNS), ``planning`` (validating
and chunking an input file), ``service`` (the API side), ``controller`` (plan and finalize), ``multipart`` (the
Files API's upload body).
"""
