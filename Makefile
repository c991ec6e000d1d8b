# nsim — the two commands:  `make demo`  (set up, build, simulate an example kernel on trn2)
#                           `make test`  (set up, build, run every test)
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
APT_PKGS   := build-essential cmake ninja-build libeigen3-dev libfmt-dev libyaml-cpp-dev catch2 libbenchmark-dev pybind11-dev
PIP_PKGS   := numpy ml-dtypes pytest matplotlib

.PHONY: all deps build test demo bench clean

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

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@if ls tests/python/test_*.py >/dev/null 2>&1; then PYTHONPATH=python:$(BUILD)/python$${PYTHONPATH:+:$$PYTHONPATH} python3 -m pytest -q tests/python; fi

demo: build
	$(BUILD)/nsim_demo --config trn2
	$(BUILD)/nsim run examples/flash_attention.json --config trn2

bench: build
	$(BUILD)/bench_simulator --benchmark_min_time=0.5

clean:
	rm -rf $(BUILD)
