#include "sharding/store_communicator.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "sharding/internal/communicator_checks.h"

// The key protocol. A communicator's keys live under "store_comm/<g>/", where g counts the
// communicators this rank has created on this store (key "store_comm/created/rank<r>"; every
// rank creates them in the same order, so all ranks of one communicator agree on g without
// talking). Collective number s (Create's join is #0; the number is in every error) uses
// "store_comm/<g>/<s>/" followed by
//   "<r>"       rank r's contribution, read by several ranks: all of them (all-gather,
//               all-reduce, barrier, join) or all but the root (broadcast);
//   "<r>to<q>"  rank r's part for rank q alone (reduce-scatter, scatter); q deletes it as soon
//               as it has read it;
//   "left<r>"   written by rank r > 0 once it has read (and deleted) everything it needs,
//               its last store request of the collective. Rank 0 waits for every "left<r>",
//               then deletes them and the "<r>" keys.
// No rank can read a deleted or stale key: a key name is written once in the life of the
// store (generation, sequence number and writer are all in it, and none repeats), and it is
// deleted only by its one reader after reading it, or by rank 0 after every reader said it
// has left. So every collective's keys are gone when it returns on rank 0, however many run.
// Rank 0 ends each collective last, after every peer's last store request for it: rank 0 is
// where ConnectStore hosts the TCPStore, so it may exit right after its last collective
// without cutting a peer off mid-collective.
// A value longer than max_value_bytes is written as pieces: "<key>/p1", "<key>/p2", ... first,
// then "<key>" holding the first piece, so a reader that sees "<key>" finds every piece; the
// reader knows the length it expects, so the number of pieces. Whoever deletes "<key>" deletes
// its pieces too.
// A rank that waits for a key never written (a peer died, or called another collective) gives
// up at the deadline and names the ranks whose keys are missing. Each value ends with the
// collective's name, so ranks that issue different collectives under one number get an error
// rather than each other's bytes.

namespace cpptrain {
namespace store_internal {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

constexpr char kKeyRoot[] = "store_comm";
constexpr char kJoin[] = "join";
constexpr std::chrono::milliseconds kClockSlack(50);

std::string Seconds(std::chrono::milliseconds ms) {
  return absl::StrCat(static_cast<double>(ms.count()) / 1000.0, " s");
}

// Appends the name of the collective (and its length) to a value.
void AppendTag(absl::string_view op, Bytes& value) {
  value.insert(value.end(), op.begin(), op.end());
  value.push_back(static_cast<uint8_t>(op.size()));
}

// Removes the tag AppendTag added and returns it ("" for a value without one).
std::string StripTag(Bytes& value) {
  if (value.empty() || value.back() + size_t{1} > value.size()) return "";
  const size_t length = value.back();
  const size_t start = value.size() - 1 - length;
  std::string tag(value.begin() + start, value.end() - 1);
  value.resize(start);
  return tag;
}

}  // namespace

// One collective in flight: its store operations, with errors that name the collective, its
// number, the rank and the ranks it waited for.
class Round {
 public:
  Round(c10d::Store& store, const std::string& communicator_prefix, const char* op,
        int64_t sequence, int rank, int size, std::chrono::milliseconds timeout,
        int64_t max_value_bytes)
      : store_(store),
        prefix_(absl::StrCat(communicator_prefix, sequence, "/")),
        op_(op),
        sequence_(sequence),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        max_value_bytes_(max_value_bytes),
        deadline_(Clock::now() + timeout) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  std::string Key(int from) const { return absl::StrCat(prefix_, from); }
  std::string Key(int from, int to) const { return absl::StrCat(prefix_, from, "to", to); }

  absl::Status Put(const std::string& key, Bytes value) {
    AppendTag(op_, value);
    const int64_t pieces = Pieces(static_cast<int64_t>(value.size()));
    pieces_[key] = pieces;
    for (int64_t i = pieces - 1; i >= 0; --i) {  // "<key>" last: readers wait for it
      const auto begin = value.begin() + i * max_value_bytes_;
      const auto end = i + 1 == pieces ? value.end() : begin + max_value_bytes_;
      CT_RETURN_IF_ERROR(
          Guard("writing", [&] { store_.set(PieceKey(key, i), Bytes(begin, end)); }));
    }
    return absl::OkStatus();
  }

  // Waits until the deadline for `keys` (written by `senders`, in the same order), then reads
  // them; each must hold `bytes` bytes from the same collective.
  absl::StatusOr<std::vector<Bytes>> Get(const std::vector<std::string>& keys,
                                         const std::vector<int>& senders, int64_t bytes) {
    if (keys.empty()) return std::vector<Bytes>();
    const char* never = op_ == absl::string_view(kJoin) ? kNeverJoined : kNeverContributed;
    CT_RETURN_IF_ERROR(WaitFor(keys, senders, never));
    std::vector<Bytes> values(keys.size());
    const int64_t pieces = Pieces(bytes + static_cast<int64_t>(std::strlen(op_)) + 1);  // + tag
    for (size_t i = 0; i < keys.size(); ++i) {
      pieces_[keys[i]] = pieces;
      for (int64_t p = 0; p < pieces; ++p) {
        Bytes piece;
        CT_RETURN_IF_ERROR(Guard("reading", [&] { piece = store_.get(PieceKey(keys[i], p)); }));
        values[i].insert(values[i].end(), piece.begin(), piece.end());
        // A shorter first piece: the sender wrote less than expected (CheckValue says so).
        if (static_cast<int64_t>(piece.size()) < max_value_bytes_) break;
      }
      CT_RETURN_IF_ERROR(CheckValue(values[i], senders[i], bytes));
    }
    return values;
  }

  // Ends the collective on this rank, once it has read (and deleted) all it needs. Rank 0 ends
  // last: every other rank writes "left<r>"; rank 0 waits for all of them, then deletes them
  // and `shared` (the keys several ranks read).
  absl::Status Finish(const std::vector<std::string>& shared) {
    if (size_ == 1) return absl::OkStatus();
    if (rank_ != 0) return Guard("writing", [&] { store_.set(LeftKey(rank_), Bytes{1}); });
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int q = 1; q < size_; ++q) {
      keys.push_back(LeftKey(q));
      ranks.push_back(q);
    }
    CT_RETURN_IF_ERROR(WaitFor(keys, ranks, kNeverFinished));
    keys.insert(keys.end(), shared.begin(), shared.end());
    return Delete(keys);
  }

  absl::Status Delete(const std::vector<std::string>& keys) {
    return Guard("deleting keys", [&] {
      for (const std::string& key : keys) {
        const auto known = pieces_.find(key);
        const int64_t pieces = known == pieces_.end() ? 1 : known->second;
        for (int64_t p = 0; p < pieces; ++p) store_.deleteKey(PieceKey(key, p));
      }
    });
  }

 private:
  static constexpr char kNeverContributed[] =
      "never contributed (a rank died, hangs, or stopped issuing the same collectives in the "
      "same order)";
  static constexpr char kNeverJoined[] =
      "never joined (did every rank create its communicator on the same store, with the same "
      "size?)";
  static constexpr char kNeverFinished[] =
      "never finished it (a rank died, hangs, or stopped issuing the same collectives in the "
      "same order)";

  std::string LeftKey(int rank) const { return absl::StrCat(prefix_, "left", rank); }

  // How many pieces a value of `bytes` bytes (tag included) is stored in.
  int64_t Pieces(int64_t bytes) const {
    return std::max<int64_t>(1, (bytes + max_value_bytes_ - 1) / max_value_bytes_);
  }
  static std::string PieceKey(const std::string& key, int64_t piece) {
    return piece == 0 ? key : absl::StrCat(key, "/p", piece);
  }

  // "rank 1 of 2: store all-reduce #12"
  std::string Where() const {
    return absl::StrCat("rank ", rank_, " of ", size_, ": store ", op_, " #", sequence_);
  }

  absl::Status StoreFailed(absl::string_view what, absl::string_view message) const {
    return absl::UnavailableError(absl::StrCat(Where(), ": the store failed while ", what,
                                               " (is the process hosting it gone?): ", message));
  }

  template <typename Fn>
  absl::Status Guard(absl::string_view what, Fn&& fn) {
    absl::Status status = CatchTorch(std::forward<Fn>(fn));
    return status.ok() ? status : StoreFailed(what, status.message());
  }

  // Waits until the deadline for `keys`, written by `writers` (in the same order); at the
  // deadline, the error names the writers whose keys are missing and what they `never` did.
  absl::Status WaitFor(const std::vector<std::string>& keys, const std::vector<int>& writers,
                       const char* never) {
    // Rounded up: c10d reads a zero timeout as "wait forever".
    const auto left =
        std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()),
                 std::chrono::milliseconds(1));
    try {
      store_.wait(keys, left);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      // A store measures the timeout on its own clock and may give up a little early.
      if (Clock::now() + kClockSlack < deadline_)
        return StoreFailed("waiting", TorchErrorMessage(e));
      return TimedOut(keys, writers, never);
    }
  }

  absl::Status TimedOut(const std::vector<std::string>& keys, const std::vector<int>& writers,
                        const char* never) {
    std::vector<int> missing;
    absl::Status status = CatchTorch([&] {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_.check({keys[i]})) missing.push_back(writers[i]);
      }
    });
    const std::string who = status.ok()
                                ? absl::StrCat("rank(s) ", absl::StrJoin(missing, ", "))
                                : absl::StrCat("some of rank(s) ", absl::StrJoin(writers, ", "),
                                               " (the store failed too: ", status.message(), ")");
    return absl::DeadlineExceededError(absl::StrCat(Where(), " did not complete within ",
                                                    Seconds(timeout_), ": ", who, " ", never));
  }

  absl::Status CheckValue(Bytes& value, int sender, int64_t bytes) const {
    const std::string tag = StripTag(value);
    if (tag != op_) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(), ": rank ", sender, "'s value under this number is from a store ",
                       tag.empty() ? "(unknown)" : tag,
                       ": the ranks issued different collectives; every rank must issue the same "
                       "collectives in the same order"));
    }
    if (static_cast<int64_t>(value.size()) != bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(), ": rank ", sender, " sent ", value.size(), " bytes but this rank expects ",
          bytes, ": the ranks passed tensors of different sizes or dtypes"));
    }
    return absl::OkStatus();
  }

  c10d::Store& store_;
  std::string prefix_;
  const char* op_;
  int64_t sequence_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  int64_t max_value_bytes_;
  Clock::time_point deadline_;
  std::map<std::string, int64_t> pieces_;  // of each key written or read, for Delete
};

}  // namespace store_internal

namespace {

using store_internal::Bytes;
using store_internal::Round;

// ---- Byte exchanges: the four patterns every collective is built from ----------------------

// Every rank's `mine` (all of one size), in rank order.
absl::StatusOr<std::vector<Bytes>> AllGatherBytes(Round& round, Bytes mine) {
  const int size = round.size();
  const int rank = round.rank();
  std::vector<Bytes> all(size);
  const int64_t bytes = static_cast<int64_t>(mine.size());
  if (size > 1) {
    std::vector<std::string> every_key, keys;
    std::vector<int> senders;
    for (int q = 0; q < size; ++q) {
      every_key.push_back(round.Key(q));
      if (q == rank) continue;
      keys.push_back(round.Key(q));
      senders.push_back(q);
    }
    CT_RETURN_IF_ERROR(round.Put(round.Key(rank), mine));
    CT_ASSIGN_OR_RETURN(std::vector<Bytes> got, round.Get(keys, senders, bytes));
    CT_RETURN_IF_ERROR(round.Finish(every_key));
    for (size_t i = 0; i < senders.size(); ++i) all[senders[i]] = std::move(got[i]);
  }
  all[rank] = std::move(mine);
  return all;
}

// `root`'s `payload` (`bytes` long) on every rank.
absl::StatusOr<Bytes> BroadcastBytes(Round& round, Bytes payload, int root, int64_t bytes) {
  if (round.size() == 1) return payload;
  const std::string key = round.Key(root);
  if (round.rank() == root) {
    CT_RETURN_IF_ERROR(round.Put(key, payload));
    CT_RETURN_IF_ERROR(round.Finish({key}));
    return payload;
  }
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> got, round.Get({key}, {root}, bytes));
  CT_RETURN_IF_ERROR(round.Finish({key}));
  return std::move(got[0]);
}

// Rank q receives `root`'s parts[q] (each `bytes` long); `parts` is read on `root` only.
absl::StatusOr<Bytes> ScatterBytes(Round& round, std::vector<Bytes> parts, int root,
                                   int64_t bytes) {
  const int rank = round.rank();
  if (rank == root) {
    for (int q = 0; q < round.size(); ++q) {
      if (q != root) CT_RETURN_IF_ERROR(round.Put(round.Key(root, q), std::move(parts[q])));
    }
    CT_RETURN_IF_ERROR(round.Finish({}));
    return std::move(parts[root]);
  }
  const std::string key = round.Key(root, rank);
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> got, round.Get({key}, {root}, bytes));
  CT_RETURN_IF_ERROR(round.Delete({key}));
  CT_RETURN_IF_ERROR(round.Finish({}));
  return std::move(got[0]);
}

// received[q] is rank q's parts[rank]; every part is `bytes` long.
absl::StatusOr<std::vector<Bytes>> AllToAllBytes(Round& round, std::vector<Bytes> parts,
                                                 int64_t bytes) {
  const int size = round.size();
  const int rank = round.rank();
  std::vector<std::string> keys;
  std::vector<int> senders;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    CT_RETURN_IF_ERROR(round.Put(round.Key(rank, q), std::move(parts[q])));
    keys.push_back(round.Key(q, rank));
    senders.push_back(q);
  }
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> got, round.Get(keys, senders, bytes));
  CT_RETURN_IF_ERROR(round.Delete(keys));
  CT_RETURN_IF_ERROR(round.Finish({}));
  std::vector<Bytes> received(size);
  for (size_t i = 0; i < senders.size(); ++i) received[senders[i]] = std::move(got[i]);
  received[rank] = std::move(parts[rank]);
  return received;
}

// ---- Tensors and bytes ---------------------------------------------------------------------

int64_t ByteSize(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Appends the elements of `t` in logical (row-major) order.
void AppendBytes(const at::Tensor& t, Bytes& out) {
  const at::Tensor dense = t.contiguous();
  const auto* begin = static_cast<const uint8_t*>(dense.data_ptr());
  out.insert(out.end(), begin, begin + ByteSize(dense));
}

// A fresh 1-D tensor of `numel` elements of `dtype` read from `data`.
at::Tensor FromBytes(const uint8_t* data, int64_t numel, at::ScalarType dtype) {
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
  if (numel > 0) std::memcpy(t.data_ptr(), data, ByteSize(t));
  return t;
}

// Writes the elements of 1-D `flat` into `dst` in logical order (any strides).
void Assign(at::Tensor& dst, const at::Tensor& flat) { dst.copy_(flat.view(dst.sizes())); }

at::ScalarType AccumulationDtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t;
}

// Reduces rows[0] op rows[1] op ... in that order, so every rank computes the same bits.
at::Tensor ReduceInRankOrder(const std::vector<at::Tensor>& rows, ReduceOp op) {
  const at::ScalarType dtype = rows[0].scalar_type();
  const at::ScalarType accumulation = AccumulationDtype(dtype);
  at::Tensor result = rows[0].to(accumulation, /*non_blocking=*/false, /*copy=*/true);
  for (size_t q = 1; q < rows.size(); ++q) {
    if (op == ReduceOp::kMax) {
      result = at::maximum(result, rows[q].to(accumulation));
    } else {
      result.add_(rows[q]);
    }
  }
  if (op == ReduceOp::kAvg) result.div_(static_cast<double>(rows.size()));
  return result.to(dtype);
}

// Reduces, for each tensor, its bytes at the same offset of every rank's value.
void ReduceInto(const std::vector<Bytes>& values, ReduceOp op, std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (at::Tensor& out : outputs) {
    std::vector<at::Tensor> rows;
    for (const Bytes& value : values) {
      rows.push_back(FromBytes(value.data() + offset, out.numel(), out.scalar_type()));
    }
    Assign(out, ReduceInRankOrder(rows, op));
    offset += ByteSize(out);
  }
}

// ---- Argument checks -----------------------------------------------------------------------

// Data movement takes any dtype and any strides: every tensor is copied.
constexpr sharding_internal::TensorRules kTensorRules{};

sharding_internal::CollectiveChecks Checks(const char* op, int rank, int size) {
  return sharding_internal::CollectiveChecks("StoreCommunicator", kTensorRules, op, rank, size);
}

int64_t TotalBytes(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += ByteSize(t);
  return total;
}

class FinishedWork : public Work {
 public:
  explicit FinishedWork(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }
  absl::Status Synchronize() override { return status_; }

 private:
  absl::Status status_;
};

std::unique_ptr<Work> Finished(absl::Status status) {
  return std::make_unique<FinishedWork>(std::move(status));
}

// ---- Collectives over byte exchanges -------------------------------------------------------

absl::Status AllReduceTensors(Round& round, std::vector<at::Tensor>& tensors, ReduceOp op) {
  Bytes mine;
  for (const at::Tensor& t : tensors) AppendBytes(t, mine);
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> all, AllGatherBytes(round, std::move(mine)));
  ReduceInto(all, op, tensors);
  return absl::OkStatus();
}

absl::Status AllGatherTensors(Round& round, const std::vector<at::Tensor>& inputs,
                              std::vector<at::Tensor>& outputs) {
  Bytes mine;  // A copy: an input may be a slice of its output.
  for (const at::Tensor& t : inputs) AppendBytes(t, mine);
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> all, AllGatherBytes(round, std::move(mine)));
  int64_t offset = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t bytes = ByteSize(inputs[i]);
    at::Tensor flat = at::empty({outputs[i].numel()}, outputs[i].options());
    auto* dst = static_cast<uint8_t*>(flat.data_ptr());
    for (size_t q = 0; q < all.size() && bytes > 0; ++q) {
      std::memcpy(dst + q * bytes, all[q].data() + offset, bytes);
    }
    Assign(outputs[i], flat);
    offset += bytes;
  }
  return absl::OkStatus();
}

absl::Status ReduceScatterTensors(Round& round, const std::vector<at::Tensor>& inputs,
                                  std::vector<at::Tensor>& outputs, ReduceOp op) {
  std::vector<Bytes> parts(round.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor flat = inputs[i].reshape({-1});
    const int64_t n = outputs[i].numel();
    for (int q = 0; q < round.size(); ++q) AppendBytes(flat.narrow(0, q * n, n), parts[q]);
  }
  CT_ASSIGN_OR_RETURN(std::vector<Bytes> received,
                      AllToAllBytes(round, std::move(parts), TotalBytes(outputs)));
  ReduceInto(received, op, outputs);
  return absl::OkStatus();
}

}  // namespace

// ---- StoreCommunicator ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<StoreCommunicator>> StoreCommunicator::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
    int64_t max_value_bytes) {
  CT_RETURN_IF_ERROR(
      sharding_internal::CheckCreateArguments("StoreCommunicator", store, rank, size, timeout));
  if (max_value_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StoreCommunicator::Create: max_value_bytes is ", max_value_bytes,
        "; it must be at least 1 (the default, ", kDefaultMaxValueBytes, ", suits TCPStore)"));
  }
  absl::StatusOr<int64_t> generation = CatchTorch(
      [&] { return store->add(absl::StrCat(store_internal::kKeyRoot, "/created/rank", rank), 1); });
  if (!generation.ok()) {
    return absl::UnavailableError(
        absl::StrCat("StoreCommunicator::Create: rank ", rank, " of ", size,
                     " cannot use the store: ", generation.status().message()));
  }
  std::unique_ptr<StoreCommunicator> comm(new StoreCommunicator(
      std::move(store), absl::StrCat(store_internal::kKeyRoot, "/", *generation, "/"), rank, size,
      timeout, max_value_bytes));
  absl::Status joined = comm->Join();
  if (!joined.ok()) {
    return absl::Status(joined.code(),
                        absl::StrCat("StoreCommunicator::Create: ", joined.message()));
  }
  VLOG(1) << "Store communicator: rank " << rank << " of " << size << " under "
          << comm->key_prefix_;
  return comm;
}

StoreCommunicator::StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix,
                                     int rank, int size, std::chrono::milliseconds timeout,
                                     int64_t max_value_bytes)
    : store_(std::move(store)),
      key_prefix_(std::move(key_prefix)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      max_value_bytes_(max_value_bytes) {}

absl::Status StoreCommunicator::Run(const char* op,
                                    const std::function<absl::Status(Round&)>& body) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " of ", size_, ": store ", op,
        " refused: an earlier collective of this communicator failed, so the ranks no longer "
        "agree on what comes next; create a new communicator. The failure: ",
        failure_.message()));
  }
  Round round(*store_, key_prefix_, op, next_sequence_++, rank_, size_, timeout_,
              max_value_bytes_);
  absl::Status status = body(round);
  if (!status.ok()) failure_ = status;
  return status;
}

absl::Status StoreCommunicator::Join() {
  return Run(store_internal::kJoin,
             [](Round& round) { return AllGatherBytes(round, {}).status(); });
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::AllReduce(at::Tensor& tensor,
                                                                   ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  CT_RETURN_IF_ERROR(Checks("all-reduce", rank_, size_).Reducible(tensor, "tensor", op));
  if (ByteSize(tensor) == 0) return Finished(absl::OkStatus());
  return Finished(
      Run("all-reduce", [&](Round& round) { return AllReduceTensors(round, tensors, op); }));
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::AllReduceCoalesced(
    std::vector<at::Tensor>& tensors, ReduceOp op) {
  const auto checks = Checks("all-reduce (coalesced)", rank_, size_);
  for (size_t i = 0; i < tensors.size(); ++i) {
    CT_RETURN_IF_ERROR(checks.Reducible(tensors[i], absl::StrCat("tensors[", i, "]"), op));
  }
  if (TotalBytes(tensors) == 0) return Finished(absl::OkStatus());
  return Finished(
      Run(checks.op(), [&](Round& round) { return AllReduceTensors(round, tensors, op); }));
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::AllGather(const at::Tensor& input,
                                                                   at::Tensor& output) {
  std::vector<at::Tensor> outputs{output};
  return AllGatherCoalesced({input}, outputs);
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::AllGatherCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  const auto checks =
      Checks(inputs.size() == 1 ? "all-gather" : "all-gather (coalesced)", rank_, size_);
  CT_RETURN_IF_ERROR(checks.Pairs(inputs, outputs, sharding_internal::LargerSide::kOutput));
  if (TotalBytes(inputs) == 0) return Finished(absl::OkStatus());
  return Finished(
      Run(checks.op(), [&](Round& round) { return AllGatherTensors(round, inputs, outputs); }));
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::ReduceScatter(const at::Tensor& input,
                                                                       at::Tensor& output,
                                                                       ReduceOp op) {
  std::vector<at::Tensor> outputs{output};
  return ReduceScatterCoalesced({input}, outputs, op);
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::ReduceScatterCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, ReduceOp op) {
  const auto checks =
      Checks(inputs.size() == 1 ? "reduce-scatter" : "reduce-scatter (coalesced)", rank_, size_);
  CT_RETURN_IF_ERROR(checks.Pairs(inputs, outputs, sharding_internal::LargerSide::kInput));
  for (size_t i = 0; i < inputs.size(); ++i) {
    CT_RETURN_IF_ERROR(checks.Reducible(inputs[i], absl::StrCat("input[", i, "]"), op));
  }
  if (TotalBytes(outputs) == 0) return Finished(absl::OkStatus());
  return Finished(Run(
      checks.op(), [&](Round& round) { return ReduceScatterTensors(round, inputs, outputs, op); }));
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const auto checks = Checks("broadcast", rank_, size_);
  CT_RETURN_IF_ERROR(checks.Tensor(tensor, "tensor"));
  CT_RETURN_IF_ERROR(checks.Root(root));
  if (ByteSize(tensor) == 0) return Finished(absl::OkStatus());
  return Finished(Run(checks.op(), [&](Round& round) -> absl::Status {
    Bytes payload;
    if (rank_ == root) AppendBytes(tensor, payload);
    CT_ASSIGN_OR_RETURN(Bytes got,
                        BroadcastBytes(round, std::move(payload), root, ByteSize(tensor)));
    if (rank_ != root) Assign(tensor, FromBytes(got.data(), tensor.numel(), tensor.scalar_type()));
    return absl::OkStatus();
  }));
}

absl::StatusOr<std::unique_ptr<Work>> StoreCommunicator::Scatter(const at::Tensor& input,
                                                                 at::Tensor& output, int root) {
  const auto checks = Checks("scatter", rank_, size_);
  CT_RETURN_IF_ERROR(checks.Scatter(input, output, root));
  if (ByteSize(output) == 0) return Finished(absl::OkStatus());
  return Finished(Run(checks.op(), [&](Round& round) -> absl::Status {
    const int64_t n = output.numel();
    std::vector<Bytes> parts(size_);
    if (rank_ == root) {
      const at::Tensor flat = input.reshape({-1});
      for (int q = 0; q < size_; ++q) AppendBytes(flat.narrow(0, q * n, n), parts[q]);
    }
    CT_ASSIGN_OR_RETURN(Bytes got, ScatterBytes(round, std::move(parts), root, ByteSize(output)));
    Assign(output, FromBytes(got.data(), n, output.scalar_type()));
    return absl::OkStatus();
  }));
}

absl::Status StoreCommunicator::Barrier() {
  return Run("barrier", [](Round& round) { return AllGatherBytes(round, {}).status(); });
}

}  // namespace cpptrain
