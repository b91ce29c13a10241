// The edge between LibTorch's exceptions and our absl::Status: run a callable, and turn a
// c10::Error (or any std::exception) it throws into an Internal status with its message.
//
//   absl::Status s = cpptrain::CatchTorch([&] { model->forward(x); });
#ifndef CPPTRAIN_BASE_TORCH_STATUS_H_
#define CPPTRAIN_BASE_TORCH_STATUS_H_

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {

// Returns the message of a LibTorch exception without its C++ backtrace.
std::string TorchErrorMessage(const std::exception& e);

// Runs `fn`. A void callable gives absl::Status, one returning absl::Status gives that
// status, and one returning T gives absl::StatusOr<T>.
template <typename Fn>
auto CatchTorch(Fn&& fn) {
  using R = std::invoke_result_t<Fn>;
  if constexpr (std::is_void_v<R>) {
    try {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("LibTorch: ", TorchErrorMessage(e)));
    }
  } else if constexpr (std::is_same_v<R, absl::Status>) {
    try {
      return absl::Status(std::forward<Fn>(fn)());
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("LibTorch: ", TorchErrorMessage(e)));
    }
  } else {
    try {
      return absl::StatusOr<R>(std::forward<Fn>(fn)());
    } catch (const std::exception& e) {
      return absl::StatusOr<R>(
          absl::InternalError(absl::StrCat("LibTorch: ", TorchErrorMessage(e))));
    }
  }
}

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_TORCH_STATUS_H_
