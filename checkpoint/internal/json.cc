#include "checkpoint/internal/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/charconv.h"
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

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Parser {
 public:
  Parser(absl::string_view text, JsonGrammar grammar) : text_(text), grammar_(grammar) {}

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
    return Invalid(pos, absl::StrCat("expected ", expected, ", found ", Found(pos)));
  }

  // What is at `pos`: "'x'", "byte 0xFF" or "the end of the text".
  std::string Found(size_t pos) const {
    if (pos >= text_.size()) return "the end of the text";
    const unsigned char c = static_cast<unsigned char>(text_[pos]);
    return (c >= 0x20 && c < 0x7F) ? absl::StrFormat("'%c'", c) : absl::StrFormat("byte 0x%02X", c);
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
    if (c == '-' || IsDigit(c)) return ParseNumber(out);
    const absl::string_view rest = text_.substr(pos_);
    if (full()) {
      struct Literal {
        absl::string_view text;
        JsonValue::Kind kind;
        bool boolean;
      };
      constexpr Literal kLiterals[] = {{"true", JsonValue::Kind::kBool, true},
                                       {"false", JsonValue::Kind::kBool, false},
                                       {"null", JsonValue::Kind::kNull, false}};
      for (const Literal& literal : kLiterals) {
        if (absl::StartsWith(rest, literal.text)) {
          out->kind = literal.kind;
          out->boolean = literal.boolean;
          pos_ += literal.text.size();
          return absl::OkStatus();
        }
      }
      return Error("an object, array, string, number, true, false or null");
    }
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
    const std::string escape(text_.substr(escape_pos, 6));
    constexpr absl::string_view kPairs =
        "; a character above U+FFFF is written as a high surrogate (\\uD800-\\uDBFF) followed "
        "by a low one (\\uDC00-\\uDFFF), e.g. \\uD83D\\uDE00, or as the character itself";
    if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
      return Invalid(escape_pos, absl::StrCat(escape,
                                              " is a low surrogate without a high surrogate "
                                              "before it, which is no character",
                                              kPairs));
    }
    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") {
        return Invalid(pos_, absl::StrCat("expected a \\u low surrogate after the high surrogate ",
                                          escape, ", found ", Found(pos_), kPairs));
      }
      const size_t low_pos = pos_;
      pos_ += 2;
      CT_ASSIGN_OR_RETURN(uint32_t low, ParseHex4());
      if (low < 0xDC00 || low > 0xDFFF) {
        return Invalid(low_pos, absl::StrCat("expected a \\u low surrogate after the high "
                                             "surrogate ",
                                             escape, ", found ", text_.substr(low_pos, 6), kPairs));
      }
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(code_point, out);
    return absl::OkStatus();
  }

  // "invalid JSON at byte START: expected valid UTF-8, found bytes 0xE0 0x80 0x80: PROBLEM;
  // ...", naming the `count` bytes from `start` that were read.
  absl::Status Utf8Error(size_t start, size_t count, absl::string_view problem) const {
    std::string bytes = count == 1 ? "byte" : "bytes";
    for (size_t i = start; i < start + count && i < text_.size(); ++i) {
      absl::StrAppendFormat(&bytes, " 0x%02X", static_cast<unsigned char>(text_[i]));
    }
    return Invalid(start, absl::StrCat("expected valid UTF-8, found ", bytes, ": ", problem,
                                       "; JSON text must be UTF-8 (RFC 8259): save the file as "
                                       "UTF-8 or write the character as a \\u escape"));
  }

  // Copies one UTF-8 encoded character of two or more bytes after checking that it is the
  // shortest form of a Unicode scalar value (RFC 3629): no overlong forms, no UTF-16
  // surrogates (U+D800-U+DFFF), nothing above U+10FFFF, no missing continuation bytes.
  absl::Status CopyUtf8(std::string* out) {
    const size_t start = pos_;
    const unsigned char lead = static_cast<unsigned char>(text_[start]);
    if (lead < 0xC0) {
      return Utf8Error(start, 1, "a continuation byte (0x80-0xBF) with no lead byte before it");
    }
    if (lead >= 0xF5) {
      return Utf8Error(start, 1,
                       "0xF5-0xFF never start a UTF-8 sequence (they would encode more than "
                       "U+10FFFF, the largest code point)");
    }
    const size_t length = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t code_point = lead & (0x7F >> length);
    for (size_t i = 1; i < length; ++i) {
      if (start + i >= text_.size()) {
        return Utf8Error(
            start, i,
            absl::StrCat("a ", length, "-byte sequence cut short: the text ends after ", i,
                         " of its bytes"));
      }
      const unsigned char c = static_cast<unsigned char>(text_[start + i]);
      if ((c & 0xC0) != 0x80) {
        return Utf8Error(
            start, i + 1,
            absl::StrFormat("a %d-byte sequence cut short: its byte %d (0x%02X) is not a "
                            "continuation byte (0x80-0xBF)",
                            length, i + 1, c));
      }
      code_point = (code_point << 6) | (c & 0x3F);
    }
    if (code_point < kSmallest[length]) {
      return Utf8Error(start, length,
                       absl::StrFormat("an overlong form of U+%04X (%d bytes; UTF-8 allows only "
                                       "the shortest form, %d byte%s)",
                                       code_point, length,
                                       code_point < 0x80    ? 1
                                       : code_point < 0x800 ? 2
                                                            : 3,
                                       code_point < 0x80 ? "" : "s"));
    }
    if (code_point >= 0xD800 && code_point <= 0xDFFF) {
      return Utf8Error(start, length,
                       absl::StrFormat("the UTF-16 surrogate U+%04X encoded as UTF-8 (CESU-8 or "
                                       "WTF-8); a character above U+FFFF is one 4-byte sequence",
                                       code_point));
    }
    if (code_point > 0x10FFFF) {
      return Utf8Error(start, length,
                       absl::StrFormat("U+%X, above U+10FFFF, the largest code point", code_point));
    }
    out->append(text_.data() + start, length);
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

  // An integer; with JsonGrammar::kFull also a fraction, an exponent or an integer too large
  // for 64 bits, all three as a double.
  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    const bool negative = Peek() == '-';
    if (negative) ++pos_;
    if (!IsDigit(Peek())) return Error("a digit");
    if (Peek() == '0' && pos_ + 1 < text_.size() && IsDigit(text_[pos_ + 1])) {
      return Error("an integer without leading zeros");
    }
    // Magnitudes up to 2^63 fit, so that INT64_MIN parses.
    const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1;
    uint64_t magnitude = 0;
    bool overflow = false;
    for (; IsDigit(Peek()); ++pos_) {
      const uint64_t digit = static_cast<uint64_t>(Peek() - '0');
      if (overflow || magnitude > (limit - digit) / 10 ||
          (!negative && magnitude * 10 + digit == limit)) {
        overflow = true;
      } else {
        magnitude = magnitude * 10 + digit;
      }
    }
    const bool fraction_or_exponent = Peek() == '.' || Peek() == 'e' || Peek() == 'E';
    if (!full()) {
      if (overflow) return ErrorAt(start, "an integer that fits in 64 bits");
      if (fraction_or_exponent) {
        return Error("an integer (fractions and exponents are not supported)");
      }
    }
    if (!overflow && !fraction_or_exponent) {
      out->kind = JsonValue::Kind::kInteger;
      out->integer =
          negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
      return absl::OkStatus();
    }
    if (Peek() == '.') {
      ++pos_;
      if (!IsDigit(Peek())) return Error("a digit after the decimal point");
      while (IsDigit(Peek())) ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!IsDigit(Peek())) return Error("a digit in the exponent");
      while (IsDigit(Peek())) ++pos_;
    }
    double value = 0;
    const absl::from_chars_result result =
        absl::from_chars(text_.data() + start, text_.data() + pos_, value);
    if (result.ec != std::errc() || result.ptr != text_.data() + pos_ || !std::isfinite(value)) {
      return ErrorAt(start, "a number within the range of a double");
    }
    out->kind = JsonValue::Kind::kDouble;
    out->number = value;
    return absl::OkStatus();
  }

  bool full() const { return grammar_ == JsonGrammar::kFull; }

  absl::string_view text_;
  JsonGrammar grammar_;
  size_t pos_ = 0;
};

void AppendJson(const JsonValue& value, size_t max_chars, std::string* out) {
  if (out->size() > max_chars) return;
  switch (value.kind) {
    case JsonValue::Kind::kNull:
      *out += "null";
      return;
    case JsonValue::Kind::kBool:
      *out += value.boolean ? "true" : "false";
      return;
    case JsonValue::Kind::kInteger:
      absl::StrAppend(out, value.integer);
      return;
    case JsonValue::Kind::kDouble:
      absl::StrAppend(out, value.number);
      return;
    case JsonValue::Kind::kString:
      *out += JsonQuote(value.string);
      return;
    case JsonValue::Kind::kArray:
      *out += "[";
      for (size_t i = 0; i < value.values.size() && out->size() <= max_chars; ++i) {
        if (i > 0) *out += ", ";
        AppendJson(value.values[i], max_chars, out);
      }
      *out += "]";
      return;
    case JsonValue::Kind::kObject:
      *out += "{";
      for (size_t i = 0; i < value.keys.size() && out->size() <= max_chars; ++i) {
        absl::StrAppend(out, i > 0 ? ", " : "", JsonQuote(value.keys[i]), ": ");
        AppendJson(value.values[i], max_chars, out);
      }
      *out += "}";
      return;
  }
}

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return &values[i];
  }
  return nullptr;
}

double JsonValue::AsDouble() const {
  if (is_integer()) return static_cast<double>(integer);
  return is_double() ? number : 0;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, JsonGrammar grammar) {
  return Parser(text, grammar).ParseDocument();
}

std::string JsonToString(const JsonValue& value, size_t max_chars) {
  std::string out;
  AppendJson(value, max_chars, &out);
  if (out.size() > max_chars) out = out.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return out;
}

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
