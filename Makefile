# Quick start: `make demo` (serve the embedded model on 127.0.0.1) and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build demo test clean gpu-check

all: build

deps:
	@scripts/bootstrap

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The demo model also answers to the name the seeds' curl examples use.
demo: build
	$(BUILD)/moonrun serve --host 127.0.0.1 --port 8000 --served-model-name moonrun-demo moonshotai/Kimi-K3

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

gpu-check:
	scripts/gpu-check.sh

clean:
	rm -rf $(BUILD)
