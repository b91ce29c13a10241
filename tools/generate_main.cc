// //tools:generate: completions from a checkpoint of tools/train or a Hugging Face model
// directory, through the generation room (generation/generate.h): greedy, or sampled with
// --do_sample (--temperature, --top_k, --top_p, --seed). Token ids in and out, or text with the
// builtin arithmetic corpus's character tokenizer (trainer/data/arithmetic_corpus.h). One JSON
// line per prompt on stdout; the --prompt flags run as one GenerateBatch call.
//
//   tools/generate --model=out/checkpoint-300 --prompt="1 5 9" --max_new_tokens=8
//   tools/generate --model=out/checkpoint-300 --prompt="1 5 9" --do_sample --top_p=0.9 --seed=7
//   tools/generate --model=out/checkpoint-300 --tokenizer=arithmetic --prompt="17+25="
//   tools/generate --model=out/checkpoint-300 --arithmetic_eval=20 --arithmetic_seed=43
//
// --arithmetic_eval=N completes the prompts ("A+B=") of the first N whole lines of the
// arithmetic corpus drawn from --arithmetic_seed (tools/train's eval split uses the data seed
// + 1), prints each completion against the answer, and ends with the exact-match accuracy.
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/working_directory.h"
#include "generation/generate.h"
#include "jobs/job_model.h"
#include "tools/repeated_flag.h"
#include "trainer/data/arithmetic_corpus.h"

ABSL_FLAG(std::string, model, "",
          "A checkpoint directory of tools/train or a Hugging Face "
          "model directory (config.json and safetensors).");
ABSL_FLAG(std::string, tokenizer, "ids",
          "How --prompt is read and completions are printed: \"ids\" (token ids separated by "
          "spaces or commas) or \"arithmetic\" (text of \"0123456789+=\\n\").");
ABSL_FLAG(int64_t, max_new_tokens, 32, "The most tokens to generate per prompt.");
ABSL_FLAG(bool, do_sample, false, "Sample the next token instead of taking the argmax.");
ABSL_FLAG(double, temperature, 1.0, "With --do_sample: the logits are divided by it (> 0).");
ABSL_FLAG(int64_t, top_k, 0, "With --do_sample: keep the k most likely tokens (0: all).");
ABSL_FLAG(double, top_p, 1.0,
          "With --do_sample: keep the smallest most likely set reaching this probability.");
ABSL_FLAG(uint64_t, seed, 0, "With --do_sample: the seed of the sampling generator.");
ABSL_FLAG(int64_t, arithmetic_eval, 0, "Complete this many lines of the arithmetic corpus.");
ABSL_FLAG(uint64_t, arithmetic_seed, 43, "The corpus seed for --arithmetic_eval.");
// --prompt=... (repeatable) is taken out of argv before absl parses the rest.

namespace cpptrain {
namespace {

constexpr int64_t kArithmeticNewline = 13;

absl::StatusOr<std::vector<int64_t>> ParseIds(const std::string& text) {
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt \"", text, "\": \"", piece,
                                                     "\" is not a token id; give integers "
                                                     "separated by spaces or commas"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += absl::StrCat("\\", std::string(1, c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

absl::Status CompletePrompts(DecoderLM& model, const std::vector<std::string>& prompts,
                             const GenerationConfig& config, bool arithmetic) {
  std::vector<std::vector<int64_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (arithmetic) {
      CT_ASSIGN_OR_RETURN(ids[i], EncodeArithmetic(prompts[i]));
    } else {
      CT_ASSIGN_OR_RETURN(ids[i], ParseIds(prompts[i]));
    }
  }
  CT_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> completions,
                      GenerateBatch(model, ids, config));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string line = absl::StrCat("{\"prompt_ids\":[", absl::StrJoin(ids[i], ","),
                                    "],\"completion_ids\":[", absl::StrJoin(completions[i], ","),
                                    "]");
    if (arithmetic) {
      absl::StrAppend(&line, ",\"prompt\":", JsonString(prompts[i]),
                      ",\"completion\":", JsonString(DecodeArithmetic(completions[i])));
    }
    std::cout << line << "}" << std::endl;
  }
  return absl::OkStatus();
}

// The first `count` whole lines "A+B=C" of the corpus from `seed`.
absl::StatusOr<std::vector<std::string>> ArithmeticLines(int64_t count, uint64_t seed) {
  CT_ASSIGN_OR_RETURN(auto corpus, MakeArithmeticDataset(1, 16 * (count + 2), seed));
  const std::string text = DecodeArithmetic(corpus->Get(0).inputs);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  // The first line may start mid-way and the last may be cut: keep whole ones only.
  std::vector<std::string> out;
  for (size_t i = 1; i + 1 < lines.size() && static_cast<int64_t>(out.size()) < count; ++i) {
    out.push_back(lines[i]);
  }
  return out;
}

absl::Status ArithmeticEval(DecoderLM& model, int64_t count, uint64_t seed,
                            GenerationConfig options) {
  CT_ASSIGN_OR_RETURN(std::vector<std::string> lines, ArithmeticLines(count, seed));
  options.stop_ids.push_back(kArithmeticNewline);
  std::vector<std::string> prompts, answers;
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& line : lines) {
    const size_t equals = line.find('=');
    prompts.push_back(line.substr(0, equals + 1));
    answers.push_back(line.substr(equals + 1));
    CT_ASSIGN_OR_RETURN(ids.emplace_back(), EncodeArithmetic(prompts.back()));
  }
  // One call: the prompts of each length run as one batch.
  CT_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> completions,
                      GenerateBatch(model, ids, options));
  int64_t right = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string text = DecodeArithmetic(completions[i]);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const bool ok = text == answers[i];
    right += ok ? 1 : 0;
    std::cout << prompts[i] << text
              << (ok ? "   ok" : absl::StrCat("   wrong (", answers[i], ")")) << std::endl;
  }
  std::cout << "exact match: " << right << "/" << lines.size() << " = "
            << (lines.empty() ? 0.0 : static_cast<double>(right) / lines.size()) << std::endl;
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& prompts) {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    return absl::InvalidArgumentError("--model is empty: pass a checkpoint or model directory");
  }
  const std::string tokenizer = absl::GetFlag(FLAGS_tokenizer);
  if (tokenizer != "ids" && tokenizer != "arithmetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer is \"", tokenizer, "\"; use \"ids\" or \"arithmetic\""));
  }
  const int64_t eval_lines = absl::GetFlag(FLAGS_arithmetic_eval);
  if (prompts.empty() && eval_lines <= 0) {
    return absl::InvalidArgumentError(
        "nothing to complete: pass --prompt=... or --arithmetic_eval=N");
  }
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, LoadDecoderDir(dir));
  GenerationConfig options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.do_sample = absl::GetFlag(FLAGS_do_sample);
  options.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  options.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  options.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  const auto& eos = model->config().eos_token_id();
  options.stop_ids.assign(eos.begin(), eos.end());
  if (tokenizer == "arithmetic") options.stop_ids.push_back(kArithmeticNewline);
  CT_RETURN_IF_ERROR(ValidateGenerationConfig(options));
  if (!prompts.empty()) {
    CT_RETURN_IF_ERROR(CompletePrompts(*model, prompts, options, tokenizer == "arithmetic"));
  }
  if (eval_lines > 0) {
    CT_RETURN_IF_ERROR(
        ArithmeticEval(*model, eval_lines, absl::GetFlag(FLAGS_arithmetic_seed), options));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  std::vector<std::string> prompts = cpptrain::TakeRepeatedFlag("prompt", argc, argv);
  absl::ParseCommandLine(argc, argv);
  cpptrain::InitLogging(argv[0], 0);
  const absl::Status status = cpptrain::Run(prompts);
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  return 0;
}
