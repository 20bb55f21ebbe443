"""The wire objects the SDK sends and reads: jobs (``jobs``), their results (``chat``, ``embeddings``), files and batches
(``batches``). The server imports these same models (``async_inference.schemas``, ``async_inference.batches.models``),
so what the API answers and what the client parses cannot drift apart."""
