// //tools:training_args_table: prints docs/TRAINING_ARGUMENTS.md's table, one row per field of
// transformers.TrainingArguments as config/testdata/hf_training_arguments_fields.txt lists
// them (tools/hf_training_args_fields.py writes that list), with what each is here.
//
//   bazel run //tools:training_args_table    # from the list in the runfiles
//   bazel-bin/tools/training_args_table config/testdata/hf_training_arguments_fields.txt
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "config/hf_training_args.h"
#include "proto/training_args.pb.h"

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : "config/testdata/hf_training_arguments_fields.txt";
  std::ifstream in(path);
  if (!in) {
    std::cerr << "cannot read " << path
              << "; give the field list (tools/hf_training_args_fields.py's output)\n";
    return 1;
  }
  std::vector<std::string> fields;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') fields.push_back(line);
  }
  const auto* ours = cpptrain::proto::TrainingArguments::descriptor();
  std::cout << cpptrain::HfTrainingArgumentsTableMarkdown(
      fields, [ours](const std::string& name) { return ours->FindFieldByName(name) != nullptr; });
  return 0;
}
