// The mixed-precision mode an engine runs in, resolved from the training arguments' bf16 and
// fp16 flags. Parameters stay fp32; the forward runs under autocast in the low precision.
#ifndef CPPTRAIN_ENGINES_MIXED_PRECISION_H_
#define CPPTRAIN_ENGINES_MIXED_PRECISION_H_

namespace cpptrain {

enum class MixedPrecision { kNone, kBf16, kFp16 };

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_MIXED_PRECISION_H_
