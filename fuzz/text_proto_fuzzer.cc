// Fuzzes the job loader (config/text_proto.h ParseTextProto into proto::TrainJob, then what
// LoadTrainJob and tools/train do with a job: ValidateTrainJob, the warnings, ValidateForWorld
// and the Resolve* helpers of config/training_args.h). A job that parses must print and parse
// back to the same message; an error must name the source.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "config/text_proto.h"
#include "config/training_args.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_util.h"
#include "google/protobuf/text_format.h"
#include "proto/job.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  cpptrain::proto::TrainJob job;
  const absl::Status parsed = cpptrain::ParseTextProto(text, "fuzz.textproto", &job);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::StartsWith(parsed.message(), "fuzz.textproto"),
               "a parse error that does not start with the source: " << parsed);
    return 0;
  }
  std::string printed;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(job, &printed), "cannot print the job");
  cpptrain::proto::TrainJob again;
  const absl::Status reparsed = cpptrain::ParseTextProto(printed, "printed", &again);
  FUZZ_CHECK(reparsed.ok(), "the printed job does not parse: " << reparsed << "\n" << printed);
  FUZZ_CHECK(cpptrain::fuzz::SameMessage(job, again), "the printed job parses to another job:\n"
                                                          << printed);

  const cpptrain::proto::TrainingArguments& args = job.args();
  (void)cpptrain::TrainingArgumentsWarnings(args);
  (void)cpptrain::ResolvedMetricForBestModel(args);
  (void)cpptrain::ResolvedGreaterIsBetter(args);
  (void)cpptrain::ResolvedDataSeed(args);
  (void)cpptrain::ResolvedGradientAccumulationSteps(args);
  for (int world : {0, 1, 2, 3, 8}) (void)cpptrain::ValidateForWorld(args, world);
  if (!cpptrain::ValidateTrainJob(job).ok()) return 0;
  // What the Trainer resolves from a job that passed validation.
  const int64_t max_steps = args.max_steps() > 0 ? args.max_steps() : 1000;
  (void)cpptrain::ResolveStepInterval(cpptrain::ResolvedEvalSteps(args), max_steps);
  (void)cpptrain::ResolveStepInterval(args.logging_steps(), max_steps);
  (void)cpptrain::ResolveStepInterval(args.save_steps(), max_steps);
  (void)cpptrain::ResolveWarmupSteps(args, max_steps);
  return 0;
}
