# Soak, not part of `make test`: 10,000 jobs through the local stack with the echo engine and three workers, one
# killed with SIGKILL at 3,000 and replaced (about 18 minutes on two cores, bound by moto server's one process).
# Figures in bench/results/soak.json; `python -m bench.soak --help` for a shorter run.
.PHONY: soak
soak: venv
	$(PY) -m bench.soak
