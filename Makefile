# Set-up and everyday commands. `make demo` and `make test` create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The PyPI builds named in DEVELOPERS.md: they run on CPU, CUDA picks them up when present.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: setup demo test bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q -e '.[test,demo]' $(TORCH_PINS)
	touch $@

demo: setup
	$(VENV)/bin/inceptionlab demo

test: setup
	$(VENV)/bin/lint-imports --no-cache  # the layer contract in pyproject.toml (DESIGN.md)
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/train_throughput.py

lint: setup
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check --select F,E9,B --ignore B905,B008 --line-length 120 src tests benchmarks

clean:
	rm -rf $(VENV) build src/*.egg-info
