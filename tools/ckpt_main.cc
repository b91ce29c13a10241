// //tools:ckpt: inspects checkpoint and Hugging Face model directories, and converts a model
// between the full form (model.safetensors) and the sharded form (one file per shard rank plus
// manifest.pb) without holding more than one tensor in memory.
//
//   bazel-bin/tools/ckpt inspect /ckpt/checkpoint-100
//   bazel-bin/tools/ckpt verify /ckpt/checkpoint-100       # exit 1 naming what is damaged
//   bazel-bin/tools/ckpt to-full /ckpt/checkpoint-100 /hf/my-model
//   bazel-bin/tools/ckpt to-sharded /hf/my-model /ckpt/my-model-8 --ranks=8
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/working_directory.h"
#include "tools/ckpt_lib.h"

ABSL_FLAG(int, ranks, 0, "to-sharded: the number of shard ranks to write the model for (>= 1).");

namespace cpptrain {
namespace {

constexpr char kUsage[] =
    "inspects and converts model checkpoints.\n"
    "  ckpt inspect DIR                        the manifest or tensors of DIR, with checksums\n"
    "  ckpt verify DIR                         reads every byte of DIR; exit 1 if damaged\n"
    "  ckpt to-full DIR OUT_DIR                OUT_DIR/model.safetensors (Hugging Face names)\n"
    "  ckpt to-sharded DIR OUT_DIR --ranks=N   OUT_DIR/shard-*-of-N.safetensors + manifest.pb\n"
    "DIR is a checkpoint directory (manifest.pb) or a Hugging Face model directory\n"
    "(model.safetensors or model.safetensors.index.json).";

std::string Bytes(int64_t bytes) {
  return absl::StrFormat("%d bytes (%.1f MiB)", bytes, bytes / (1024.0 * 1024.0));
}

// `args` is the command and `operands` more words; `form` shows the right use.
absl::Status CheckArgs(const std::vector<std::string>& args, size_t operands,
                       const std::string& form) {
  if (args.size() != operands + 1) {
    const std::string got =
        args.size() == 1 ? "none"
                         : absl::StrCat(args.size() - 1, " (",
                                        absl::StrJoin(args.begin() + 1, args.end(), " "), ")");
    return absl::InvalidArgumentError(absl::StrCat(args[0], " takes ", operands,
                                                   " argument(s) but got ", got, ": use ckpt ",
                                                   form));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args, int ranks) {
  if (args.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no command given; usage: ", kUsage));
  }
  const std::string& command = args[0];
  if (ranks != 0 && command != "to-sharded") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ranks=", ranks, " was given to ", command, ": it applies to to-sharded only"));
  }
  if (command == "inspect") {
    CT_RETURN_IF_ERROR(CheckArgs(args, 1, "inspect DIR"));
    return InspectCheckpoint(args[1], std::cout);
  }
  if (command == "verify") {
    CT_RETURN_IF_ERROR(CheckArgs(args, 1, "verify DIR"));
    return VerifyDirectory(args[1], std::cout);
  }
  if (command == "to-full") {
    CT_RETURN_IF_ERROR(CheckArgs(args, 2, "to-full DIR OUT_DIR"));
    CT_ASSIGN_OR_RETURN(ConvertResult result, ConvertToFull(args[1], args[2]));
    std::cout << "wrote " << result.files.front() << ": " << result.tensors << " tensors, "
              << Bytes(result.bytes) << "\n";
    return absl::OkStatus();
  }
  if (command == "to-sharded") {
    CT_RETURN_IF_ERROR(CheckArgs(args, 2, "to-sharded DIR OUT_DIR --ranks=N"));
    if (ranks == 0) {
      return absl::InvalidArgumentError(
          "to-sharded needs --ranks: pass --ranks=N, the number of shard ranks (>= 1)");
    }
    CT_ASSIGN_OR_RETURN(ConvertResult result, ConvertToSharded(args[1], args[2], ranks));
    for (const std::string& file : result.files) std::cout << "wrote " << file << "\n";
    std::cout << result.tensors << " tensors for " << ranks << " ranks, " << Bytes(result.bytes)
              << "\n";
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command '", command,
                   "': use inspect, verify, to-full or to-sharded; usage: ", kUsage));
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  absl::SetProgramUsageMessage(cpptrain::kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  const absl::Status status = cpptrain::Run(args, absl::GetFlag(FLAGS_ranks));
  if (!status.ok()) {
    std::cerr << "ckpt: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
