// //tools:ds_config_to_textproto: a DeepSpeed JSON config as the job textproto of the ZeRO
// engine (config/ds_config.h says what maps to what).
//
//   bazel-bin/tools/ds_config_to_textproto ds_config.json > job.textproto
//   bazel-bin/tools/ds_config_to_textproto --base=tools/demo.textproto
//       --output=job.textproto ds_config.json            (one command line)
//
// With --base, the converted fields are merged over that job (its model, data and other
// arguments kept) and the result is validated as //tools:train would load it. Notes ("auto"
// values left unset, keys dropped) go to the output as comments and to stderr.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/working_directory.h"
#include "config/text_proto.h"
#include "config/training_args.h"
#include "config/ds_config.h"

ABSL_FLAG(std::string, base, "", "a job textproto the converted fields are merged over");
ABSL_FLAG(std::string, output, "", "where to write the textproto (default: stdout)");

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::cerr << "usage: ds_config_to_textproto [--base=job.textproto] [--output=FILE] "
                 "ds_config.json\n";
    return 2;
  }
  const std::string path = positional[1];
  std::ifstream in(path);
  if (!in) {
    std::cerr << path << ": cannot be read\n";
    return 1;
  }
  std::stringstream json;
  json << in.rdbuf();
  absl::StatusOr<cpptrain::DeepSpeedConversion> conversion =
      cpptrain::ConvertDeepSpeedConfig(json.str(), path);
  if (!conversion.ok()) {
    std::cerr << conversion.status().message() << "\n";
    return 1;
  }
  for (const std::string& note : conversion->notes) std::cerr << "note: " << note << "\n";
  cpptrain::proto::TrainJob base;
  const std::string base_path = absl::GetFlag(FLAGS_base);
  if (!base_path.empty()) {
    absl::Status loaded = cpptrain::LoadTextProtoFile(base_path, &base);
    if (!loaded.ok()) {
      std::cerr << loaded.message() << "\n";
      return 1;
    }
  }
  const std::string text =
      cpptrain::DeepSpeedConversionText(*conversion, path, base_path.empty() ? nullptr : &base);
  if (!base_path.empty()) {
    cpptrain::proto::TrainJob job;
    absl::Status valid = cpptrain::ParseTextProto(text, "converted job", &job);
    if (valid.ok()) valid = cpptrain::ValidateTrainJob(job);
    if (!valid.ok()) {
      std::cerr << "the converted job does not validate:\n" << valid.message() << "\n";
      return 1;
    }
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) {
    std::cout << text;
    return 0;
  }
  std::ofstream out(output);
  out << text;
  if (!out.flush()) {
    std::cerr << output << ": cannot be written\n";
    return 1;
  }
  return 0;
}
