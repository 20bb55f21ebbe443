# The scaling simulator, not part of `make test`: the deployed policy (read from the synthesized template) and four
# others on the Azure LLM inference conversation trace, side by side. Figures and a plot in bench/results/; the last
# line printed is one JSON object keyed by policy. `python -m bench.scaling --help` for other traces and inputs.
.PHONY: simulate
simulate: venv
	$(PY) -m bench.scaling
