// Fuzzes the checkpoint manifest (checkpoint/manifest.h ReadManifest, proto/checkpoint.proto) and
// everything that trusts it once it reads: ckpt verify (checkpoint/verify.h VerifyCheckpoint) and
// resuming (checkpoint/checkpoint.h VerifyModelState and LoadModelState, strict and not) into a
// tiny decoder with an AdamW optimizer. The input is manifest.pb. It is placed in two fixture
// checkpoints of that decoder, written once at start-up by SaveModelState with values that are
// exact in float (so the files, and the seeds' checksums, are the same on every machine): one with
// model.safetensors (full_model), one with the shard file only. Each is tried with the input as it
// is (only ReadManifest when that fails), and with its manifest checksum rewritten to match the
// rest (else nearly every mutation would stop at the checksum); an input naming
// model.safetensors goes to the first fixture, any other to the second. Properties:
// VerifyModelState changes nothing; when it fails, LoadModelState fails too; a failed
// LoadModelState leaves the parameters as they were (unless the optimizer refused its state).
//
// CPPTRAIN_FUZZ_WRITE_SEEDS=DIR writes the fixtures' own manifests to DIR and exits (how
// fuzz/corpus/manifest_fuzzer/fixture-*.pb were made).
#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/optim/adamw.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/verify.h"
#include "engines/local/local_engine.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/manifest_bytes.h"
#include "glog/logging.h"
#include "models/configs.h"
#include "models/decoder.h"

namespace {

using cpptrain::DecoderLM;

// Values exact in float: (i % 17 - 8) / 16 + offset / 64.
at::Tensor ExactPattern(at::IntArrayRef shape, int offset) {
  return ((at::arange(c10::multiply_integers(shape), at::kLong) % 17 - 8).to(at::kFloat) / 16 +
          static_cast<float>(offset) / 64)
      .reshape(shape);
}

struct Fixture {
  std::shared_ptr<DecoderLM> model;
  std::vector<at::Tensor> initial;  // the parameters before any load
  std::vector<std::string> dirs;    // full_model, shards
  std::vector<std::string> seeds;   // their manifest.pb bytes
};

std::unique_ptr<torch::optim::AdamW> NewOptimizer(DecoderLM& model) {
  return std::make_unique<torch::optim::AdamW>(model.parameters(),
                                               torch::optim::AdamWOptions(1e-3));
}

Fixture& TheFixture() {
  static Fixture* const fixture = [] {
    auto* f = new Fixture();
    cpptrain::proto::DecoderConfig config;
    config.set_vocab_size(16);
    config.set_hidden_size(8);
    config.set_intermediate_size(16);
    config.set_num_hidden_layers(1);
    config.set_num_attention_heads(2);
    config.set_num_key_value_heads(1);
    config.set_qk_norm(true);
    auto model = cpptrain::BuildDecoder(config, {});
    FUZZ_CHECK(model.ok(), model.status());
    f->model = *model;
    auto optimizer = NewOptimizer(*f->model);
    torch::NoGradGuard no_grad;
    int k = 0;
    for (const auto& item : f->model->named_parameters()) {
      at::Tensor p = item.value();
      p.copy_(ExactPattern(p.sizes(), k));
      const absl::Status imported =
          cpptrain::ImportOptimizerState(*optimizer, p,
                                         {{"exp_avg", ExactPattern(p.sizes(), k + 1)},
                                          {"exp_avg_sq", ExactPattern(p.sizes(), k + 2).abs()},
                                          {"step", at::full({}, 3.0, at::kDouble)}});
      FUZZ_CHECK(imported.ok(), imported);
      f->initial.push_back(p.detach().clone());
      ++k;
    }
    cpptrain::proto::LocalEngineConfig engine_config;
    engine_config.set_device("cpu");
    auto engine = cpptrain::LocalEngine::Create(engine_config, cpptrain::MixedPrecision::kNone);
    FUZZ_CHECK(engine.ok(), engine.status());
    for (const bool full : {true, false}) {
      const std::string dir = cpptrain::fuzz::ScratchPath(full ? "full_model" : "shards");
      FUZZ_CHECK(::mkdir(dir.c_str(), 0755) == 0, dir);
      cpptrain::SaveModelStateOptions options;
      options.full_model = full;
      const absl::Status saved =
          cpptrain::SaveModelState(dir, *f->model, optimizer.get(), **engine, options);
      FUZZ_CHECK(saved.ok(), saved);
      auto bytes = cpptrain::ReadFile(dir + "/" + cpptrain::kManifestFileName);
      FUZZ_CHECK(bytes.ok(), bytes.status());
      f->dirs.push_back(dir);
      f->seeds.push_back(*bytes);
    }
    return f;
  }();
  return *fixture;
}

bool ParametersAre(const DecoderLM& model, const std::vector<at::Tensor>& values) {
  size_t i = 0;
  for (const auto& item : model.named_parameters()) {
    if (!at::equal(item.value(), values[i++])) return false;
  }
  return true;
}

void ResetParameters(Fixture& f) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const auto& item : f.model->named_parameters()) item.value().copy_(f.initial[i++]);
}

// Everything that reads the manifest in `dir`, as the Trainer and tools/ckpt call it: strict, a
// LoadModelState that verifies for itself (load_best_model_at_end); not strict, VerifyModelState
// and then LoadModelState with `verified` (resume_from_checkpoint).
void Check(Fixture& f, const std::string& dir) {
  const auto manifest = cpptrain::ReadManifest(dir);
  const auto report = cpptrain::VerifyCheckpoint(dir);
  FUZZ_CHECK(report.ok() == manifest.ok(),
             "VerifyCheckpoint: " << report.status() << "; ReadManifest: " << manifest.status());
  for (const bool strict : {true, false}) {
    cpptrain::LoadModelStateOptions options;
    options.strict = strict;
    auto optimizer = NewOptimizer(*f.model);
    absl::Status verified = absl::OkStatus();
    if (!strict) {
      verified = cpptrain::VerifyModelState(dir, *f.model, optimizer.get(), options);
      FUZZ_CHECK(ParametersAre(*f.model, f.initial), "VerifyModelState changed the model");
      FUZZ_CHECK(manifest.ok() || !verified.ok(), "verified a manifest that does not read");
      options.verified = verified.ok();
    }
    const absl::Status loaded = cpptrain::LoadModelState(dir, *f.model, optimizer.get(), options);
    FUZZ_CHECK(manifest.ok() || !loaded.ok(), "loaded a manifest that does not read");
    if (!verified.ok()) {
      FUZZ_CHECK(!loaded.ok(), "loaded what VerifyModelState refused: " << verified);
    }
    // Only an optimizer refusing its state (ImportState's errors: "', parameter <name>: ..." and
    // "...; the parameters are loaded") fails after the parameters were copied.
    if (!loaded.ok() && !absl::StrContains(loaded.message(), "the parameters are loaded") &&
        !absl::StrContains(loaded.message(), "', parameter ")) {
      FUZZ_CHECK(ParametersAre(*f.model, f.initial),
                 "a failed LoadModelState changed the model: " << loaded);
    }
    ResetParameters(f);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;  // loading warns (load_strict: false, no checksums); errors only
  Fixture& f = TheFixture();
  if (const char* out = std::getenv("CPPTRAIN_FUZZ_WRITE_SEEDS"); out != nullptr) {
    const char* names[] = {"fixture-full_model.pb", "fixture-shards.pb"};
    for (size_t i = 0; i < f.seeds.size(); ++i) {
      cpptrain::fuzz::WriteFileOrDie(std::string(out) + "/" + names[i], f.seeds[i]);
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = TheFixture();
  // The fixture whose data files the manifest names: model.safetensors, or the shards alone.
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string& dir =
      absl::StrContains(bytes, cpptrain::kSafetensorsFileName) ? f.dirs[0] : f.dirs[1];
  const std::string path = dir + "/" + cpptrain::kManifestFileName;
  const std::string fixed = cpptrain::fuzz::WithFixedChecksum(data, size);
  if (fixed != bytes) {
    // As it is: the checksum (or the parse) refuses it, and so must everything else.
    cpptrain::fuzz::WriteFileOrDie(path, data, size);
    const auto manifest = cpptrain::ReadManifest(dir);
    if (!manifest.ok()) {
      auto optimizer = NewOptimizer(*f.model);
      FUZZ_CHECK(!cpptrain::LoadModelState(dir, *f.model, optimizer.get()).ok() &&
                     !cpptrain::VerifyCheckpoint(dir).ok() && ParametersAre(*f.model, f.initial),
                 "a manifest that does not read was used: " << manifest.status());
    } else {
      Check(f, dir);
    }
  }
  cpptrain::fuzz::WriteFileOrDie(path, fixed);
  Check(f, dir);
  return 0;
}
