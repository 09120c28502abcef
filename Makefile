# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Both create .venv and install cpkv into it first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch==2.13.0 is a CPU build where a local wheel exists; on other machines pass a CPU index, e.g.
# make test TORCH_PIP_ARGS="--index-url <PyTorch CPU wheel index>"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: install demo test lint clean

# torch is most of the install time (minutes): its pip runs without -q so its download and install
# progress show.
$(BIN)/cpkv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "Installing $(TORCH_SPEC), the longest step (a few minutes):"
	$(BIN)/pip install --progress-bar on $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/cpkv

install: $(BIN)/cpkv

demo: install
	$(BIN)/cpkv simulate --out out/demo

test: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m cpkv.gov check $(if $(wildcard ../shared/design/SPEC.md),--spec ../shared/design/SPEC.md)
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check src tests

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
