#include "config/text_proto.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "base/status.h"
#include "config/hf_training_args.h"

namespace cpptrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::TextFormat;

// Records every parser error with its 0-based position.
class CollectingErrors : public google::protobuf::io::ErrorCollector {
 public:
  struct Error {
    int line;
    int column;
    std::string message;
  };

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors_.push_back({line, column, message});
  }

  const std::vector<Error>& errors() const { return errors_; }

 private:
  std::vector<Error> errors_;
};

// Levenshtein distance, for "did you mean" hints on short identifiers.
int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate closest to `name` when one is close enough, otherwise null.
const std::string* Nearest(absl::string_view name, const std::vector<std::string>& candidates) {
  const std::string lower = absl::AsciiStrToLower(name);
  const std::string* best = nullptr;
  int best_distance = std::max<int>(2, static_cast<int>(name.size()) / 3) + 1;
  for (const std::string& candidate : candidates) {
    // The distance is at least the difference in length: skip what cannot be closer (and the
    // quadratic distance of a long typo against every field name).
    const size_t shorter = std::min(lower.size(), candidate.size());
    if (static_cast<int>(std::max(lower.size(), candidate.size()) - shorter) >= best_distance) {
      continue;
    }
    int distance = EditDistance(lower, absl::AsciiStrToLower(candidate));
    if (distance < best_distance) {
      best_distance = distance;
      best = &candidate;
    }
  }
  return best;
}

// " (did you mean \"x\"?)" when one candidate is close to `name`, otherwise "".
std::string Suggestion(absl::string_view name, const std::vector<std::string>& candidates) {
  const std::string* best = Nearest(name, candidates);
  return best == nullptr ? "" : absl::StrCat(" (did you mean \"", *best, "\"?)");
}

// The hint after an unknown field `name` of `type` whose fields are `names`: the nearest field,
// and for TrainingArguments and TrainJob also where Hugging Face's setting of that name (or of
// the nearest such name) lives here (config/hf_training_args.h).
std::string NameHint(const Descriptor* type, absl::string_view name,
                     const std::vector<std::string>& names) {
  const bool args = type->full_name() == "cpptrain.proto.TrainingArguments";
  const bool job = type->full_name() == "cpptrain.proto.TrainJob";
  if (!args && !job) return Suggestion(name, names);
  const std::string under_args = job ? "; it belongs under args" : "";
  const std::string note = HfArgumentNote(name);
  if (!note.empty()) return absl::StrCat(" (", note, under_args, ")");
  std::vector<std::string> candidates = names;
  for (const std::string& hf : HfOnlyArgumentNames()) candidates.push_back(hf);
  const std::string* best = Nearest(name, candidates);
  if (best != nullptr && IsHfOnlyArgument(*best)) {
    return absl::StrCat(" (did you mean \"", *best, "\"? ", HfArgumentNote(*best), under_args,
                        ")");
  }
  return Suggestion(name, names);
}

std::vector<std::string> FieldNames(const Descriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->field_count(); ++i) names.push_back(type->field(i)->name());
  return names;
}

std::vector<std::string> EnumValueNames(const EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return names;
}

// The shortest path ("args.learning_rate") from `type` to a nested field called `name`, or "".
std::string PathToNestedField(const Descriptor* type, absl::string_view name) {
  std::vector<std::pair<const Descriptor*, std::string>> level = {{type, ""}};
  std::set<const Descriptor*> seen = {type};
  while (!level.empty()) {
    std::vector<std::pair<const Descriptor*, std::string>> next;
    for (const auto& [message, prefix] : level) {
      for (int i = 0; i < message->field_count(); ++i) {
        const FieldDescriptor* field = message->field(i);
        const std::string path = absl::StrCat(prefix, field->name());
        if (!prefix.empty() && field->name() == name) return path;
        const Descriptor* child = field->message_type();
        if (child != nullptr && !field->is_repeated() && seen.insert(child).second) {
          next.push_back({child, absl::StrCat(path, ".")});
        }
      }
    }
    level = std::move(next);
  }
  return "";
}

std::string UnknownFieldText(const Descriptor* type, absl::string_view name) {
  std::vector<std::string> names = FieldNames(type);
  std::string hint = NameHint(type, name, names);
  const std::string nested = PathToNestedField(type, name);
  if (!nested.empty()) hint = absl::StrCat(" (did you mean \"", nested, "\"?)");
  return absl::StrCat("message ", type->full_name(), " has no field \"", name, "\"", hint,
                      "; valid fields: ", absl::StrJoin(names, ", "));
}

std::string EnumValuesText(const EnumDescriptor* type, absl::string_view value) {
  std::vector<std::string> names = EnumValueNames(type);
  return absl::StrCat(Suggestion(value, names), "; valid values of ", type->full_name(), ": ",
                      absl::StrJoin(names, ", "));
}

// The text between `open` and the next `close` after it, or "" when absent.
std::string Between(absl::string_view text, absl::string_view open, absl::string_view close) {
  size_t start = text.find(open);
  if (start == absl::string_view::npos) return "";
  start += open.size();
  size_t end = text.find(close, start);
  if (end == absl::string_view::npos) return "";
  return std::string(text.substr(start, end - start));
}

// Enum types of fields named `field_name` in every message reachable from `root`.
std::vector<const EnumDescriptor*> EnumTypesOfField(const Descriptor* root,
                                                    const std::string& field_name) {
  std::vector<const EnumDescriptor*> found;
  std::set<const Descriptor*> seen = {root};
  std::vector<const Descriptor*> pending = {root};
  while (!pending.empty()) {
    const Descriptor* type = pending.back();
    pending.pop_back();
    for (int i = 0; i < type->field_count(); ++i) {
      const FieldDescriptor* field = type->field(i);
      if (field->type() == FieldDescriptor::TYPE_ENUM && field->name() == field_name &&
          std::find(found.begin(), found.end(), field->enum_type()) == found.end()) {
        found.push_back(field->enum_type());
      }
      const Descriptor* child = field->message_type();
      if (child != nullptr && seen.insert(child).second) pending.push_back(child);
    }
  }
  return found;
}

// Appends the valid names to the parser's unknown-field and unknown-enum messages.
std::string ExplainParserError(const Descriptor* root, const std::string& message) {
  if (absl::StrContains(message, "has no field named")) {
    const std::string type_name = Between(message, "Message type \"", "\"");
    const std::string field_name = Between(message, "has no field named \"", "\"");
    const Descriptor* type = root->file()->pool()->FindMessageTypeByName(type_name);
    if (type == nullptr) return message;
    std::vector<std::string> names = FieldNames(type);
    return absl::StrCat(message, NameHint(type, field_name, names), " Valid fields of ",
                        type->name(), ": ", absl::StrJoin(names, ", "));
  }
  if (absl::StrContains(message, "Unknown enumeration value of")) {
    const std::string value = Between(message, "Unknown enumeration value of \"", "\"");
    const std::string field_name = Between(message, "for field \"", "\"");
    std::string result = message;
    for (const EnumDescriptor* type : EnumTypesOfField(root, field_name)) {
      std::vector<std::string> names = EnumValueNames(type);
      absl::StrAppend(&result, Suggestion(value, names), " Valid values of ", type->name(), ": ",
                      absl::StrJoin(names, ", "));
    }
    return result;
  }
  return message;
}

// The byte offset of a tokenizer position (0-based line, column with tabs advancing to the
// next multiple of 8), clamped to the text.
size_t OffsetOf(absl::string_view text, int line, int column) {
  size_t offset = 0;
  for (int l = 0; l < line && offset < text.size(); ++offset) {
    if (text[offset] == '\n') ++l;
  }
  for (int c = 0; c < column && offset < text.size() && text[offset] != '\n'; ++offset) {
    c = text[offset] == '\t' ? c + 8 - c % 8 : c + 1;
  }
  return offset;
}

bool IsIdentifierChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// The parser reports unknown names after consuming them, i.e. at the next token (possibly on
// a later line). Moves the position back to the last whole-word occurrence of `token`.
void MoveToToken(absl::string_view text, absl::string_view token, int* line, int* column) {
  if (token.empty()) return;
  size_t end = OffsetOf(text, *line, *column);
  size_t found = absl::string_view::npos;
  while (end > 0) {
    size_t at = text.substr(0, end).rfind(token);
    if (at == absl::string_view::npos) break;
    const bool starts = at == 0 || !IsIdentifierChar(text[at - 1]);
    const size_t after = at + token.size();
    if (starts && (after >= text.size() || !IsIdentifierChar(text[after]))) {
      found = at;
      break;
    }
    end = at;
  }
  if (found == absl::string_view::npos) return;
  *line = 0;
  *column = 0;
  for (size_t i = 0; i < found; ++i) {
    if (text[i] == '\n') {
      ++*line;
      *column = 0;
    } else {
      *column = text[i] == '\t' ? *column + 8 - *column % 8 : *column + 1;
    }
  }
}

// The dotted path of the field whose value sits at byte `offset` of `text`: the innermost
// "name {" blocks open there and the last "name:" before it, e.g. "args.learning_rate"; ""
// when it cannot be told. With `field_name`, the blocks open there and that name instead (for
// an error the parser reports at a field's name, where the last "name:" is the field before).
// Strings and # comments are skipped.
std::string FieldPathAt(absl::string_view text, size_t offset, absl::string_view field_name = "") {
  std::vector<std::string> open;
  std::string last;   // the identifier most recently read
  std::string field;  // the last "name:" in the innermost open block
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    const char c = text[i];
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      for (++i; i < text.size() && text[i] != c; ++i) i += text[i] == '\\';
    } else if (IsIdentifierChar(c)) {
      size_t end = i;
      while (end < text.size() && IsIdentifierChar(text[end])) ++end;
      last = std::string(text.substr(i, end - i));
      i = end - 1;
    } else if (c == ':') {
      field = last;
    } else if (c == '{' || c == '<') {
      open.push_back(last);
      field.clear();
    } else if ((c == '}' || c == '>') && !open.empty()) {
      open.pop_back();
      field.clear();
    }
  }
  if (!field_name.empty()) field = std::string(field_name);
  if (field.empty()) return "";
  open.push_back(field);
  return absl::StrJoin(open, ".");
}

// Formats the collected errors as "source:line:column: message" lines.
std::string FormatErrors(const CollectingErrors& errors, absl::string_view text,
                         absl::string_view source_name, const Descriptor* root) {
  std::vector<std::string> lines;
  for (const CollectingErrors::Error& e : errors.errors()) {
    int line = e.line;
    int column = e.column;
    // A repeated field is reported at the ':' after its name, where the last "name:" read is
    // the field before it: point at the name and build the path from it.
    const std::string repeated = Between(e.message, "Non-repeated field \"", "\"");
    if (!repeated.empty()) {
      MoveToToken(text, repeated, &line, &column);
    } else if (absl::StrContains(e.message, "has no field named")) {
      MoveToToken(text, Between(e.message, "has no field named \"", "\""), &line, &column);
    } else if (absl::StrContains(e.message, "Unknown enumeration value of")) {
      MoveToToken(text, Between(e.message, "Unknown enumeration value of \"", "\""), &line,
                  &column);
    }
    // A value the parser refused (wrong type, out of range) also names its field.
    std::string field;
    if (!absl::StrContains(e.message, "has no field named")) {
      const std::string path = FieldPathAt(text, OffsetOf(text, line, column), repeated);
      if (!path.empty()) field = absl::StrCat("field ", path, ": ");
    }
    lines.push_back(absl::StrCat(source_name, ":", line + 1, ":", column + 1, ": ", field,
                                 ExplainParserError(root, e.message)));
  }
  if (lines.empty()) lines.push_back(absl::StrCat(source_name, ": malformed text proto"));
  return absl::StrJoin(lines, "\n");
}

bool IsQuoted(absl::string_view value) {
  return value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
         value.back() == value.front();
}

// One scalar value in text-format syntax: strings are quoted unless they already are, enum
// names are matched case-insensitively.
std::string ScalarText(const FieldDescriptor* field, absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      if (IsQuoted(value)) return std::string(value);
      return absl::StrCat("\"", absl::CEscape(value), "\"");
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor* type = field->enum_type();
      if (absl::StartsWith(value, "_")) value.remove_prefix(1);  // Hugging Face's private spelling
      if (type->FindValueByName(std::string(value)) == nullptr) {
        for (int i = 0; i < type->value_count(); ++i) {
          if (absl::EqualsIgnoreCase(type->value(i)->name(), value)) return type->value(i)->name();
        }
      }
      return std::string(value);
    }
    default:
      return std::string(value);
  }
}

// The text-format assignment of `value` to the leaf `field`, e.g. "learning_rate: 3e-4".
// Returns "" for an empty repeated value (the field is only cleared).
std::string LeafText(const FieldDescriptor* field, absl::string_view value) {
  const std::string& name = field->name();
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return absl::StrCat(name, " ", value);
  }
  if (!field->is_repeated()) return absl::StrCat(name, ": ", ScalarText(field, value));
  if (value.empty()) return "";
  if (value.front() == '[') return absl::StrCat(name, ": ", value);
  std::vector<std::string> items;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    items.push_back(ScalarText(field, item));
  }
  return absl::StrCat(name, ": [", absl::StrJoin(items, ", "), "]");
}

// Reaching into a oneof member (parts[i]) while another member of that oneof is set would
// switch silently ("ddp.bucket_cap_mb=25" on a file that selects `local`): an error saying how
// to switch explicitly. A message-valued assignment ("ddp={...}") still switches.
absl::Status CheckOneofCase(const Message& parent, const FieldDescriptor* field,
                            const std::vector<absl::string_view>& parts, size_t i) {
  const google::protobuf::OneofDescriptor* oneof = field->containing_oneof();
  if (oneof == nullptr) return absl::OkStatus();
  const FieldDescriptor* current = parent.GetReflection()->GetOneofFieldDescriptor(parent, oneof);
  if (current == nullptr || current == field) return absl::OkStatus();
  const std::string prefix = absl::StrJoin(parts.begin(), parts.begin() + i, ".");
  const std::string base = prefix.empty() ? "" : absl::StrCat(prefix, ".");
  return absl::InvalidArgumentError(absl::StrCat(
      base, current->name(), " is selected (", oneof->name(), " is a oneof), so setting a field of ",
      base, field->name(), " would switch ", oneof->name(), " silently; switch explicitly with ",
      "--set=", base, field->name(), "={} before this --set, or give its fields in the braces (",
      "--set=", base, field->name(), "={", parts[i + 1], ": ...})"));
}

// Applies `assignment` to `msg` in place; the caller works on a copy. Returns the reason
// (without the "--set=" prefix) on failure.
absl::Status ApplyInPlace(absl::string_view assignment, Message* msg) {
  const size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError("expected path.to.field=value");
  }
  const absl::string_view path = absl::StripAsciiWhitespace(assignment.substr(0, eq));
  const absl::string_view value = absl::StripAsciiWhitespace(assignment.substr(eq + 1));
  if (path.empty()) return absl::InvalidArgumentError("empty field path before '='");

  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  Message* parent = msg;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const Descriptor* type = parent->GetDescriptor();
    const FieldDescriptor* field = type->FindFieldByName(std::string(parts[i]));
    if (field == nullptr) return absl::InvalidArgumentError(UnknownFieldText(type, parts[i]));
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field->full_name(), " is not a singular message field, so \"", parts[i + 1],
                       "\" cannot follow it in the path"));
    }
    CT_RETURN_IF_ERROR(CheckOneofCase(*parent, field, parts, i));
    // For a oneof member whose case is unset, this selects the case.
    parent = parent->GetReflection()->MutableMessage(parent, field);
  }

  const Descriptor* type = parent->GetDescriptor();
  const FieldDescriptor* leaf = type->FindFieldByName(std::string(parts.back()));
  if (leaf == nullptr) return absl::InvalidArgumentError(UnknownFieldText(type, parts.back()));
  if (leaf->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (leaf->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(
          leaf->full_name(), " is a repeated message field; overrides set scalar fields"));
    }
    if (value.size() < 2 || value.front() != '{' || value.back() != '}') {
      const Descriptor* body_type = leaf->message_type();
      const std::string example =
          body_type->field_count() > 0
              ? absl::StrCat("e.g. ", parts.back(), ".", body_type->field(0)->name(), "=...; ")
              : "";
      return absl::InvalidArgumentError(absl::StrCat(
          leaf->full_name(), " is a message: set one of its fields (", example,
          "fields: ", absl::StrJoin(FieldNames(body_type), ", "),
          ") or give a text-format body in braces (", parts.back(), "={} for the defaults)"));
    }
  }

  const Reflection* reflection = parent->GetReflection();
  if (leaf->containing_oneof() != nullptr) {
    reflection->ClearOneof(parent, leaf->containing_oneof());
  }
  reflection->ClearField(parent, leaf);
  const std::string text = LeafText(leaf, value);
  if (text.empty()) return absl::OkStatus();

  CollectingErrors errors;
  TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (parser.MergeFromString(text, parent)) return absl::OkStatus();

  std::vector<std::string> reasons;
  for (const CollectingErrors::Error& e : errors.errors()) {
    reasons.push_back(std::string(absl::StripSuffix(e.message, ".")));
  }
  std::string why = absl::StrCat("bad value \"", value, "\" for ", leaf->full_name(), " (",
                                 leaf->is_repeated() ? "repeated " : "", leaf->type_name(),
                                 "): ", absl::StrJoin(reasons, "; "));
  if (leaf->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    absl::StrAppend(&why, EnumValuesText(leaf->enum_type(), value));
  }
  return absl::InvalidArgumentError(why);
}

// Hugging Face spells some enum values with a leading underscore (`_HYBRID_SHARD_ZERO2`),
// which protobuf identifiers cannot have: a value that starts with '_' right after a ':'
// (outside strings and comments) is read without it. Field names never follow a ':'.
std::string WithoutLeadingUnderscoreValues(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  char quote = 0;
  bool comment = false, after_colon = false;
  for (char c : text) {
    if (comment) {
      comment = c != '\n';
    } else if (quote != 0) {
      if (c == quote && (out.empty() || out.back() != '\\')) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      comment = true;
    } else if (c == '_' && after_colon) {
      after_colon = false;
      continue;
    }
    if (quote == 0 && !comment && !absl::ascii_isspace(c)) after_colon = c == ':';
    out.push_back(c);
  }
  return out;
}

}  // namespace

absl::Status ParseTextProto(absl::string_view text, absl::string_view source_name, Message* msg) {
  CollectingErrors errors;
  TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  const std::string readable = WithoutLeadingUnderscoreValues(text);
  if (parser.ParseFromString(readable, msg)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      FormatErrors(errors, readable, source_name, msg->GetDescriptor()));
}

absl::Status LoadTextProtoFile(const std::string& path, Message* msg,
                               const TextRewrite& rewrite) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file \"", path, "\": ", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    return absl::DataLossError(absl::StrCat("error while reading config file \"", path, "\""));
  }
  if (!rewrite) return ParseTextProto(contents.str(), path, msg);
  CT_ASSIGN_OR_RETURN(const std::string text, rewrite(contents.str()));
  return ParseTextProto(text, path, msg);
}

absl::Status ApplyOverride(absl::string_view assignment, Message* msg) {
  std::unique_ptr<Message> copy(msg->New());
  copy->CopyFrom(*msg);
  absl::Status status = ApplyInPlace(assignment, copy.get());
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--set=", assignment, ": ", status.message()));
  }
  msg->GetReflection()->Swap(msg, copy.get());
  return absl::OkStatus();
}

absl::Status ApplyOverrides(const std::vector<std::string>& assignments, Message* msg) {
  std::unique_ptr<Message> copy(msg->New());
  copy->CopyFrom(*msg);
  std::vector<std::string> failures;
  for (const std::string& assignment : assignments) {
    absl::Status status = ApplyOverride(assignment, copy.get());
    if (!status.ok()) failures.push_back(std::string(status.message()));
  }
  if (!failures.empty()) return absl::InvalidArgumentError(absl::StrJoin(failures, "\n"));
  msg->GetReflection()->Swap(msg, copy.get());
  return absl::OkStatus();
}

}  // namespace cpptrain
