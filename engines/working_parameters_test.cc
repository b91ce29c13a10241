// WorkingParameters on the CPU: the parameters become bf16 roundings of fp32 masters laid out in
// the order asked for, gradients reach the masters in fp32 (overwritten at the start of an
// accumulation, added after), a step's refresh and someone else's write of the working copies
// both reach the right side, and Expose/Restore hand checkpoints the masters.
#include "engines/working_parameters.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <string>
#include <vector>

namespace cpptrain {
namespace {

// Values with bits below bf16's 8-bit mantissa, so a rounding shows.
WorkingParameters::Named TwoParameters() {
  torch::manual_seed(3);
  at::Tensor w = (torch::randn({3, 5}) * 1.001).set_requires_grad(true);
  at::Tensor b = (torch::randn({5}) + 1e-3).set_requires_grad(true);
  return {{"w", w}, {"b", b}};
}

// sum((x W + b) * c) in bf16, c fixed: dW = x^T c, db = sum of c's rows.
at::Tensor Loss(const WorkingParameters::Named& params, const at::Tensor& x) {
  const at::Tensor& w = params[0].second;
  const at::Tensor& b = params[1].second;
  at::Tensor c = torch::linspace(-1, 1, 5).to(at::kBFloat16);
  return ((x.to(at::kBFloat16).matmul(w) + b) * c).sum();
}

TEST(WorkingParametersTest, ParametersBecomeBf16RoundingsOfFp32MastersInTheOrderAsked) {
  WorkingParameters::Named params = TwoParameters();
  const at::Tensor w0 = params[0].second.detach().clone();
  const at::Tensor b0 = params[1].second.detach().clone();
  auto working = WorkingParameters::Create(params, /*order=*/{1, 0});
  ASSERT_TRUE(working.ok()) << working.status();
  EXPECT_EQ((*working)->offset(1), 0);
  EXPECT_EQ((*working)->offset(0), 5);
  EXPECT_EQ(params[0].second.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(params[0].second.equal(w0.to(at::kBFloat16)));
  EXPECT_TRUE(params[1].second.equal(b0.to(at::kBFloat16)));
  const auto& masters = (*working)->masters();
  ASSERT_EQ(masters.size(), 2u);
  EXPECT_EQ(masters[0].first, "w");
  EXPECT_EQ(masters[0].second.scalar_type(), at::kFloat);
  EXPECT_TRUE(masters[0].second.equal(w0)) << "the master keeps the unrounded values";
  EXPECT_FALSE(masters[0].second.equal(w0.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(masters[1].second.equal(b0));
  EXPECT_TRUE(masters[0].second.requires_grad());
}

class GradientsTest : public ::testing::TestWithParam<bool> {};  // flat_gradients

TEST_P(GradientsTest, MoveIntoTheMastersInFp32AndAccumulate) {
  const bool flat = GetParam();
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params, {}, flat);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->InstallHooks(nullptr);
  const at::Tensor& master_w = (*working)->masters()[0].second;
  EXPECT_FALSE(master_w.grad().defined()) << "no gradient before a backward";

  const at::Tensor x1 = torch::randn({4, 3}), x2 = torch::randn({4, 3});
  Loss(params, x1).backward();
  EXPECT_FALSE(params[0].second.grad().defined()) << "the bf16 gradient was moved out";
  ASSERT_TRUE(master_w.grad().defined());
  EXPECT_EQ(master_w.grad().scalar_type(), at::kFloat);
  // The same backward on a plain bf16 copy gives the bf16 gradients to compare with.
  at::Tensor w_ref = params[0].second.detach().clone().set_requires_grad(true);
  at::Tensor b_ref = params[1].second.detach().clone().set_requires_grad(true);
  const WorkingParameters::Named ref = {{"w", w_ref}, {"b", b_ref}};
  Loss(ref, x1).backward();
  const at::Tensor g1 = w_ref.grad().to(at::kFloat);
  EXPECT_TRUE(master_w.grad().equal(g1));

  Loss(params, x2).backward();  // a second micro-batch adds, in fp32
  w_ref.mutable_grad() = at::Tensor();
  Loss(ref, x2).backward();
  EXPECT_TRUE(master_w.grad().equal(g1 + w_ref.grad().to(at::kFloat)));
  if (flat) {
    EXPECT_TRUE((*working)->gradients().narrow(0, 0, 15).view({3, 5}).equal(master_w.grad()));
    EXPECT_EQ(master_w.grad().data_ptr(), (*working)->gradients().data_ptr())
        << "the master's gradient is a view of the flat buffer";
  } else {
    EXPECT_FALSE((*working)->gradients().defined()) << "no persistent gradient buffer";
  }

  (*working)->masters()[0].second.mutable_grad() = at::Tensor();  // the optimizer's zero_grad
  (*working)->masters()[1].second.mutable_grad() = at::Tensor();
  (*working)->BeginAccumulation();
  Loss(params, x2).backward();  // a new accumulation overwrites
  EXPECT_TRUE(master_w.grad().equal(w_ref.grad().to(at::kFloat)));
}

TEST_P(GradientsTest, ZeroUnmovedGivesUntouchedMastersZeroGradients) {
  const bool flat = GetParam();
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params, {}, flat);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->InstallHooks(nullptr);
  if (flat) (*working)->gradients().fill_(7);  // what a previous step left
  (params[0].second.sum() * 2).backward();  // only w takes part
  (*working)->ZeroUnmoved();
  const auto& masters = (*working)->masters();
  EXPECT_TRUE(masters[0].second.grad().equal(torch::full({3, 5}, 2.0)));
  ASSERT_TRUE(masters[1].second.grad().defined());
  EXPECT_TRUE(masters[1].second.grad().equal(torch::zeros({5})));
}

INSTANTIATE_TEST_SUITE_P(WorkingParametersTest, GradientsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Flat" : "OwnAllocations";
                         });

// Remade accumulators (for a CUDA graph's stream) carry the hooks once: a backward moves each
// gradient once, as before. One held elsewhere leaves everything as it was.
TEST(WorkingParametersTest, RemadeAccumulatorsMoveEachGradientOnce) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  int moved = 0;
  (*working)->InstallHooks([&](int) { ++moved; });
  auto held = torch::autograd::impl::grad_accumulator(params[0].second);
  EXPECT_FALSE((*working)->RemakeAccumulators()) << "`held` holds one";
  EXPECT_EQ(torch::autograd::impl::grad_accumulator(params[0].second), held) << "unchanged";
  held.reset();
  ASSERT_TRUE((*working)->RemakeAccumulators());

  const at::Tensor x = torch::randn({4, 3});
  Loss(params, x).backward();
  EXPECT_EQ(moved, 2) << "one move per parameter";
  at::Tensor w_ref = params[0].second.detach().clone().set_requires_grad(true);
  at::Tensor b_ref = params[1].second.detach().clone().set_requires_grad(true);
  Loss({{"w", w_ref}, {"b", b_ref}}, x).backward();
  EXPECT_TRUE((*working)->masters()[0].second.grad().equal(w_ref.grad().to(at::kFloat)))
      << "moved once, not added twice";
}

// For an optimizer that reads bf16 gradients: the first micro-batch's gradient reaches the
// master as the bf16 tensor itself (no widening pass), the second widens it and adds in fp32.
TEST(WorkingParametersTest, KeptBf16GradientsAreWidenedOnlyToAccumulate) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->KeepBf16Gradients(true);
  (*working)->InstallHooks(nullptr);
  const at::Tensor& master_w = (*working)->masters()[0].second;
  at::Tensor w_ref = params[0].second.detach().clone().set_requires_grad(true);
  at::Tensor b_ref = params[1].second.detach().clone().set_requires_grad(true);
  const WorkingParameters::Named ref = {{"w", w_ref}, {"b", b_ref}};
  const at::Tensor x1 = torch::randn({4, 3}), x2 = torch::randn({4, 3});

  Loss(params, x1).backward();
  Loss(ref, x1).backward();
  ASSERT_TRUE(master_w.grad().defined());
  EXPECT_EQ(master_w.grad().scalar_type(), at::kBFloat16) << "kept as it came";
  EXPECT_TRUE(master_w.grad().equal(w_ref.grad()));
  EXPECT_FALSE(params[0].second.grad().defined());
  const at::Tensor g1 = w_ref.grad().to(at::kFloat);

  Loss(params, x2).backward();
  w_ref.mutable_grad() = at::Tensor();
  Loss(ref, x2).backward();
  EXPECT_EQ(master_w.grad().scalar_type(), at::kFloat) << "a second micro-batch widens";
  EXPECT_TRUE(master_w.grad().equal(g1 + w_ref.grad().to(at::kFloat)));

  auto flat = WorkingParameters::Create(TwoParameters(), {}, /*flat_gradients=*/true);
  ASSERT_TRUE(flat.ok()) << flat.status();
  (*flat)->KeepBf16Gradients(true);  // no effect: the flat fp32 buffer is the gradient
  (*flat)->InstallHooks(nullptr);
  (*flat)->parameters()[0].sum().backward();
  EXPECT_EQ((*flat)->masters()[0].second.grad().scalar_type(), at::kFloat);
}

// WorkingCopyOf names where an optimizer writes a master's rounding; MarkRefreshed then stands
// for Refresh (the versions move on, so the write is not taken for someone else's).
TEST(WorkingParametersTest, WorkingCopyOfIsTheFlatBf16ViewOfAMaster) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params, /*order=*/{1, 0});
  ASSERT_TRUE(working.ok()) << working.status();
  const at::Tensor& master_w = (*working)->masters()[0].second;
  at::Tensor copy = (*working)->WorkingCopyOf(master_w);
  ASSERT_TRUE(copy.defined());
  EXPECT_EQ(copy.scalar_type(), at::kBFloat16);
  EXPECT_EQ(copy.dim(), 1);
  EXPECT_EQ(copy.numel(), 15);
  EXPECT_EQ(copy.data_ptr(), params[0].second.data_ptr());
  EXPECT_FALSE((*working)->WorkingCopyOf(params[0].second).defined()) << "not a master";
  EXPECT_FALSE((*working)->WorkingCopyOf(torch::zeros({15})).defined());
  {
    torch::NoGradGuard no_grad;
    master_w.fill_(1.001);               // what the optimizer's step wrote
    copy.copy_(master_w.reshape({-1}));  // and its rounding, in the same pass
  }
  (*working)->MarkRefreshed();
  (*working)->AdoptWrittenWorkingCopies();  // must not take the rounding for an outside write
  EXPECT_TRUE(params[0].second.equal(torch::full({3, 5}, 1.001).to(at::kBFloat16)));
  EXPECT_TRUE(master_w.equal(torch::full({3, 5}, 1.001))) << "the master stays unrounded";
}

TEST(WorkingParametersTest, RefreshRoundsTheSteppedMastersAndWrittenCopiesAreAdopted) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  at::Tensor master_w = (*working)->masters()[0].second;
  {
    torch::NoGradGuard no_grad;
    master_w.add_(1e-3);  // a step
  }
  (*working)->Refresh();
  EXPECT_TRUE(params[0].second.equal(master_w.to(at::kBFloat16)));
  (*working)->AdoptWrittenWorkingCopies();  // nobody wrote them: the masters stay unrounded
  EXPECT_FALSE(master_w.equal(master_w.to(at::kBFloat16).to(at::kFloat)));

  {
    torch::NoGradGuard no_grad;
    params[0].second.fill_(0.5);  // a write from outside the step
  }
  const at::Tensor master_b = (*working)->masters()[1].second.clone();
  (*working)->AdoptWrittenWorkingCopies();
  EXPECT_TRUE(master_w.equal(torch::full({3, 5}, 0.5)));
  EXPECT_TRUE((*working)->masters()[1].second.equal(master_b))
      << "only the written parameter's master takes its working copy's rounding";
}

TEST(WorkingParametersTest, MastersGradientsClearedByHandStartAFreshAccumulation) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->InstallHooks(nullptr);
  (params[0].second.sum() * 2).backward();
  (*working)->masters()[0].second.mutable_grad() = at::Tensor();  // zero_grad, not ZeroGrad
  (params[0].second.sum() * 3).backward();
  EXPECT_TRUE((*working)->masters()[0].second.grad().equal(torch::full({3, 5}, 3.0)));
}

TEST(WorkingParametersTest, ExposeHandsOutTheMastersAndRestoreKeepsWhatWasWritten) {
  WorkingParameters::Named params = TwoParameters();
  const at::Tensor w0 = params[0].second.detach().clone();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->InstallHooks(nullptr);
  (*working)->Expose();
  EXPECT_EQ(params[0].second.scalar_type(), at::kFloat);
  EXPECT_TRUE(params[0].second.equal(w0));
  const at::Tensor loaded = torch::randn({3, 5});
  {
    torch::NoGradGuard no_grad;
    params[0].second.copy_(loaded);  // a checkpoint load
  }
  (*working)->Restore();
  EXPECT_EQ(params[0].second.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(params[0].second.equal(loaded.to(at::kBFloat16)));
  EXPECT_TRUE((*working)->masters()[0].second.equal(loaded));
  Loss(params, torch::randn({2, 3})).backward();  // the hooks came back with the dtype
  EXPECT_FALSE(params[0].second.grad().defined());
  EXPECT_TRUE((*working)->masters()[0].second.grad().defined());
}

// The model outlives the engine: destroying the working copies gives it the fp32 masters back
// as its parameters, and a backward afterwards (a second Trainer) runs no hook of theirs.
TEST(WorkingParametersTest, DestroyingThemGivesTheModelItsFp32MastersBack) {
  WorkingParameters::Named params = TwoParameters();
  auto working = WorkingParameters::Create(params);
  ASSERT_TRUE(working.ok()) << working.status();
  (*working)->InstallHooks(nullptr);
  at::Tensor master_w = (*working)->masters()[0].second;
  {
    torch::NoGradGuard no_grad;
    master_w.add_(1e-3);  // a step, not refreshed into the working copy
  }
  const at::Tensor want = master_w.clone();
  working->reset();
  EXPECT_EQ(params[0].second.scalar_type(), at::kFloat);
  EXPECT_TRUE(params[0].second.equal(want));
  (params[0].second.sum() * 2).backward();  // the old hooks are gone with the accumulator
  ASSERT_TRUE(params[0].second.grad().defined()) << "the gradient stays where autograd put it";
  EXPECT_TRUE(params[0].second.grad().equal(torch::full({3, 5}, 2.0)));
}

TEST(WorkingParametersTest, RefusesANonFp32ParameterAndABadOrder) {
  WorkingParameters::Named half = {{"h", torch::zeros({2}, at::kBFloat16).set_requires_grad(true)}};
  auto refused = WorkingParameters::Create(half);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("parameter h is BFloat16"), std::string::npos)
      << refused.status();
  auto bad = WorkingParameters::Create(TwoParameters(), {0, 0});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("order"), std::string::npos) << bad.status();
}

// Parameters a..f; {c, b} and {e, f} want to be side by side in that order; "x" is no parameter
// and {d} alone keeps nothing together.
TEST(WorkingParametersTest, FlatOrderUnitsKeepEachAdjacentSetTogetherInItsOrder) {
  const std::vector<std::string> names = {"a", "b", "c", "d", "e", "f"};
  const std::vector<std::vector<std::string>> sets = {{"c", "b", "x"}, {"d"}, {"e", "f"}};
  using Units = std::vector<std::vector<int>>;
  EXPECT_EQ(FlatOrderUnits(names, sets, /*reversed=*/false), (Units{{0}, {2, 1}, {3}, {4, 5}}));
  // Backward's order: a set sits where the walk from the end first meets it.
  EXPECT_EQ(FlatOrderUnits(names, sets, /*reversed=*/true), (Units{{4, 5}, {3}, {2, 1}, {0}}));
  EXPECT_EQ(FlatOrderUnits(names, {}, /*reversed=*/true),
            (Units{{5}, {4}, {3}, {2}, {1}, {0}}));
  // A name already in a set is not taken by a later one ({b, a} keeps only a: no set).
  EXPECT_EQ(FlatOrderUnits(names, {{"c", "b"}, {"b", "a"}}, /*reversed=*/false),
            (Units{{0}, {2, 1}, {3}, {4}, {5}}));
}

}  // namespace
}  // namespace cpptrain
