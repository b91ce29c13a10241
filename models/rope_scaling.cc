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

absl::Status ScalingError(const proto::RopeScaling& s, const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("DecoderConfig.rope_scaling (rope_type \"", s.rope_type(), "\"): ", problem));
}

}  // namespace

std::vector<std::string> SupportedRopeTypes() { return {"linear", "dynamic", "llama3"}; }

absl::Status ValidateRopeScaling(const proto::DecoderConfig& c) {
  if (!c.has_rope_scaling()) return absl::OkStatus();
  const proto::RopeScaling& s = c.rope_scaling();
  const std::vector<std::string> types = SupportedRopeTypes();
  if (std::find(types.begin(), types.end(), s.rope_type()) == types.end()) {
    return ScalingError(
        s, absl::StrCat("rope_type is not implemented; supported: ", absl::StrJoin(types, ", "),
                        " (or leave rope_scaling unset for the default)"));
  }
  if (!s.has_factor() || !(s.factor() >= 1) || !std::isfinite(s.factor())) {
    return ScalingError(
        s, absl::StrCat("factor = ", s.has_factor() ? absl::StrCat(s.factor()) : "unset",
                        "; set a finite factor >= 1"));
  }
  if (s.rope_type() == "dynamic" && c.max_position_embeddings() <= 0) {
    return ScalingError(s, absl::StrCat("max_position_embeddings = ", c.max_position_embeddings(),
                                        "; dynamic scaling needs a positive length"));
  }
  if (s.rope_type() == "llama3") {
    if (!(s.low_freq_factor() > 0) || !(s.high_freq_factor() > s.low_freq_factor())) {
      return ScalingError(s, absl::StrCat("low_freq_factor = ", s.low_freq_factor(),
                                          ", high_freq_factor = ", s.high_freq_factor(),
                                          "; llama3 needs high_freq_factor > low_freq_factor > 0"));
    }
    if (s.original_max_position_embeddings() <= 0) {
      return ScalingError(s, absl::StrCat("original_max_position_embeddings = ",
                                          s.original_max_position_embeddings(),
                                          "; set the pretraining context length (> 0)"));
    }
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
  TORCH_CHECK(type == "llama3", "rope_scaling.rope_type \"", type,
              "\" is not implemented (ValidateRopeScaling refuses it)");
  return Llama3InvFreq(c, head_dim, device);
}

}  // namespace cpptrain
