#include "config/accelerate_yaml.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace cpptrain {
namespace {

constexpr absl::string_view kSubset =
    "this reader takes the YAML subset `accelerate config` writes (key: value mappings two "
    "levels deep, quoted or plain scalars, lists of scalars, comments)";

struct Line {
  int number = 0;
  int indent = 0;
  std::string text;  // without indentation, comment and trailing spaces
};

class Parser {
 public:
  explicit Parser(absl::string_view source) : source_(source) {}

  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", what, "; ", kSubset));
  }

  absl::Status Split(absl::string_view text);
  absl::StatusOr<std::vector<YamlEntry>> Parse();

 private:
  absl::Status ParseMapping(size_t& i, int indent, const std::string& prefix, int depth,
                            std::vector<YamlEntry>& out);
  absl::Status ParseBlockList(size_t& i, int indent, YamlEntry& entry);
  absl::StatusOr<std::string> Scalar(absl::string_view text, int line, bool in_flow) const;
  absl::StatusOr<std::string> Value(absl::string_view text, int line) const;

  std::string source_;
  std::vector<Line> lines_;
};

// The text before a comment: '#' at the start or after a space, outside quotes.
absl::StatusOr<absl::string_view> WithoutComment(absl::string_view text) {
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quote != 0) {
      if ((ch == '\\' && quote == '"') ||
          (ch == '\'' && quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'')) {
        ++i;  // an escaped character, or '' inside single quotes
      } else if (ch == quote) {
        quote = 0;
      }
    } else if (ch == '"' || ch == '\'') {
      // A quote opens a quoted scalar only at its start (after ": ", "- ", "[" or ", ").
      if (i == 0 || text[i - 1] == ' ' || text[i - 1] == '[') quote = ch;
    } else if (ch == '#' && (i == 0 || text[i - 1] == ' ')) {
      return text.substr(0, i);
    }
  }
  return text;
}

absl::Status Parser::Split(absl::string_view text) {
  int number = 0;
  bool seen_content = false;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    absl::ConsumeSuffix(&raw, "\r");
    if (raw.find('\0') != absl::string_view::npos) return Error(number, "a NUL byte");
    size_t indent = 0;
    while (indent < raw.size() && raw[indent] == ' ') ++indent;
    if (indent < raw.size() && raw[indent] == '\t') return Error(number, "a tab in indentation");
    absl::StatusOr<absl::string_view> body = WithoutComment(raw.substr(indent));
    if (!body.ok()) return Error(number, body.status().message());
    const absl::string_view content = absl::StripTrailingAsciiWhitespace(*body);
    if (content.empty()) continue;
    if (content == "---" && indent == 0) {
      if (seen_content) return Error(number, "a second YAML document");
      seen_content = true;
      continue;
    }
    if (content == "..." || absl::StartsWith(content, "%")) {
      return Error(number, absl::StrCat("\"", content, "\" (a document marker or directive)"));
    }
    seen_content = true;
    lines_.push_back({number, static_cast<int>(indent), std::string(content)});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Parser::Scalar(absl::string_view text, int line, bool in_flow) const {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return Error(line, "an empty list item");
  const char first = text[0];
  if (first == '"' || first == '\'') {
    std::string out;
    size_t i = 1;
    for (; i < text.size(); ++i) {
      const char ch = text[i];
      if (first == '\'' && ch == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        out.push_back('\'');  // '' inside single quotes
        ++i;
      } else if (ch == first) {
        break;
      } else if (first == '"' && ch == '\\' && i + 1 < text.size()) {
        const char e = text[++i];
        const std::string escapes = "\"\\/nt";
        if (escapes.find(e) == std::string::npos) {
          return Error(line,
                       absl::StrCat("the escape \\", std::string(1, e), " in a quoted string"));
        }
        out.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);
      } else {
        out.push_back(ch);
      }
    }
    if (i >= text.size()) return Error(line, "a quoted string that does not end on its line");
    if (!absl::StripAsciiWhitespace(text.substr(i + 1)).empty()) {
      return Error(line, "text after a quoted string");
    }
    return out;
  }
  if (std::string("&*!|>@`%{[]}").find(first) != std::string::npos) {
    return Error(line, absl::StrCat("\"", text, "\" (anchors, aliases, tags, block scalars and "
                                    "nested collections are not read)"));
  }
  if ((first == '-' || first == '?') && (text.size() == 1 || text[1] == ' ')) {
    return Error(line, absl::StrCat("\"", text, "\" where a scalar belongs"));
  }
  if (absl::StrContains(text, ": ") || absl::EndsWith(text, ":")) {
    return Error(line, absl::StrCat("\"", text, "\": a mapping where a scalar belongs"));
  }
  if (in_flow && absl::StrContains(text, ",")) return Error(line, "a comma inside a list item");
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "null" || lower == "~") return std::string();
  return std::string(text);
}

// A mapping value on the key's own line: a scalar, {} or a flow list of scalars.
absl::StatusOr<std::string> Parser::Value(absl::string_view text, int line) const {
  if (absl::StartsWith(text, "{")) {
    if (absl::StripAsciiWhitespace(absl::StripPrefix(absl::StripSuffix(text, "}"), "{")).empty() &&
        absl::EndsWith(text, "}")) {
      return std::string();
    }
    return Error(line, absl::StrCat("\"", text, "\": a flow mapping (write it as indented lines)"));
  }
  if (!absl::StartsWith(text, "[")) return Scalar(text, line, false);
  if (!absl::EndsWith(text, "]")) return Error(line, "a list that does not end on its line");
  const absl::string_view inside = absl::StripAsciiWhitespace(text.substr(1, text.size() - 2));
  if (inside.empty()) return std::string();
  std::vector<std::string> items;
  // Split on commas outside quotes.
  char quote = 0;
  size_t start = 0;
  for (size_t i = 0; i <= inside.size(); ++i) {
    const char ch = i < inside.size() ? inside[i] : ',';
    if (quote != 0) {
      if (ch == quote) quote = 0;
      continue;
    }
    if (ch == '"' || ch == '\'') quote = ch;
    if (ch != ',') continue;
    absl::StatusOr<std::string> item = Scalar(inside.substr(start, i - start), line, true);
    if (!item.ok()) return item.status();
    items.push_back(*std::move(item));
    start = i + 1;
  }
  return absl::StrJoin(items, ",");
}

absl::Status Parser::ParseBlockList(size_t& i, int indent, YamlEntry& entry) {
  std::vector<std::string> items;
  while (i < lines_.size() && lines_[i].indent == indent &&
         (lines_[i].text == "-" || absl::StartsWith(lines_[i].text, "- "))) {
    const Line& l = lines_[i];
    if (l.text == "-") return Error(l.number, "an empty list item");
    absl::StatusOr<std::string> item = Scalar(l.text.substr(2), l.number, true);
    if (!item.ok()) return item.status();
    items.push_back(*std::move(item));
    ++i;
  }
  entry.value = absl::StrJoin(items, ",");
  return absl::OkStatus();
}

absl::Status Parser::ParseMapping(size_t& i, int indent, const std::string& prefix, int depth,
                                  std::vector<YamlEntry>& out) {
  std::set<std::string> keys;
  while (i < lines_.size() && lines_[i].indent >= indent) {
    const Line& l = lines_[i];
    if (l.indent != indent) {
      return Error(l.number, absl::StrCat("indented by ", l.indent, " where ", indent,
                                          " spaces continue the mapping"));
    }
    if (absl::StartsWith(l.text, "- ") || l.text == "-") {
      return Error(l.number, "a list item where a key belongs");
    }
    const size_t colon = l.text.find(':');
    if (colon == std::string::npos || (colon + 1 < l.text.size() && l.text[colon + 1] != ' ')) {
      return Error(l.number, absl::StrCat("\"", l.text, "\" is not `key: value`"));
    }
    const std::string key = l.text.substr(0, colon);
    const bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
      return absl::ascii_isalnum(ch) || ch == '_' || ch == '-';
    });
    if (!plain) return Error(l.number, absl::StrCat("the key \"", key, "\" (letters, digits, '_' and '-' only)"));
    if (!keys.insert(key).second) {
      return Error(l.number, absl::StrCat("the key \"", key, "\" twice"));
    }
    YamlEntry entry{prefix + key, "", l.number};
    const absl::string_view rest =
        absl::StripAsciiWhitespace(absl::string_view(l.text).substr(colon + 1));
    ++i;
    if (!rest.empty()) {
      absl::StatusOr<std::string> value = Value(rest, l.number);
      if (!value.ok()) return value.status();
      entry.value = *std::move(value);
      // `key: {}` is an empty mapping: no entry, as if absent.
      if (!(absl::StartsWith(rest, "{") && entry.value.empty())) out.push_back(entry);
      continue;
    }
    if (i < lines_.size() && lines_[i].indent >= indent &&
        (absl::StartsWith(lines_[i].text, "- ") || lines_[i].text == "-")) {
      absl::Status list = ParseBlockList(i, lines_[i].indent, entry);
      if (!list.ok()) return list;
      out.push_back(entry);
      continue;
    }
    if (i < lines_.size() && lines_[i].indent > indent) {
      if (depth == 2) {
        return Error(lines_[i].number, "a third level of nesting");
      }
      absl::Status nested = ParseMapping(i, lines_[i].indent, entry.path + ".", depth + 1, out);
      if (!nested.ok()) return nested;
      continue;
    }
    out.push_back(entry);  // `key:` alone is null
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<YamlEntry>> Parser::Parse() {
  std::vector<YamlEntry> out;
  size_t i = 0;
  if (!lines_.empty() && lines_[0].indent != 0) {
    return Error(lines_[0].number, "an indented first line");
  }
  absl::Status s = ParseMapping(i, 0, "", 1, out);
  if (!s.ok()) return s;
  if (i < lines_.size()) return Error(lines_[i].number, "text outside the mapping");
  return out;
}

}  // namespace

absl::StatusOr<std::vector<YamlEntry>> ParseYamlSubset(absl::string_view text,
                                                       absl::string_view source) {
  Parser parser(source);
  absl::Status split = parser.Split(text);
  if (!split.ok()) return split;
  return parser.Parse();
}

absl::StatusOr<std::vector<AccelerateSetting>> ReadAccelerateYamlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read the Accelerate config \"", path,
                                            "\"; pass the YAML `accelerate config` wrote"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<YamlEntry>> entries = ParseYamlSubset(text.str(), path);
  if (!entries.ok()) return entries.status();
  std::vector<AccelerateSetting> settings;
  for (const YamlEntry& e : *entries) {
    settings.push_back({e.path, e.value, absl::StrCat(path, ":", e.line)});
  }
  return settings;
}

}  // namespace cpptrain
