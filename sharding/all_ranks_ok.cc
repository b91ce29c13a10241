#include "sharding/all_ranks_ok.h"

#include <torch/types.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cpptrain {
namespace {

constexpr char kCut[] = " [...]";

// What this rank passes on: its message, cut to kMaxRankFailureBytes.
std::string MessageToSend(const absl::Status& local) {
  if (local.ok()) return "";
  std::string message(local.message());
  if (message.empty()) message = absl::StatusCodeToString(local.code());
  if (static_cast<int64_t>(message.size()) > kMaxRankFailureBytes) {
    message.resize(kMaxRankFailureBytes - (sizeof(kCut) - 1));
    message += kCut;
  }
  return message;
}

// Each rank's message, `width` bytes a rank (one float64 per byte: AllGather takes the
// tensors the host collectives take), for the ranks listed in `failures`.
absl::Status GatherMessages(HostGroup& ranks, const std::string& mine, int64_t width,
                            std::vector<RankFailure>& failures) {
  torch::Tensor bytes = torch::zeros({width}, torch::kFloat64);
  double* b = bytes.data_ptr<double>();
  for (size_t i = 0; i < mine.size(); ++i) b[i] = static_cast<unsigned char>(mine[i]);
  CT_ASSIGN_OR_RETURN(torch::Tensor all, ranks.AllGather(bytes));
  all = all.to(torch::kCPU).contiguous();
  const double* a = all.data_ptr<double>();
  for (RankFailure& failure : failures) {
    const double* row = a + failure.rank * width;
    for (int64_t i = 0; i < width && row[i] != 0; ++i) {
      failure.message.push_back(static_cast<char>(static_cast<unsigned char>(row[i])));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<RankFailure>> GatherFailures(HostGroup& ranks,
                                                        const absl::Status& local) {
  const std::string mine = MessageToSend(local);
  const torch::Tensor head = torch::tensor(
      {static_cast<double>(local.code()), static_cast<double>(mine.size())}, torch::kFloat64);
  CT_ASSIGN_OR_RETURN(torch::Tensor heads, ranks.AllGather(head));
  heads = heads.to(torch::kCPU).contiguous();
  const double* h = heads.data_ptr<double>();
  std::vector<RankFailure> failures;
  int64_t width = 1;
  for (int64_t r = 0; r < heads.numel() / 2; ++r) {
    if (h[2 * r] == 0) continue;  // absl::StatusCode::kOk
    const auto code = static_cast<absl::StatusCode>(static_cast<int>(h[2 * r]));
    failures.push_back({static_cast<int>(r), code, ""});
    width = std::max(width, static_cast<int64_t>(h[2 * r + 1]));
  }
  if (failures.empty()) return failures;
  CT_RETURN_IF_ERROR(GatherMessages(ranks, mine, width, failures));
  return failures;
}

std::string DescribeFailures(const std::vector<RankFailure>& failures) {
  if (failures.size() == 1) {
    return absl::StrCat("rank ", failures[0].rank, " failed: ", failures[0].message);
  }
  std::vector<std::string> ranks, each;
  for (const RankFailure& f : failures) {
    ranks.push_back(absl::StrCat(f.rank));
    each.push_back(absl::StrCat("rank ", f.rank, ": ", f.message));
  }
  return absl::StrCat("ranks ", absl::StrJoin(ranks, ", "), " failed: ", absl::StrJoin(each, "; "));
}

absl::Status AllRanksOk(HostGroup& ranks, const absl::Status& local) {
  absl::StatusOr<std::vector<RankFailure>> failures = GatherFailures(ranks, local);
  if (!local.ok()) return local;
  if (!failures.ok()) return failures.status();
  if (failures->empty()) return absl::OkStatus();
  return absl::Status(failures->front().code, DescribeFailures(*failures));
}

}  // namespace cpptrain
