// A communicator that communicates nothing, for measuring how much communication a training
// step exposes (bench --skip_collectives): every collective completes at once and leaves the
// data as it is (all-gather copies the input into this rank's slot). Results are wrong by
// design for size > 1; never train with such a one. With size 1 every collective is exactly
// what a one-rank group computes (all-gather and reduce-scatter copy, the rest leave the data),
// so FSDP1's NO_SHARD uses NoopCommunicator(0, 1) as each rank's own shard group.
//
//   auto comm = std::make_shared<NoopCommunicator>(rank, world);
#ifndef CPPTRAIN_SHARDING_NOOP_COMMUNICATOR_H_
#define CPPTRAIN_SHARDING_NOOP_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "sharding/communicator.h"

namespace cpptrain {

class NoopCommunicator : public Communicator {
 public:
  NoopCommunicator(int rank, int size) : rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "none"; }

  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor&, ReduceOp) override { return Done(); }
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input,
                                                  at::Tensor& output) override {
    output.view(-1).narrow(0, rank_ * input.numel(), input.numel()).copy_(input.view(-1));
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& input, at::Tensor& output,
                                                      ReduceOp) override {
    output.view(-1).copy_(input.view(-1).narrow(0, rank_ * output.numel(), output.numel()));
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor&, int) override { return Done(); }
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& input, at::Tensor& output,
                                                int root) override {
    if (rank_ == root) {
      output.view(-1).copy_(input.view(-1).narrow(0, rank_ * output.numel(), output.numel()));
    }
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>&,
                                                           ReduceOp) override {
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) override {
    for (size_t i = 0; i < inputs.size(); ++i) AllGather(inputs[i], outputs[i]).IgnoreError();
    return Done();
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(
      const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs,
      ReduceOp op) override {
    for (size_t i = 0; i < inputs.size(); ++i)
      ReduceScatter(inputs[i], outputs[i], op).IgnoreError();
    return Done();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }

 private:
  class DoneWork : public Work {
   public:
    absl::Status Wait() override { return absl::OkStatus(); }
    absl::Status Synchronize() override { return absl::OkStatus(); }
  };
  static std::unique_ptr<Work> Done() { return std::make_unique<DoneWork>(); }

  int rank_;
  int size_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_NOOP_COMMUNICATOR_H_
