# Entry points named in the README. Each one installs what it needs first.
#   make demo    install deps, build, run the main job
#   make test    install deps, build, run every test (ctest)
#   make bench   install deps, build optimised, run the benchmarks
#   make package install deps, build, make the .deb (and its -dbgsym .ddeb)
#                in $(BUILD_DIR)/packages with CPack
#   make soak    build, then run the e2e tests 5 times beside a busy loop
#                (scripts/soak.sh; SOAK_ARGS="-n 20 -- -R ChaosTest" for more)
# Options: SANITIZE=ON (AddressSanitizer + UBSan), WERROR=ON (warnings fail
# the build). CI (.ci/run) runs `make test` under the sanitizers for the unit
# and fuzz tests (CTEST_ARGS="-LE e2e") and on the plain build for the e2e ones.

SANITIZE ?= OFF
WERROR ?= OFF
BUILD_TYPE ?= RelWithDebInfo
ifeq ($(SANITIZE),ON)
BUILD_DIR ?= build-asan
else
BUILD_DIR ?= build
endif
JOBS ?= $(shell nproc)
# Extra ctest arguments, e.g. CTEST_ARGS="-L e2e" (real processes only) or
# CTEST_ARGS="-LE e2e" (everything else: unit, in-process and fuzz tests).
CTEST_ARGS ?=

# More -D flags, e.g. CMAKE_EXTRA=-DGPUHA_ONLY_E2E=ON (with a BUILD_DIR of its own).
CMAKE_EXTRA ?=

CMAKE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
  -DGPUHA_SANITIZE=$(SANITIZE) -DGPUHA_WERROR=$(WERROR) $(CMAKE_EXTRA)

.PHONY: deps configure build test demo bench package soak format clean

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 300 $(CTEST_ARGS)

demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target gpuha
	$(BUILD_DIR)/gpuha demo

bench: deps
	cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build build-release -j $(JOBS) --target gpuha gpuha-test-backend plan_bench agent_bench controller_bench controller_ha_bench failover_bench job_takeover_bench
	build-release/bench/plan_bench
	build-release/bench/agent_bench build-release/gpuha 20 100
	build-release/bench/controller_bench build-release/gpuha 2000 15
	build-release/bench/controller_ha_bench build-release/gpuha 10
	build-release/bench/job_takeover_bench build-release/gpuha 10
	bench/router_throughput.sh build-release/gpuha 5 64 5
	bench/failover.sh build-release 10
	bench/grpc_throughput.sh build-release/gpuha 20000 16 8 3
	bench/grpc_failover.sh build-release/gpuha 8 400
	bench/router_allocs.sh build-release/gpuha

soak: build
	scripts/soak.sh -b $(BUILD_DIR) $(SOAK_ARGS)

package: build
	cd $(BUILD_DIR) && cpack -B packages
	@ls -l $(BUILD_DIR)/packages/*.deb $(BUILD_DIR)/packages/*.ddeb

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build build-asan build-e2e build-release
