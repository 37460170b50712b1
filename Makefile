# train_gpt build. `make` builds the trainer (C++17) with the CPU and CUDA backends (nvcc);
# `make test` builds and runs the test suite (GPU tests only where a CUDA device is present).
# `make CUDA=0 [test]` builds everything but the CUDA backend, on a machine without the toolkit.
CUDA      ?= 1
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CXX       ?= g++
GPU_ARCH  ?= 80 90a

MPI_CFLAGS := $(shell mpicxx --showme:compile 2>/dev/null) -DOMPI_SKIP_MPICXX
MPI_LIBS   := $(shell mpicxx --showme:link 2>/dev/null)

# OpenBLAS, the OpenMP build (libopenblas-openmp-dev; its threads are OpenMP's), named by its folder
# so that the system's default BLAS (often the pthread build) does not stand in: only
# dev/bench/cpu_gemm.sh's comparison links it. The CPU backend keeps its hand-written GEMM
# (llmc/cpu/gemm.h): faster on the project's machines, and bitwise the same for any thread count.
BLAS_DIR   ?= /usr/lib/$(shell $(CXX) -print-multiarch)/openblas-openmp
BLAS_CFLAGS := -I/usr/include/$(shell $(CXX) -print-multiarch)/openblas-openmp
BLAS_LIBS  := -L$(BLAS_DIR) -Xlinker -rpath -Xlinker $(BLAS_DIR) -lopenblas

# SANITIZE=1: everything (train_gpt, the data tools, build-asan/test_cpu) built with ASan and
# UBSan (-O1 -g, any error fatal) into build-asan/, leaving the usual build alone; CPU only.
# `make test SANITIZE=1` runs the suite on those binaries (see docs/building.md, "Sanitizers").
SANITIZE  ?= 0
ifeq ($(SANITIZE),1)
override CUDA := 0
BUILD     ?= build-asan
BIN       ?= build-asan/
CXXFLAGS  ?= -O1 -g $(CPU_ARCH) -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif

# CPU_ARCH: the bundle (scripts/bundle.sh) builds with portable flags, e.g. -march=x86-64-v2.
CPU_ARCH  ?= -march=native
CXXFLAGS  ?= -O3 $(CPU_ARCH)
CXXFLAGS  += -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I. $(MPI_CFLAGS) -MMD -MP
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 -I. $(MPI_CFLAGS) -Xcompiler -fopenmp,-Wall -MMD -MP \
             $(foreach a,$(GPU_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) --expt-relaxed-constexpr \
             $(if $(filter 90a,$(GPU_ARCH)),-DLLMC_SM90A) -compress-mode=size
# (-compress-mode=size: the device code compressed harder in the binary; the CUDA runtime unpacks
# it at load. attention.o 12.5 -> 1.9 MB: the bundle and the GPU kit had reached their 60 MiB)
# (90a: sm_90 with Hopper's arch-specific instructions, wgmma: llmc/cuda/flash_forward_wgmma.cuh; its
# code runs on sm_90 devices only, as sm_90's would. LLMC_SM90A tells the host code it is there.)
# (cuBLASLt is not linked: the backend loads it on first use, llmc/cuda/common.cuh's lt(); the rpath
# still finds it there)
LDLIBS    := -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart \
             $(MPI_LIBS) -lgomp -lpthread -ldl

# BUILD holds objects and tests; BIN prefixes train_gpt and the data tools (empty: the repository root).
# scripts/bundle.sh builds with BUILD=build-dist BIN=build-dist/ so that it leaves the usual build alone.
BUILD     ?= build
BIN       ?=
LIB_SRCS  := $(wildcard llmc/*/*.cpp)
LIB_OBJS  := $(LIB_SRCS:%.cpp=$(BUILD)/%.o)
ifeq ($(CUDA),0)
CUDA_OBJS :=
LINK      := $(CXX) $(CXXFLAGS)
LINK_LIBS := $(MPI_LIBS)
else
CUDA_SRCS := $(wildcard llmc/cuda/*.cu)
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
LINK      := $(NVCC) $(NVCCFLAGS)
LINK_LIBS := $(LDLIBS)
endif
TEST_SRCS := $(wildcard test/test_*.cpp)
TEST_OBJS := $(TEST_SRCS:%.cpp=$(BUILD)/%.o)
# (test_gpu.cu is test_gpu's one translation unit: it includes test/gpu/cases_*.cuh)
GPU_TEST_SRCS := $(if $(filter 0,$(CUDA)),,test/gpu/test_gpu.cu)
TOOLS     := $(patsubst %.cpp,$(BIN)%,$(wildcard dev/data/*.cpp))

.PHONY: all test clean bundle gpu-kit fuzz check-layout test-emu
# the data tools' objects stay (make would delete them as intermediates and rebuild them each time)
.PRECIOUS: $(BUILD)/dev/data/%.o
all: $(BIN)train_gpt $(TOOLS)

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
# the backend refuses, naming the make line, a GPU that none of GPU_ARCH's code runs on
# (llmc/cuda/device_arch.h; the words joined by commas: one argument through the shell and nvcc)
comma := ,
empty :=
space := $(empty) $(empty)
$(BUILD)/llmc/cuda/cuda_ops.o: NVCCFLAGS += -DLLMC_GPU_ARCHS=\"$(subst $(space),$(comma),$(strip $(GPU_ARCH)))\"

# The unit tests' own code at TEST_OPT (-O1): they test the library, built at CXXFLAGS; -O3 took
# 40-70% longer to compile them (test_config.cpp 16.7 -> 9.9 s, Catch2's test_main.cpp 21 -> 14 s here)
TEST_OPT  ?= -O1
$(TEST_OBJS): CXXFLAGS := $(filter-out -O%,$(CXXFLAGS)) $(TEST_OPT)

# train_gpt.cu holds no device code: g++ compiles it as C++ with or without the CUDA backend.
$(BUILD)/train_gpt.o: train_gpt.cu
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -x c++ -c $< -o $@

$(BUILD)/libllmc.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

# The binary remembers which CUDA setting built it: switching relinks.
$(BUILD)/.cuda-$(CUDA):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.cuda-* && touch $@

$(BIN)train_gpt: $(BUILD)/train_gpt.o $(CUDA_OBJS) $(BUILD)/libllmc.a $(BUILD)/.cuda-$(CUDA)
	$(LINK) -o $@ $(filter-out $(BUILD)/.cuda-%,$^) $(LINK_LIBS)

$(BIN)dev/data/%: $(BUILD)/dev/data/%.o $(BUILD)/libllmc.a
	$(CXX) $(CXXFLAGS) -o $@ $^ $(MPI_LIBS)

# CPU tests: Catch2 v2, no CUDA needed.
$(BUILD)/test_cpu: $(TEST_OBJS) $(BUILD)/libllmc.a
	$(CXX) $(CXXFLAGS) -o $@ $^ $(MPI_LIBS)

# dev/bench/cpu_gemm.sh: the hand-written GEMM against OpenBLAS's sgemm on the model's shapes.
$(BUILD)/dev/bench/cpu_gemm_bench.o: CXXFLAGS += $(BLAS_CFLAGS)
$(BUILD)/cpu_gemm_bench: $(BUILD)/dev/bench/cpu_gemm_bench.o
	$(CXX) $(CXXFLAGS) -o $@ $^ $(BLAS_LIBS)

# GPU tests: compiled everywhere, run only where a CUDA device is present.
$(BUILD)/test_gpu: $(GPU_TEST_SRCS:%.cu=$(BUILD)/%.o) $(CUDA_OBJS) $(BUILD)/libllmc.a
	$(NVCC) $(NVCCFLAGS) -o $@ $^ $(LDLIBS)

# The CUDA source on the CPU (test/cuemu, see its README section): llmc/cuda's backend and test_gpu's
# op cases compiled by g++ against the emulator (each CUDA thread a fiber, blocks over OpenMP).
# `make test-emu` builds build/test_gpu_emu and runs test/cuemu/run.sh (two schedules, planted bugs).
# -g1: backtraces name functions and lines (full -g took 20% longer: attention.cu 29 -> 24 s here).
EMU_FLAGS := -O2 -g1 $(CPU_ARCH) -std=c++17 -fopenmp -Wall -Wextra -Wno-unused-parameter -I. -Itest/cuemu/include $(MPI_CFLAGS) \
             -DLLMC_CUEMU -MMD -MP
EMU_OBJS  := $(patsubst %.cpp,$(BUILD)/emu/%.o,$(wildcard test/cuemu/cuemu.cpp test/cuemu/cublaslt.cpp))
# the backend's translation units (NCCL's communicator is not emulated)
EMU_CUDA_OBJS := $(patsubst %.cu,$(BUILD)/emu/%.o,$(filter-out llmc/cuda/comm_nccl.cu,$(wildcard llmc/cuda/*.cu)))
$(BUILD)/emu/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_FLAGS) -x c++ -c $< -o $@
$(BUILD)/emu/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_FLAGS) -c $< -o $@
$(BUILD)/test_gpu_emu: $(BUILD)/emu/test/gpu/test_gpu.o $(EMU_CUDA_OBJS) $(EMU_OBJS) $(BUILD)/libllmc.a
	$(CXX) $(EMU_FLAGS) -o $@ $^ $(MPI_LIBS) -lboost_context
# The trainer itself on the emulator (train_gpt.cu is plain C++; CudaOps the emulated one): device
# "cuda" end to end in CI, slowly (test/e2e/test_fp16_cuda_emu.sh).
$(BUILD)/train_gpt_emu: $(BUILD)/train_gpt.o $(EMU_CUDA_OBJS) $(EMU_OBJS) $(BUILD)/libllmc.a
	$(CXX) $(EMU_FLAGS) -o $@ $^ $(MPI_LIBS) -lboost_context
$(BUILD)/cuemu_selftest: $(BUILD)/emu/test/cuemu/selftest.o $(EMU_OBJS) $(BUILD)/libllmc.a
	$(CXX) $(EMU_FLAGS) -o $@ $^ $(MPI_LIBS) -lboost_context
EMU_ENV   := CXX="$(CXX)" EMU_FLAGS="$(EMU_FLAGS)" MPI_LIBS="$(MPI_LIBS)"
test-emu: $(BUILD)/test_gpu_emu $(BUILD)/cuemu_selftest
	LLMC_BUILD=$(BUILD) $(EMU_ENV) bash test/cuemu/run.sh

# NCCL/MPI communicator checks on a GPU machine: mpirun -np 2 dev/comm_check nccl (see the file).
dev/comm_check: $(BUILD)/dev/comm_check.o $(CUDA_OBJS) $(BUILD)/libllmc.a
	$(NVCC) $(NVCCFLAGS) -o $@ $^ $(LDLIBS)

# (the emulator's tests: not under SANITIZE=1, whose library objects need ASan's runtime)
EMU_TESTS := $(if $(filter 1,$(SANITIZE)),,$(BUILD)/test_gpu_emu $(BUILD)/cuemu_selftest $(BUILD)/train_gpt_emu)
test: $(BIN)train_gpt $(TOOLS) $(BUILD)/test_cpu $(if $(GPU_TEST_SRCS),$(BUILD)/test_gpu) $(EMU_TESTS)
	LLMC_BUILD=$(BUILD) LLMC_BIN=$(BIN) LLMC_SANITIZE=$(SANITIZE) $(EMU_ENV) bash test/run_tests.sh

# llmc/'s includes point down its layer table (llmc/README.md); test/e2e/test_include_layers.sh runs it.
check-layout:
	bash scripts/check_layout.sh

# A relocatable folder dist/ with the binaries and the OpenMPI runtime, for a machine without OpenMPI.
bundle:
	CUDA=$(CUDA) GPU_ARCH="$(GPU_ARCH)" bash scripts/bundle.sh

# gpu-kit/: everything a GPU window runs, built here for sm_90a (GPU_ARCH="80 90a" for both), with
# the test data: copy it to the GPU machine and run gpu-kit/scripts/gpu_check.sh --quick (docs/gpu.md).
gpu-kit:
	$(if $(filter command line,$(origin GPU_ARCH)),GPU_ARCH="$(GPU_ARCH)") bash scripts/bundle.sh --kit

# Fuzzing (libFuzzer, clang; no CUDA): `make fuzz FUZZ_SECONDS=N` builds test/fuzz/fuzz_*.cpp with
# ASan and UBSan and runs each target for N seconds from its seeds (test/fuzz/corpus/<target>/);
# see test/fuzz/README.md. Line tables only: the sanitizers' reports name file and line (full -g
# took 11% longer to compile, 18.3 -> 16.3 s for llmc/core/config.cpp).
FUZZ_CXX      ?= clang++
FUZZ_SECONDS  ?= 60
FUZZ_FLAGS    := -O1 -gline-tables-only -std=c++17 -fopenmp -I. $(MPI_CFLAGS) -fsanitize=address,undefined \
                 -fno-sanitize-recover=undefined -fno-omit-frame-pointer -MMD -MP
FUZZ_LIB_SRCS := llmc/core/common.cpp llmc/core/config.cpp llmc/core/config_schema.cpp llmc/data/shard.cpp \
                 llmc/data/dataloader.cpp llmc/io/checkpoint.cpp llmc/io/model_file.cpp llmc/model/param_table.cpp \
                 llmc/model/families.cpp llmc/io/safetensors.cpp llmc/data/tokenizer.cpp
FUZZ_BINS     := $(patsubst test/fuzz/%.cpp,$(BUILD)/fuzz/bin/%,$(wildcard test/fuzz/fuzz_*.cpp))

.PRECIOUS: $(BUILD)/fuzz/obj/%.o
$(BUILD)/fuzz/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(BUILD)/fuzz/bin/%: $(BUILD)/fuzz/obj/test/fuzz/%.o $(FUZZ_LIB_SRCS:%.cpp=$(BUILD)/fuzz/obj/%.o)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(MPI_LIBS)

fuzz: $(FUZZ_BINS)
	bash test/fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BIN)train_gpt $(TOOLS) dev/comm_check

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
