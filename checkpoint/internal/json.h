// A strict JSON parser. By default it accepts only the subset safetensors headers and Hugging
// Face index files use: objects, arrays, strings (all escapes, \uXXXX with surrogate pairs)
// and integers; literals (true, false, null), fractions and exponents are rejected with an
// error naming the byte offset. JsonGrammar::kFull adds those (config.json has them). Either
// way duplicate object keys, trailing bytes other than whitespace, NaN/Infinity, strings that
// are not UTF-8 (overlong forms, encoded surrogates, code points above U+10FFFF, cut or stray
// bytes), \u escapes of unpaired surrogates and other non-JSON are errors.
//
//   CT_ASSIGN_OR_RETURN(JsonValue root, ParseJson(text));
//   if (!root.is_object()) ...
//   for (size_t i = 0; i < root.keys.size(); ++i) Use(root.keys[i], root.values[i]);
//
//   CT_ASSIGN_OR_RETURN(JsonValue config, ParseJson(text, JsonGrammar::kFull));
//   const JsonValue* eps = config.Find("rms_norm_eps");
//   if (eps != nullptr && eps->is_number()) Use(eps->AsDouble());
//
// Private to //checkpoint and to config/ds_config.cc (the DeepSpeed config converter).
#ifndef CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_
#define CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {
namespace checkpoint_internal {

// What ParseJson accepts.
enum class JsonGrammar {
  // Objects, arrays, strings and integers (safetensors headers, index files).
  kIntegersOnly,
  // All of JSON: also true, false, null and numbers with fractions or exponents.
  kFull,
};

struct JsonValue {
  // kBool, kNull and kDouble come only from JsonGrammar::kFull. There a number is kInteger
  // when written without fraction or exponent and it fits in 64 bits, kDouble otherwise.
  enum class Kind { kObject, kArray, kString, kInteger, kDouble, kBool, kNull };

  bool is_object() const { return kind == Kind::kObject; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_integer() const { return kind == Kind::kInteger; }
  bool is_double() const { return kind == Kind::kDouble; }
  bool is_bool() const { return kind == Kind::kBool; }
  bool is_null() const { return kind == Kind::kNull; }
  // kInteger or kDouble.
  bool is_number() const { return is_integer() || is_double(); }
  // The value of a number (an integer converted); 0 for other kinds.
  double AsDouble() const;

  // The value of `key` in an object, or nullptr.
  const JsonValue* Find(absl::string_view key) const;

  Kind kind = Kind::kObject;
  int64_t integer = 0;
  double number = 0;     // kDouble
  bool boolean = false;  // kBool
  std::string string;
  // An object: keys[i] maps to values[i], in file order. An array: values only.
  std::vector<std::string> keys;
  std::vector<JsonValue> values;
};

// Parses `text` (which may end in whitespace). Errors say what was expected at which byte.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text,
                                    JsonGrammar grammar = JsonGrammar::kIntegersOnly);

// `value` as compact JSON text for error messages, cut to about `max_chars` characters.
std::string JsonToString(const JsonValue& value, size_t max_chars = 80);

// `s` as a JSON string literal, quotes included (UTF-8 passes through unescaped).
std::string JsonQuote(absl::string_view s);

}  // namespace checkpoint_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_
