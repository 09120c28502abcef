# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Both create .venv and install cpkv into it first. `make test-sglang` runs the SGLang integration tests
# in their own .venv-sglang (SGLang 0.5.23 without its dependencies, plus the pinned set it imports), and
# the SGLang 0.5.9 differential tests in .venv-sglang059 (0.5.9 over .venv-sglang's packages). Its L3
# test starts a real mooncake_master, whose binaries and Python store link libibverbs.so.1 (even over
# TCP): `make test-sglang` apt-installs Debian's libibverbs1 first when ldconfig does not list it.
# `make test-quick` is the edit loop: unit tests without the ones marked slow or distributed (CI
# runs `make test`, everything); `make test-module M=allocator` runs one folder of tests/unit (without the
# slow tests), `make lint-fast` ruff on the files changed against main. `make lint` is ruff (check and
# format --check) and mypy on src (pyproject's [tool.mypy]); `make test` runs it first. `make test` sets CPKV_REQUIRE_COST=1: a missing aiconfigurator (the `cost`
# extra) fails the measured cost model's tests instead of skipping them; CPKV_REQUIRE_RAY=1 does the same
# for Ray (the `ray` extra) and the `cpkv sweep --executor ray` test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch==2.13.0 is a CPU build where a local wheel exists; on other machines pass a CPU index, e.g.
# make test TORCH_PIP_ARGS="--index-url <PyTorch CPU wheel index>"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# The `gpu` extra (Triton) is installed too: tests/unit/kernels run the kernels in Triton's CPU interpreter.
# Pinned here for CI (about 290 MB download, 1 GB on disk, 15-35 s); `make test TRITON_SPEC=` skips the pin.
TRITON_SPEC ?= triton==3.9.0

SGLANG_VENV ?= .venv-sglang
SGLANG_BIN  := $(SGLANG_VENV)/bin
SGLANG_REQS := tests/integration/sglang/requirements.txt
SGLANG059_VENV ?= .venv-sglang059
SGLANG059_BIN  := $(SGLANG059_VENV)/bin
SGLANG059_REQS := tests/integration/sglang059/requirements.txt

.PHONY: install demo test test-quick test-module test-sglang bench-sglang-quick lint lint-fast clean ibverbs

# torch is most of the install time (minutes): its pip runs without -q so its download and install
# progress show.
$(BIN)/cpkv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "Installing $(TORCH_SPEC), the longest step (a few minutes):"
	$(BIN)/pip install --progress-bar on $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	@echo "Installing cpkv with the dev, gpu, cost and ray extras ($(or $(TRITON_SPEC),triton): a 290 MB wheel; aiconfigurator with pandas, pyarrow, scipy: 0.5 GB; ray: 80 MB):"
	$(BIN)/pip install -q -e ".[dev,gpu,cost,ray]" $(if $(TRITON_SPEC),"$(TRITON_SPEC)")
	touch $(BIN)/cpkv

install: $(BIN)/cpkv

# Two replays: the synthetic workload (first, the offered load against one group's capacity, then the policies
# side by side), and a burst of tiny chunks where the owner policies differ (legacy livelocks on lane 0).
demo: install
	@echo "Each CP rank owns the KV pages of the tokens it computes (its owner lane); an owner policy picks the lane"
	@echo "a request's first new page goes to. 1) 1,000 synthetic requests, one C=8 group, three policies:"
	$(BIN)/cpkv simulate --out out/demo
	@echo
	@echo "2) 64 requests at once, each prefilled one page (64 tokens) a step: legacy starts every request on lane 0,"
	@echo "   which fills while the other lanes stay empty (a livelock); rotation and balanced spread the pages:"
	$(BIN)/cpkv simulate --workload tiny-chunks --out out/demo/tiny-chunks

# The RFC check reads the checkout only; .ci/run also checks the clauses against a SPEC.md beside it.
test: lint
	$(BIN)/python -m cpkv.gov check
	CPKV_REQUIRE_COST=1 CPKV_REQUIRE_RAY=1 $(BIN)/python -m pytest -q

$(SGLANG_BIN)/.installed: pyproject.toml $(SGLANG_REQS)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_BIN)/pip install -q --upgrade pip
	$(SGLANG_BIN)/pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(SGLANG_BIN)/pip install -q pytest==9.2.0 pytest-timeout==2.4.0
	$(SGLANG_BIN)/pip install -q --no-deps -r $(SGLANG_REQS)
	$(SGLANG_BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# SGLang 0.5.9, for the differential tests of its CP metadata: a venv of its own for sglang 0.5.9 and the
# five modules it imports that 0.5.23's set lacks (a 7 MB download, about 30 s), layered over .venv-sglang's
# packages by a .pth file (its own site-packages come first, so `import sglang` is 0.5.9).
$(SGLANG059_BIN)/.installed: $(SGLANG_BIN)/.installed $(SGLANG059_REQS)
	rm -rf $(SGLANG059_VENV)
	$(PYTHON) -m venv $(SGLANG059_VENV)
	base=$$($(SGLANG_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	own=$$($(SGLANG059_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	echo "import site; site.addsitedir('$$base')" > "$$own/zz_cpkv_sglang_base.pth"
	$(SGLANG059_BIN)/python -m pip install -q --no-deps -r $(SGLANG059_REQS)
	touch $@

# Mooncake (mooncake-transfer-engine-non-cuda) needs libibverbs.so.1: Debian's libibverbs1, installed with
# apt-get (as root, else through sudo; apt-get update first, as on a fresh CI machine) when it is missing.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
ibverbs:
	@{ ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | grep -q 'libibverbs\.so\.1 ' || { \
	  echo "Installing libibverbs1 (Mooncake's mooncake_master and store link libibverbs.so.1):"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1; }

# CPKV_REQUIRE_SGLANG=1: a failing `import sglang` fails the run instead of skipping every test.
test-sglang: ibverbs $(SGLANG_BIN)/.installed $(SGLANG059_BIN)/.installed
	CPKV_REQUIRE_SGLANG=1 $(SGLANG_BIN)/python -m pytest -q -m sglang tests/integration/sglang
	CPKV_REQUIRE_SGLANG=1 $(SGLANG059_BIN)/python -m pytest -q -m sglang tests/integration/sglang059

# The benchmark against SGLang's own allocator and radix cache, short form (CI runs it after test-sglang).
bench-sglang-quick: $(SGLANG_BIN)/.installed
	$(SGLANG_BIN)/python benchmarks/bench_vs_sglang.py --quick

test-quick: install
	$(BIN)/python -m pytest -q -m "not slow and not distributed"

# One folder of tests/unit, e.g. `make test-module M=allocator` (tests/unit/allocator), without the slow tests.
M ?=
test-module: install
	@test -n "$(M)" -a -d "tests/unit/$(M)" || { echo "usage: make test-module M=<folder of tests/unit>"; exit 2; }
	$(BIN)/python -m pytest -q -m "not slow" tests/unit/$(M)

LINT_PATHS := src tests benchmarks examples
lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

# ruff (check and format --check) on the Python files changed against main (committed, staged or not).
LINT_BASE ?= main
lint-fast: install
	@files=$$(git diff --name-only --diff-filter=d $(LINT_BASE) -- $(LINT_PATHS) | grep '\.py$$'); \
	if [ -z "$$files" ]; then echo "lint-fast: no Python file changed against $(LINT_BASE)"; else \
	  $(BIN)/ruff check $$files && $(BIN)/ruff format --check $$files; fi

clean:
	rm -rf $(VENV) $(SGLANG_VENV) $(SGLANG059_VENV) build *.egg-info src/*.egg-info .pytest_cache
