# Benchmarks, not part of `make test`: each prints ratios measured side by side in one run, writes its figures to
# bench/results/ and ends with one JSON line.
.PHONY: bench
bench: venv
	$(PY) -m bench.run

-include bench/soak.mk
-include bench/scaling.mk

# What each attack of issue 30 costs another tenant's job on the CPU engine (bench/attacks.py): ratios, goal <= 2.
.PHONY: bench-attacks
bench-attacks: venv
	$(PY) -m bench.attacks

# The same engine attacks through the local stack (the API, moto, one CPU-engine worker): bench/attacks_stack.py.
.PHONY: bench-attacks-stack
bench-attacks-stack: venv
	$(PY) -m bench.attacks_stack

# The CPU engine's decoding step and batch with its narrow linear layers against torch.nn.Linear's (bench/cpu_engine_steps.py).
.PHONY: bench-cpu-engine
bench-cpu-engine: venv
	$(PY) -m bench.cpu_engine_steps
