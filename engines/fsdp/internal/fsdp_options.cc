#include "engines/fsdp/internal/fsdp_options.h"

namespace cpptrain {
namespace fsdp_options {

at::ScalarType ToScalarType(proto::DType dtype) {
  switch (dtype) {
    case proto::BF16:
      return at::kBFloat16;
    case proto::FP16:
      return at::kHalf;
    case proto::FP32:
      break;
  }
  return at::kFloat;
}

WrapPolicy WrapPolicyOf(const proto::FsdpConfig& config) {
  WrapPolicy wrap;
  switch (config.auto_wrap_policy()) {
    case proto::FsdpConfig::TRANSFORMER_BASED_WRAP:
      wrap.kind = WrapPolicy::Kind::kTransformer;
      wrap.classes.assign(config.transformer_layer_cls_to_wrap().begin(),
                          config.transformer_layer_cls_to_wrap().end());
      break;
    case proto::FsdpConfig::SIZE_BASED_WRAP:
      wrap.kind = WrapPolicy::Kind::kSize;
      wrap.min_num_params = config.min_num_params();
      break;
    case proto::FsdpConfig::NO_WRAP:
      wrap.kind = WrapPolicy::Kind::kNone;
      break;
  }
  return wrap;
}

std::optional<at::ScalarType> ParamDtype(const proto::FsdpConfig& config,
                                         MixedPrecision precision) {
  if (config.has_param_dtype()) return ToScalarType(config.param_dtype());
  if (precision == MixedPrecision::kBf16) return at::kBFloat16;
  if (precision == MixedPrecision::kFp16) return at::kHalf;
  return std::nullopt;
}

std::optional<at::ScalarType> ReduceDtype(const proto::FsdpConfig& config,
                                          MixedPrecision precision) {
  if (config.has_reduce_dtype()) return ToScalarType(config.reduce_dtype());
  if (precision != MixedPrecision::kNone) return at::kFloat;
  return std::nullopt;
}

}  // namespace fsdp_options
}  // namespace cpptrain
