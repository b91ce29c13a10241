// A strict parser for the JSON subset safetensors headers and Hugging Face index files use:
// objects, arrays, strings (all escapes, \uXXXX with surrogate pairs) and integers. Literals
// (true, false, null), fractions and exponents are rejected with an error naming the byte
// offset, as are duplicate object keys and trailing bytes other than whitespace.
//
//   CT_ASSIGN_OR_RETURN(JsonValue root, ParseJson(text));
//   if (!root.is_object()) ...
//   for (size_t i = 0; i < root.keys.size(); ++i) Use(root.keys[i], root.values[i]);
//
// Private to //checkpoint.
#ifndef CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_
#define CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {
namespace checkpoint_internal {

struct JsonValue {
  enum class Kind { kObject, kArray, kString, kInteger };

  bool is_object() const { return kind == Kind::kObject; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_integer() const { return kind == Kind::kInteger; }

  // The value of `key` in an object, or nullptr.
  const JsonValue* Find(absl::string_view key) const;

  Kind kind = Kind::kObject;
  int64_t integer = 0;
  std::string string;
  // An object: keys[i] maps to values[i], in file order. An array: values only.
  std::vector<std::string> keys;
  std::vector<JsonValue> values;
};

// Parses `text` (which may end in whitespace). Errors say what was expected at which byte.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `s` as a JSON string literal, quotes included (UTF-8 passes through unescaped).
std::string JsonQuote(absl::string_view s);

}  // namespace checkpoint_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_INTERNAL_JSON_H_
