#include "decoder_generation.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status.h"
#include "config/text_proto.h"
#include "config/training_args.h"
#include "generation/generate.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "proto/training_args.pb.h"
#include "trainer/data/arithmetic_corpus.h"
#include "trainer/predictions.h"
#include "trainer/trainer.h"

namespace example {
namespace {

constexpr int64_t kNewline = 13;  // '\n' of the arithmetic corpus: a line ends there

constexpr char kDecoderArgs[] = R"pb(
  per_device_train_batch_size: 16
  per_device_eval_batch_size: 16
  max_steps: 40
  learning_rate: 3e-3
  lr_scheduler_type: COSINE
  logging_steps: 40
  eval_strategy: NO
  save_strategy: NO
  disable_tqdm: true
  seed: 7
  local { device: "cpu" }
)pb";

}  // namespace

absl::Status TrainDecoderAndGenerate(const std::string& output_dir, std::ostream& out) {
  cpptrain::proto::TrainingArguments args;
  CT_RETURN_IF_ERROR(cpptrain::ParseTextProto(kDecoderArgs, "decoder arguments", &args));
  args.set_output_dir(output_dir);
  CT_RETURN_IF_ERROR(cpptrain::ValidateTrainingArguments(args));
  std::filesystem::create_directories(output_dir);

  CT_ASSIGN_OR_RETURN(auto train_data, cpptrain::MakeArithmeticDataset(640, 32, /*seed=*/11));
  CT_ASSIGN_OR_RETURN(auto test_data, cpptrain::MakeArithmeticDataset(8, 32, /*seed=*/12));
  CT_ASSIGN_OR_RETURN(cpptrain::proto::DecoderConfig config,
                      cpptrain::NamedDecoderConfig("demo"));
  at::manual_seed(args.seed());
  CT_ASSIGN_OR_RETURN(std::shared_ptr<cpptrain::DecoderLM> model, cpptrain::BuildDecoder(config));

  cpptrain::Trainer trainer(args, model, train_data);
  CT_ASSIGN_OR_RETURN(cpptrain::TrainOutput trained, trainer.Train());
  CT_ASSIGN_OR_RETURN(cpptrain::PredictionOutput predicted, trainer.Predict(test_data));
  const std::string predictions = output_dir + "/predictions.jsonl";
  CT_RETURN_IF_ERROR(cpptrain::WritePredictions(predicted, /*top_k=*/3, predictions));
  out << "decoder: " << trained.global_step << " steps, train loss " << trained.training_loss
      << ", test loss " << predicted.metrics.at("test_loss") << "; predictions in "
      << predictions << std::endl;

  const std::string prompt_text = "12+30=";
  CT_ASSIGN_OR_RETURN(std::vector<int64_t> prompt, cpptrain::EncodeArithmetic(prompt_text));
  cpptrain::GenerationConfig greedy;
  greedy.max_new_tokens = 6;
  greedy.stop_ids = {kNewline};
  CT_ASSIGN_OR_RETURN(std::vector<int64_t> completion, cpptrain::Generate(*model, prompt, greedy));
  cpptrain::GenerationConfig sampled = greedy;
  sampled.do_sample = true;
  sampled.sampling.temperature = 0.8;
  sampled.sampling.top_k = 5;
  sampled.sampling.top_p = 0.9;
  sampled.seed = 2024;
  CT_ASSIGN_OR_RETURN(auto first,
                      cpptrain::GenerateBatch(*model, {prompt, prompt, prompt}, sampled));
  CT_ASSIGN_OR_RETURN(auto second,
                      cpptrain::GenerateBatch(*model, {prompt, prompt, prompt}, sampled));
  auto text = [](const std::vector<int64_t>& ids) {
    return absl::StrCat("\"", absl::StrReplaceAll(cpptrain::DecodeArithmetic(ids), {{"\n", "\\n"}}),
                        "\"");
  };
  out << "generated (greedy): " << prompt_text << " -> " << text(completion) << std::endl;
  for (const auto& sample : first) {
    out << "generated (sampled, seed " << sampled.seed << "): " << prompt_text << " -> "
        << text(sample) << std::endl;
  }
  if (completion.empty()) return absl::InternalError("the greedy completion is empty");
  if (first != second) {
    return absl::InternalError("two sampled generations with one seed differ");
  }
  return absl::OkStatus();
}

}  // namespace example
