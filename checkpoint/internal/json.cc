#include "checkpoint/internal/json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"

namespace cpptrain {
namespace checkpoint_internal {
namespace {

constexpr int kMaxDepth = 64;

void AppendUtf8(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    CT_RETURN_IF_ERROR(ParseValue(0, &value));
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("the end of the JSON text");
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  void SkipWhitespace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  // "invalid JSON at byte N: expected <expected>, found <what is at N>".
  absl::Status Error(absl::string_view expected) const { return ErrorAt(pos_, expected); }

  absl::Status ErrorAt(size_t pos, absl::string_view expected) const {
    std::string found = "the end of the text";
    if (pos < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos]);
      found =
          (c >= 0x20 && c < 0x7F) ? absl::StrFormat("'%c'", c) : absl::StrFormat("byte 0x%02X", c);
    }
    return Invalid(pos, absl::StrCat("expected ", expected, ", found ", found));
  }

  static absl::Status Invalid(size_t pos, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON at byte ", pos, ": ", problem));
  }

  absl::Status ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxDepth) {
      return Invalid(pos_, absl::StrCat("nesting deeper than ", kMaxDepth, " levels"));
    }
    SkipWhitespace();
    const char c = Peek();
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return ParseString(&out->string);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseInteger(out);
    const absl::string_view rest = text_.substr(pos_);
    if (absl::StartsWith(rest, "true") || absl::StartsWith(rest, "false") ||
        absl::StartsWith(rest, "null")) {
      return Error("an object, array, string or integer (true, false and null are not supported)");
    }
    return Error("an object, array, string or integer");
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    out->kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipWhitespace();
    if (Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    absl::flat_hash_set<std::string> seen;
    while (true) {
      SkipWhitespace();
      if (Peek() != '"') return Error("a string key");
      const size_t key_pos = pos_;
      std::string key;
      CT_RETURN_IF_ERROR(ParseString(&key));
      if (!seen.insert(key).second) {
        return Invalid(
            key_pos, absl::StrCat("duplicate key ", JsonQuote(key), "; each key may appear once"));
      }
      SkipWhitespace();
      if (Peek() != ':') return Error("':' after an object key");
      ++pos_;
      JsonValue value;
      CT_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      out->keys.push_back(std::move(key));
      out->values.push_back(std::move(value));
      SkipWhitespace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      } else {
        return Error("',' or '}' in an object");
      }
    }
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    out->kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipWhitespace();
    if (Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      JsonValue value;
      CT_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      out->values.push_back(std::move(value));
      SkipWhitespace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      } else {
        return Error("',' or ']' in an array");
      }
    }
  }

  // Four hex digits at pos_.
  absl::StatusOr<uint32_t> ParseHex4() {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = Peek();
      int digit = -1;
      if (c >= '0' && c <= '9') digit = c - '0';
      if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
      if (digit < 0) return Error("4 hex digits after \\u");
      value = value * 16 + static_cast<uint32_t>(digit);
    }
    return value;
  }

  absl::Status ParseEscape(std::string* out) {
    const size_t escape_pos = pos_;
    ++pos_;  // '\'
    const char c = Peek();
    ++pos_;
    constexpr absl::string_view kEscaped = "\"\\/bfnrt";
    constexpr absl::string_view kDecoded = "\"\\/\b\f\n\r\t";
    if (const size_t i = kEscaped.find(c); i != absl::string_view::npos) {
      out->push_back(kDecoded[i]);
      return absl::OkStatus();
    }
    if (c != 'u') return ErrorAt(escape_pos + 1, "an escape: one of \"\\/bfnrtu");
    CT_ASSIGN_OR_RETURN(uint32_t code_point, ParseHex4());
    if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
      return Invalid(escape_pos, "a low surrogate \\u escape without a high surrogate before it");
    }
    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") {
        return Error("a \\u low surrogate after a high surrogate");
      }
      pos_ += 2;
      CT_ASSIGN_OR_RETURN(uint32_t low, ParseHex4());
      if (low < 0xDC00 || low > 0xDFFF) {
        return ErrorAt(pos_ - 6, "a low surrogate (\\uDC00-\\uDFFF)");
      }
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(code_point, out);
    return absl::OkStatus();
  }

  // Copies one UTF-8 encoded character of two or more bytes, checking its form.
  absl::Status CopyUtf8(std::string* out) {
    const unsigned char lead = static_cast<unsigned char>(Peek());
    const size_t length = (lead & 0xE0) == 0xC0   ? 2
                          : (lead & 0xF0) == 0xE0 ? 3
                          : (lead & 0xF8) == 0xF0 ? 4
                                                  : 0;
    bool valid = length != 0 && lead != 0xC0 && lead != 0xC1 && lead <= 0xF4 &&
                 pos_ + length <= text_.size();
    for (size_t i = 1; valid && i < length; ++i) {
      valid = (static_cast<unsigned char>(text_[pos_ + i]) & 0xC0) == 0x80;
    }
    if (!valid) return Error("valid UTF-8");
    out->append(text_.data() + pos_, length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (AtEnd()) return Error("'\"' to close the string");
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("a string character (control characters must be escaped)");
      if (c == '\\') {
        CT_RETURN_IF_ERROR(ParseEscape(out));
      } else if (c >= 0x80) {
        CT_RETURN_IF_ERROR(CopyUtf8(out));
      } else {
        out->push_back(static_cast<char>(c));
        ++pos_;
      }
    }
  }

  absl::Status ParseInteger(JsonValue* out) {
    out->kind = JsonValue::Kind::kInteger;
    const size_t start = pos_;
    const bool negative = Peek() == '-';
    if (negative) ++pos_;
    if (!(Peek() >= '0' && Peek() <= '9')) return Error("a digit");
    if (Peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return Error("an integer without leading zeros");
    }
    // Magnitudes up to 2^63 fit, so that INT64_MIN parses.
    const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1;
    uint64_t magnitude = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      const uint64_t digit = static_cast<uint64_t>(Peek() - '0');
      if (magnitude > (limit - digit) / 10 || (!negative && magnitude * 10 + digit == limit)) {
        return ErrorAt(start, "an integer that fits in 64 bits");
      }
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (Peek() == '.' || Peek() == 'e' || Peek() == 'E') {
      return Error("an integer (fractions and exponents are not supported)");
    }
    out->integer = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return &values[i];
  }
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    constexpr absl::string_view kSpecial = "\"\\\b\f\n\r\t";
    constexpr absl::string_view kEscaped = "\"\\bfnrt";
    if (const size_t i = kSpecial.find(c); i != absl::string_view::npos) {
      out.push_back('\\');
      out.push_back(kEscaped[i]);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace checkpoint_internal
}  // namespace cpptrain
