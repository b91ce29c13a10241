// Text-format configuration files and command-line overrides for any protobuf message.
// Errors name the source, line and column, and list the valid field names or enum values, so
// a typo in a config file is fixed from the message alone.
//
//   proto::TrainingArguments args;
//   CT_RETURN_IF_ERROR(LoadTextProtoFile("run.textproto", &args));
//   CT_RETURN_IF_ERROR(ApplyOverrides({"learning_rate=3e-4", "fsdp.version=2",
//                                      "lr_scheduler_type=COSINE"}, &args));
#ifndef CPPTRAIN_CONFIG_TEXT_PROTO_H_
#define CPPTRAIN_CONFIG_TEXT_PROTO_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace cpptrain {

// Parses `text` (protobuf text format) into `msg`, replacing its contents. Unknown fields,
// repeated singular fields, type errors and malformed input are InvalidArgument errors of the
// form "source_name:line:column: message" (1-based); an unknown field lists the valid field
// names of its message, an unknown enum value lists the valid values.
absl::Status ParseTextProto(absl::string_view text, absl::string_view source_name,
                            google::protobuf::Message* msg);

// Reads the file at `path` and parses it with ParseTextProto. A file that cannot be read is
// a NotFound error naming the path. `rewrite`, when given, sees the text first and returns the
// text to parse (keeping its lines, so errors point into the file) or an error.
using TextRewrite = std::function<absl::StatusOr<std::string>(const std::string& text)>;
absl::Status LoadTextProtoFile(const std::string& path, google::protobuf::Message* msg,
                               const TextRewrite& rewrite = nullptr);

// Applies one "path.to.field=value" assignment (a --set flag) to `msg`.
//  - Each path component but the last names a singular message field; reaching into a oneof
//    member selects that oneof case when none is selected, as in "fsdp.version=2", and is an
//    error when another member is (it would switch engines silently): switch with a message
//    body, "ddp={}" or "ddp={bucket_cap_mb: 25}".
//  - The leaf is a scalar, enum, string or repeated scalar field. Strings may be unquoted;
//    enum names also match case-insensitively ("cosine" -> COSINE). A repeated field takes a
//    comma-separated list or text-format list syntax ("[a, b]") and is replaced; an empty
//    value clears it.
//  - A singular message leaf takes a text-format body in braces, replacing the field:
//    "ddp={}" selects DDP with its defaults, "fsdp={version: 1}" sets FSDP from scratch.
// Values are parsed by the text-format parser, so "learning_rate=abc" is an error. Errors
// start with "--set=<assignment>: ". On error `msg` is unchanged.
absl::Status ApplyOverride(absl::string_view assignment, google::protobuf::Message* msg);

// Applies every assignment in order (a later one wins). All failing assignments are reported
// together, one per line; on error `msg` is unchanged.
absl::Status ApplyOverrides(const std::vector<std::string>& assignments,
                            google::protobuf::Message* msg);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_TEXT_PROTO_H_
