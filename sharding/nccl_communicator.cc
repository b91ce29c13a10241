#include "sharding/nccl_communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status NcclError(ncclResult_t result, const char* what, int rank, const char* file,
                       int line) {
  const char* last = ncclGetLastError(nullptr);
  return absl::InternalError(absl::StrCat(file, ":", line, ": rank ", rank, ": ", what, ": ",
                                          ncclGetErrorString(result),
                                          last && *last ? absl::StrCat(" (", last, ")") : ""));
}

#define CT_NCCL_RETURN_IF_ERROR(expr, rank)                                    \
  do {                                                                         \
    ncclResult_t ct_nccl_result_ = (expr);                                     \
    if (ct_nccl_result_ != ncclSuccess && ct_nccl_result_ != ncclInProgress) { \
      return NcclError(ct_nccl_result_, #expr, (rank), __FILE__, __LINE__);    \
    }                                                                          \
  } while (false)

absl::StatusOr<ncclDataType_t> NcclType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL reductions take float32/64, float16, bfloat16, int8/32/64 or uint8 tensors, not ",
          c10::toString(t.scalar_type()),
          " (all-gather, broadcast and scatter move any dtype); convert it before reducing"));
  }
}

// How a collective that only moves data (all-gather, broadcast, scatter) sends `t`: as its
// NCCL type, or as its bytes for the dtypes NCCL has none for (bool, int16, float8, complex),
// as Gloo moves every dtype. Nothing is computed on the values, so the bytes are exact.
struct Moved {
  ncclDataType_t type = ncclUint8;
  size_t count = 0;
};
Moved MovedAs(const at::Tensor& t) {
  const absl::StatusOr<ncclDataType_t> type = NcclType(t);
  if (type.ok()) return {*type, static_cast<size_t>(t.numel())};
  return {ncclUint8, static_cast<size_t>(t.numel()) * t.element_size()};
}

absl::StatusOr<ncclRedOp_t> NcclOp(ReduceOp op, const at::Tensor& t) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      if (!at::isFloatingType(t.scalar_type())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ReduceOp::kAvg on a ", c10::toString(t.scalar_type()),
            " tensor: averages need a floating-point dtype; reduce with kSum and divide"));
      }
      return ncclAvg;
  }
  return ncclSum;
}

struct Pending {
  std::shared_ptr<at::cuda::CUDAEvent> done;
  Clock::time_point deadline;
  std::string name;
};

}  // namespace

struct NcclCommunicator::State {
  int rank = 0;
  int device = 0;
  // The handles; null once aborted. Readers use them (issue, poll), the abort is the writer,
  // so no thread touches a communicator ncclCommAbort is freeing. Never taken while holding
  // `mu` (Launch holds it while reading Health()).
  mutable absl::Mutex comm_mu;
  ncclComm_t comms[kNumKinds] ABSL_GUARDED_BY(comm_mu) = {};
  std::vector<c10::cuda::CUDAStream> streams;
  std::atomic<bool> stop{false};
  mutable absl::Mutex mu;
  std::vector<Pending> pending ABSL_GUARDED_BY(mu);
  absl::Status failure ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;

  absl::Status Health() const {
    absl::MutexLock lock(&mu);
    return failure;
  }

  // The watchdog fails the communicator unless `done` completes within `timeout`.
  void Watch(std::shared_ptr<at::cuda::CUDAEvent> done, std::chrono::milliseconds timeout,
             std::string what) {
    absl::MutexLock lock(&mu);
    pending.push_back({std::move(done), Clock::now() + timeout, std::move(what)});
  }

  // Marks the communicator failed with `why` and aborts every NCCL communicator, unless that
  // happened already; returns the (first) failure.
  absl::Status FailAndAbort(absl::Status why) {
    bool abort_now = false;
    {
      absl::MutexLock lock(&mu);
      if (!aborted) {
        LOG(ERROR) << why.message() << "; aborting the NCCL communicators";
        aborted = true;
        failure = std::move(why);
        pending.clear();
        abort_now = true;
      }
    }
    if (abort_now) {
      absl::WriterMutexLock lock(&comm_mu);
      for (ncclComm_t& comm : comms) {
        if (comm != nullptr) ncclCommAbort(comm);
        comm = nullptr;
      }
    }
    return Health();
  }

  // The communicators are non-blocking: a call may return ncclInProgress while NCCL sets up
  // the communicator or, on a collective's first use of a peer, its connections, which needs
  // every peer to join. Polls until `comm` is ready; a failure, or no progress by `deadline`
  // (a rank died or never called), is returned for the caller to FailAndAbort once it no
  // longer holds `comm_mu`.
  absl::Status PollReady(ncclComm_t comm, absl::string_view what, Clock::time_point deadline) const
      ABSL_SHARED_LOCKS_REQUIRED(comm_mu) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
      if (queried != ncclSuccess) state = queried;
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return absl::InternalError(absl::StrCat("rank ", rank, ": NCCL reported ",
                                                ncclGetErrorString(state), " in ", what));
      }
      CT_RETURN_IF_ERROR(Health());
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank, ": NCCL ", what,
            " did not start within the timeout: a peer never joined (a rank died or stopped "
            "calling it)"));
      }
      std::this_thread::yield();
    }
  }

  // Runs on the watchdog thread: completion, deadlines and NCCL's asynchronous errors.
  void Watch() {
    c10::cuda::CUDAGuard guard(device);
    while (!stop.load()) {
      absl::SleepFor(absl::Milliseconds(20));
      absl::Status problem;
      {
        absl::MutexLock lock(&mu);
        if (aborted) continue;
        const Clock::time_point now = Clock::now();
        for (size_t i = 0; i < pending.size();) {
          if (pending[i].done->query()) {
            pending[i] = std::move(pending.back());
            pending.pop_back();
          } else if (now > pending[i].deadline) {
            problem = absl::DeadlineExceededError(absl::StrCat(
                "rank ", rank, ": NCCL ", pending[i].name,
                " did not complete within the timeout (a rank died or stopped calling it)"));
            break;
          } else {
            ++i;
          }
        }
      }
      if (problem.ok()) {
        absl::ReaderMutexLock lock(&comm_mu);
        for (ncclComm_t comm : comms) {
          ncclResult_t async_error = ncclSuccess;
          if (comm != nullptr && ncclCommGetAsyncError(comm, &async_error) == ncclSuccess &&
              async_error != ncclSuccess && async_error != ncclInProgress) {
            problem = absl::InternalError(
                absl::StrCat("rank ", rank, ": NCCL reported ", ncclGetErrorString(async_error)));
            break;
          }
        }
      }
      if (!problem.ok()) FailAndAbort(std::move(problem)).IgnoreError();
    }
  }
};

namespace {

bool Capturing(const c10::cuda::CUDAStream& stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

class NcclWork : public Work {
 public:
  // `captured`: issued while the caller's stream was being captured into a CUDA graph.
  NcclWork(std::shared_ptr<NcclCommunicator::State> state,
           std::shared_ptr<at::cuda::CUDAEvent> done, std::vector<at::Tensor> keep_alive,
           std::string name, bool captured)
      : state_(std::move(state)),
        done_(std::move(done)),
        keep_alive_(std::move(keep_alive)),
        name_(std::move(name)),
        captured_(captured) {}

  // Unwaited work is waited for, so freeing its tensors stays ordered after the collective.
  ~NcclWork() override {
    if (!waited_) Wait().IgnoreError();
  }

  // A captured collective's event exists only inside its capture: waited for there, it joins
  // the caller's stream to it; after the capture ended (or failed) the graph orders its replays
  // itself and there is nothing to wait for, and touching the event would be an error.
  absl::Status Wait() override {
    CT_RETURN_IF_ERROR(state_->Health());
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(state_->device);
    absl::Status blocked = absl::OkStatus();
    if (!captured_ || Capturing(current)) blocked = CatchTorch([&] { done_->block(current); });
    keep_alive_.clear();
    waited_ = true;
    return blocked;
  }

  absl::Status Synchronize() override {
    if (captured_) return Wait();  // nothing the host could wait for
    c10::cuda::CUDAGuard guard(state_->device);
    while (!done_->query()) {
      CT_RETURN_IF_ERROR(state_->Health());
      absl::SleepFor(absl::Microseconds(20));
    }
    return Wait();
  }

 private:
  std::shared_ptr<NcclCommunicator::State> state_;
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  std::vector<at::Tensor> keep_alive_;
  std::string name_;
  bool captured_;
  bool waited_ = false;
};

absl::Status CheckTensor(const at::Tensor& t, int device, const char* what) {
  if (!t.is_cuda() || t.get_device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on ", t.device().str(),
                                                   "; this NCCL communicator serves cuda:", device,
                                                   " only"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not contiguous: pass .contiguous()"));
  }
  return absl::OkStatus();
}

using Issue = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

bool Failed(ncclResult_t result) { return result != ncclSuccess && result != ncclInProgress; }

// Issues `issues` on `stream`, as one NCCL group when there are several. The group is closed
// on every path: left open after a failed call, it would swallow the next collective.
absl::Status IssueGrouped(ncclComm_t comm, cudaStream_t stream, const std::vector<Issue>& issues,
                          int rank) {
  const bool grouped = issues.size() > 1;
  if (grouped) CT_NCCL_RETURN_IF_ERROR(ncclGroupStart(), rank);
  ncclResult_t result = ncclSuccess;
  for (const Issue& issue : issues) {
    result = issue(comm, stream);
    if (Failed(result)) break;
  }
  if (grouped) {
    const ncclResult_t ended = ncclGroupEnd();
    if (!Failed(result)) result = ended;
  }
  if (Failed(result)) return NcclError(result, "issuing the collective", rank, __FILE__, __LINE__);
  return absl::OkStatus();
}

void RecordStream(const std::vector<at::Tensor>& tensors, const c10::cuda::CUDAStream& stream) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda()) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
    }
  }
}

absl::StatusOr<std::unique_ptr<Work>> Launch(const std::shared_ptr<NcclCommunicator::State>& st,
                                             NcclCommunicator::Kind kind, std::string name,
                                             std::chrono::milliseconds timeout,
                                             std::vector<at::Tensor> keep_alive,
                                             const std::vector<Issue>& issues) {
  CT_RETURN_IF_ERROR(st->Health());
  c10::cuda::CUDAGuard guard(st->device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(st->device);
  const c10::cuda::CUDAStream& stream = st->streams[kind];
  // The collective's stream waits for the inputs the caller's stream produced.
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(stream);
  const Clock::time_point deadline = Clock::now() + timeout;
  absl::Status issued;
  {
    absl::ReaderMutexLock lock(&st->comm_mu);
    ncclComm_t comm = st->comms[kind];
    if (comm == nullptr) return st->Health();  // aborted
    issued = IssueGrouped(comm, stream.stream(), issues, st->rank);
    // Enqueued on `stream` only once the communicator is ready (at once, when connected).
    if (issued.ok()) issued = st->PollReady(comm, name, deadline);
  }
  // A collective this rank failed to issue is one its peers wait for: the communicator is
  // done for (and the error ends the job, which ends theirs).
  if (!issued.ok()) return st->FailAndAbort(std::move(issued));
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(stream);
  // Under capture the collective is recorded, not run, and its event must not be queried.
  const bool captured = Capturing(current);
  if (!captured) {
    st->Watch(done, timeout, name);
    // The caching allocator reuses a freed block on the stream it was allocated on; a tensor
    // from another stream than the caller's (a side stream's buffer) is held back until the
    // collective's stream is past this point, whenever it is freed. (A capture's memory stays
    // in its graph's pool, so nothing is recorded under capture.)
    RecordStream(keep_alive, stream);
  }
  return std::unique_ptr<Work>(std::make_unique<NcclWork>(st, std::move(done),
                                                          std::move(keep_alive),
                                                          std::move(name), captured));
}

}  // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, int device,
                                   std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      device_(device),
      timeout_(timeout),
      state_(std::make_shared<State>()) {
  state_->rank = rank;
  state_->device = device;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, int device,
    std::chrono::milliseconds timeout) {
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(rank, size, device, timeout));
  State& st = *comm->state_;
  c10::cuda::CUDAGuard guard(device);
  CT_RETURN_IF_ERROR(comm->InitFromUniqueId(*store, kReduce));
  for (int kind = kReduce + 1; kind < kNumKinds; ++kind) {
    CT_RETURN_IF_ERROR(comm->SplitFrom(kReduce, static_cast<Kind>(kind)));
  }
  for (int kind = 0; kind < kNumKinds; ++kind) {
    st.streams.push_back(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device));
  }
  comm->watchdog_ = std::thread([state = comm->state_] { state->Watch(); });
  return comm;
}

absl::Status NcclCommunicator::InitFromUniqueId(c10d::Store& store, Kind kind) {
  State& st = *state_;
  const int rank = rank_;
  {
    const std::string key = absl::StrCat("nccl_unique_id_", kind);
    ncclUniqueId id;
    if (rank == 0) {
      CT_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), rank);
      std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id),
                                 reinterpret_cast<uint8_t*>(&id) + sizeof(id));
      CT_RETURN_IF_ERROR(CatchTorch([&] { store.set(key, bytes); }));
    } else {
      CT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, CatchTorch([&] { return store.get(key); }));
      if (bytes.size() != sizeof(id)) {
        return absl::InternalError(absl::StrCat("rank ", rank, ": NCCL unique id under ", key,
                                                " has ", bytes.size(), " bytes, not ", sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    absl::Status ready;
    {
      absl::WriterMutexLock lock(&st.comm_mu);
      CT_NCCL_RETURN_IF_ERROR(
          ncclCommInitRankConfig(&st.comms[kind], size_, id, rank, &config), rank);
      ready = st.PollReady(st.comms[kind], "communicator setup", Clock::now() + timeout_);
    }
    if (!ready.ok()) return st.FailAndAbort(std::move(ready));
  }
  return absl::OkStatus();
}

// Every rank splits with one color, so the child spans the parent's ranks in the same order;
// NCCL sets it up over the parent's connections instead of a new unique id and bootstrap.
// A non-blocking split leaves the child null until it completes and reports its progress on
// the parent (polling the null child is NCCL's "invalid argument", as the first run on a GPU
// showed), so the parent is polled first, then the child.
absl::Status NcclCommunicator::SplitFrom(Kind parent, Kind kind) {
  State& st = *state_;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  absl::Status ready;
  {
    absl::WriterMutexLock lock(&st.comm_mu);
    const Clock::time_point deadline = Clock::now() + timeout_;
    CT_NCCL_RETURN_IF_ERROR(ncclCommSplit(st.comms[parent], /*color=*/0, /*key=*/rank_,
                                          &st.comms[kind], &config),
                            rank_);
    ready = st.PollReady(st.comms[parent], "communicator split", deadline);
    if (ready.ok() && st.comms[kind] == nullptr) {
      ready = absl::InternalError(absl::StrCat(
          "rank ", rank_, ": NCCL finished the communicator split without a communicator"));
    }
    if (ready.ok()) ready = st.PollReady(st.comms[kind], "communicator split", deadline);
  }
  if (!ready.ok()) return st.FailAndAbort(std::move(ready));
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  state_->stop.store(true);
  if (watchdog_.joinable()) watchdog_.join();
  // Finalize flushes what is still in flight; a communicator that does not finish within the
  // timeout (a peer gone) is aborted rather than waited for. Aborted ones are null already.
  const Clock::time_point deadline = Clock::now() + timeout_;
  absl::WriterMutexLock lock(&state_->comm_mu);
  for (ncclComm_t& comm : state_->comms) {
    if (comm == nullptr) continue;
    ncclResult_t state = ncclCommFinalize(comm);
    while (state == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
    comm = nullptr;
  }
}

absl::Status NcclCommunicator::health() const { return state_->Health(); }

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllReduce(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors = {tensor};
  return AllReduceCoalesced(tensors, op);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllReduceCoalesced(
    std::vector<at::Tensor>& tensors, ReduceOp op) {
  std::vector<Issue> issues;
  for (at::Tensor& t : tensors) {
    CT_RETURN_IF_ERROR(CheckTensor(t, device_, "all-reduce tensor"));
    CT_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(t));
    CT_ASSIGN_OR_RETURN(ncclRedOp_t nccl_op, NcclOp(op, t));
    void* data = t.data_ptr();
    const size_t count = t.numel();
    issues.push_back([=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(data, data, count, type, nccl_op, comm, stream);
    });
  }
  return Launch(state_, kReduce, absl::StrCat("all-reduce (", ReduceOpName(op), ")"), timeout_,
                tensors, issues);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllGather(const at::Tensor& input,
                                                                  at::Tensor& output) {
  std::vector<at::Tensor> outputs = {output};
  return AllGatherCoalesced({input}, outputs);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllGatherCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  if (inputs.size() != outputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-gather got ", inputs.size(), " inputs and ", outputs.size(), " outputs"));
  }
  std::vector<Issue> issues;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    CT_RETURN_IF_ERROR(CheckTensor(inputs[i], device_, "all-gather input"));
    CT_RETURN_IF_ERROR(CheckTensor(outputs[i], device_, "all-gather output"));
    if (outputs[i].numel() != inputs[i].numel() * size_ ||
        outputs[i].scalar_type() != inputs[i].scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-gather output has ", outputs[i].numel(), " ",
          c10::toString(outputs[i].scalar_type()), " elements; it needs world size (", size_,
          ") x input (", inputs[i].numel(), " ", c10::toString(inputs[i].scalar_type()), ")"));
    }
    const Moved moved = MovedAs(inputs[i]);
    const void* send = inputs[i].data_ptr();
    void* recv = outputs[i].data_ptr();
    issues.push_back([=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(send, recv, moved.count, moved.type, comm, stream);
    });
    keep.push_back(inputs[i]);
    keep.push_back(outputs[i]);
  }
  return Launch(state_, kGather, "all-gather", timeout_, std::move(keep), issues);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::ReduceScatter(const at::Tensor& input,
                                                                      at::Tensor& output,
                                                                      ReduceOp op) {
  std::vector<at::Tensor> outputs = {output};
  return ReduceScatterCoalesced({input}, outputs, op);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::ReduceScatterCoalesced(
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs, ReduceOp op) {
  if (inputs.size() != outputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter got ", inputs.size(),
                                                   " inputs and ", outputs.size(), " outputs"));
  }
  std::vector<Issue> issues;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    CT_RETURN_IF_ERROR(CheckTensor(inputs[i], device_, "reduce-scatter input"));
    CT_RETURN_IF_ERROR(CheckTensor(outputs[i], device_, "reduce-scatter output"));
    if (inputs[i].numel() != outputs[i].numel() * size_ ||
        outputs[i].scalar_type() != inputs[i].scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduce-scatter input has ", inputs[i].numel(), " ",
          c10::toString(inputs[i].scalar_type()), " elements; it needs world size (", size_,
          ") x output (", outputs[i].numel(), " ", c10::toString(outputs[i].scalar_type()), ")"));
    }
    CT_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(inputs[i]));
    CT_ASSIGN_OR_RETURN(ncclRedOp_t nccl_op, NcclOp(op, inputs[i]));
    const void* send = inputs[i].data_ptr();
    void* recv = outputs[i].data_ptr();
    const size_t count = outputs[i].numel();
    issues.push_back([=](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(send, recv, count, type, nccl_op, comm, stream);
    });
    keep.push_back(inputs[i]);
    keep.push_back(outputs[i]);
  }
  return Launch(state_, kScatter, absl::StrCat("reduce-scatter (", ReduceOpName(op), ")"), timeout_,
                std::move(keep), issues);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::Broadcast(at::Tensor& tensor, int root) {
  CT_RETURN_IF_ERROR(CheckTensor(tensor, device_, "broadcast tensor"));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside [0, ", size_, ")"));
  }
  const Moved moved = MovedAs(tensor);
  void* data = tensor.data_ptr();
  return Launch(state_, kReduce, "broadcast", timeout_, {tensor},
                {[=](ncclComm_t comm, cudaStream_t stream) {
                  return ncclBroadcast(data, data, moved.count, moved.type, root, comm, stream);
                }});
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::Scatter(const at::Tensor& input,
                                                                at::Tensor& output, int root) {
  CT_RETURN_IF_ERROR(CheckTensor(output, device_, "scatter output"));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("scatter root ", root, " is outside [0, ", size_, ")"));
  }
  const bool is_root = rank_ == root;
  std::vector<at::Tensor> keep = {output};
  if (is_root) {
    CT_RETURN_IF_ERROR(CheckTensor(input, device_, "scatter input"));
    if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scatter input has ", input.numel(), " ", c10::toString(input.scalar_type()),
          " elements; it needs world size (", size_, ") x output (", output.numel(), " ",
          c10::toString(output.scalar_type()), ")"));
    }
    keep.push_back(input);
  }
  const Moved moved = MovedAs(output);
  const ncclDataType_t type = moved.type;
  const char* send = is_root ? static_cast<const char*>(input.data_ptr()) : nullptr;
  void* recv = output.data_ptr();
  const size_t count = moved.count;
  const size_t bytes = static_cast<size_t>(output.numel()) * output.element_size();
  const int size = size_;
  return Launch(state_, kReduce, absl::StrCat("scatter (root ", root, ")"), timeout_,
                std::move(keep), {[=](ncclComm_t comm, cudaStream_t stream) -> ncclResult_t {
                  if (count == 0) return ncclSuccess;
                  if (!is_root) return ncclRecv(recv, count, type, root, comm, stream);
                  if (cudaMemcpyAsync(recv, send + root * bytes, bytes, cudaMemcpyDeviceToDevice,
                                      stream) != cudaSuccess) {
                    return ncclUnhandledCudaError;
                  }
                  ncclResult_t result = ncclGroupStart();
                  for (int peer = 0; peer < size && result == ncclSuccess; ++peer) {
                    if (peer == root) continue;
                    result = ncclSend(send + peer * bytes, count, type, peer, comm, stream);
                  }
                  const ncclResult_t ended = ncclGroupEnd();
                  return result != ncclSuccess ? result : ended;
                }});
}

absl::Status NcclCommunicator::WatchQueuedWork(const std::string& what) {
  CT_RETURN_IF_ERROR(state_->Health());
  c10::cuda::CUDAGuard guard(device_);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
  if (Capturing(current)) {
    return absl::FailedPreconditionError(
        "WatchQueuedWork while the current stream is being captured: call it between replays");
  }
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(current);
  state_->Watch(std::move(done), timeout_, what);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  c10::cuda::CUDAGuard guard(device_);
  at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, AllReduce(one, ReduceOp::kSum));
  return work->Synchronize();
}

}  // namespace cpptrain
