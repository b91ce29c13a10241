// The pieces of Trainer::Preflight (trainer/trainer_preflight.cc), for its tests.
//
//   CT_RETURN_IF_ERROR(trainer_internal::CheckWritable(args.output_dir()));
//   CT_RETURN_IF_ERROR(trainer_internal::CheckFreeSpace(
//       args.output_dir(), trainer_internal::CheckpointBytes(model, /*with_optimizer=*/true)));
#ifndef CPPTRAIN_TRAINER_INTERNAL_PREFLIGHT_H_
#define CPPTRAIN_TRAINER_INTERNAL_PREFLIGHT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "module/trainable_model.h"

namespace cpptrain {
namespace trainer_internal {

// Creates, writes and removes a probe file in `dir`: FailedPrecondition naming the directory
// and the system's reason when it cannot.
absl::Status CheckWritable(const std::string& dir);

// Bytes of one checkpoint of `model`: every parameter at its full size (also when sharded)
// and, with_optimizer, AdamW's two fp32 moments of each trainable one.
int64_t CheckpointBytes(const TrainableModel& model, bool with_optimizer);

// Bytes free for this user on the file system of `dir`; nullopt when it cannot tell.
std::optional<int64_t> FreeBytes(const std::string& dir);

// ResourceExhausted naming both sizes when the file system of `dir` has less than `needed`
// bytes free for this user; OK when it cannot tell.
absl::Status CheckFreeSpace(const std::string& dir, int64_t needed);

}  // namespace trainer_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_INTERNAL_PREFLIGHT_H_
