#include "models/rope_scaling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cpptrain {
namespace {

// arange(0, dim, 2) / dim in fp32, as transformers computes the exponents.
at::Tensor Exponents(int64_t head_dim, const c10::Device& device) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  return at::arange(0, head_dim, 2, options).to(at::kFloat) / head_dim;
}

at::Tensor DefaultInvFreq(double theta, int64_t head_dim, const c10::Device& device) {
  return at::pow(theta, Exponents(head_dim, device)).reciprocal();
}

// transformers' _compute_dynamic_ntk_parameters with a tensor seq_len (the forward's update):
// the base is computed in fp32.
at::Tensor DynamicInvFreq(const proto::DecoderConfig& c, int64_t head_dim, int64_t seq_len,
                          const c10::Device& device) {
  const int64_t max_pos = c.max_position_embeddings();
  if (seq_len <= max_pos) return DefaultInvFreq(c.rope_theta(), head_dim, device);
  const double factor = c.rope_scaling().factor();
  const at::Tensor length = at::scalar_tensor(seq_len, at::TensorOptions().dtype(at::kLong));
  const at::Tensor base =
      ((length * factor) / max_pos - (factor - 1))
          .pow(static_cast<double>(head_dim) / static_cast<double>(head_dim - 2)) *
      c.rope_theta();
  return at::pow(base.to(device), Exponents(head_dim, device)).reciprocal();
}

// transformers' _compute_llama3_parameters: long wavelengths divided by factor, short ones
// kept, the band between interpolated.
at::Tensor Llama3InvFreq(const proto::DecoderConfig& c, int64_t head_dim,
                         const c10::Device& device) {
  const proto::RopeScaling& s = c.rope_scaling();
  const at::Tensor inv_freq = DefaultInvFreq(c.rope_theta(), head_dim, device);
  const double context = static_cast<double>(s.original_max_position_embeddings());
  const double low_freq_wavelen = context / s.low_freq_factor();
  const double high_freq_wavelen = context / s.high_freq_factor();
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor(), inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * context - s.low_freq_factor()) /
                            (s.high_freq_factor() - s.low_freq_factor());
  const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / s.factor() + smooth * scaled;
  const at::Tensor medium =
      at::logical_not(wavelen < high_freq_wavelen) * at::logical_not(wavelen > low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// yarn's and longrope's factor: unset, the ratio of the lengths (transformers).
double ScaleFactor(const proto::DecoderConfig& c) {
  const proto::RopeScaling& s = c.rope_scaling();
  if (s.has_factor()) return s.factor();
  return static_cast<double>(c.max_position_embeddings()) /
         static_cast<double>(s.original_max_position_embeddings());
}

// YaRN's mscale: 0.1 * mscale * ln(scale) + 1, and 1 for scale <= 1.
double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The rotary dimension index at which `rotations` full turns fit in the pretraining context.
double YarnCorrectionDim(double rotations, int64_t dim, double base, double context) {
  return static_cast<double>(dim) * std::log(context / (rotations * 2 * M_PI)) /
         (2 * std::log(base));
}

// transformers' _compute_yarn_parameters: extrapolated (unscaled) frequencies above the ramp,
// interpolated (divided by factor) below it, a linear blend in between.
at::Tensor YarnInvFreq(const proto::DecoderConfig& c, int64_t head_dim,
                       const c10::Device& device) {
  const proto::RopeScaling& s = c.rope_scaling();
  const double base = c.rope_theta();
  const double factor = ScaleFactor(c);
  const double beta_fast = s.beta_fast() != 0 ? s.beta_fast() : 32;
  const double beta_slow = s.beta_slow() != 0 ? s.beta_slow() : 1;
  const double context = static_cast<double>(s.original_max_position_embeddings());
  double low = YarnCorrectionDim(beta_fast, head_dim, base, context);
  double high = YarnCorrectionDim(beta_slow, head_dim, base, context);
  if (!s.has_truncate() || s.truncate()) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;
  const at::Tensor pos_freqs = at::pow(base, Exponents(head_dim, device));
  const at::Tensor extrapolation = pos_freqs.reciprocal();
  const at::Tensor interpolation = (pos_freqs * factor).reciprocal();
  const at::Tensor ramp =
      ((at::arange(head_dim / 2, at::TensorOptions().dtype(at::kFloat).device(device)) - low) /
       (high - low))
          .clamp(0, 1);
  const at::Tensor extrapolation_factor = at::rsub(ramp, 1);
  return interpolation * at::rsub(extrapolation_factor, 1) + extrapolation * extrapolation_factor;
}

// transformers' _compute_longrope_parameters: inv_freq / long_factor beyond the pretraining
// length, / short_factor within it (the forward's update, by seq_len).
at::Tensor LongropeInvFreq(const proto::DecoderConfig& c, int64_t head_dim, int64_t seq_len,
                           const c10::Device& device) {
  const proto::RopeScaling& s = c.rope_scaling();
  const auto& factors = seq_len > s.original_max_position_embeddings() ? s.long_factor()
                                                                       : s.short_factor();
  const std::vector<double> values(factors.begin(), factors.end());
  const at::Tensor ext = at::tensor(values, at::TensorOptions().dtype(at::kDouble))
                             .to(at::kFloat)
                             .to(device);
  return (ext * at::pow(c.rope_theta(), Exponents(head_dim, device))).reciprocal();
}

absl::Status ScalingError(const proto::RopeScaling& s, const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("DecoderConfig.rope_scaling (rope_type \"", s.rope_type(), "\"): ", problem));
}

}  // namespace

std::vector<std::string> SupportedRopeTypes() {
  return {"linear", "dynamic", "llama3", "yarn", "longrope"};
}

double RopeAttentionScaling(const proto::DecoderConfig& c) {
  if (!c.has_rope_scaling()) return 1.0;
  const proto::RopeScaling& s = c.rope_scaling();
  if (s.rope_type() != "yarn" && s.rope_type() != "longrope") return 1.0;
  if (s.has_attention_factor()) return s.attention_factor();
  const double factor = ScaleFactor(c);
  if (s.rope_type() == "yarn") {
    if (s.mscale() != 0 && s.mscale_all_dim() != 0) {
      return YarnMscale(factor, s.mscale()) / YarnMscale(factor, s.mscale_all_dim());
    }
    return YarnMscale(factor, 1.0);
  }
  if (factor <= 1.0) return 1.0;
  return std::sqrt(1 + std::log(factor) /
                           std::log(static_cast<double>(s.original_max_position_embeddings())));
}

absl::Status ValidateRopeScaling(const proto::DecoderConfig& c, int64_t head_dim) {
  if (!c.has_rope_scaling()) return absl::OkStatus();
  const proto::RopeScaling& s = c.rope_scaling();
  const std::vector<std::string> types = SupportedRopeTypes();
  if (std::find(types.begin(), types.end(), s.rope_type()) == types.end()) {
    return ScalingError(
        s, absl::StrCat("rope_type is not implemented; supported: ", absl::StrJoin(types, ", "),
                        " (or leave rope_scaling unset for the default)"));
  }
  const bool derived_factor = s.rope_type() == "yarn" || s.rope_type() == "longrope";
  if (s.has_factor() ? !(s.factor() >= 1) || !std::isfinite(s.factor()) : !derived_factor) {
    return ScalingError(
        s, absl::StrCat("factor = ", s.has_factor() ? absl::StrCat(s.factor()) : "unset",
                        "; set a finite factor >= 1"));
  }
  if (s.has_attention_factor() &&
      !(s.attention_factor() > 0 && std::isfinite(s.attention_factor()))) {
    return ScalingError(s, absl::StrCat("attention_factor = ", s.attention_factor(),
                                        "; set a finite factor > 0, or leave it unset"));
  }
  if (s.rope_type() == "dynamic" && c.max_position_embeddings() <= 0) {
    return ScalingError(s, absl::StrCat("max_position_embeddings = ", c.max_position_embeddings(),
                                        "; dynamic scaling needs a positive length"));
  }
  if (derived_factor && !s.has_factor() &&
      c.max_position_embeddings() < s.original_max_position_embeddings()) {
    return ScalingError(s, absl::StrCat("factor unset and max_position_embeddings = ",
                                        c.max_position_embeddings(),
                                        " < original_max_position_embeddings = ",
                                        s.original_max_position_embeddings(),
                                        "; set factor"));
  }
  if (s.rope_type() == "longrope") {
    const int64_t half = head_dim / 2;
    if (s.short_factor_size() != half || s.long_factor_size() != half) {
      return ScalingError(s, absl::StrCat("short_factor has ", s.short_factor_size(),
                                          " values and long_factor ", s.long_factor_size(),
                                          "; longrope needs head_dim / 2 = ", half, " each"));
    }
  }
  if (s.rope_type() == "llama3") {
    if (!(s.low_freq_factor() > 0) || !(s.high_freq_factor() > s.low_freq_factor())) {
      return ScalingError(s, absl::StrCat("low_freq_factor = ", s.low_freq_factor(),
                                          ", high_freq_factor = ", s.high_freq_factor(),
                                          "; llama3 needs high_freq_factor > low_freq_factor > 0"));
    }
  }
  if (s.rope_type() != "linear" && s.rope_type() != "dynamic" &&
      s.original_max_position_embeddings() <= 0) {
    return ScalingError(s, absl::StrCat("original_max_position_embeddings = ",
                                        s.original_max_position_embeddings(),
                                        "; set the pretraining context length (> 0)"));
  }
  return absl::OkStatus();
}

at::Tensor RopeInverseFrequencies(const proto::DecoderConfig& c, int64_t head_dim, int64_t seq_len,
                                  const c10::Device& device) {
  if (!c.has_rope_scaling()) return DefaultInvFreq(c.rope_theta(), head_dim, device);
  const std::string& type = c.rope_scaling().rope_type();
  if (type == "linear")
    return DefaultInvFreq(c.rope_theta(), head_dim, device) / c.rope_scaling().factor();
  if (type == "dynamic") return DynamicInvFreq(c, head_dim, seq_len, device);
  if (type == "yarn") return YarnInvFreq(c, head_dim, device);
  if (type == "longrope") return LongropeInvFreq(c, head_dim, seq_len, device);
  TORCH_CHECK(type == "llama3", "rope_scaling.rope_type \"", type,
              "\" is not implemented (ValidateRopeScaling refuses it)");
  return Llama3InvFreq(c, head_dim, device);
}

bool RopeDependsOnLength(const proto::DecoderConfig& c) {
  if (!c.has_rope_scaling()) return false;
  const std::string& type = c.rope_scaling().rope_type();
  return type == "dynamic" || type == "longrope";
}

}  // namespace cpptrain
