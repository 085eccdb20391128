# Build for the whole project. CPU pieces: g++ (C++20, OpenMP, OpenBLAS), MPI through mpicxx when it exists
# (USE_MPI=0 builds a single-process trainer without it). CUDA pieces: nvcc for sm_80 and sm_90, which
# compile and link on machines without a GPU.
#
#   make                 CPU trainer, tools, tests
#   make train_gpt       CUDA trainer (bf16; train_gpt_fp32: the fp32 build, for testing)
#   make test            build everything and run every test (the command CI runs)
#   make bench           CPU benchmarks (ms/step, tok/s)
#   make gpu-check       GPU tests and benchmarks (skips without a GPU)
#   make emu             the CUDA trainer and GPU tests on the emulated device (CPU; part of `all`)

USE_MPI ?= $(if $(shell command -v mpicxx 2>/dev/null),1,0)
CXX_PLAIN ?= g++
ifeq ($(USE_MPI),1)
  CXX := mpicxx
  MPI_FLAGS := -DLLMC_USE_MPI -DOMPI_SKIP_MPICXX
else
  CXX := $(CXX_PLAIN)
  MPI_FLAGS :=
endif
OPT ?= -O3 -march=native
GIT_VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CXXFLAGS := -std=c++20 $(OPT) -fopenmp -Wall -Wextra -Wno-unused-parameter -I. $(MPI_FLAGS) -MMD -MP
# zlib and zstd: compressed corpora and eval files (llmc/base/byte_stream.cpp)
HOST_LIBS := -lopenblas -licuuc -lz -lzstd
LDLIBS := $(HOST_LIBS) -fopenmp -lm

NVCC ?= /usr/local/cuda/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
# -lineinfo: source lines for Nsight Compute's per-line counters; it does not change the generated code
NVCCFLAGS := -std=c++20 -O3 --use_fast_math -lineinfo $(CUDA_ARCH) -I. -Xcompiler -fopenmp $(MPI_FLAGS)
NVCC_LDLIBS := -lcublasLt -lcublas -lnccl -lgomp
ifeq ($(USE_MPI),1)
  NVCCFLAGS += $(shell mpicxx --showme:compile)
  NVCC_LDLIBS += $(shell mpicxx --showme:link)
endif

BUILD := build
LIB_SRCS := $(shell find llmc -name '*.cpp' | sort)
LIB_OBJS := $(LIB_SRCS:%.cpp=$(BUILD)/%.o)
LIB := $(BUILD)/libllmc.a

# test/unit/test_*.cpp are run by test/run_tests.sh; test/unit/check_*.cpp are helpers that a test script drives.
TEST_SRCS := $(wildcard test/unit/test_*.cpp test/unit/check_*.cpp)
TEST_BINS := $(TEST_SRCS:test/unit/%.cpp=$(BUILD)/test/%)
# LD_PRELOAD library that logs (and can kill at) file-system calls, for test/e2e/test_reliability.sh
FS_PROBE := $(BUILD)/test/libfs_probe.so
TOOL_SRCS := $(wildcard data/*.cpp dev/tools/*.cpp)
TOOL_BINS := $(foreach s,$(TOOL_SRCS),$(BUILD)/$(basename $(notdir $(s))))
BENCH_SRCS := $(wildcard dev/bench/*.cpp)
BENCH_BINS := $(BENCH_SRCS:dev/bench/%.cpp=$(BUILD)/bench/%)
CUDA_TEST_SRCS := $(wildcard dev/cuda/*.cu test/gpu/gpu_*.cu)
CUDA_BINS := $(foreach s,$(CUDA_TEST_SRCS),$(BUILD)/cuda/$(basename $(notdir $(s))))

# CUDA kernels run on the CPU by emu/block_emulator.h: host tests (test/emulated/test_<name>_emu.cpp ->
# build/test/test_<name>_emu) that need only the CUDA headers (g++, no GPU, no CUDA libraries), part of `all`
# wherever the toolkit is installed.
CUDA_INCLUDE ?= $(dir $(NVCC))../include
EMU_SRCS := $(wildcard test/emulated/test_*_emu.cpp)
EMU_BINS := $(if $(wildcard $(CUDA_INCLUDE)/cuda_runtime.h),$(EMU_SRCS:test/emulated/%.cpp=$(BUILD)/test/%))
# The CUDA trainer and GPU tests on the emulated device (rules below).
EMU_PROGRAMS := train_gpt $(basename $(notdir $(wildcard test/gpu/gpu_*.cu)))
EMU_DEVICE_BINS := $(if $(EMU_BINS),$(EMU_PROGRAMS:%=$(BUILD)/emu/%) $(EMU_PROGRAMS:%=$(BUILD)/emu-fp32/%) \
                   $(BUILD)/emu/nccl_transport)
EMU_DEVICE_OBJS := $(BUILD)/emu/obj/runtime.o $(BUILD)/emu/obj/cublas.o $(BUILD)/emu/obj/nccl.o

.PHONY: all test bench gpu-check clean cuda cuda-check emu
all: train_gpt_cpu sample_gpt eval_gpt $(TOOL_BINS) $(TEST_BINS) $(FS_PROBE) $(BENCH_BINS) $(EMU_BINS) $(EMU_DEVICE_BINS)

# The compilers and flags of the last build ($(BUILD)/build_flags): every object and CUDA program depends on them,
# so a build started before MPI was installed, or with another USE_MPI or OPT, is redone rather than linked from
# objects that disagree (an emulated NCCL without MPI fails at its first collective).
BUILD_FLAGS := $(CXX) $(CXXFLAGS) | $(NVCC) $(NVCCFLAGS)
FLAGS_STAMP := $(BUILD)/build_flags
$(FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo '$(BUILD_FLAGS)' | cmp -s - $@ || echo '$(BUILD_FLAGS)' > $@

$(BUILD)/%.o: %.cpp $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The code version recorded in every run's config.json. Only run_setup.o sees it, and it is rebuilt when
# `git describe` changes ($(BUILD)/git_version keeps the last value), so a run never records a stale version.
$(BUILD)/git_version: FORCE
	@mkdir -p $(BUILD)
	@echo '$(GIT_VERSION)' | cmp -s - $@ || echo '$(GIT_VERSION)' > $@
$(BUILD)/llmc/run/run_setup.o: $(BUILD)/git_version
$(BUILD)/llmc/run/run_setup.o: CXXFLAGS += -DLLMC_GIT_VERSION=\"$(GIT_VERSION)\"
.PHONY: FORCE
FORCE:

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

train_gpt_cpu: $(BUILD)/train_gpt_cpu.o $(LIB)
	$(CXX) $^ -o $@ $(LDLIBS)

sample_gpt: $(BUILD)/sample_gpt.o $(LIB)
	$(CXX) $^ -o $@ $(LDLIBS)

eval_gpt: $(BUILD)/eval_gpt.o $(LIB)
	$(CXX) $^ -o $@ $(LDLIBS)

$(FS_PROBE): test/support/fs_probe.c
	@mkdir -p $(dir $@)
	$(CXX_PLAIN) -x c -O2 -Wall -Wextra -shared -fPIC $< -o $@ -ldl

$(BUILD)/test/%: $(BUILD)/test/unit/%.o $(LIB)
	$(CXX) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/dev/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(LDLIBS)

define tool_rule
$(BUILD)/$(basename $(notdir $(1))): $(BUILD)/$(basename $(1)).o $(LIB)
	$$(CXX) $$^ -o $$@ $$(LDLIBS)
endef
$(foreach s,$(TOOL_SRCS),$(eval $(call tool_rule,$(s))))

# ---- CUDA ----
CUDA_HEADERS := $(shell find llmc -name '*.h' -o -name '*.cuh')
train_gpt: train_gpt.cu $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< $(LIB) -o $@ $(NVCC_LDLIBS) $(HOST_LIBS)

define cuda_rule
$(BUILD)/cuda/$(basename $(notdir $(1))): $(1) $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(BUILD)/cuda
	$$(NVCC) $$(NVCCFLAGS) $$< $(LIB) -o $$@ $$(NVCC_LDLIBS) $(HOST_LIBS)
endef
$(foreach s,$(CUDA_TEST_SRCS),$(eval $(call cuda_rule,$(s))))

# The fp32 build (-DENABLE_FP32: every kernel and activation in fp32, no bf16 rounding), for tight comparisons
# with the CPU trainer and PyTorch: its own trainer and GPU tests, built apart from the bf16 ones.
FP32_TEST_SRCS := $(wildcard test/gpu/gpu_*.cu)
FP32_BINS := $(if $(wildcard train_gpt.cu),train_gpt_fp32) $(FP32_TEST_SRCS:test/gpu/%.cu=$(BUILD)/cuda-fp32/%)
train_gpt_fp32: train_gpt.cu $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 $< $(LIB) -o $@ $(NVCC_LDLIBS) $(HOST_LIBS)
$(BUILD)/cuda-fp32/%: test/gpu/%.cu $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(BUILD)/cuda-fp32
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 $< $(LIB) -o $@ $(NVCC_LDLIBS) $(HOST_LIBS)

cuda: $(if $(wildcard train_gpt.cu),train_gpt) $(CUDA_BINS) $(FP32_BINS)

# What `make test` compiles with nvcc where no GPU runs it: the trainer for both architectures (the tests run
# ./train_gpt's command line), every GPU test and benchmark for sm_90 alone (no kernel has a code path that
# differs between sm_80 and sm_90, so one architecture finds every compile break at ~2/3 of the time), and the
# fp32 programs only as the emulated fp32 build compiles them (`all`). `make cuda` builds the full set.
CHECK_ARCH := -gencode arch=compute_90,code=sm_90
CHECK_BINS := $(foreach s,$(CUDA_TEST_SRCS),$(BUILD)/cuda-check/$(basename $(notdir $(s))))
define cuda_check_rule
$(BUILD)/cuda-check/$(basename $(notdir $(1))): $(1) $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(BUILD)/cuda-check
	$$(NVCC) $$(subst $$(CUDA_ARCH),$$(CHECK_ARCH),$$(NVCCFLAGS)) $$< $(LIB) -o $$@ $$(NVCC_LDLIBS) $(HOST_LIBS)
endef
$(foreach s,$(CUDA_TEST_SRCS),$(eval $(call cuda_check_rule,$(s))))
cuda-check: $(if $(wildcard train_gpt.cu),train_gpt) $(CHECK_BINS)

# The emulated-kernel tests (EMU_BINS above).
$(BUILD)/test/test_%_emu: test/emulated/test_%_emu.cpp emu/block_emulator.h $(CUDA_HEADERS) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I$(CUDA_INCLUDE) -Wno-attributes -Wno-unknown-pragmas $< $(EMU_EXTRA_OBJS) $(LIB) -o $@ $(LDLIBS)

# The CUDA trainer and GPU tests on the emulated device (no GPU): the same sources compiled by g++ with
# emu/block_emulator.h running the kernels and emu/{runtime,cublas,nccl}.cpp standing in for the
# CUDA runtime, cuBLASLt/cuBLAS and NCCL (over MPI). build/emu/ holds the bf16 programs, build/emu-fp32/ the
# fp32 ones; test/emulated/test_emulated_gpu.sh runs them against PyTorch and the CPU trainer.
EMU_CXXFLAGS = $(CXXFLAGS) -I$(CUDA_INCLUDE) -Wno-attributes -Wno-unknown-pragmas -Wno-maybe-uninitialized
EMU_COMPILE = $(CXX) $(EMU_CXXFLAGS) -x c++ -include emu/block_emulator.h
$(BUILD)/emu/obj/%.o: emu/%.cpp emu/block_emulator.h emu/streams.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
# emu_program OUTPUT SOURCE FLAGS: one program on the emulated device.
define emu_program
$(1): $(2) $(CUDA_HEADERS) dev/cuda/common.h emu/block_emulator.h $(EMU_DEVICE_OBJS) $(LIB) $(FLAGS_STAMP)
	@mkdir -p $$(dir $$@)
	$$(EMU_COMPILE) $(3) $$< -x none $(EMU_DEVICE_OBJS) $(LIB) -o $$@ $$(LDLIBS)
endef
$(foreach p,$(EMU_PROGRAMS),$(eval $(call emu_program,$(BUILD)/emu/$(p),$(if $(filter train_gpt,$(p)),train_gpt.cu,test/gpu/$(p).cu),)))
$(foreach p,$(EMU_PROGRAMS),$(eval $(call emu_program,$(BUILD)/emu-fp32/$(p),$(if $(filter train_gpt,$(p)),train_gpt.cu,test/gpu/$(p).cu),-DENABLE_FP32)))
# the NCCL transport's checker, its collectives served over MPI (test/emulated/test_emulated_gpu.sh runs it at 1-3 ranks)
$(eval $(call emu_program,$(BUILD)/emu/nccl_transport,dev/cuda/nccl_transport.cu,))
$(BUILD)/test/test_cublas_emu: $(BUILD)/emu/obj/cublas.o
$(BUILD)/test/test_cublas_emu: EMU_EXTRA_OBJS = $(BUILD)/emu/obj/cublas.o
$(BUILD)/test/test_streams_emu: $(BUILD)/emu/obj/runtime.o $(BUILD)/emu/obj/nccl.o
$(BUILD)/test/test_streams_emu: EMU_EXTRA_OBJS = $(BUILD)/emu/obj/runtime.o $(BUILD)/emu/obj/nccl.o
# the OLMo kernels' test calls the kernels' host wrappers, which need the emulated runtime
$(BUILD)/test/test_olmo_kernels_emu: $(BUILD)/emu/obj/runtime.o
$(BUILD)/test/test_olmo_kernels_emu: EMU_EXTRA_OBJS = $(BUILD)/emu/obj/runtime.o
emu: $(EMU_DEVICE_BINS)

JOBS ?= $(shell nproc)
HAVE_NVCC := $(if $(wildcard $(NVCC)),1,0)
# CI has no GPU but has the CUDA toolkit: compiling every CUDA program here (cuda-check) keeps compile breaks from
# landing.
test:
	$(MAKE) -j$(JOBS) all $(if $(filter 1,$(HAVE_NVCC)),cuda-check)
	test/run_tests.sh

bench: $(BENCH_BINS) train_gpt_cpu
	dev/bench/run_cpu_bench.sh

gpu-check: cuda
	dev/cuda/gpu_check.sh

clean:
	rm -rf $(BUILD) train_gpt_cpu sample_gpt eval_gpt train_gpt train_gpt_fp32

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
