# Soak, not part of `make test`: 10,000 jobs through the local stack with the echo engine and three workers, one
# killed with SIGKILL and replaced along the way (about 10 minutes on two cores). Figures in bench/results/soak.json.
.PHONY: soak
soak: venv
	$(PY) -m bench.soak
