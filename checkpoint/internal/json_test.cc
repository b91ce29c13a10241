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

// Each way a string's bytes can fail to be UTF-8 (RFC 3629), and each way \u escapes can fail
// to pair their surrogates, in both grammars (the string starts at byte 2 of `["...`); then
// the valid boundary cases.
TEST(JsonTest, ValidatesUtf8AndSurrogateEscapes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Overlong forms: more bytes than the code point needs.
      {"[\"\xC0\x80\"]", "byte 2: expected valid UTF-8, found bytes 0xC0 0x80: an overlong form "
                         "of U+0000 (2 bytes; UTF-8 allows only the shortest form, 1 byte)"},
      {"[\"\xC1\xBF\"]", "byte 2: expected valid UTF-8, found bytes 0xC1 0xBF: an overlong form "
                         "of U+007F"},
      {"[\"\xE0\x80\x80\"]", "byte 2: expected valid UTF-8, found bytes 0xE0 0x80 0x80: an "
                             "overlong form of U+0000 (3 bytes; "},
      {"[\"\xE0\x9F\xBF\"]", "found bytes 0xE0 0x9F 0xBF: an overlong form of U+07FF (3 bytes; "
                             "UTF-8 allows only the shortest form, 2 bytes)"},
      {"[\"\xF0\x80\x80\x80\"]", "byte 2: expected valid UTF-8, found bytes 0xF0 0x80 0x80 0x80: "
                                 "an overlong form of U+0000 (4 bytes; "},
      {"[\"\xF0\x8F\xBF\xBF\"]", "found bytes 0xF0 0x8F 0xBF 0xBF: an overlong form of U+FFFF "
                                 "(4 bytes; UTF-8 allows only the shortest form, 3 bytes)"},
      // UTF-16 surrogates encoded in UTF-8 (CESU-8 writes a pair as two such sequences).
      {"[\"\xED\xA0\x80\"]", "byte 2: expected valid UTF-8, found bytes 0xED 0xA0 0x80: the "
                             "UTF-16 surrogate U+D800 encoded as UTF-8"},
      {"[\"\xED\xBF\xBF\"]", "found bytes 0xED 0xBF 0xBF: the UTF-16 surrogate U+DFFF"},
      {"[\"\xED\xA0\xBD\xED\xB8\x80\"]", "found bytes 0xED 0xA0 0xBD: the UTF-16 surrogate "
                                         "U+D83D"},
      // Above U+10FFFF.
      {"[\"\xF4\x90\x80\x80\"]", "byte 2: expected valid UTF-8, found bytes 0xF4 0x90 0x80 0x80: "
                                 "U+110000, above U+10FFFF, the largest code point"},
      {"[\"\xF5\x80\x80\x80\"]", "byte 2: expected valid UTF-8, found byte 0xF5: 0xF5-0xFF never "
                                 "start a UTF-8 sequence"},
      {"[\"\xF7\xBF\xBF\xBF\"]", "found byte 0xF7: 0xF5-0xFF never start a UTF-8 sequence"},
      {"[\"\xF8\x88\x80\x80\x80\"]", "found byte 0xF8: 0xF5-0xFF never start"},
      {"[\"\xFE\"]", "found byte 0xFE: 0xF5-0xFF never start"},
      {"[\"\xFF\"]", "found byte 0xFF: 0xF5-0xFF never start"},
      // Truncated sequences: a byte that is no continuation byte, or the end of the text.
      {"[\"\xC3\"]", "byte 2: expected valid UTF-8, found bytes 0xC3 0x22: a 2-byte sequence cut "
                     "short: its byte 2 (0x22) is not a continuation byte (0x80-0xBF)"},
      {"[\"\xE2\x82\"]", "found bytes 0xE2 0x82 0x22: a 3-byte sequence cut short: its byte 3 "
                         "(0x22)"},
      {"[\"\xF0\x9F\x98x\"]", "found bytes 0xF0 0x9F 0x98 0x78: a 4-byte sequence cut short: its "
                              "byte 4 (0x78)"},
      {"[\"\xE2\x82\xC3\xBC\"]", "found bytes 0xE2 0x82 0xC3: a 3-byte sequence cut short: its "
                                 "byte 3 (0xC3)"},
      {"[\"\xF0\x9F\x98", "byte 2: expected valid UTF-8, found bytes 0xF0 0x9F 0x98: a 4-byte "
                          "sequence cut short: the text ends after 3 of its bytes"},
      // Continuation bytes with no lead byte.
      {"[\"\x80\"]", "byte 2: expected valid UTF-8, found byte 0x80: a continuation byte "
                     "(0x80-0xBF) with no lead byte before it"},
      {"[\"a\xC3\xBC\xBF\"]", "byte 5: expected valid UTF-8, found byte 0xBF: a continuation "
                              "byte"},
      // In a key, too.
      {"{\"\xC0\x80\": 1}", "byte 2: expected valid UTF-8, found bytes 0xC0 0x80: an overlong"},
      // \u escapes: a lone low surrogate, a high one without a low one after it.
      {R"(["\udc00"])", "byte 2: \\udc00 is a low surrogate without a high surrogate before it"},
      {R"(["\uDFFF"])", "byte 2: \\uDFFF is a low surrogate without a high surrogate"},
      {R"(["\ud800x"])", "byte 8: expected a \\u low surrogate after the high surrogate \\ud800, "
                         "found 'x'"},
      {R"(["\ud800"])", "byte 8: expected a \\u low surrogate after the high surrogate \\ud800, "
                        "found '\"'"},
      {R"(["\ud800\ud800"])", "byte 8: expected a \\u low surrogate after the high surrogate "
                              "\\ud800, found \\ud800"},
      {R"(["\uDBFF\u0041"])", "found \\u0041"},
      {R"(["\ud83d\ue000"])", "byte 8: expected a \\u low surrogate after the high surrogate "
                              "\\ud83d, found \\ue000"},
  };
  for (const JsonGrammar grammar : {JsonGrammar::kIntegersOnly, JsonGrammar::kFull}) {
    for (const auto& [text, expected] : cases) {
      absl::StatusOr<JsonValue> value = ParseJson(text, grammar);
      if (value.ok()) {
        ADD_FAILURE() << JsonQuote(text) << " was accepted";
        continue;
      }
      EXPECT_THAT(std::string(value.status().message()), HasSubstr(expected)) << JsonQuote(text);
    }
  }

  // The boundaries of each UTF-8 length and of the surrogate range, as bytes and as escapes,
  // still pass.
  const std::vector<std::pair<std::string, std::string>> valid = {
      {"\x7F", "\x7F"},                          // U+007F, the last 1-byte form
      {"\xC2\x80", "\xC2\x80"},                  // U+0080, the first 2-byte form
      {"\xDF\xBF", "\xDF\xBF"},                  // U+07FF
      {"\xE0\xA0\x80", "\xE0\xA0\x80"},          // U+0800, the first 3-byte form
      {"\xED\x9F\xBF", "\xED\x9F\xBF"},          // U+D7FF, below the surrogates
      {"\xEE\x80\x80", "\xEE\x80\x80"},          // U+E000, above them
      {"\xEF\xBF\xBF", "\xEF\xBF\xBF"},          // U+FFFF
      {"\xF0\x90\x80\x80", "\xF0\x90\x80\x80"},  // U+10000, the first 4-byte form
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},  // U+10FFFF, the last code point
      {"a\xC3\xBC\xE2\x82\xAC\xF0\x9F\x98\x80z", "a\xC3\xBC\xE2\x82\xAC\xF0\x9F\x98\x80z"},
      {R"(\u0080)", "\xC2\x80"},
      {R"(\uffff)", "\xEF\xBF\xBF"},
      {R"(\ud7ff\ue000)", "\xED\x9F\xBF\xEE\x80\x80"},
      {R"(\ud800\udc00)", "\xF0\x90\x80\x80"},  // U+10000
      {R"(\uD83D\uDE00)", "\xF0\x9F\x98\x80"},  // U+1F600
      {R"(\udbff\udfff)", "\xF4\x8F\xBF\xBF"},  // U+10FFFF
  };
  for (const JsonGrammar grammar : {JsonGrammar::kIntegersOnly, JsonGrammar::kFull}) {
    for (const auto& [inside, decoded] : valid) {
      const std::string text = "{\"" + inside + "\": [\"" + inside + "\"]}";
      absl::StatusOr<JsonValue> value = ParseJson(text, grammar);
      ASSERT_TRUE(value.ok()) << JsonQuote(text) << ": " << value.status();
      EXPECT_EQ(value->keys[0], decoded) << JsonQuote(text);
      EXPECT_EQ(value->values[0].values[0].string, decoded) << JsonQuote(text);
    }
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
