// //tools:train: runs a TrainJob text config (proto/job.proto) on the CPU or CUDA devices:
// trains (args.do_train), evaluates (do_eval) and predicts (do_predict, writing
// <output_dir>/predictions.jsonl), a model built fresh or loaded from a Hugging Face directory
// (model.pretrained). Writes <output_dir>/metrics.jsonl and prints a final summary line.
//
//   bazel run //tools:train -- --config=tools/demo.textproto --set=args.max_steps=50
//   tools/train --config=job.textproto --set=model.pretrained=/models/Llama-3.2-1B
//   tools/train --config=job.textproto --set=args.do_train=false   # evaluate only
//   tools/train --config=job.textproto --accelerate_config=fsdp.yaml  # `accelerate config`'s
//
// Under `accelerate launch` the ACCELERATE_* and FSDP_* variables it sets are read the same way
// as --accelerate_config's YAML (tools/accelerate_job.h; docs/ACCELERATE.md lists every key);
// precedence: the job file, then Accelerate's settings, then --set.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/utils.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/working_directory.h"
#include "config/accelerate_config.h"
#include "config/training_args.h"
#include "models/configs.h"
#include "tools/accelerate_job.h"
#include "tools/arithmetic_metrics.h"
#include "jobs/job_model.h"
#include "trainer/predictions.h"
#include "tools/repeated_flag.h"
#include "trainer/data/arithmetic_corpus.h"
#include "trainer/data/collator.h"
#include "trainer/data/sft_jsonl_dataset.h"
#include "trainer/data/token_file_dataset.h"
#include "trainer/metrics_log.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, config, "", "TrainJob in protobuf text format (proto/job.proto).");
ABSL_FLAG(std::string, accelerate_config, "",
          "The YAML `accelerate config` writes; its settings go under --set's "
          "(docs/ACCELERATE.md). "
          "Unset: CPPTRAIN_ACCELERATE_CONFIG (set by tools/launch --config_file), else the "
          "variables of `accelerate launch`, if any.");
ABSL_FLAG(bool, accelerate_table, false,
          "Print docs/ACCELERATE.md's table of Accelerate keys and exit.");
// --set=path=value (repeatable) overrides a config field by its path, e.g.
// --set=args.learning_rate=1e-3; it is taken out of argv before absl parses the rest.

namespace cpptrain {
namespace {

using DatasetPtr = std::shared_ptr<const Dataset>;

struct JobData {
  DatasetPtr train;
  DatasetPtr eval;
  DatasetPtr test;  // do_predict's: data.test_file, else the eval data
};

absl::StatusOr<DatasetPtr> OpenTokenFile(const proto::DataSpec& data, const std::string& path,
                                         int64_t vocab_size) {
  const TokenWidth width =
      data.token_dtype() == proto::DataSpec::UINT32 ? TokenWidth::kUint32 : TokenWidth::kUint16;
  CT_ASSIGN_OR_RETURN(auto dataset, TokenFileDataset::Open(path, width, data.seq_len()));
  CT_RETURN_IF_ERROR(dataset->CheckTokensBelow(vocab_size));
  return DatasetPtr(dataset);
}

// A JSONL instruction data file (docs/INSTRUCTION_DATA.md).
absl::StatusOr<DatasetPtr> OpenJsonl(const proto::DataSpec& data, const std::string& path,
                                     int64_t vocab_size, const std::string& model_dir) {
  SftDataOptions options;
  options.max_length = data.max_length();
  options.packing = data.packing();
  if (data.has_completion_only_loss()) options.completion_only_loss = data.completion_only_loss();
  options.assistant_only_loss = data.assistant_only_loss();
  options.model_dir = model_dir;
  CT_ASSIGN_OR_RETURN(auto dataset, SftJsonlDataset::Open(path, options));
  CT_RETURN_IF_ERROR(dataset->CheckTokensBelow(vocab_size));
  LOG(INFO) << path << ": " << dataset->num_records() << " records, " << dataset->size()
            << (data.packing() ? " packed rows" : " examples") << ", "
            << dataset->num_label_tokens() << " label tokens";
  return DatasetPtr(dataset);
}

absl::StatusOr<JobData> LoadData(const proto::DataSpec& data, int64_t vocab_size, uint64_t seed,
                                 bool need_train, const std::string& model_dir) {
  JobData out;
  if (data.format() == proto::DataSpec::JSONL) {
    auto open = [&](const std::string& path) { return OpenJsonl(data, path, vocab_size, model_dir); };
    if (need_train && !data.has_train_file()) {
      return absl::InvalidArgumentError(
          "data.format is JSONL but data.train_file is unset: set it to a JSONL file");
    }
    if (data.has_train_file()) {
      CT_ASSIGN_OR_RETURN(out.train, open(data.train_file()));
    }
    if (data.has_eval_file()) {
      CT_ASSIGN_OR_RETURN(out.eval, open(data.eval_file()));
    }
    out.test = out.eval;
    if (data.has_test_file()) {
      CT_ASSIGN_OR_RETURN(out.test, open(data.test_file()));
    }
    return out;
  }
  if (data.has_builtin()) {
    if (data.builtin() != "arithmetic") {
      return absl::InvalidArgumentError(
          absl::StrCat("data.builtin is \"", data.builtin(),
                       "\", which is not a builtin corpus: use \"arithmetic\""));
    }
    if (ArithmeticVocabSize() > vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the arithmetic corpus has ", ArithmeticVocabSize(),
                       " tokens but the model's vocab_size is ", vocab_size,
                       ": use a model with vocab_size >= ", ArithmeticVocabSize()));
    }
    CT_ASSIGN_OR_RETURN(auto train,
                        MakeArithmeticDataset(data.builtin_train_samples(), data.seq_len(), seed));
    CT_ASSIGN_OR_RETURN(
        auto eval, MakeArithmeticDataset(data.builtin_eval_samples(), data.seq_len(), seed + 1));
    out.train = train;
    out.eval = eval;
  } else {
    if (need_train && !data.has_train_file()) {
      return absl::InvalidArgumentError(
          "data has neither train_file nor builtin: set data.train_file to a token file, or "
          "data.builtin: \"arithmetic\" (or args.do_train: false to only evaluate or predict)");
    }
    if (data.has_train_file()) {
      CT_ASSIGN_OR_RETURN(out.train, OpenTokenFile(data, data.train_file(), vocab_size));
    }
    if (data.has_eval_file()) {
      CT_ASSIGN_OR_RETURN(out.eval, OpenTokenFile(data, data.eval_file(), vocab_size));
    }
  }
  out.test = out.eval;
  if (data.has_test_file()) {
    CT_ASSIGN_OR_RETURN(out.test, OpenTokenFile(data, data.test_file(), vocab_size));
  }
  return out;
}

// do_eval and do_predict need data to run on; at least one mode must be on.
absl::Status CheckRunModes(const proto::TrainingArguments& args, const proto::DataSpec& data_spec,
                           const JobData& data, bool do_eval) {
  if (do_eval && data.eval == nullptr) {
    return absl::InvalidArgumentError(
        "args.do_eval is true but there is no eval data: set data.eval_file (or data.builtin)");
  }
  if (args.do_predict() && data.test == nullptr) {
    return absl::InvalidArgumentError(
        "args.do_predict is true but there is no data to predict: set data.test_file or "
        "data.eval_file");
  }
  if (!args.do_train() && !do_eval && !args.do_predict()) {
    return absl::InvalidArgumentError(
        "args.do_train, do_eval and do_predict are all false: nothing to run; set one of them");
  }
  if (args.do_predict() && data_spec.format() == proto::DataSpec::JSONL &&
      (data_spec.packing() || data_spec.padding_free())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "args.do_predict with data.", data_spec.packing() ? "packing" : "padding_free",
        " = true would write one prediction per packed row, not per example; predict with "
        "data.packing: false and data.padding_free: false"));
  }
  if (args.predict_top_k() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("args.predict_top_k is ", args.predict_top_k(),
                                                   "; use 0 (none) or a positive count"));
  }
  return absl::OkStatus();
}

// Set when training stopped for SIGTERM/SIGINT after saving a checkpoint: the exit code is then
// 128 + the signal, as for a process the signal ended.
int stopped_by_signal = 0;

// The metrics of the evaluation the schedule ran at `step`, if there was one.
std::optional<Metrics> EvalAtStep(const Trainer& trainer, int64_t step) {
  const std::vector<Metrics>& history = trainer.state().log_history;
  auto last_eval = std::find_if(history.rbegin(), history.rend(),
                                [](const Metrics& m) { return m.count("eval_loss") > 0; });
  if (last_eval == history.rend() || last_eval->at("step") != step) return std::nullopt;
  return *last_eval;
}

// The user's --set flags after Accelerate's settings (from `yaml_path`, or the environment).
absl::StatusOr<std::vector<std::string>> WithAccelerate(const std::string& yaml_path,
                                                       std::vector<std::string> overrides) {
  CT_ASSIGN_OR_RETURN(AccelerateJob accelerate, AccelerateJobOverrides(yaml_path));
  if (accelerate.source.empty()) return overrides;
  for (const std::string& note : accelerate.notes) CT_LOG_RANK0(INFO) << note;
  CT_LOG_RANK0(INFO) << "Accelerate configuration from " << accelerate.source << ": "
                     << (accelerate.overrides.empty() ? "nothing to set"
                                                      : absl::StrJoin(accelerate.overrides, " "));
  overrides.insert(overrides.begin(), accelerate.overrides.begin(), accelerate.overrides.end());
  return overrides;
}

absl::Status Run(const std::string& config_path, const std::vector<std::string>& user_overrides) {
  if (config_path.empty()) {
    return absl::InvalidArgumentError("--config is empty: pass a TrainJob text file");
  }
  // tools/launch --config_file passes its YAML to the ranks this way.
  std::string accelerate_yaml = absl::GetFlag(FLAGS_accelerate_config);
  const char* from_launcher = std::getenv("CPPTRAIN_ACCELERATE_CONFIG");
  if (accelerate_yaml.empty() && from_launcher != nullptr) accelerate_yaml = from_launcher;
  CT_ASSIGN_OR_RETURN(std::vector<std::string> overrides,
                      WithAccelerate(accelerate_yaml, user_overrides));
  CT_ASSIGN_OR_RETURN(proto::TrainJob job, LoadTrainJob(config_path, overrides));
  const proto::TrainingArguments& args = job.args();
  for (const std::string& warning : TrainingArgumentsWarnings(args)) LOG(WARNING) << warning;
  torch::manual_seed(static_cast<uint64_t>(args.seed()));
  CT_ASSIGN_OR_RETURN(JobModel built, BuildJobModel(job));
  std::shared_ptr<DecoderLM> model = built.model;
  const proto::DecoderConfig& model_config = model->config();
  CT_ASSIGN_OR_RETURN(JobData data,
                      LoadData(job.data(), model_config.vocab_size(),
                               static_cast<uint64_t>(ResolvedDataSeed(args)), args.do_train(),
                               job.model().pretrained()));
  const bool do_eval = args.has_do_eval() ? args.do_eval() : data.eval != nullptr;
  CT_RETURN_IF_ERROR(CheckRunModes(args, job.data(), data, do_eval));
  LOG(INFO) << "model: " << DecoderParameterCount(model_config) << " parameters; data: "
            << (data.train ? absl::StrCat(data.train->size(), " train samples") : "no train data")
            << (data.eval ? absl::StrCat(", ", data.eval->size(), " eval samples") : "");

  Trainer trainer(args, model, data.train, data.eval, std::move(built.engine));
  if (model_config.has_pad_token_id()) trainer.set_pad_token_id(model_config.pad_token_id());
  const proto::DataSpec& data_spec = job.data();
  if (data_spec.format() == proto::DataSpec::JSONL &&
      (data_spec.has_padding_free() ? data_spec.padding_free() : data_spec.packing())) {
    // TRL's padding_free: each micro-batch as one row with position_ids.
    const Collator collator(model_config.has_pad_token_id() ? model_config.pad_token_id() : 0);
    trainer.set_data_collator(
        [collator](const std::vector<Example>& examples) {
          return collator.CollatePaddingFree(examples);
        });
  }
  trainer.set_job_identity(
      absl::StrCat("model ", job.model().ShortDebugString(), " data ", job.data().ShortDebugString()));
  if (job.data().builtin() == "arithmetic") trainer.set_compute_metrics(ArithmeticExactMatch);
  Metrics summary;
  if (args.do_train()) {
    absl::StatusOr<TrainOutput> trained = trainer.Train();
    stopped_by_signal = trainer.stopped_by_signal();
    CT_ASSIGN_OR_RETURN(TrainOutput out, std::move(trained));
    summary = out.metrics;
    summary["global_step"] = static_cast<double>(out.global_step);
  }
  if (do_eval) {
    // Reuse the evaluation the schedule ran at the final step, if there was one.
    std::optional<Metrics> eval =
        args.do_train() ? EvalAtStep(trainer, trainer.state().global_step) : std::nullopt;
    if (!eval.has_value()) {
      CT_ASSIGN_OR_RETURN(eval, trainer.Evaluate());
    }
    summary.insert(eval->begin(), eval->end());
  }
  if (args.do_predict()) {
    CT_ASSIGN_OR_RETURN(PredictionOutput predicted, trainer.Predict(data.test));
    const std::string path =
        (std::filesystem::path(args.output_dir()) / "predictions.jsonl").string();
    if (trainer.engine()->rank() == 0) {
      CT_RETURN_IF_ERROR(WritePredictions(predicted, args.predict_top_k(), path));
      LOG(INFO) << "wrote " << predicted.predictions.size(0) << " predictions to " << path;
    }
    summary.insert(predicted.metrics.begin(), predicted.metrics.end());
  }
  if (trainer.engine()->rank() == 0) std::cout << MetricsToJson(summary) << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  std::vector<std::string> overrides = cpptrain::TakeRepeatedFlag("set", argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_accelerate_table)) {
    std::cout << cpptrain::AccelerateKeyTableMarkdown();
    return 0;
  }
  const char* rank = std::getenv("RANK");
  cpptrain::InitLogging(argv[0], rank ? std::atoi(rank) : 0);
  absl::Status status =
      cpptrain::Run(absl::GetFlag(FLAGS_config), overrides);
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return cpptrain::stopped_by_signal != 0 ? 128 + cpptrain::stopped_by_signal : 1;
  }
  return 0;
}
