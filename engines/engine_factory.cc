#include "engines/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engines/local/local_engine.h"

namespace cpptrain {

MixedPrecision MixedPrecisionFromArgs(const proto::TrainingArguments& args) {
  if (args.bf16()) return MixedPrecision::kBf16;
  if (args.fp16()) return MixedPrecision::kFp16;
  return MixedPrecision::kNone;
}

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(const proto::TrainingArguments& args) {
  const MixedPrecision precision = MixedPrecisionFromArgs(args);
  switch (args.engine_case()) {
    case proto::TrainingArguments::ENGINE_NOT_SET:
    case proto::TrainingArguments::kLocal: {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<LocalEngine> engine,
                          LocalEngine::Create(args.local(), precision));
      return std::unique_ptr<Engine>(std::move(engine));
    }
    case proto::TrainingArguments::kDdp:
    case proto::TrainingArguments::kFsdp:
    case proto::TrainingArguments::kZero:
      break;
  }
  const char* names[] = {"", "", "ddp", "fsdp", "zero"};
  const int index = args.engine_case() - proto::TrainingArguments::kLocal + 1;
  return absl::UnimplementedError(absl::StrCat(
      "the training arguments select the `", names[index],
      "` engine, which this build does not contain yet (only `local` exists so far): "
      "configure `local {}` or leave the engine unset"));
}

}  // namespace cpptrain
