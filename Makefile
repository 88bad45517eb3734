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
HOST ?= 127.0.0.1

.PHONY: serve test lint format models venv clean samples perf

venv: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Re-exported when the network, the export code or the pinned packages change.
$(CLASSIFIER_ONNX): $(STAMP) pipelines/efficientnet_lite.py pipelines/classification.py \
		pipelines/image.py pipelines/samples.py pipelines/onnx_runner.py \
		export/__main__.py export/onnx_export.py export/efficientnet_lite0.py
	$(PY) -m export efficientnet_lite0 --output $@

# Both encoder versions come from one export run (INT8 is quantized from the fp32 model).
$(ENCODER_ONNX): $(STAMP) pipelines/minilm.py pipelines/embedding.py pipelines/text_samples.py \
		pipelines/onnx_runner.py export/__main__.py export/onnx_export.py export/minilm.py
	$(PY) -m export minilm --output $@ --int8-output $(ENCODER_INT8_ONNX)

$(ENCODER_INT8_ONNX): $(ENCODER_ONNX)
	@test -f $@ || { rm -f $(ENCODER_ONNX); $(MAKE) $(ENCODER_ONNX); }

models: $(CLASSIFIER_ONNX) $(ENCODER_ONNX) $(ENCODER_INT8_ONNX)

serve: models
	$(PY) -m server --host $(HOST)

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint models
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# Benchmark: perf_analyzer sweeps vs the raw engine and a peer server (PERF_ARGS=--full for all).
perf: models
	$(PY) -m client perf $(PERF_ARGS)

samples: $(STAMP)
	$(PY) -m client samples samples/

clean:
	rm -f $(CLASSIFIER_ONNX) $(ENCODER_ONNX) $(ENCODER_INT8_ONNX)
	rm -rf $(VENV)
