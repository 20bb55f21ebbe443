"""Development checks of the engines on real vLLM (``make vllm-cpu-check``, ``make gpu-check``). Not shipped in the
worker image, and nothing under ``gpu_worker`` imports from here; they import the local stack (``local_runtime``)
to run the worker against it. Run from the repository root: ``python -m checks.<module>``."""
