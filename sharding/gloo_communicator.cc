#include "sharding/gloo_communicator.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "sharding/internal/communicator_checks.h"

namespace cpptrain {
namespace {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Abseil 20220623 has no StrContainsIgnoreCase.
bool ContainsIgnoreCase(absl::string_view text, absl::string_view needle) {
  return absl::StrContains(absl::AsciiStrToLower(text), absl::AsciiStrToLower(needle));
}

// Runs on a Gloo worker thread after the transfer of one collective has finished.
using Finish = std::function<void()>;

std::string ExceptionMessage(const std::exception_ptr& eptr) {
  try {
    std::rethrow_exception(eptr);
  } catch (const std::exception& e) {
    return TorchErrorMessage(e);
  } catch (...) {
    return "unknown exception";
  }
}

// A c10d / Gloo failure of `op` as a status naming the collective, the rank and the world.
absl::Status CollectiveError(absl::string_view op, int rank, int size, const std::string& message,
                             int line) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string hint;
  if (ContainsIgnoreCase(message, "timed out") || ContainsIgnoreCase(message, "timeout")) {
    code = absl::StatusCode::kDeadlineExceeded;
    // Gloo does not say which peer's data it waited for.
    hint =
        " (no peer answered within the timeout: a peer died or hangs, its host is unreachable, "
        "or it did not issue the same collective)";
  } else if (ContainsIgnoreCase(message, "connection") ||
             ContainsIgnoreCase(message, "broken pipe") || ContainsIgnoreCase(message, "closed")) {
    code = absl::StatusCode::kUnavailable;
    hint = " (a peer process exited or its connection dropped)";
  }
  return absl::Status(code, absl::StrCat("Gloo ", op, " failed on rank ", rank, " of ", size, hint,
                                         " [gloo_communicator.cc:", line, "]: ", message));
}

class GlooWork : public Work {
 public:
  GlooWork(std::string op, int rank, int size, std::vector<FuturePtr> futures)
      : op_(std::move(op)), rank_(rank), size_(size), futures_(std::move(futures)) {}

  // Blocks the calling thread until every transfer and its post-processing have finished.
  absl::Status Wait() override {
    for (const FuturePtr& future : futures_) {
      future->wait();
      if (future->hasError() && status_.ok()) {
        status_ =
            CollectiveError(op_, rank_, size_, ExceptionMessage(future->exception_ptr()), __LINE__);
      }
    }
    futures_.clear();
    return status_;
  }

  absl::Status Synchronize() override { return Wait(); }

 private:
  std::string op_;
  int rank_;
  int size_;
  std::vector<FuturePtr> futures_;
  absl::Status status_;
};

// The dtype a reduction runs in: Gloo 1.13 has no bfloat16; float16 joins it for accuracy.
at::ScalarType ReductionDtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t;
}

// The tensor's elements as a flat uint8 view sharing its storage (Gloo moves bytes of any
// dtype, bfloat16 included).
at::Tensor ByteView(const at::Tensor& t) { return t.view(-1).view(at::kByte); }

}  // namespace

GlooDeviceChoice ChooseGlooDevice(const std::function<const char*(const char*)>& getenv) {
  GlooDeviceChoice choice;
  const char* ifname = getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    choice.kind = GlooDeviceChoice::Kind::kInterfaces;
    for (absl::string_view name : absl::StrSplit(ifname, ',', absl::SkipWhitespace())) {
      choice.interfaces.emplace_back(absl::StripAsciiWhitespace(name));
    }
    return choice;
  }
  const char* master = getenv("MASTER_ADDR");
  absl::string_view addr = master == nullptr ? "" : master;
  const bool loopback =
      addr.empty() || addr == "localhost" || addr == "::1" || absl::StartsWith(addr, "127.");
  choice.kind = loopback ? GlooDeviceChoice::Kind::kLoopback : GlooDeviceChoice::Kind::kHostname;
  return choice;
}

std::string GlooDeviceChoice::Describe() const {
  switch (kind) {
    case Kind::kInterfaces:
      return absl::StrCat("interfaces ", absl::StrJoin(interfaces, ","), " (GLOO_SOCKET_IFNAME)");
    case Kind::kLoopback:
      return "127.0.0.1 (MASTER_ADDR unset or loopback)";
    case Kind::kHostname:
      return "this host's address (MASTER_ADDR is not loopback; set GLOO_SOCKET_IFNAME to pick "
             "an interface)";
  }
  return "unknown";
}

namespace {

// Gloo's rendezvous reads peers' addresses with Store::get, which waits as long as the
// store's own timeout (300 s by default) rather than the communicator's; this store bounds
// that wait by `timeout` without changing the timeout of the caller's (shared) store.
class RendezvousStore : public c10d::PrefixStore {
 public:
  RendezvousStore(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout)
      : c10d::PrefixStore("gloo", std::move(store)), get_timeout_(timeout) {}

  std::vector<uint8_t> get(const std::string& key) override {
    c10d::PrefixStore::wait({key}, get_timeout_);
    return c10d::PrefixStore::get(key);
  }

 private:
  std::chrono::milliseconds get_timeout_;
};

absl::StatusOr<std::vector<std::shared_ptr<::gloo::transport::Device>>> CreateDevices(
    const GlooDeviceChoice& choice) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  absl::Status status = CatchTorch([&] {
    switch (choice.kind) {
      case GlooDeviceChoice::Kind::kInterfaces:
        for (const std::string& name : choice.interfaces) {
          devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
        }
        break;
      case GlooDeviceChoice::Kind::kLoopback:
        devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        break;
      case GlooDeviceChoice::Kind::kHostname:
        devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        break;
    }
  });
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("Gloo: cannot create a device on ",
                                                    choice.Describe(), ": ", status.message()));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        "Gloo: GLOO_SOCKET_IFNAME names no interface; set it to e.g. eth0 or unset it");
  }
  return devices;
}

// Gloo's TCP transport writes to its sockets without MSG_NOSIGNAL, so a write to a peer that
// just died raises SIGPIPE, whose default action kills this process before the failed write
// can become an error status. Ignore it unless the application installed its own handler.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      (current.sa_flags & SA_SIGINFO) == 0) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout) {
  CT_RETURN_IF_ERROR(
      sharding_internal::CheckCreateArguments("GlooCommunicator", store, rank, size, timeout));
  IgnoreSigpipeUnlessHandled();
  const GlooDeviceChoice choice = ChooseGlooDevice(&std::getenv);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  CT_ASSIGN_OR_RETURN(options->devices, CreateDevices(choice));
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroupGloo>> pg = CatchTorch([&] {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<RendezvousStore>(store, timeout), rank, size, options);
  });
  if (!pg.ok()) {
    return absl::Status(
        pg.status().code(),
        absl::StrCat("Gloo rendezvous failed on rank ", rank, " of ", size, " (device ",
                     choice.Describe(), ", timeout ", timeout.count(),
                     " ms; did every rank call Create with the same store and size?): ",
                     pg.status().message()));
  }
  // A barrier over the new connections, so no rank returns before every rank's are complete.
  // Without it a rank that closed its communicator right after Create (a job whose first step
  // fails before any collective) could cut a peer's connections while that peer was still
  // completing them: its Create then failed with "Connection closed by peer" (seen once, in
  // //engines/fsdp:fsdp_wrap_test's made-up-class case, whose ranks fail before any collective).
  const absl::Status connected = CatchTorch([&] { (*pg)->barrier()->wait(); });
  if (!connected.ok()) {
    return absl::Status(connected.code(),
                        absl::StrCat("Gloo: the barrier after connecting failed on rank ", rank,
                                     " of ", size, " (a peer left during rendezvous?): ",
                                     connected.message()));
  }
  VLOG(1) << "Gloo communicator: rank " << rank << " of " << size << " on " << choice.Describe();
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(*std::move(pg), rank, size));
}

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank,
                                   int size)
    : pg_(std::move(pg)), rank_(rank), size_(size) {}

GlooCommunicator::~GlooCommunicator() = default;

namespace {

// Gloo hands each tensor's storage over as is, and moves only the dtypes it reduces.
constexpr sharding_internal::TensorRules kTensorRules{/*reducible_dtype_everywhere=*/true,
                                                      /*contiguous=*/true};

// Everything a collective needs from its communicator while it is being issued.
struct Context {
  c10d::ProcessGroupGloo& pg;
  const char* op;
  int rank;
  int size;

  sharding_internal::CollectiveChecks Checks() const {
    return sharding_internal::CollectiveChecks("GlooCommunicator", kTensorRules, op, rank, size);
  }

  // Issues `launch` now; `finish` runs on the worker thread once the transfer succeeded.
  absl::StatusOr<FuturePtr> Launch(const std::function<c10::intrusive_ptr<c10d::Work>()>& launch,
                                   Finish finish) const {
    try {
      FuturePtr future = launch()->getFuture();
      if (!finish) return future;
      return future->then(
          [finish = std::move(finish)](c10::ivalue::Future& parent) {
            if (parent.hasError()) std::rethrow_exception(parent.exception_ptr());
            finish();
            return c10::IValue();
          },
          c10::NoneType::get());
    } catch (const std::exception& e) {
      return CollectiveError(op, rank, size, TorchErrorMessage(e), __LINE__);
    }
  }

  std::unique_ptr<Work> MakeWork(std::vector<FuturePtr> futures) const {
    return std::make_unique<GlooWork>(op, rank, size, std::move(futures));
  }
};

c10d::ReduceOp ToC10d(ReduceOp op) {
  return op == ReduceOp::kMax ? c10d::ReduceOp(c10d::ReduceOp::MAX)
                              : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

// Reduces x [world, n] over its first dimension.
at::Tensor ReduceRows(const at::Tensor& x, ReduceOp op) {
  if (op == ReduceOp::kMax) return x.amax(0);
  at::Tensor sum = x.to(ReductionDtype(x.scalar_type())).sum(0);
  if (op == ReduceOp::kAvg) sum.div_(x.size(0));
  return sum;
}

absl::StatusOr<std::unique_ptr<Work>> AllReduceTensors(const Context& ctx,
                                                       std::vector<at::Tensor>& tensors,
                                                       ReduceOp op) {
  const sharding_internal::CollectiveChecks checks = ctx.Checks();
  for (size_t i = 0; i < tensors.size(); ++i) {
    CT_RETURN_IF_ERROR(checks.Reducible(tensors[i], absl::StrCat("tensors[", i, "]"), op));
  }
  // One buffer per reduction dtype, in order of first appearance (the same on every rank).
  std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> groups;
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const at::ScalarType dtype = ReductionDtype(t.scalar_type());
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == dtype; });
    if (it == groups.end()) it = groups.emplace(groups.end(), dtype, std::vector<at::Tensor>());
    it->second.push_back(t);
  }
  const int size = ctx.size;
  std::vector<FuturePtr> futures;
  for (auto& [dtype, members] : groups) {
    std::vector<at::Tensor> buffer(1);
    Finish finish;
    if (members.size() == 1 && members[0].scalar_type() == dtype) {
      buffer[0] = members[0];  // In place.
      if (op == ReduceOp::kAvg) {
        finish = [t = buffer[0], size] { t.div_(size); };
      }
    } else {
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : members) flat.push_back(t.view(-1).to(dtype));
      buffer[0] = at::cat(flat);
      finish = [flat_buffer = buffer[0], members, op, size] {
        if (op == ReduceOp::kAvg) flat_buffer.div_(size);
        int64_t offset = 0;
        for (const at::Tensor& t : members) {
          t.view(-1).copy_(flat_buffer.narrow(0, offset, t.numel()));
          offset += t.numel();
        }
      };
    }
    c10d::AllreduceOptions options;
    options.reduceOp = ToC10d(op);
    CT_ASSIGN_OR_RETURN(
        FuturePtr future,
        ctx.Launch([&] { return ctx.pg.allreduce(buffer, options); }, std::move(finish)));
    futures.push_back(std::move(future));
  }
  return ctx.MakeWork(std::move(futures));
}

absl::StatusOr<std::unique_ptr<Work>> AllGatherTensors(const Context& ctx,
                                                       const std::vector<at::Tensor>& inputs,
                                                       std::vector<at::Tensor>& outputs) {
  CT_RETURN_IF_ERROR(ctx.Checks().Pairs(inputs, outputs, sharding_internal::LargerSide::kOutput));
  const int size = ctx.size;
  int64_t total_bytes = 0;
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bytes.push_back(inputs[i].nbytes());
    total_bytes += bytes.back();
  }
  if (total_bytes == 0) return ctx.MakeWork({});

  // Gloo 1.13 has no flat all-gather: the list form writes each rank's bytes into a view of
  // the flat buffer. A single tensor gathers straight into its output.
  std::vector<at::Tensor> send(1);
  at::Tensor receive;
  Finish finish;
  if (inputs.size() == 1) {
    send[0] = ByteView(inputs[0]);
    receive = ByteView(outputs[0]);
  } else {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& t : inputs) parts.push_back(ByteView(t));
    send[0] = at::cat(parts);
    receive = at::empty({size * total_bytes}, send[0].options());
    finish = [receive, outputs, bytes, size, total_bytes] {
      at::Tensor rows = receive.view({size, total_bytes});
      int64_t offset = 0;
      for (size_t i = 0; i < outputs.size(); ++i) {
        ByteView(outputs[i]).view({size, bytes[i]}).copy_(rows.narrow(1, offset, bytes[i]));
        offset += bytes[i];
      }
    };
  }
  std::vector<std::vector<at::Tensor>> chunks(1);
  for (int r = 0; r < size; ++r) {
    chunks[0].push_back(receive.narrow(0, r * total_bytes, total_bytes));
  }
  CT_ASSIGN_OR_RETURN(FuturePtr future, ctx.Launch([&] { return ctx.pg.allgather(chunks, send); },
                                                   std::move(finish)));
  return ctx.MakeWork({std::move(future)});
}

absl::StatusOr<std::unique_ptr<Work>> ReduceScatterTensors(const Context& ctx,
                                                           const std::vector<at::Tensor>& inputs,
                                                           std::vector<at::Tensor>& outputs,
                                                           ReduceOp op) {
  const sharding_internal::CollectiveChecks checks = ctx.Checks();
  CT_RETURN_IF_ERROR(checks.Pairs(inputs, outputs, sharding_internal::LargerSide::kInput));
  const int size = ctx.size;
  int64_t chunk_bytes = 0;  // What each rank sends to each rank.
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    CT_RETURN_IF_ERROR(checks.Reducible(inputs[i], absl::StrCat("input[", i, "]"), op));
    bytes.push_back(outputs[i].nbytes());
    chunk_bytes += bytes.back();
  }
  if (chunk_bytes == 0) return ctx.MakeWork({});

  // Gloo 1.13 has no reduce-scatter: an all-to-all hands rank r every rank's chunk r, as
  // bytes; rank r then reduces its [world, n] rows locally, in float32 for 16-bit floats.
  at::Tensor send;
  if (inputs.size() == 1) {
    send = ByteView(inputs[0]);
  } else {
    send = at::empty({size, chunk_bytes}, at::kByte);
    int64_t offset = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      send.narrow(1, offset, bytes[i]).copy_(ByteView(inputs[i]).view({size, bytes[i]}));
      offset += bytes[i];
    }
    send = send.view(-1);
  }
  at::Tensor receive = at::empty({size * chunk_bytes}, at::kByte);
  Finish finish = [receive, outputs, bytes, size, chunk_bytes, op] {
    at::Tensor rows = receive.view({size, chunk_bytes});
    int64_t offset = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (bytes[i] == 0) continue;
      // A fresh copy: a view of `rows` may start at an offset no wider dtype can view.
      at::Tensor mine = at::empty({size, bytes[i]}, at::kByte)
                            .copy_(rows.narrow(1, offset, bytes[i]))
                            .view(outputs[i].scalar_type());
      outputs[i].view(-1).copy_(ReduceRows(mine, op));
      offset += bytes[i];
    }
  };
  std::vector<int64_t> equal_splits;
  CT_ASSIGN_OR_RETURN(
      FuturePtr future,
      ctx.Launch([&] { return ctx.pg.alltoall_base(receive, send, equal_splits, equal_splits); },
                 std::move(finish)));
  return ctx.MakeWork({std::move(future)});
}

}  // namespace

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllReduce(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  return AllReduceTensors(Context{*pg_, "AllReduce", rank_, size_}, tensors, op);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllReduceCoalesced(
    std::vector<at::Tensor>& tensors, ReduceOp op) {
  return AllReduceTensors(Context{*pg_, "AllReduceCoalesced", rank_, size_}, tensors, op);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllGather(const at::Tensor& input,
                                                                  at::Tensor& output) {
  std::vector<at::Tensor> outputs{output};
  return AllGatherTensors(Context{*pg_, "AllGather", rank_, size_}, {input}, outputs);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllGatherCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  return AllGatherTensors(Context{*pg_, "AllGatherCoalesced", rank_, size_}, inputs, outputs);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::ReduceScatter(const at::Tensor& input,
                                                                      at::Tensor& output,
                                                                      ReduceOp op) {
  std::vector<at::Tensor> outputs{output};
  return ReduceScatterTensors(Context{*pg_, "ReduceScatter", rank_, size_}, {input}, outputs, op);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::ReduceScatterCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, ReduceOp op) {
  return ReduceScatterTensors(Context{*pg_, "ReduceScatterCoalesced", rank_, size_}, inputs,
                              outputs, op);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::Broadcast(at::Tensor& tensor, int root) {
  const Context ctx{*pg_, "Broadcast", rank_, size_};
  const sharding_internal::CollectiveChecks checks = ctx.Checks();
  CT_RETURN_IF_ERROR(checks.Tensor(tensor, "tensor"));
  CT_RETURN_IF_ERROR(checks.Root(root));
  if (tensor.numel() == 0) return ctx.MakeWork({});
  std::vector<at::Tensor> bytes{ByteView(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  CT_ASSIGN_OR_RETURN(FuturePtr future,
                      ctx.Launch([&] { return pg_->broadcast(bytes, options); }, nullptr));
  return ctx.MakeWork({std::move(future)});
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::Scatter(const at::Tensor& input,
                                                                at::Tensor& output, int root) {
  const Context ctx{*pg_, "Scatter", rank_, size_};
  CT_RETURN_IF_ERROR(ctx.Checks().Scatter(input, output, root));
  if (output.numel() == 0) return ctx.MakeWork({});
  std::vector<at::Tensor> outputs{ByteView(output)};
  std::vector<std::vector<at::Tensor>> inputs;
  if (rank_ == root) {
    const at::Tensor parts = ByteView(input).view({size_, -1});
    inputs.emplace_back();
    for (int r = 0; r < size_; ++r) inputs[0].push_back(parts[r]);
  }
  c10d::ScatterOptions options;
  options.rootRank = root;
  CT_ASSIGN_OR_RETURN(FuturePtr future,
                      ctx.Launch([&] { return pg_->scatter(outputs, inputs, options); }, nullptr));
  return ctx.MakeWork({std::move(future)});
}

absl::Status GlooCommunicator::Barrier() {
  const Context ctx{*pg_, "Barrier", rank_, size_};
  CT_ASSIGN_OR_RETURN(FuturePtr future, ctx.Launch([&] { return pg_->barrier(); }, nullptr));
  return ctx.MakeWork({std::move(future)})->Wait();
}

}  // namespace cpptrain
