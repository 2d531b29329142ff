# ctune — build, test, demo, bench.
#   make          build/ctune (CUDA backend too when nvcc is present)
#   make test     build and run every test; ends with "N passed, N failed"
#   make demo     the quick start: tiny model, bundled data, a short training run
#   make bench    GPU benchmarks (on a machine with a GPU): BENCH=dense (default,
#                 scripts/bench.sh), memory (scripts/bench_memory.sh), moe
#                 (scripts/bench_moe.sh) or all
#   make test-asan  the CPU test suite under AddressSanitizer + UBSan (build-asan/)
#   make fuzz     libFuzzer targets (clang) for every untrusted-input reader, each
#                 run FUZZ_SECONDS (default 60); see docs/RELIABILITY.md
# Options: STATIC=0 links libyaml, zlib, PCRE2 and utf8proc dynamically (default:
# statically when their .a files exist, so the binary runs on machines that lack them);
# CUDA=0 forces a CPU-only build.

BUILD   ?= build
# Sources live in one folder per concern (src/*/, cuda/*/; docs/ARCHITECTURE.md);
# every folder is on the include path, so an #include names only the file.
SRC_INC := $(patsubst %/,-I%,$(sort $(wildcard src/*/)))
CU_INC  := $(patsubst %/,-I%,$(sort $(wildcard cuda/*/)))
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),$(if $(wildcard cuda/*/*.cu),1,0),0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
LIBDIR  := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib))
# Whether a library's .a exists is asked when a link runs, not when make reads this
# file: on a fresh machine scripts/ensure_deps.sh installs them after that.
have_static = $(shell test -f $(LIBDIR)/lib$(1).a && echo 1)
STATIC  ?= $(if $(call have_static,yaml),1,0)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp $(SRC_INC) -MMD -MP
# libyaml and zlib static when STATIC=1; PCRE2 and utf8proc (the tokenizer) static
# too where their .a files exist. LDLIBS is expanded at link time (see have_static).
static_or_dynamic = $(if $(and $(filter 1,$(STATIC)),$(call have_static,$(1))),$(LIBDIR)/lib$(1).a,-l$(1))
LDLIBS   = -lm -lpthread -fopenmp \
           $(if $(filter 1,$(STATIC)),$(LIBDIR)/libyaml.a $(LIBDIR)/libz.a,-lyaml -lz) \
           $(call static_or_dynamic,pcre2-8) $(call static_or_dynamic,utf8proc)

C_SRCS   := $(filter-out src/cli/main.c,$(wildcard src/*/*.c))
C_OBJS   := $(C_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

ifeq ($(CUDA),1)
  CU_SRCS  := $(wildcard cuda/*/*.cu)
  CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
  NVFLAGS  ?= -O3 -g -lineinfo
  NVFLAGS  += -std=c++17 $(SRC_INC) $(CU_INC) -gencode arch=compute_90a,code=sm_90a \
              -gencode arch=compute_90a,code=compute_90a -Xcompiler -fPIC -MMD -MP
  CFLAGS   += -DCT_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas \
              -lcudart_static -ldl -lrt -lstdc++
else
  CU_OBJS  :=
endif
ALL_OBJS := $(C_OBJS) $(CU_OBJS)

.PHONY: all tests test demo bench bench-bins clean deps test-asan fuzz fuzz-bins fuzz-cc
all: $(BUILD)/deps.ok $(BUILD)/ctune

# Missing build dependencies are installed when we are root, else named exactly.
$(BUILD)/deps.ok: scripts/ensure_deps.sh
	@mkdir -p $(BUILD)
	@bash scripts/ensure_deps.sh
	@if [ "$(CUDA)" != 1 ]; then echo "note: nvcc not found, building the CPU-only backend (install the CUDA toolkit for the GPU backend)"; fi
	@touch $@

$(BUILD)/obj/%.o: %.c | $(BUILD)/deps.ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu | $(BUILD)/deps.ok
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/libctune.a: $(ALL_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/ctune: $(BUILD)/obj/src/cli/main.o $(BUILD)/libctune.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libctune.a tests/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -Itests -Ifuzz -o $@ $< $(BUILD)/libctune.a $(LDLIBS)

tests: all $(TEST_BINS)

test: tests
	@bash tests/run_tests.sh $(BUILD)

demo: all
	@bash scripts/demo.sh

$(BUILD)/bench/%: bench/%.c $(BUILD)/libctune.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libctune.a $(LDLIBS)

bench-bins: all $(BENCH_BINS)

BENCH ?= dense
bench: bench-bins
	@case " $(BENCH) " in *" dense "*|*" all "*) bash scripts/bench.sh ;; esac
	@case " $(BENCH) " in *" memory "*|*" all "*) bash scripts/bench_memory.sh ;; esac
	@case " $(BENCH) " in *" moe "*|*" all "*) bash scripts/bench_moe.sh ;; esac

# The CPU suite again with every object built under ASan + UBSan; a sanitizer
# report aborts the test that triggered it (no recovery), so it counts as failed.
# GCC leaves float-cast-overflow out of 'undefined'; it is what a huge config value trips.
# CFLAGS goes through the environment so the Makefile's own flags still append
# to it; libyaml/zlib link shared (their static archives gain nothing here).
ASAN_FLAGS := -O2 -g -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=all
test-asan:
	CFLAGS="$(ASAN_FLAGS)" LDFLAGS="-fsanitize=address,undefined,float-cast-overflow" $(MAKE) BUILD=build-asan CUDA=0 STATIC=0 tests
	CTUNE_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    bash tests/run_tests.sh build-asan

# libFuzzer targets: fuzz/fuzz_NAME.c linked with the readers it exercises, all
# built by clang into build-fuzz/: the readers with -fsanitize=fuzzer-no-link
# (coverage) + ASan + UBSan, each target with -fsanitize=fuzzer (libFuzzer's main).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN     := address,undefined,float-cast-overflow
FUZZ_CFLAGS  := -O1 -g -std=c11 -D_GNU_SOURCE -DCT_LIBFUZZER $(SRC_INC) -Ifuzz -fno-omit-frame-pointer \
                -fno-sanitize-recover=all -MMD -MP
FUZZ_LIB     := src/common/common.c src/common/json.c src/formats/config.c src/formats/safetensors.c src/formats/shard.c src/formats/model_config.c \
                src/text/tokenizer.c src/text/tokenizer_encode.c src/text/tokenizer_decode.c src/text/tokenizer_bpe.c src/text/tokenizer_text.c \
                src/model/model.c src/model/lora.c src/formats/adapter.c src/formats/checkpoint.c src/formats/quant4.c \
                src/formats/quant4_write.c src/formats/mxfp4.c src/formats/fp8.c $(wildcard src/text/chat_template*.c)
FUZZ_OBJS    := $(FUZZ_LIB:src/%.c=build-fuzz/obj/%.o)
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))

fuzz-cc:
	@command -v $(FUZZ_CC) >/dev/null || { echo "error: make fuzz needs clang" >&2; \
	    echo "HINT: run: sudo apt-get install -y clang" >&2; exit 2; }

build-fuzz/obj/%.o: src/%.c | fuzz-cc
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@

build-fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,$(FUZZ_SAN) -o $@ $< $(FUZZ_OBJS) -lyaml -lz -lpcre2-8 -lutf8proc -lm

fuzz-bins: $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)

fuzz: fuzz-bins
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash fuzz/run.sh $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) build-asan build-fuzz

-include $(shell find $(BUILD)/obj build-fuzz -name '*.d' 2>/dev/null)
