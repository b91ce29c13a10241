#include "trainer/data/arithmetic_corpus.h"

#include <random>
#include <utility>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace {

// Index i + 1 is the token id of kAlphabet[i].
constexpr absl::string_view kAlphabet = "0123456789+=\n";
constexpr int64_t kMaxCorpusTokens = int64_t{1} << 28;
constexpr uint64_t kOperandLimit = 100;

char DecodeOne(int64_t id) {
  if (id >= 1 && id <= static_cast<int64_t>(kAlphabet.size())) return kAlphabet[id - 1];
  return '?';
}

void AppendText(absl::string_view text, std::vector<int64_t>& out) {
  for (char c : text) out.push_back(static_cast<int64_t>(kAlphabet.find(c)) + 1);
}

}  // namespace

int64_t ArithmeticVocabSize() { return static_cast<int64_t>(kAlphabet.size()) + 1; }

absl::StatusOr<std::shared_ptr<InMemoryDataset>> MakeArithmeticDataset(int64_t num_samples,
                                                                       int64_t seq_len,
                                                                       uint64_t seed) {
  if (num_samples <= 0 || seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arithmetic corpus with num_samples ", num_samples, " and seq_len ", seq_len,
                     ": both must be positive (DataSpec.builtin_*_samples, DataSpec.seq_len)"));
  }
  if (num_samples > kMaxCorpusTokens / seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arithmetic corpus of num_samples ", num_samples, " x seq_len ", seq_len, " exceeds ",
        kMaxCorpusTokens, " tokens: use fewer samples or a shorter seq_len"));
  }
  const int64_t total = num_samples * seq_len;
  std::mt19937_64 rng(seed);
  std::vector<int64_t> stream;
  stream.reserve(static_cast<size_t>(total) + 16);
  while (static_cast<int64_t>(stream.size()) < total) {
    // Modulo, not std::uniform_int_distribution, whose output differs between libraries.
    const uint64_t a = rng() % kOperandLimit;
    const uint64_t b = rng() % kOperandLimit;
    AppendText(absl::StrCat(a, "+", b, "=", a + b, "\n"), stream);
  }
  const at::Tensor all = at::tensor(at::ArrayRef<int64_t>(stream.data(), total), at::kLong);
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) {
    Example e;
    e.inputs = all.slice(0, i * seq_len, (i + 1) * seq_len);  // Views of one buffer.
    examples.push_back(std::move(e));
  }
  return InMemoryDataset::Create(std::move(examples));
}

std::string DecodeArithmetic(const std::vector<int64_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int64_t id : tokens) {
    if (id != kArithmeticPadId) text.push_back(DecodeOne(id));
  }
  return text;
}

std::string DecodeArithmetic(const at::Tensor& tokens) {
  if (!tokens.defined() || at::isFloatingType(tokens.scalar_type())) return "";
  const at::Tensor flat = tokens.reshape({-1}).to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = flat.data_ptr<int64_t>();
  return DecodeArithmetic(std::vector<int64_t>(data, data + flat.numel()));
}

absl::StatusOr<std::vector<int64_t>> EncodeArithmetic(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (kAlphabet.find(text[i]) == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "character '", text.substr(i, 1), "' (byte ", static_cast<int>(text[i]), ") at position ",
          i, " is not in the arithmetic vocabulary \"0123456789+=\\n\""));
    }
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  AppendText(text, ids);
  return ids;
}

}  // namespace cpptrain
