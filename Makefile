# Two commands: `make serve` runs the real thing, `make test` checks it.
# Everything below is incremental: a second run reuses the venv and the exported models.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLASSIFIER_ONNX := model_repository/classifier/1/model.onnx
ENCODER_ONNX := model_repository/encoder/1/model.onnx
ENCODER_INT8_ONNX := model_repository/encoder/2/model.onnx
ENCODER_QDQ_ONNX := model_repository/encoder/2/model.qdq.onnx
EMBED_GRAPH_ONNX := model_repository/embed_graph/1/model.onnx
HOST ?= 127.0.0.1
# apt-get needs root: empty when we are root (CI), sudo otherwise.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: serve test lint format models configs venv clean samples perf perf-genai tune tools gpu-bundle gpu-check gpu-diag \
	imports lock \
	engine up down

venv: $(STAMP)

# --no-compile: byte-compiling every installed file (torch's thousands among them) takes longer
# than the install itself; Python compiles what it imports when it first imports it.
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Re-exported when the network, the export code or the pinned packages change.
$(CLASSIFIER_ONNX): $(STAMP) pipelines/efficientnet_lite.py pipelines/classification.py \
		pipelines/image.py export/samples.py pipelines/onnx_runner.py \
		export/__main__.py export/onnx_export.py export/efficientnet_lite0.py
	$(PY) -m export efficientnet_lite0 --output $@

# Every encoder file comes from one export run (the INT8 ones are quantized from fp32):
# version 1 fp32, version 2 dynamic INT8 (CPU) and static Q/DQ INT8 (for TensorRT).
$(ENCODER_ONNX): $(STAMP) pipelines/bert.py pipelines/embedding.py pipelines/padding.py \
		pipelines/tokenization.py pipelines/minilm_weights.py export/text_samples.py \
		pipelines/onnx_runner.py export/__main__.py export/onnx_export.py export/minilm.py
	$(PY) -m export minilm --output $@ --int8-output $(ENCODER_INT8_ONNX) \
		--qdq-output $(ENCODER_QDQ_ONNX)

$(ENCODER_INT8_ONNX) $(ENCODER_QDQ_ONNX): $(ENCODER_ONNX)
	@test -f $@ || { rm -f $(ENCODER_ONNX); $(MAKE) $(ENCODER_ONNX); }

# The tokenizer op in front of the fp32 encoder: text in, embedding out, one graph.
$(EMBED_GRAPH_ONNX): $(ENCODER_ONNX) export/text_graph.py
	$(PY) -m export embed-graph --encoder $(ENCODER_ONNX) --output $@

# What Triton reads for --model-config-name=<name>: configs/<name>.pbtxt, rendered from the
# overlay configs/<name>.overlay.pbtxt over its bases (model_config/ says how). The configs/
# folders are prerequisites too, so adding or removing an overlay renders again.
VARIANT_OVERLAYS := $(wildcard model_repository/*/configs/*.overlay.pbtxt)
RENDERED_CONFIGS := $(VARIANT_OVERLAYS:.overlay.pbtxt=.pbtxt)
$(RENDERED_CONFIGS) &: $(VARIANT_OVERLAYS) $(wildcard model_repository/*/configs) \
		$(wildcard model_repository/*/config.pbtxt) $(wildcard model_config/*.py) $(STAMP)
	$(PY) -m model_config
	@touch $(RENDERED_CONFIGS)

configs: $(RENDERED_CONFIGS)

# Models `python -m export torch` added (docs/your-model.md): a fresh clone has their configs and
# signature.json, which keeps the command that exports their graphs again (their own package
# must import). Order-only: an existing graph is the user's until they export it with --replace.
GENERATED_ONNX := $(patsubst %/signature.json,%/1/model.onnx,$(wildcard model_repository/*/signature.json))
model_repository/%/1/model.onnx: | $(STAMP) model_repository/%/signature.json
	$(PY) -m export regenerate

models: $(CLASSIFIER_ONNX) $(ENCODER_ONNX) $(ENCODER_INT8_ONNX) $(ENCODER_QDQ_ONNX) \
		$(EMBED_GRAPH_ONNX) $(GENERATED_ONNX) configs

# SERVE_ARGS: more launcher options, e.g. SERVE_ARGS="--http-port 9000". GATEWAY=1 puts the
# gateway in front (nginx with njs, `make tools`): OpenAI's embeddings API on :8080/v1.
# embed's per-text cache is in-process by default; REDIS=1 shares it through a local
# redis-server (loopback, a password, bounded memory; `make tools`), REDIS_URL=redis[s]://...
# through a Redis that runs elsewhere (docs/operations.md#the-per-text-embedding-cache).
# TRACE=<OTLP/HTTP URL> turns on OpenTelemetry traces of the server and its Python steps (one
# request in TRACE_RATE, 1 here: every request; docs/operations.md#tracing-one-request).
TRACE_RATE ?= 1
serve: models
	$(if $(REDIS_URL),EMBED_TEXT_CACHE_URL='$(REDIS_URL)') $(PY) -m \
		$(if $(GATEWAY),gateway serve,server) --host $(HOST) $(if $(REDIS),--redis local) \
		$(if $(TRACE),--trace-url '$(TRACE)' --trace-rate $(TRACE_RATE)) $(SERVE_ARGS)

# Whether the one-way import rules of pyproject.toml hold (import-linter), and the graph itself.
# The images' hash locks: every pin of docker/requirements*.txt with the sha256 of each file
# PyPI has for that version, by uv (--no-deps: each file is the whole list, for the base image's
# CPython and glibc). The Dockerfile installs them with --require-hashes; run after a pin changes.
UV_COMPILE = $(VENV)/bin/uv pip compile --generate-hashes --no-deps --quiet \
	--custom-compile-command "make lock"
lock: $(STAMP)
	$(UV_COMPILE) --python-version 3.10 --python-platform x86_64-manylinux_2_35 \
		docker/requirements.txt -o docker/requirements.lock
	$(UV_COMPILE) --python-version 3.11 --python-platform x86_64-manylinux_2_36 \
		docker/requirements-cpu.txt -o docker/requirements-cpu.lock

imports: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m tests.layout

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Debian packages the tests drive for real: promtool/prometheus check the Prometheus config and
# evaluate the dashboard's queries and alerts, prometheus-alertmanager (amtool) routes them;
# nginx is the load balancer in front of several servers, and
# its njs module serves OpenAI's embeddings API (gateway/openai.js); redis-server is embed's
# shared per-text cache (server/redis.py).
# docker.io, docker-compose, runc and mmdebstrap: the container engine, Compose 1.29 and the
# Debian root file systems the container tests build their images from (containers/).
NJS_MODULE := /usr/lib/nginx/modules/ngx_http_js_module.so
TOOL_PACKAGES := prometheus prometheus-alertmanager nginx libnginx-mod-http-js redis-server \
	docker.io docker-compose runc mmdebstrap
# Another install (unattended-upgrades on a fresh machine, a second checkout's `make tools`)
# holds dpkg's lock for a while: apt-get waits up to APT_LOCK_WAIT_S for it rather than failing
# at once. bookworm's apt (2.6) waits so for dpkg's lock only, not for the package lists' lock
# that another `apt-get update` holds: update is tried again every APT_RETRY_S while that is
# what it reports, for as long.
APT_LOCK_WAIT_S ?= 120
APT_RETRY_S ?= 5
APT_GET = $(SUDO) apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT_S)
APT_UPDATE = waited=0; until out=$$($(APT_GET) update -qq 2>&1); do \
		if ! grep -q 'Could not get lock' <<<"$$out" || [ $$waited -ge $(APT_LOCK_WAIT_S) ]; then \
			echo "$$out" >&2; exit 1; \
		fi; \
		echo "apt-get update: another one holds the package lists' lock; waiting"; \
		sleep $(APT_RETRY_S); waited=$$((waited + $(APT_RETRY_S))); \
	done
tools:
	@command -v promtool >/dev/null && command -v amtool >/dev/null \
		&& command -v nginx >/dev/null && test -f $(NJS_MODULE) \
		&& command -v redis-server >/dev/null && command -v dockerd >/dev/null \
		&& command -v docker-compose >/dev/null && command -v mmdebstrap >/dev/null || { \
		echo "installing Debian's prometheus, prometheus-alertmanager, nginx, its njs module," \
			"redis-server, docker.io," \
			"docker-compose and mmdebstrap"; \
		$(APT_UPDATE) && \
		DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends \
			$(TOOL_PACKAGES); }

test: lint models tools
	$(PY) -m pytest -raR $(PYTEST_ARGS)

# The stack in containers on this host (docker/docker-compose.yml + docker-compose.cpu.yml):
# a Docker daemon found or started (docker/engine.sh, root), the images built (from Debian's
# packages where no registry answers: UP_FROM=debian|registry|auto), every service healthy.
# `make down` removes the stack and stops a daemon that `make up` started.
UP_FROM ?= auto
engine: tools
	bash docker/engine.sh start

up: models engine
	$(PY) -m containers up --from $(UP_FROM)

down: $(STAMP)
	$(PY) -m containers down
	bash docker/engine.sh stop

# Benchmark: perf_analyzer sweeps vs the raw engine and a peer server (PERF_ARGS=--full for all).
# MODEL=<name>: one model of the repository (yours: docs/your-model.md) against its raw graph.
perf: models
	$(PY) -m bench perf $(if $(MODEL),--model $(MODEL)) $(PERF_ARGS)

# NVIDIA's genai-perf beside perf_analyzer on the gateway's OpenAI /v1/embeddings, same texts,
# concurrency and window, in one run (docs/performance.md#genai-perf-beside-perf_analyzer-2026-12-05).
# genai-perf gets an environment of its own, .peers/genai-perf/venv, made on first use from
# requirements-genai-perf.txt (its pandas and transformers are not .venv's pins).
# GENAI_PERF_ARGS: e.g. "--levels 1,8 --rounds 3 --batch-size-text 4".
perf-genai: models tools
	$(PY) -m bench.genai_perf $(GENAI_PERF_ARGS)

# The SLO tuner (docs/performance.md): TUNE is classifier, encoder, classify, embed or shared;
# it writes the winner as configs/local-tuned.pbtxt, served with --model-config-name local-tuned.
TUNE ?= classify
P99_MS ?= 100
BUDGET_S ?= 300
tune: models
	$(PY) -m tune $(TUNE) --p99-ms $(P99_MS) --budget-s $(BUDGET_S) $(TUNE_ARGS)

# The GPU check. With this venv: pack what a GPU host lacks into .gpu-bundle/ (its size:
# docs/gpu.md), for the host's Python (GPU_PYTHON=3.10|3.11|3.12). On the GPU host (Python +
# torch with CUDA): `make gpu-check`, which checks the host first and writes its results to GPU_CHECK_OUT.
GPU_PYTHON ?= 3.12
GPU_CHECK_OUT ?= results/gpu-check
gpu-bundle: $(STAMP)
	$(PY) -m tests.gpu_check bundle --out .gpu-bundle --python $(GPU_PYTHON)

gpu-check:
	python3 -m tests.gpu_check run --bundle .gpu-bundle --out $(GPU_CHECK_OUT)

# The GPU diagnosis (tests/gpu_diag.py): the image service's designs side by side on one GPU,
# the text service beside them, in one run of about 7 minutes (docs/gpu.md reads its results).
GPU_DIAG_OUT ?= results/gpu-diag
gpu-diag:
	python3 -m tests.gpu_diag run --bundle .gpu-bundle --out $(GPU_DIAG_OUT)

samples: $(STAMP)
	$(PY) -m export samples samples/

# Every exported file, by the pattern .gitignore keeps them out with, so none is forgotten.
clean:
	rm -f model_repository/*/[0-9]*/*.onnx model_repository/*/[0-9]*/*.onnx.data
	rm -f $(RENDERED_CONFIGS)
	rm -rf $(VENV)
