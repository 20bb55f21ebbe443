# CDK targets, included by the top-level Makefile. `make synth` works on a fresh machine: it builds the venv, installs
# the pinned CDK CLI from package-lock.json, synthesizes with cdk-nag's AwsSolutions checks (any unacknowledged error
# fails the synth) and lints the templates with cfn-lint (errors fail; warnings are printed).
#
# cdk.out/ is also what `make up` and `make demo` deploy locally, so it is a file target: synthesized again whenever
# the app, its context or any code that goes into an asset changed.
NPX := npx --no-install
ASSEMBLY := cdk.out/manifest.json
CDK_INPUTS := app.py cdk.json lambdas/requirements.txt gpu_worker/requirements.txt \
	$(shell git ls-files -co --exclude-standard -- cdk async_inference lambdas gpu_worker 2>/dev/null)

.PHONY: synth cdk-lint cdk-test deploy smoke

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

$(ASSEMBLY): $(VENV)/.installed node_modules/.installed $(CDK_INPUTS)
	$(NPX) cdk synth --quiet --output cdk.out
	touch $@

# `make demo`'s assembly: the same app with a second model, the embedding model all-MiniLM-L6-v2 (its own fleet),
# so that the demo shows an embeddings job beside the chat jobs. The default deploy serves the one chat model. Its
# max_num_seqs is the embedding engine's default of 256 in flight, from which each pass takes 32 of similar length.
DEMO_ASSEMBLY := cdk.out.demo/manifest.json
DEMO_MODELS := [{"name": "Qwen/Qwen2.5-1.5B-Instruct"}, {"name": "sentence-transformers/all-MiniLM-L6-v2", \
	"kind": "embedding", "max_num_seqs": 256, "max_worker_tasks": 1, "max_gpu_instances": 1}]

$(DEMO_ASSEMBLY): $(VENV)/.installed node_modules/.installed $(CDK_INPUTS)
	$(NPX) cdk synth --quiet --output cdk.out.demo -c models='$(DEMO_MODELS)'
	touch $@

synth: $(ASSEMBLY)
	$(MAKE) cdk-lint

# A deploy, gated: the preflight reads every GPU fleet and warm pool from the synthesized template, checks the account
# (G/VT vCPU quota, ECS's service-linked role, Lambda concurrency, zones, bootstrap, Docker) and exits 1 on anything
# missing, printing how to fix it, so `cdk deploy` of that same assembly runs only on a ready account. The options
# (context) are cdk.json's, read by the synth; DEPLOY_ARGS passes cdk deploy's own (--profile, --require-approval).
STACK_TEMPLATE := cdk.out/AsyncInference.template.json
deploy: $(ASSEMBLY)
	$(PY) -m async_inference.cli preflight --template $(STACK_TEMPLATE)
	$(NPX) cdk deploy --app cdk.out $(DEPLOY_ARGS)

# After a deploy: one job through the deployed stack, with the caller's AWS credentials (the stack's outputs and a
# tenant's key) and the first answer, timed: the deploy itself starts no GPU task. SMOKE_ARGS: --tenant, --model,
# --stack-name, --timeout (async_inference/smoke.py).
smoke: venv
	$(PY) -m async_inference.cli smoke $(SMOKE_ARGS)

# W3005 (DependsOn already implied by a GetAtt) is how aws-cdk-lib writes every Lambda's role dependency; not ours.
cdk-lint: venv
	$(VENV)/bin/cfn-lint --non-zero-exit-code error --ignore-checks W3005 -- cdk.out/*.template.json

cdk-test: venv
	$(PY) -m pytest tests/cdk
