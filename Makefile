# nsim — the two commands:  `make demo`  (set up, build, simulate an example kernel on trn2)
#                           `make test`  (set up, build, run every test: ctest, pytest, the unit tests
#                                         under ASan + UBSan, and a 2-minute fuzz; docs/reliability.md)
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
ASAN_BUILD ?= build-asan
# `make pgo`: the CLI, the benchmarks and the Python module built with profile-guided optimisation.
PGO_BUILD  ?= build-pgo
# The sanitizer tree: Debug (assertions on) at -O1, no Python module, no benchmarks; not -Werror
# (sanitizer instrumentation changes what GCC warns about).
ASAN_CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 -DNSIM_SANITIZE=ON -DNSIM_BUILD_PYTHON=OFF -DNSIM_BUILD_BENCHMARKS=OFF
FUZZ_TIME  ?= 600
FUZZ_SMOKE_TIME ?= 120
FUZZ_DRIVER_SMOKE_TIME ?= 20
# The seed of `make test`'s campaigns: fixed, so that a run of the test command is reproducible (new
# inputs are found by `make fuzz` / `make fuzz-driver` campaigns with other seeds; docs/reliability.md).
FUZZ_SMOKE_SEED ?= 20261202
FUZZ_JOBS  ?= 1
FUZZ_ARGS  ?=
# The C++ fuzz driver (build/nsim_fuzz, tests/fuzz/fuzz_driver.cpp): `make fuzz-driver` runs FUZZ_INPUTS inputs
# of seed FUZZ_SEED from input FUZZ_FIRST (a campaign can be split into consecutive ranges).
FUZZ_INPUTS ?= 1000000
FUZZ_SEED   ?= 1
FUZZ_FIRST  ?= 0
FUZZ_DRIVER_ARGS ?=
PYENV       = PYTHONPATH=python:$(BUILD)/python$${PYTHONPATH:+:$$PYTHONPATH}
APT_PKGS   := build-essential cmake ninja-build libeigen3-dev libfmt-dev libyaml-cpp-dev catch2 libbenchmark-dev pybind11-dev \
              nlohmann-json3-dev libcli11-dev
PIP_PKGS   := numpy 'ml-dtypes>=0.5,<0.7' pytest matplotlib  # (ml-dtypes: see pyproject.toml)

.PHONY: all deps build test unit-test demo bench clean sanitize fuzz fuzz-smoke fuzz-driver pgo

all: build

# Install what is missing: Debian -dev packages, then the Python packages the tests use.
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@python3 -c "import numpy, ml_dtypes, pytest, matplotlib" 2>/dev/null || python3 -m pip install -q $(PIP_PKGS)

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Every test: the unit tests (Catch2, pytest, with the fuzz regression corpus), the unit tests again
# under ASan + UBSan, then a short fuzz campaign (its CLI inputs go through the sanitizer binary).
test: unit-test sanitize fuzz-smoke

unit-test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@if ls tests/python/test_*.py >/dev/null 2>&1; then $(PYENV) python3 -m pytest -q tests/python; fi

$(ASAN_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(ASAN_BUILD) -G Ninja $(ASAN_CMAKE_ARGS)

# ASan + UBSan build of the C++ tree (build-asan/) and its ctest; any report fails the test.
sanitize: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# A fuzz campaign of FUZZ_TIME seconds (kernel.json, config and CLI mutations; tests/fuzz/fuzz.py).
# Findings (crash, hang, E901, uncoded error, sanitizer report) go to fuzz-findings/; exit 1 if any.
fuzz: build
	$(PYENV) nice python3 tests/fuzz/fuzz.py run --time $(FUZZ_TIME) -j $(FUZZ_JOBS) --nsim $(BUILD)/nsim $(FUZZ_ARGS)

# A campaign of the C++ fuzz driver: every input through check, run --timing-only and run, in FUZZ_JOBS
# forked workers (nice'd); findings in fuzz-findings/, exit 1 if any (docs/reliability.md).
fuzz-driver: build
	nice -n 10 $(BUILD)/nsim_fuzz run --seed $(FUZZ_SEED) --first $(FUZZ_FIRST) --inputs $(FUZZ_INPUTS) -j $(FUZZ_JOBS) \
	  --timeout 120 --summary fuzz-findings/driver-summary.json $(FUZZ_DRIVER_ARGS)

# The short campaign of `make test`: in-process inputs through the release module, CLI inputs
# through the sanitizer binary when it is built.
# Then FUZZ_DRIVER_SMOKE_TIME seconds of the C++ fuzz driver (seed FUZZ_SMOKE_SEED), in the
# release build and, when it is built, the sanitizer build.
fuzz-smoke: build
	$(PYENV) python3 tests/fuzz/fuzz.py run --time $(FUZZ_SMOKE_TIME) -j 1 --report-every 30 --seed $(FUZZ_SMOKE_SEED) \
	  --nsim $$( [ -x $(ASAN_BUILD)/nsim ] && echo $(ASAN_BUILD)/nsim || echo $(BUILD)/nsim ) $(FUZZ_ARGS)
	$(BUILD)/nsim_fuzz run --seed $(FUZZ_SMOKE_SEED) --time $(FUZZ_DRIVER_SMOKE_TIME) --timeout 60 --report-every 0
	@if [ -x $(ASAN_BUILD)/nsim_fuzz ]; then \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(ASAN_BUILD)/nsim_fuzz run --seed $(FUZZ_SMOKE_SEED) --time $(FUZZ_DRIVER_SMOKE_TIME) --timeout 300 --report-every 0; fi

demo: build
	$(BUILD)/nsim_demo --config trn2
	$(BUILD)/nsim run examples/flash_attention.json --config trn2

bench: build
	$(BUILD)/bench_simulator --benchmark_min_time=0.5

# Profile-guided build in $(PGO_BUILD)/ (docs/performance.md): instrumented binaries, a training run of
# kernels through the CLI (benchmarks/pgo_train.sh; not the benchmarks, which measure the result), then the
# same tree rebuilt with the profiles. Two builds: ~2x the time of `make build`.
PGO_DIR     = $(abspath $(PGO_BUILD))/pgo-profile
pgo: deps
	cmake -S . -B $(PGO_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) -DNSIM_PGO=generate -DNSIM_PGO_DIR=$(PGO_DIR)
	rm -rf $(PGO_DIR)
	cmake --build $(PGO_BUILD) -j $(JOBS) --target nsim
	benchmarks/pgo_train.sh $(PGO_BUILD)/nsim
	cmake -S . -B $(PGO_BUILD) -DNSIM_PGO=use -DNSIM_PGO_DIR=$(PGO_DIR)
	cmake --build $(PGO_BUILD) -j $(JOBS) --target nsim bench_simulator
	@if cmake --build $(PGO_BUILD) --target help | grep -q '^_nsim:'; then cmake --build $(PGO_BUILD) -j $(JOBS) --target _nsim; fi

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(PGO_BUILD)
