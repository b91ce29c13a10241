#include "trainer/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "config/training_args.h"

namespace cpptrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

double WsdShape(const std::string& type, double progress, bool warmup, double num_cycles) {
  if (type == "linear") return warmup ? progress : 1.0 - progress;
  if (type == "cosine") {
    return warmup ? 0.5 * (1.0 - std::cos(kPi * progress))
                  : 0.5 * (1.0 + std::cos(kPi * num_cycles * 2.0 * progress));
  }
  return warmup ? 1.0 - std::sqrt(1.0 - progress) : 1.0 - std::sqrt(progress);  // 1-sqrt
}

absl::Status KwargsError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("lr_scheduler_kwargs: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LrSchedule>> LrSchedule::Create(
    const proto::TrainingArguments& args, int64_t total_steps) {
  using Args = proto::TrainingArguments;
  std::unique_ptr<LrSchedule> s(new LrSchedule());
  s->type_ = args.lr_scheduler_type();
  s->kwargs_ = args.lr_scheduler_kwargs();
  s->peak_lr_ = args.learning_rate();
  s->total_ = total_steps;
  s->warmup_ = ResolveWarmupSteps(args, total_steps);
  const proto::SchedulerKwargs& kw = s->kwargs_;
  s->num_cycles_ = kw.has_num_cycles() ? kw.num_cycles()
                                       : (s->type_ == Args::COSINE_WITH_RESTARTS ? 1.0 : 0.5);
  switch (s->type_) {
    case Args::COSINE_WITH_MIN_LR:
    case Args::COSINE_WARMUP_WITH_MIN_LR:
      if (kw.has_min_lr() == kw.has_min_lr_rate()) {
        return KwargsError(absl::StrCat(
            Args::SchedulerType_Name(s->type_), " needs exactly one of min_lr and min_lr_rate (",
            kw.has_min_lr() ? "both" : "neither", " set): set one of them"));
      }
      s->min_lr_rate_ = kw.has_min_lr() ? kw.min_lr() / s->peak_lr_ : kw.min_lr_rate();
      break;
    case Args::POLYNOMIAL:
      if (s->peak_lr_ <= kw.lr_end()) {
        return KwargsError(absl::StrCat("polynomial needs learning_rate (", s->peak_lr_,
                                        ") above lr_end (", kw.lr_end(),
                                        "): lower lr_end or raise learning_rate"));
      }
      break;
    case Args::WARMUP_STABLE_DECAY:
      if (!kw.has_num_decay_steps()) {
        return KwargsError("warmup_stable_decay needs num_decay_steps: set it");
      }
      s->decay_steps_ = kw.num_decay_steps();
      s->stable_steps_ = kw.has_num_stable_steps()
                             ? kw.num_stable_steps()
                             : total_steps - s->warmup_ - s->decay_steps_;
      if (s->stable_steps_ < 0) {
        return KwargsError(absl::StrCat("warmup_stable_decay: warm-up (", s->warmup_,
                                        ") + num_decay_steps (", s->decay_steps_,
                                        ") exceed the total steps (", total_steps,
                                        "): lower one of them"));
      }
      for (const std::string* type : {&kw.warmup_type(), &kw.decay_type()}) {
        if (*type != "linear" && *type != "cosine" && *type != "1-sqrt") {
          return KwargsError(absl::StrCat("warmup_stable_decay type \"", *type,
                                          "\" is unknown: use linear, cosine or 1-sqrt"));
        }
      }
      break;
    default:
      break;
  }
  return s;
}

double LrSchedule::Multiplier(int64_t step_count) const {
  using Args = proto::TrainingArguments;
  const double step = static_cast<double>(step_count);
  const double warmup = static_cast<double>(warmup_);
  const double total = static_cast<double>(total_);
  const double warm = step / std::max(1.0, warmup);
  const double progress = (step - warmup) / std::max(1.0, total - warmup);
  switch (type_) {
    case Args::CONSTANT:
    case Args::REDUCE_LR_ON_PLATEAU:
      return 1.0;
    case Args::CONSTANT_WITH_WARMUP:
      return step < warmup ? warm : 1.0;
    case Args::LINEAR:
      if (step < warmup) return warm;
      return std::max(0.0, (total - step) / std::max(1.0, total - warmup));
    case Args::COSINE:
      if (step < warmup) return warm;
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * num_cycles_ * 2.0 * progress)));
    case Args::COSINE_WITH_RESTARTS:
      if (step < warmup) return warm;
      if (progress >= 1.0) return 0.0;
      return std::max(0.0,
                      0.5 * (1.0 + std::cos(kPi * std::fmod(num_cycles_ * progress, 1.0))));
    case Args::POLYNOMIAL: {
      if (step < warmup) return warm;
      const double lr_end = kwargs_.lr_end();
      if (step > total) return lr_end / peak_lr_;
      const double remaining = 1.0 - (step - warmup) / (total - warmup);
      return ((peak_lr_ - lr_end) * std::pow(remaining, kwargs_.power()) + lr_end) / peak_lr_;
    }
    case Args::INVERSE_SQRT: {
      if (step < warmup) return warm;
      const double timescale = kwargs_.has_timescale() ? kwargs_.timescale()
                                                       : (warmup_ > 0 ? warmup : 10000.0);
      return 1.0 / std::sqrt((step + timescale - warmup) / timescale);
    }
    case Args::COSINE_WITH_MIN_LR: {
      if (step < warmup) return warm;
      const double factor = 0.5 * (1.0 + std::cos(kPi * num_cycles_ * 2.0 * progress));
      return std::max(0.0, factor * (1.0 - min_lr_rate_) + min_lr_rate_);
    }
    case Args::COSINE_WARMUP_WITH_MIN_LR: {
      if (step < warmup) {
        if (!kwargs_.has_warmup_lr_rate()) return (step + 1.0) / std::max(1.0, warmup);
        const double rate = kwargs_.warmup_lr_rate();
        return rate + (1.0 - rate) * step / std::max(1.0, warmup - 1.0);
      }
      const double shifted = (step - warmup + 1.0) / std::max(1.0, total - warmup);
      const double factor = 0.5 * (1.0 + std::cos(kPi * num_cycles_ * 2.0 * shifted));
      return std::max(0.0, factor * (1.0 - min_lr_rate_) + min_lr_rate_);
    }
    case Args::WARMUP_STABLE_DECAY: {
      const double min_ratio = kwargs_.min_lr_ratio();
      if (step < warmup) {
        const double f = WsdShape(kwargs_.warmup_type(), warm, /*warmup=*/true, num_cycles_);
        return std::max(0.0, f * (1.0 - min_ratio) + min_ratio);
      }
      const double stable_end = warmup + static_cast<double>(stable_steps_);
      if (step < stable_end) return 1.0;
      if (step < stable_end + static_cast<double>(decay_steps_)) {
        const double p = (step - stable_end) / std::max<double>(1.0, decay_steps_);
        const double f = WsdShape(kwargs_.decay_type(), p, /*warmup=*/false, num_cycles_);
        return std::max(0.0, f * (1.0 - min_ratio) + min_ratio);
      }
      return min_ratio;
    }
  }
  return 1.0;
}

ReduceLrOnPlateau::ReduceLrOnPlateau(const proto::SchedulerKwargs& kwargs, double initial_lr)
    : kwargs_(kwargs),
      lr_(initial_lr),
      best_(kwargs.mode() == "max" ? -std::numeric_limits<double>::infinity()
                                   : std::numeric_limits<double>::infinity()) {}

bool ReduceLrOnPlateau::IsBetter(double metric) const {
  const double t = kwargs_.threshold();
  const bool rel = kwargs_.threshold_mode() == "rel";
  if (kwargs_.mode() == "max") return metric > (rel ? best_ * (1.0 + t) : best_ + t);
  return metric < (rel ? best_ * (1.0 - t) : best_ - t);
}

double ReduceLrOnPlateau::Step(double metric) {
  if (IsBetter(metric)) {
    best_ = metric;
    bad_evaluations_ = 0;
  } else {
    ++bad_evaluations_;
  }
  if (cooldown_left_ > 0) {
    --cooldown_left_;
    bad_evaluations_ = 0;
  }
  if (bad_evaluations_ > kwargs_.patience()) {
    const double reduced = std::max(lr_ * kwargs_.factor(), kwargs_.min_lr());
    if (lr_ - reduced > kwargs_.eps()) lr_ = reduced;
    cooldown_left_ = kwargs_.cooldown();
    bad_evaluations_ = 0;
  }
  return lr_;
}

void ReduceLrOnPlateau::Restore(const State& state) {
  lr_ = state.lr;
  best_ = state.best;
  bad_evaluations_ = state.bad_evaluations;
  cooldown_left_ = state.cooldown_left;
}

}  // namespace cpptrain
