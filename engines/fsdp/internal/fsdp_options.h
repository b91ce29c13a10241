// What FSDP1 and FSDP2 read alike from an FsdpConfig when they build their sharding options
// (FlatShardOptionsFromConfig, FullyShardOptionsFromConfig): the wrap policy, the dtypes, and
// MixedPrecision's defaults under the training arguments' bf16 / fp16.
//
//   options.wrap = fsdp_options::WrapPolicyOf(config);
//   options.param_dtype = fsdp_options::ParamDtype(config, precision);
#ifndef CPPTRAIN_ENGINES_FSDP_INTERNAL_FSDP_OPTIONS_H_
#define CPPTRAIN_ENGINES_FSDP_INTERNAL_FSDP_OPTIONS_H_

#include <c10/core/ScalarType.h>

#include <optional>

#include "engines/mixed_precision.h"
#include "proto/engines.pb.h"
#include "sharding/sharding_core.h"

namespace cpptrain {
namespace fsdp_options {

at::ScalarType ToScalarType(proto::DType dtype);

// auto_wrap_policy with its layer classes or min_num_params.
WrapPolicy WrapPolicyOf(const proto::FsdpConfig& config);

// param_dtype when set; otherwise bf16 / fp16 when the training arguments ask for it, else
// unset (the parameters' own dtype).
std::optional<at::ScalarType> ParamDtype(const proto::FsdpConfig& config,
                                         MixedPrecision precision);

// reduce_dtype when set; otherwise fp32 under mixed precision, else unset.
std::optional<at::ScalarType> ReduceDtype(const proto::FsdpConfig& config,
                                          MixedPrecision precision);

}  // namespace fsdp_options
}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_FSDP_INTERNAL_FSDP_OPTIONS_H_
