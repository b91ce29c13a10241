// The full JSON grammar (config.json) and the integer-only default kept for safetensors
// headers; the default's error messages are tested through SafetensorsFile::Open in
// checkpoint/safetensors_test.cc.
#include "checkpoint/internal/json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cpptrain {
namespace checkpoint_internal {
namespace {

using ::testing::HasSubstr;

JsonValue ParseFullOrDie(const std::string& text) {
  absl::StatusOr<JsonValue> value = ParseJson(text, JsonGrammar::kFull);
  EXPECT_TRUE(value.ok()) << text << ": " << value.status();
  return value.ok() ? *std::move(value) : JsonValue();
}

TEST(JsonTest, FullGrammarReadsLiteralsAndNumbers) {
  const JsonValue root = ParseFullOrDie(
      R"({"t": true, "f": false, "n": null, "i": -42, "d": 0.02, "e": 1e-06, "E": 2.5E+3,
          "theta": 1000000.0, "big": 18446744073709551616, "neg0": -0.0, "a": [null, 1.5]})");
  ASSERT_TRUE(root.is_object());
  EXPECT_TRUE(root.Find("t")->is_bool());
  EXPECT_TRUE(root.Find("t")->boolean);
  EXPECT_TRUE(root.Find("f")->is_bool());
  EXPECT_FALSE(root.Find("f")->boolean);
  EXPECT_TRUE(root.Find("n")->is_null());
  EXPECT_FALSE(root.Find("n")->is_number());

  const JsonValue& i = *root.Find("i");
  EXPECT_TRUE(i.is_integer() && i.is_number());
  EXPECT_EQ(i.integer, -42);
  EXPECT_EQ(i.AsDouble(), -42.0);

  for (const auto& [key, want] : std::vector<std::pair<std::string, double>>{
           {"d", 0.02}, {"e", 1e-6}, {"E", 2500.0}, {"theta", 1e6}, {"big", 18446744073709551616.0},
           {"neg0", 0.0}}) {
    const JsonValue& value = *root.Find(key);
    EXPECT_TRUE(value.is_double()) << key;
    EXPECT_EQ(value.AsDouble(), want) << key;  // exact: the nearest double, as Python writes it
  }
  EXPECT_TRUE(root.Find("a")->values[0].is_null());
  EXPECT_EQ(root.Find("a")->values[1].number, 1.5);
}

TEST(JsonTest, FullGrammarKeepsInt64Integers) {
  const JsonValue root = ParseFullOrDie(R"([9223372036854775807, -9223372036854775808])");
  EXPECT_EQ(root.values[0].integer, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(root.values[1].integer, std::numeric_limits<int64_t>::min());
  // One past INT64_MAX no longer fits: a double.
  EXPECT_TRUE(ParseFullOrDie("9223372036854775808").is_double());
}

TEST(JsonTest, FullGrammarErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1.]", "byte 3: expected a digit after the decimal point, found ']'"},
      {"[.5]", "expected an object, array, string, number, true, false or null, found '.'"},
      {"[1e]", "expected a digit in the exponent"},
      {"[1e+]", "expected a digit in the exponent"},
      {"[-]", "expected a digit"},
      {"[01.5]", "without leading zeros"},
      {"[+1]", "found '+'"},
      {"[tru]", "expected an object, array, string, number, true, false or null, found 't'"},
      {"[NaN]", "found 'N'"},
      {"[Infinity]", "found 'I'"},
      {"[1e999]", "byte 1: expected a number within the range of a double"},
      {"[truex]", "expected ',' or ']' in an array, found 'x'"},
      {"{\"a\": null, \"a\": 1}", "duplicate key \"a\""},
  };
  for (const auto& [text, expected] : cases) {
    absl::StatusOr<JsonValue> value = ParseJson(text, JsonGrammar::kFull);
    EXPECT_FALSE(value.ok()) << text;
    EXPECT_THAT(std::string(value.status().message()), HasSubstr(expected)) << text;
  }
}

TEST(JsonTest, DefaultGrammarStillRejectsLiteralsAndFractions) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"[true]", "true, false and null are not supported"},
           {"[null]", "true, false and null are not supported"},
           {"[1.5]", "fractions and exponents are not supported"},
           {"[2E3]", "fractions and exponents are not supported"},
           {"[99999999999999999999.5]", "an integer that fits in 64 bits"},
       }) {
    absl::StatusOr<JsonValue> value = ParseJson(text);
    EXPECT_FALSE(value.ok()) << text;
    EXPECT_THAT(std::string(value.status().message()), HasSubstr(expected)) << text;
  }
}

TEST(JsonTest, ToStringRendersCompactlyAndCuts) {
  const JsonValue root =
      ParseFullOrDie(R"({"type": "linear", "factor": 2.0, "on": true, "x": null, "l": [1, "a"]})");
  EXPECT_EQ(JsonToString(root),
            R"({"type": "linear", "factor": 2, "on": true, "x": null, "l": [1, "a"]})");
  const std::string cut = JsonToString(root, 20);
  EXPECT_EQ(cut.size(), 20u);
  EXPECT_EQ(cut.substr(17), "...");
}

}  // namespace
}  // namespace checkpoint_internal
}  // namespace cpptrain
