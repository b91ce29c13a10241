#include "trainer/data/token_file_metadata.h"

#include <cctype>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace {

// A string, an integer, or null (std::monostate).
using FlatValue = std::variant<std::monostate, std::string, int64_t>;

// A reader for one flat JSON object; `error` names the byte offset of the first problem.
class FlatJsonReader {
 public:
  explicit FlatJsonReader(std::string text) : text_(std::move(text)) {}

  bool Read(std::map<std::string, FlatValue>* out) {
    if (!Expect('{')) return false;
    if (Peek() == '}') return Expect('}') && End();
    while (true) {
      std::string key;
      FlatValue value;
      if (!String(&key) || !Expect(':') || !Value(&value)) return false;
      if (!out->emplace(key, value).second)
        return Fail(absl::StrCat("duplicate key \"", key, "\""));
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect('}') && End();
    }
  }
  const std::string& error() const { return error_; }

 private:
  char Peek() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool Fail(const std::string& what) {
    error_ = absl::StrCat(what, " at byte ", pos_);
    return false;
  }
  bool Expect(char c) {
    if (Peek() != c) return Fail(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
    return true;
  }
  bool End() { return Peek() == '\0' || Fail("trailing bytes"); }
  bool String(std::string* out) {
    if (!Expect('"')) return false;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\\') {
        if (++pos_ >= text_.size()) break;
        const char e = text_[pos_];
        if (e != '"' && e != '\\' && e != '/') return Fail("unsupported string escape");
      }
      out->push_back(text_[pos_++]);
    }
    if (pos_ >= text_.size()) return Fail("unterminated string");
    ++pos_;
    return true;
  }
  bool Value(FlatValue* out) {
    const char c = Peek();
    if (c == '"') {
      std::string s;
      if (!String(&s)) return false;
      *out = s;
      return true;
    }
    if (text_.compare(pos_, 4, "null") == 0) {
      pos_ += 4;
      *out = std::monostate{};
      return true;
    }
    const size_t begin = pos_;
    if (c == '-') ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    int64_t number = 0;
    if (!absl::SimpleAtoi(text_.substr(begin, pos_ - begin), &number)) {
      pos_ = begin;
      return Fail("expected a string, an integer or null");
    }
    *out = number;
    return true;
  }

  const std::string text_;
  size_t pos_ = 0;
  std::string error_;
};

absl::Status FieldError(const std::string& path, const std::string& field,
                        const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      "token metadata ", path, ": ", field, " ", problem,
      "; rewrite it with tools/tokenize_text.py, or delete it to use the token file unchecked"));
}

}  // namespace

std::string TokenFileMetadataPath(const std::string& token_file) {
  return token_file + ".meta.json";
}

absl::StatusOr<std::optional<TokenFileMetadata>> ReadTokenFileMetadata(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::optional<TokenFileMetadata>();
  std::stringstream text;
  text << in.rdbuf();
  std::map<std::string, FlatValue> fields;
  FlatJsonReader reader(text.str());
  if (!reader.Read(&fields)) {
    return absl::InvalidArgumentError(absl::StrCat("token metadata ", path,
                                                   " is not a flat JSON object of strings and "
                                                   "integers: ",
                                                   reader.error(),
                                                   "; rewrite it with tools/tokenize_text.py"));
  }
  TokenFileMetadata meta;
  meta.path = path;
  auto integer = [&](const std::string& field, int64_t* out) -> absl::Status {
    auto it = fields.find(field);
    if (it == fields.end() || !std::holds_alternative<int64_t>(it->second)) {
      return FieldError(path, field, "is missing or not an integer");
    }
    *out = std::get<int64_t>(it->second);
    return absl::OkStatus();
  };
  auto dtype = fields.find("dtype");
  if (dtype == fields.end() || !std::holds_alternative<std::string>(dtype->second)) {
    return FieldError(path, "dtype", "is missing or not a string (\"uint16\" or \"uint32\")");
  }
  meta.dtype = std::get<std::string>(dtype->second);
  if (meta.dtype != "uint16" && meta.dtype != "uint32") {
    return FieldError(path, "dtype",
                      absl::StrCat("is \"", meta.dtype, "\", not \"uint16\" or \"uint32\""));
  }
  if (absl::Status s = integer("vocab_size", &meta.vocab_size); !s.ok()) return s;
  if (absl::Status s = integer("num_tokens", &meta.num_tokens); !s.ok()) return s;
  if (meta.vocab_size < 1)
    return FieldError(path, "vocab_size", absl::StrCat("is ", meta.vocab_size));
  if (meta.num_tokens < 0)
    return FieldError(path, "num_tokens", absl::StrCat("is ", meta.num_tokens));
  if (auto eos = fields.find("eos_id");
      eos != fields.end() && !std::holds_alternative<std::monostate>(eos->second)) {
    if (!std::holds_alternative<int64_t>(eos->second)) {
      return FieldError(path, "eos_id", "is not an integer or null");
    }
    meta.eos_id = std::get<int64_t>(eos->second);
    if (*meta.eos_id < 0 || *meta.eos_id >= meta.vocab_size) {
      return FieldError(
          path, "eos_id",
          absl::StrCat("is ", *meta.eos_id, ", outside [0, vocab_size ", meta.vocab_size, ")"));
    }
  }
  return std::optional<TokenFileMetadata>(meta);
}

}  // namespace cpptrain
