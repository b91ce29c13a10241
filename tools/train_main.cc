// //tools:train: trains a reference model from a TrainJob text config on the CPU or one CUDA
// device, evaluates it, and writes <output_dir>/metrics.jsonl plus a final summary line.
//
//   bazel run //tools:train -- --config=tools/demo.textproto --set=args.max_steps=50
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "config/training_args.h"
#include "models/configs.h"
#include "trainer/data/arithmetic_corpus.h"
#include "trainer/data/token_file_dataset.h"
#include "trainer/metrics_log.h"
#include "tools/repeated_flag.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, config, "", "TrainJob in protobuf text format (proto/job.proto).");
// --set=path=value (repeatable) overrides a config field by its path, e.g.
// --set=args.learning_rate=1e-3; it is taken out of argv before absl parses the rest.

namespace cpptrain {
namespace {

using DatasetPtr = std::shared_ptr<const Dataset>;

absl::StatusOr<std::pair<DatasetPtr, DatasetPtr>> LoadData(const proto::DataSpec& data,
                                                           int64_t vocab_size, uint64_t seed) {
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
    CT_ASSIGN_OR_RETURN(auto train, MakeArithmeticDataset(data.builtin_train_samples(),
                                                           data.seq_len(), seed));
    CT_ASSIGN_OR_RETURN(auto eval, MakeArithmeticDataset(data.builtin_eval_samples(),
                                                          data.seq_len(), seed + 1));
    return std::make_pair(DatasetPtr(train), DatasetPtr(eval));
  }
  if (!data.has_train_file()) {
    return absl::InvalidArgumentError(
        "data has neither train_file nor builtin: set data.train_file to a token file, or "
        "data.builtin: \"arithmetic\"");
  }
  const TokenWidth width =
      data.token_dtype() == proto::DataSpec::UINT32 ? TokenWidth::kUint32 : TokenWidth::kUint16;
  CT_ASSIGN_OR_RETURN(auto train, TokenFileDataset::Open(data.train_file(), width, data.seq_len()));
  CT_RETURN_IF_ERROR(train->CheckTokensBelow(vocab_size));
  DatasetPtr eval;
  if (data.has_eval_file()) {
    CT_ASSIGN_OR_RETURN(auto e, TokenFileDataset::Open(data.eval_file(), width, data.seq_len()));
    CT_RETURN_IF_ERROR(e->CheckTokensBelow(vocab_size));
    eval = e;
  }
  return std::make_pair(DatasetPtr(train), eval);
}

// Set when training stopped for SIGTERM/SIGINT after saving a checkpoint: the exit code is then
// 128 + the signal, as for a process the signal ended.
int stopped_by_signal = 0;

absl::Status Run(const std::string& config_path, const std::vector<std::string>& overrides) {
  if (config_path.empty()) {
    return absl::InvalidArgumentError("--config is empty: pass a TrainJob text file");
  }
  CT_ASSIGN_OR_RETURN(proto::TrainJob job, LoadTrainJob(config_path, overrides));
  for (const std::string& warning : TrainingArgumentsWarnings(job.args())) {
    LOG(WARNING) << warning;
  }
  torch::manual_seed(static_cast<uint64_t>(job.args().seed()));
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig model_config, ResolveModelSpec(job.model()));
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(model_config));
  CT_ASSIGN_OR_RETURN(auto data, LoadData(job.data(), model_config.vocab_size(),
                                          static_cast<uint64_t>(ResolvedDataSeed(job.args()))));
  LOG(INFO) << "model: " << DecoderParameterCount(model_config) << " parameters; data: "
            << data.first->size() << " train samples"
            << (data.second ? absl::StrCat(", ", data.second->size(), " eval samples") : "");

  Trainer trainer(job.args(), model, data.first, data.second);
  absl::StatusOr<TrainOutput> trained = trainer.Train();
  stopped_by_signal = trainer.stopped_by_signal();
  CT_ASSIGN_OR_RETURN(TrainOutput out, std::move(trained));
  Metrics summary = out.metrics;
  if (data.second != nullptr) {
    // Reuse the evaluation the schedule ran at the final step, if there was one.
    const std::vector<Metrics>& history = trainer.state().log_history;
    auto last_eval = std::find_if(history.rbegin(), history.rend(), [](const Metrics& m) {
      return m.count("eval_loss") > 0;
    });
    if (last_eval != history.rend() && last_eval->at("step") == out.global_step) {
      summary.insert(last_eval->begin(), last_eval->end());
    } else {
      CT_ASSIGN_OR_RETURN(Metrics eval, trainer.Evaluate());
      summary.insert(eval.begin(), eval.end());
    }
  }
  summary["global_step"] = static_cast<double>(out.global_step);
  if (trainer.engine()->rank() == 0) std::cout << MetricsToJson(summary) << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  std::vector<std::string> overrides = cpptrain::TakeRepeatedFlag("set", argc, argv);
  absl::ParseCommandLine(argc, argv);
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
