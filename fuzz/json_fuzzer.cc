// Fuzzes the JSON parser of safetensors headers, index files and config.json
// (checkpoint/internal/json.h), in both grammars. Besides crashes and sanitizer reports it checks
// what the parser promises: what the integers-only grammar accepts the full grammar accepts alike;
// every accepted string is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF); JsonQuote of a string parses back to it; an integers-only document printed with
// JsonToString parses back to the same value; Find finds every key.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/string_view.h"
#include "checkpoint/internal/json.h"
#include "fuzz/fuzz_util.h"

namespace {

using cpptrain::checkpoint_internal::JsonGrammar;
using cpptrain::checkpoint_internal::JsonQuote;
using cpptrain::checkpoint_internal::JsonToString;
using cpptrain::checkpoint_internal::JsonValue;
using cpptrain::checkpoint_internal::ParseJson;

// RFC 3629 UTF-8, written independently of the parser's check.
bool ValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length = 0;
    uint32_t code_point = 0;
    uint32_t min = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2, code_point = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3, code_point = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4, code_point = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + length > s.size()) return false;
    for (int k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    if (code_point < min || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

bool Same(const JsonValue& a, const JsonValue& b) {
  if (a.kind != b.kind || a.keys != b.keys || a.values.size() != b.values.size()) return false;
  switch (a.kind) {
    case JsonValue::Kind::kInteger:
      if (a.integer != b.integer) return false;
      break;
    case JsonValue::Kind::kDouble:
      if (a.number != b.number) return false;
      break;
    case JsonValue::Kind::kBool:
      if (a.boolean != b.boolean) return false;
      break;
    case JsonValue::Kind::kString:
      if (a.string != b.string) return false;
      break;
    default:
      break;
  }
  for (size_t i = 0; i < a.values.size(); ++i) {
    if (!Same(a.values[i], b.values[i])) return false;
  }
  return true;
}

void CheckString(const std::string& s) {
  FUZZ_CHECK(ValidUtf8(s),
             "the parser accepted a string that is not valid UTF-8: " << JsonQuote(s));
  const auto quoted = ParseJson(JsonQuote(s));
  FUZZ_CHECK(quoted.ok() && quoted->is_string() && quoted->string == s,
             "JsonQuote(" << JsonQuote(s) << ") does not parse back: " << quoted.status());
}

void CheckValue(const JsonValue& value) {
  if (value.is_string()) CheckString(value.string);
  for (size_t i = 0; i < value.keys.size(); ++i) {
    CheckString(value.keys[i]);
    FUZZ_CHECK(value.Find(value.keys[i]) == &value.values[i],
               "Find(" << JsonQuote(value.keys[i]) << ") does not find its own key");
  }
  FUZZ_CHECK(value.is_object() || value.keys.empty(), "keys on a value that is not an object");
  for (const JsonValue& child : value.values) CheckValue(child);
  (void)value.AsDouble();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const auto strict = ParseJson(text);
  const auto full = ParseJson(text, JsonGrammar::kFull);
  if (strict.ok()) {
    FUZZ_CHECK(full.ok(),
               "the full grammar rejects what the integers-only one accepts: " << full.status());
    FUZZ_CHECK(Same(*strict, *full), "the two grammars read the same text differently");
    const std::string printed = JsonToString(*strict, std::numeric_limits<size_t>::max());
    const auto again = ParseJson(printed);
    FUZZ_CHECK(again.ok() && Same(*strict, *again),
               "JsonToString's text does not parse back to the value: " << again.status());
  }
  if (full.ok()) {
    CheckValue(*full);
    // Doubles print with 6 digits, so only that the text parses is promised, not the value.
    const auto again =
        ParseJson(JsonToString(*full, std::numeric_limits<size_t>::max()), JsonGrammar::kFull);
    FUZZ_CHECK(again.ok(),
               "JsonToString's text of a parsed value does not parse: " << again.status());
    (void)JsonToString(*full);
  }
  return 0;
}
