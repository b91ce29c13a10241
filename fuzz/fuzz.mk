# Builds the libFuzzer targets of fuzz/ with clang, ASan and UBSan, against Debian's LibTorch,
# Abseil, protobuf and glog (the link flags of third_party/system/BUILD.bazel, the defines and
# include paths of .bazelrc). Run through tools/fuzz.sh, which sets ROOT and OUT:
#   make -f fuzz/fuzz.mk ROOT=$PWD OUT=build/fuzz -j2 json_fuzzer
# Each project source is compiled once into $(OUT)/obj (coverage-instrumented, sanitized) and
# shared by every target that needs it; -MMD keeps rebuilds incremental.

ROOT ?= .
OUT ?= build/fuzz
CXX ?= clang++
# The linker driver (CXX may start with a compiler cache).
LINKER ?= $(lastword $(CXX))
PROTOC ?= protoc

SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined
CXXFLAGS := -std=c++17 -O1 -gline-tables-only -fno-omit-frame-pointer $(SANITIZE) \
  -fsanitize=fuzzer-no-link -DUSE_C10D_GLOO -DCPPTRAIN_HAS_GLOO=1 -Wno-unused-parameter \
  -I$(ROOT) -I$(OUT)/gen -isystem /usr/include/torch/csrc/api/include
LDFLAGS := $(SANITIZE) -fsanitize=fuzzer

ABSL_LIBS := -labsl_statusor -labsl_status -labsl_cord -labsl_synchronization -labsl_time \
  -labsl_str_format_internal -labsl_strings -labsl_strings_internal -labsl_throw_delegate \
  -labsl_raw_hash_set -labsl_hash -labsl_base -labsl_raw_logging_internal
BASE_LIBS := $(ABSL_LIBS) -lprotobuf -lglog -lgflags -lpthread
TORCH_LIBS := -ltorch -ltorch_cpu -lc10

PROTOS := $(basename $(notdir $(wildcard $(ROOT)/proto/*.proto)))
PROTO_HDRS := $(PROTOS:%=$(OUT)/gen/proto/%.pb.h)

TARGETS := json_fuzzer safetensors_fuzzer hf_config_fuzzer token_file_fuzzer text_proto_fuzzer \
  set_override_fuzzer trainer_state_fuzzer manifest_parse_fuzzer manifest_fuzzer \
  accelerate_yaml_fuzzer hf_json_args_fuzzer

# Sources (without .cc, from the repository root; gen/proto/X.pb for proto/X.proto) of each
# target: $(OUT)/sources.mk, written by tools/fuzz.sh from the Bazel libraries each target
# needs (its FUZZ_DEPS, `bazel query` of their source files), so the lists follow the BUILD
# files. Each target adds its own fuzz/<target>.cc.
include $(OUT)/sources.mk
$(foreach t,$(TARGETS),$(eval $(t)_SRCS := fuzz/$(t) $($(t)_SRCS)))

json_fuzzer_LIBS := $(BASE_LIBS)
safetensors_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
hf_config_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
token_file_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
text_proto_fuzzer_LIBS := $(BASE_LIBS)
set_override_fuzzer_LIBS := $(BASE_LIBS)
trainer_state_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
manifest_parse_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
manifest_fuzzer_LIBS := $(BASE_LIBS) $(TORCH_LIBS)
accelerate_yaml_fuzzer_LIBS := $(BASE_LIBS)
hf_json_args_fuzzer_LIBS := $(BASE_LIBS)

.PHONY: all
all: $(TARGETS)

# Generated sources live under $(OUT); project sources under $(ROOT).
obj_of = $(patsubst %,$(OUT)/obj/%.o,$(sort $(1)))

define fuzz_target
$(1): $(OUT)/bin/$(1)
$(OUT)/bin/$(1): $(call obj_of,$($(1)_SRCS))
	@mkdir -p $$(@D)
	$(LINKER) $(LDFLAGS) $$^ -o $$@ $($(1)_LIBS)
endef
$(foreach t,$(TARGETS),$(eval $(call fuzz_target,$(t))))
.PHONY: $(TARGETS)

$(OUT)/gen/proto/%.pb.cc $(OUT)/gen/proto/%.pb.h: $(ROOT)/proto/%.proto
	@mkdir -p $(OUT)/gen
	$(PROTOC) --proto_path=$(ROOT) --cpp_out=$(OUT)/gen $(ROOT)/proto/$*.proto

$(OUT)/obj/gen/%.o: $(OUT)/gen/%.cc | $(PROTO_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(OUT)/obj/%.o: $(ROOT)/%.cc | $(PROTO_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

-include $(shell find $(OUT)/obj -name '*.d' 2>/dev/null)

# Keep generated sources between runs.
.SECONDARY:
