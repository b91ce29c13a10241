// The peak host memory each rank adds while a Hugging Face directory is loaded for FSDP1 or
// ZeRO-3, with and without the efficient load (fsdp.cpu_ram_efficient_loading,
// zero.zero3_init_flag), through jobs/job_model's BuildJobModel as tools/train loads a model.
// For tests/distributed/efficient_load_test.sh and the figures in docs/ARCHITECTURE.md.
//
//   efficient_load --write=DIR --model=tiny --layers=8 --hidden=512   (one process, fp32 file)
//   launch --nproc_per_node=4 efficient_load --dir=DIR --engine=zero3 --efficient --check
//
// Each rank prints one line:
//   LOAD {"rank":0,"world":4,"engine":"zero3","efficient":true,"parameters":31000000,
//         "rss_before_kib":...,"hwm_kib":...,"load_peak_kib":...}
// load_peak_kib = VmHWM after the load - VmRSS before it (the high-water mark is reset to the
// current size first, /proc/self/clear_refs): what loading and sharding added at their peak.
// --check gathers every parameter and compares it with the file, then prints CHECKED.
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "engines/engine_factory.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "sharding/flat_shard.h"
#include "sharding/rendezvous.h"
#include "jobs/job_model.h"

ABSL_FLAG(std::string, write, "", "write a model directory here and exit (one process)");
ABSL_FLAG(std::string, model, "tiny", "--write: the named decoder shape");
ABSL_FLAG(int64_t, layers, 0, "--write: num_hidden_layers, when > 0");
ABSL_FLAG(int64_t, hidden, 0, "--write: hidden_size, when > 0");
ABSL_FLAG(int64_t, intermediate, 0, "--write: intermediate_size, when > 0");
ABSL_FLAG(int64_t, vocab, 0, "--write: vocab_size, when > 0");
ABSL_FLAG(bool, bf16_file, false, "--write: store the weights as BF16");
ABSL_FLAG(std::string, dir, "", "the model directory to load");
ABSL_FLAG(std::string, engine, "zero3", "fsdp1 or zero3");
ABSL_FLAG(bool, efficient, false, "cpu_ram_efficient_loading / zero3_init_flag");
ABSL_FLAG(bool, check, false, "compare every gathered parameter with the file");

namespace cpptrain {
namespace {

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS"), -1 when absent.
int64_t StatusKib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

absl::Status ResetHighWaterMark() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  if (!clear) {
    return absl::UnavailableError(
        "cannot write 5 to /proc/self/clear_refs (Linux 4.0 or later resets VmHWM that way)");
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::DecoderConfig> WrittenConfig() {
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, NamedDecoderConfig(absl::GetFlag(FLAGS_model)));
  if (absl::GetFlag(FLAGS_layers) > 0) config.set_num_hidden_layers(absl::GetFlag(FLAGS_layers));
  if (absl::GetFlag(FLAGS_hidden) > 0) config.set_hidden_size(absl::GetFlag(FLAGS_hidden));
  if (absl::GetFlag(FLAGS_intermediate) > 0) {
    config.set_intermediate_size(absl::GetFlag(FLAGS_intermediate));
  }
  if (absl::GetFlag(FLAGS_vocab) > 0) config.set_vocab_size(absl::GetFlag(FLAGS_vocab));
  return config;
}

absl::Status WriteDirectory(const std::string& dir) {
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, WrittenConfig());
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
                      BuildDecoder(config, {DecoderInit::Mode::kRowSeeded, 7}));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t parameters = 0;
  for (const auto& item : model->named_parameters()) {
    at::Tensor t = item.value().detach();
    if (absl::GetFlag(FLAGS_bf16_file)) t = t.to(at::kBFloat16);
    tensors.emplace_back(item.key(), t);
    parameters += t.numel();
  }
  CT_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  CT_RETURN_IF_ERROR(WriteHfConfig(config, dir + "/config.json"));
  std::cout << "WROTE " << dir << ": " << parameters << " parameters" << std::endl;
  return absl::OkStatus();
}

proto::TrainJob Job(const std::string& dir) {
  proto::TrainJob job;
  job.mutable_model()->set_pretrained(dir);
  job.mutable_args()->set_use_cpu(true);  // host memory is what is measured, on any host
  const bool efficient = absl::GetFlag(FLAGS_efficient);
  if (absl::GetFlag(FLAGS_engine) == "fsdp1") {
    job.mutable_args()->mutable_fsdp()->set_version(1);
    job.mutable_args()->mutable_fsdp()->set_cpu_ram_efficient_loading(efficient);
  } else {
    job.mutable_args()->mutable_zero()->set_stage(3);
    job.mutable_args()->mutable_zero()->set_zero3_init_flag(efficient);
  }
  return job;
}

// Every gathered parameter equals the file's tensor (all ranks take part in each gather).
absl::Status CheckAgainstFile(const std::string& dir, DecoderLM& model) {
  FlatShardedModel* flat = FlatShardedOf(model);
  if (flat == nullptr) return absl::InternalError("the model is not flat-sharded");
  CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModelDir> files, SafetensorsModelDir::Open(dir));
  for (const auto& item : model.named_parameters()) {
    CT_ASSIGN_OR_RETURN(at::Tensor gathered, flat->GatherFull(item.value()));
    CT_ASSIGN_OR_RETURN(at::Tensor want, files->Get(item.key()));
    if (!gathered.equal(want.to(at::kFloat))) {
      return absl::InternalError(absl::StrCat(item.key(), " differs from the file's tensor"));
    }
  }
  return absl::OkStatus();
}

// Loads as tools/train does (BuildJobModel; the Trainer's engine shards a model loaded whole).
absl::Status Load(int rank, int world) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const proto::TrainJob job = Job(dir);
  const int64_t before = StatusKib("VmRSS");
  CT_RETURN_IF_ERROR(ResetHighWaterMark());
  CT_ASSIGN_OR_RETURN(JobModel built, BuildJobModel(job));
  if (built.engine == nullptr) {
    CT_ASSIGN_OR_RETURN(built.engine, CreateEngine(job.args()));
    CT_RETURN_IF_ERROR(built.engine->PrepareForInference(built.model));
  }
  const int64_t hwm = StatusKib("VmHWM");
  int64_t parameters = 0;
  for (const auto& p : built.model->parameters()) parameters += p.numel();
  std::cout << "LOAD {\"rank\":" << rank << ",\"world\":" << world << ",\"engine\":\""
            << absl::GetFlag(FLAGS_engine) << "\",\"efficient\":"
            << (absl::GetFlag(FLAGS_efficient) ? "true" : "false")
            << ",\"local_parameters\":" << parameters << ",\"rss_before_kib\":" << before
            << ",\"hwm_kib\":" << hwm << ",\"load_peak_kib\":" << hwm - before << "}" << std::endl;
  if (absl::GetFlag(FLAGS_check)) {
    CT_RETURN_IF_ERROR(CheckAgainstFile(dir, *built.model));
    std::cout << "CHECKED rank " << rank << std::endl;
  }
  return absl::OkStatus();
}

int Run() {
  if (!absl::GetFlag(FLAGS_write).empty()) {
    const absl::Status written = WriteDirectory(absl::GetFlag(FLAGS_write));
    if (!written.ok()) std::cerr << "ERROR: " << written << std::endl;
    return written.ok() ? 0 : 1;
  }
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) {
    std::cerr << "ERROR: environment: " << env.status() << std::endl;
    return 1;
  }
  InitLogging("efficient_load", env->rank);
  const absl::Status loaded = Load(env->rank, env->world_size);
  if (!loaded.ok()) std::cerr << "ERROR: rank " << env->rank << ": " << loaded << std::endl;
  return loaded.ok() ? 0 : 1;
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
