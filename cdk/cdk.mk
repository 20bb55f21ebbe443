# CDK targets, included by the top-level Makefile. `make synth` works on a fresh machine: it builds the venv, installs
# the pinned CDK CLI from package-lock.json, synthesizes with cdk-nag's AwsSolutions checks (any unacknowledged error
# fails the synth) and lints the templates with cfn-lint (errors fail; warnings are printed).
NPX := npx --no-install

.PHONY: synth cdk-lint cdk-test

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

synth: venv node_modules/.installed
	$(NPX) cdk synth --quiet --output cdk.out
	$(MAKE) cdk-lint

# W3005 (DependsOn already implied by a GetAtt) is how aws-cdk-lib writes every Lambda's role dependency; not ours.
cdk-lint: venv
	$(VENV)/bin/cfn-lint --non-zero-exit-code error --ignore-checks W3005 -- cdk.out/*.template.json

cdk-test: venv
	$(PY) -m pytest tests/cdk
