# agentruntime — the newcomer's entry points.
#
#   make run     serve the AgentRuntime gRPC service on 127.0.0.1:50051 (embedded scripted model)
#   make test    everything CI runs: generated-code drift, lint, tests
#
# Everything lives in .venv (Python) and .tools (grpcurl); `make clean` removes both.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON      ?= python3
PIP_VERSION := 25.3
GRPCURL     := github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3

VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TOOLS   := $(CURDIR)/.tools/bin
PROTO   := proto/agentruntime/v1/agent_runtime.proto
GEN_OUT := clients/python

.PHONY: test-fast help install tools gen check-gen lint release consumer-tests test test-python conformance-python test-go test-java test-typescript conformance-secure breaking proto-release run grpcurl smoke bench bench-baseline profile clean image image-context image-test local-base container-tools deploy-check browser-tools flake-hunt

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# --- setup -------------------------------------------------------------------

install: $(STAMP) ## create .venv and install the client and the server (with dev tools)

$(STAMP): server/pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==$(PIP_VERSION)
	$(BIN)/pip install -e clients/python -e 'server[dev]'
	touch $@

grpcurl: $(TOOLS)/grpcurl ## install grpcurl into .tools/bin (needs Go)

$(TOOLS)/grpcurl:
	GOBIN=$(TOOLS) go install $(GRPCURL)

# Code generators for buf.gen.yaml (local plugins only).
TS_DIR := clients/typescript
tools: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TS_DIR)/node_modules/.installed ## install the Go and TypeScript generators

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

$(TS_DIR)/node_modules/.installed: $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund
	touch $@

# --- generated code ----------------------------------------------------------

gen: $(STAMP) tools ## regenerate every committed stub from the proto (Python, Go, TypeScript)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc \
		-Iproto -I"$$($(BIN)/python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')" \
		--python_out=$(GEN_OUT) --grpc_python_out=$(GEN_OUT) \
		--mypy_out=$(GEN_OUT) --mypy_grpc_out=$(GEN_OUT) \
		$(PROTO)
	$(BIN)/python scripts/widen_pyi.py $(GEN_OUT)/agentruntime/v1/agent_runtime_pb2.pyi
	$(BIN)/buf generate
	cd $(TS_DIR) && npm run --silent gen:rpc

GENERATED := $(GEN_OUT)/agentruntime/v1 clients/go/agentruntime/v1 $(TS_DIR)/src/gen
check-gen: gen ## fail if the committed stubs differ from the proto (or new ones appear)
	git diff --exit-code -- $(GENERATED)
	test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))"

# --- quality -----------------------------------------------------------------

PY_SOURCES := server tests bench clients/python/agentruntime/__init__.py clients/python/agentruntime/client.py clients/python/agentruntime/sync.py clients/python/agentruntime/output.py clients/python/agentruntime/cli clients/python/conformance clients/python/consumer scripts/widen_pyi.py scripts/flake_hunt.py scripts/image_check.py scripts/k8s_schemas.py deploy/healthcheck.py
lint: $(STAMP) ## ruff, mypy, buf lint, buf format
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy
	scripts/check-version.sh
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	$(MAKE) breaking

# The released contract, as a buf image: every change must stay wire- and source-compatible
# with it (FILE rules). Refresh it only when a release is cut: `make proto-release`.
RELEASED := proto/released/agentruntime-v1.binpb
breaking: $(STAMP) ## buf breaking against the released contract
	$(BIN)/buf breaking --against $(RELEASED)

proto-release: $(STAMP) ## record the current proto as the released contract
	$(BIN)/buf build -o $(RELEASED)

# --- releases ----------------------------------------------------------------

# One version for every client (VERSION; the Go module's is its tag clients/go/vVERSION). Each
# client's Makefile builds its artifact into RELEASE_DIR (`release`), and its consumer test
# (`consumer-test`) makes a fresh project outside the source tree that depends on that artifact,
# compiles strictly and runs an example against the server in AGENTRUNTIME_ADDR.
RELEASE_DIR := $(CURDIR)/dist/release
CLIENT_DIRS := clients/python clients/go $(TS_DIR) clients/java
release: $(STAMP) $(TS_DIR)/node_modules/.installed ## build every client's release artifact into dist/release (one VERSION)
	scripts/check-version.sh
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	for dir in $(CLIENT_DIRS); do $(MAKE) -s -C $$dir release RELEASE_DIR=$(RELEASE_DIR); done
	ls -l $(RELEASE_DIR)

consumer-tests: release ## a fresh project per language on the released artifacts, against a real server
	scripts/with-server.sh bash -c 'failed=0; for dir in $(CLIENT_DIRS); do \
		echo "== consumer test: $$dir"; $(MAKE) -s -C $$dir consumer-test RELEASE_DIR=$(RELEASE_DIR) || failed=1; done; exit $$failed'

# One line per client language: add `test-go` etc. here and define it below.
TEST_TARGETS := test-python conformance-python test-go test-java test-typescript conformance-secure consumer-tests smoke deploy-check image-test

test: $(STAMP) ## generated-code drift, lint, then every client's tests
	$(MAKE) check-gen
	$(MAKE) lint
	$(MAKE) $(TEST_TARGETS)

# The fast tier alone (tests/domain: no gRPC, no process, a clock moved by hand): seconds.
test-fast: $(STAMP) ## the domain's fast tier of tests only
	$(BIN)/pytest -q tests/domain

test-python: $(STAMP) browser-tools
	$(BIN)/pytest -q

# The console's tests drive Debian's headless Chromium through its chromedriver (Selenium).
browser-tools: ## install chromium and chromium-driver where missing (apt-get)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then echo "apt-get install chromium chromium-driver"; \
		apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; fi

# The Python suite FLAKE_RUNS times in a row, then the e2e folder FLAKE_E2E_RUNS times, going on
# whatever fails; then each test that failed and the runs it failed in (scripts/flake_hunt.py:
# the runs' logs and JUnit reports stay in build/flake-hunt/). FLAKE_SUITE and FLAKE_E2E: other
# paths. Hours on a shared machine: run it where nobody else is.
FLAKE_RUNS     ?= 5
FLAKE_E2E_RUNS ?= 10
FLAKE_SUITE    ?= tests
FLAKE_E2E      ?= tests/e2e
flake-hunt: $(STAMP) browser-tools ## the Python suite FLAKE_RUNS times (5), tests/e2e FLAKE_E2E_RUNS times (10): which tests failed in which run
	$(BIN)/python scripts/flake_hunt.py --suite $(FLAKE_SUITE) --suite-runs $(FLAKE_RUNS) --e2e $(FLAKE_E2E) --e2e-runs $(FLAKE_E2E_RUNS)

conformance-python: $(STAMP) ## the shared vectors (tests/vectors) through the Python client
	scripts/with-server.sh $(BIN)/python clients/python/conformance/run.py

test-go: $(STAMP) ## the Go client: vet, build, unit tests, then the vectors against a fresh server
	$(MAKE) -C clients/go test

test-typescript: $(STAMP) tools ## the TypeScript client: build, unit tests (node:test), then the vectors against a fresh server
	scripts/with-server.sh $(MAKE) -C $(TS_DIR) test

test-java: $(STAMP) ## the Java client (Maven, stubs generated at build): the vectors against a fresh server
	scripts/with-server.sh bash -c 'cd clients/java && $(MAKE) test'

# The four runners one after the other against one server (TLS, mTLS, AUTH=tokens), each run even
# when one before it failed. After test-go, test-java and test-typescript it reuses their builds
# (a client's build is redone only when a source changed); alone, it builds what it needs first.
SECURE_RUNNERS := "$(BIN)/python clients/python/conformance/run.py" "$(MAKE) -s -C clients/go conformance" \
	"$(MAKE) -s -C $(TS_DIR) conformance" "$(MAKE) -s -C clients/java conformance"
conformance-secure: $(STAMP) $(TS_DIR)/node_modules/.installed ## every client's vectors against a server with TLS, mTLS and a bearer token
	scripts/with-secure-server.sh bash -c 'failed=0; for runner in $(SECURE_RUNNERS); do \
		echo "== $$runner"; $$runner || failed=1; done; exit $$failed'

# --- deployment (docs/deploy.md) ---------------------------------------------

# The image: deploy/Containerfile, built from a context holding the server, the client and every
# dependency as wheels built here (pinned to what .venv holds), so no index is needed inside the
# build. Elsewhere: `make image PODMAN=docker ULIMITS=` (or podman as it is set up there).
PODMAN     ?= podman --runtime runc
ULIMITS    ?= --ulimit nofile=16384:16384 --ulimit nproc=8192:8192
BASE       ?= docker.io/library/python:3.11-slim-bookworm
IMAGE      ?= localhost/agentruntime:$(shell cat VERSION)
LOCAL_BASE := localhost/agentruntime-base:bookworm
TEST_IMAGE := localhost/agentruntime:test
IMAGE_CONTEXT := build/image
# $(1): the base, $(2): the tag. HEALTHCHECK needs podman's docker format (OCI images have none;
# BUILDAH_FORMAT says so to podman, and docker ignores it).
build-image = BUILDAH_FORMAT=docker $(PODMAN) build $(ULIMITS) --build-arg BASE=$(1) -t $(2) -f deploy/Containerfile $(IMAGE_CONTEXT)

image-context: $(STAMP)
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)
	$(BIN)/pip freeze --exclude-editable >$(IMAGE_CONTEXT)/constraints.txt
	$(BIN)/pip wheel --quiet --disable-pip-version-check --constraint $(IMAGE_CONTEXT)/constraints.txt \
		--wheel-dir $(IMAGE_CONTEXT)/wheels ./clients/python './server[console]'
	cp deploy/healthcheck.py $(IMAGE_CONTEXT)/

image: image-context ## build the server's image (BASE=... for another Python 3.11 bookworm base; IMAGE=... its tag)
	$(call build-image,$(BASE),$(IMAGE))

# These machines reach no container registry: podman, runc and debootstrap from Debian's
# packages, and the base made from Debian's packages too (kept once made). Podman's network
# stack is netavark (aardvark-dns names the containers of a network), and netavark sets its rules
# with iptables: without it the build's first RUN fails ("netavark: No such file or directory").
# They are Recommends or Suggests of podman, which --no-install-recommends leaves out.
container-tools: ## install podman, runc, debootstrap, netavark, aardvark-dns and iptables where missing (apt-get)
	@missing=""; for tool in podman runc debootstrap iptables; do \
		PATH=$$PATH:/usr/sbin:/sbin command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	for package in netavark aardvark-dns; do \
		dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$package"; done; \
	if [ -n "$$missing" ]; then echo "apt-get install$$missing"; apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing; fi

local-base: container-tools ## make the local base image from Debian's packages (debootstrap), unless it exists
	PODMAN="$(PODMAN)" deploy/local-base.sh $(LOCAL_BASE)

image-test: container-tools image-context ## build the image on the local base and prove it (scripts/image_check.py)
	PODMAN="$(PODMAN)" deploy/local-base.sh $(LOCAL_BASE)
	$(call build-image,$(LOCAL_BASE),$(TEST_IMAGE)) >build/image-build.log 2>&1 || { tail -40 build/image-build.log; exit 1; }
	$(PODMAN) image prune --force --filter label=io.agentruntime.image >/dev/null  # earlier builds' untagged layers
	$(BIN)/python scripts/image_check.py --image $(TEST_IMAGE) --podman "$(PODMAN)" --run-flags "$(ULIMITS)"

# The manifests: the compose file loaded as Docker Compose loads it (compose-go), the Kustomize
# output validated strictly against the schemas of the oldest and the newest Kubernetes we
# target (from the PyPI package kubernetes-validate: GitHub, kubeconform's usual source, is out of reach).
KUBECONFORM := github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
KUSTOMIZE   := sigs.k8s.io/kustomize/kustomize/v5@v5.8.2
K8S_SCHEMAS_PACKAGE := kubernetes-validate==1.37.0
K8S_VERSIONS := 1.30.0 1.37.0
K8S_SCHEMAS := $(CURDIR)/.tools/k8s-schemas
deploy-check: $(TOOLS)/kubeconform $(TOOLS)/kustomize $(TOOLS)/composecheck $(K8S_SCHEMAS)/.installed ## validate deploy/compose.yaml and deploy/k8s (kubeconform -strict)
	mkdir -p build
	$(TOOLS)/composecheck deploy/compose.yaml >build/compose.resolved.yaml
	$(TOOLS)/kustomize build deploy/k8s >build/k8s.yaml
	for version in $(K8S_VERSIONS); do echo "kubeconform -strict, Kubernetes $$version:"; \
		$(TOOLS)/kubeconform -strict -summary -kubernetes-version $$version -schema-location $(K8S_SCHEMAS) build/k8s.yaml; done

$(TOOLS)/kubeconform:
	GOBIN=$(TOOLS) go install $(KUBECONFORM)

$(TOOLS)/kustomize:
	GOBIN=$(TOOLS) go install $(KUSTOMIZE)

$(TOOLS)/composecheck: scripts/composecheck/main.go scripts/composecheck/go.mod scripts/composecheck/go.sum
	cd scripts/composecheck && GOBIN=$(TOOLS) go install .

$(K8S_SCHEMAS)/.installed: scripts/k8s_schemas.py | $(STAMP)
	rm -rf $(K8S_SCHEMAS) $(K8S_SCHEMAS).download && mkdir -p $(K8S_SCHEMAS)
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --dest $(K8S_SCHEMAS).download $(K8S_SCHEMAS_PACKAGE)
	$(BIN)/python scripts/k8s_schemas.py $(K8S_SCHEMAS).download/*.whl $(K8S_SCHEMAS) $(K8S_VERSIONS)
	rm -rf $(K8S_SCHEMAS).download
	touch $@

# --- running -----------------------------------------------------------------

run: $(STAMP) ## serve on 127.0.0.1:50051, and the web console on http://127.0.0.1:8080 (AGENTRUNTIME_* env, see docs/configuration.md)
	scripts/run.sh $(BIN)/agentruntime

smoke: $(STAMP) $(TOOLS)/grpcurl ## start a server on a free port and walk docs/walkthrough.md with grpcurl
	scripts/smoke.sh

bench: $(STAMP) ## measured figures (not asserted): the service workload, HTTP transports, journal cost, memory, watchers, replicas, capacity, forks
	$(BIN)/python bench/encoders.py
	$(BIN)/python bench/workload.py
	$(BIN)/python bench/streaming.py
	$(BIN)/python bench/console.py
	$(BIN)/python bench/http_clients.py
	$(BIN)/python bench/store.py
	$(BIN)/python bench/watch_memory.py
	$(BIN)/python bench/large_answers.py
	$(BIN)/python bench/replicas.py
	$(BIN)/python bench/pg_drivers.py
	$(BIN)/python bench/capacity.py
	$(BIN)/python bench/fork.py

# Release 0.1.0 (tag v0.1.0, before the journal), served from its own tree and venv under .bench/, and
# this tree, alternating on the bench workload: issue 10's "a third of the CPU per turn".
BASELINE_COMMIT := 2c42bb045c38baec1c5e6ed0dd2aff13495f05b3
BASELINE := .bench/release-0.1.0
bench-baseline: $(STAMP) $(BASELINE)/.venv/.installed ## CPU per model turn against release 0.1.0's, alternating runs
	$(BIN)/python bench/workload.py --baseline-python $(BASELINE)/.venv/bin/python

$(BASELINE)/.venv/.installed:
	rm -rf $(BASELINE) && mkdir -p $(BASELINE)
	git archive $(BASELINE_COMMIT) | tar -x -C $(BASELINE)
	$(PYTHON) -m venv $(BASELINE)/.venv
	$(BASELINE)/.venv/bin/python -m pip install --quiet --upgrade pip==$(PIP_VERSION)
	$(BASELINE)/.venv/bin/pip install --quiet -e $(BASELINE)/clients/python -e $(BASELINE)/server
	touch $@

profile: $(STAMP) ## py-spy samples of the server under the bench workload, by component (needs ptrace: root or CAP_SYS_PTRACE)
	$(BIN)/python bench/profile.py

clean: ## remove the venv, tools and caches
	rm -rf $(VENV) .tools .bench .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
