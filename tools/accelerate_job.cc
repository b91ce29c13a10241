#include "tools/accelerate_job.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "config/accelerate_yaml.h"

namespace cpptrain {
namespace {

// A relative deepspeed_config_file is taken from the working directory, as Accelerate does,
// or else from the YAML's directory.
std::string ResolveBesideYaml(const std::string& file, const std::string& yaml_path) {
  namespace fs = std::filesystem;
  if (fs::path(file).is_absolute() || fs::exists(file) || yaml_path.empty()) return file;
  const fs::path beside = fs::path(yaml_path).parent_path() / file;
  return fs::exists(beside) ? beside.string() : file;
}

absl::StatusOr<std::vector<std::string>> DeepSpeedFileOverrides(const std::string& path,
                                                                 std::vector<std::string>& notes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("deepspeed_config.deepspeed_config_file \"", path,
                                            "\" cannot be read; give the DeepSpeed JSON's path"));
  }
  std::stringstream text;
  text << in.rdbuf();
  CT_ASSIGN_OR_RETURN(DeepSpeedConversion conversion, ConvertDeepSpeedConfig(text.str(), path));
  notes.insert(notes.end(), conversion.notes.begin(), conversion.notes.end());
  return DeepSpeedConversionOverrides(conversion);
}

}  // namespace

absl::StatusOr<AccelerateJob> AccelerateJobOverrides(const std::string& yaml_path) {
  AccelerateJob job;
  std::vector<AccelerateSetting> settings;
  if (!yaml_path.empty()) {
    CT_ASSIGN_OR_RETURN(settings, ReadAccelerateYamlFile(yaml_path));
    job.source = yaml_path;
  } else {
    settings = AccelerateSettingsFromEnvironment();
    if (settings.empty()) return job;
    job.source = "the environment of accelerate launch";
  }
  CT_ASSIGN_OR_RETURN(AccelerateMapping mapping, MapAccelerateSettings(settings));
  job.overrides = mapping.overrides;
  job.launch = mapping.launch;
  job.notes = mapping.notes;
  if (!mapping.deepspeed_config_file.empty()) {
    CT_ASSIGN_OR_RETURN(
        std::vector<std::string> ds,
        DeepSpeedFileOverrides(ResolveBesideYaml(mapping.deepspeed_config_file, yaml_path),
                               job.notes));
    // After "args.zero={}" (the mapping puts the engine's selection first).
    const auto at = job.overrides.empty() ? job.overrides.end() : job.overrides.begin() + 1;
    job.overrides.insert(at, ds.begin(), ds.end());
  }
  return job;
}

}  // namespace cpptrain
