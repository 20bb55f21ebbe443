"""The whole service on one machine: moto server as AWS, the same Lambda handlers behind a local HTTP gateway, the S3
upload and DLQ events delivered to their handlers, and worker processes."""
