// Each fused step against its eager reference: forward values and the gradients of every
// input under a random upstream gradient, fp32 (relative 1e-5) and bf16 (1e-2), on odd shapes.
// The CUDA kernels run where this build has them and a GPU is present (the GPU hosts' CTest);
// elsewhere those tests print SKIPPED, and the CPU tests (the chunked linear cross-entropy,
// the references the fallbacks return) run everywhere.
#include "kernels/fused_ops.h"

#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/linear_cross_entropy.h"

namespace cpptrain {
namespace kernels {
namespace {

// ||a - b|| / ||b|| in double (0 when both are zero).
double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kCPU, at::kDouble);
  const at::Tensor b64 = b.detach().to(at::kCPU, at::kDouble);
  const double denominator = b64.norm().item<double>();
  const double difference = (a64 - b64).norm().item<double>();
  return denominator == 0 ? difference : difference / denominator;
}

// Leaves for two runs of the same function: one copy per run.
std::vector<at::Tensor> Leaves(const std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& v : values) out.push_back(v.detach().clone().requires_grad_(true));
  return out;
}

// Runs `f` on fresh leaves with the upstream gradient `grad_out`; returns the output followed by
// each input's gradient.
std::vector<at::Tensor> ValueAndGrads(
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
    const std::vector<at::Tensor>& inputs, const at::Tensor& grad_out) {
  std::vector<at::Tensor> leaves = Leaves(inputs);
  at::Tensor out = f(leaves);
  (out.to(at::kFloat) * grad_out).sum().backward();
  std::vector<at::Tensor> result = {out.detach()};
  for (const at::Tensor& leaf : leaves) result.push_back(leaf.grad());
  return result;
}

void ExpectClose(const std::vector<at::Tensor>& fused, const std::vector<at::Tensor>& reference,
                 double tolerance, const std::string& what) {
  ASSERT_EQ(fused.size(), reference.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_TRUE(fused[i].defined()) << what << ": output " << i << " undefined";
    EXPECT_FALSE(at::isnan(fused[i]).any().item<bool>()) << what << ": output " << i;
    EXPECT_LT(RelativeError(fused[i], reference[i]), tolerance)
        << what << ": output " << i << " (0 = value, then each input's gradient)";
  }
}

// t's values in a tensor that starts one element into its storage, so that its rows start off
// a 16-byte boundary (contiguous, differentiable).
at::Tensor Misaligned(const at::Tensor& t) {
  return at::cat({t.new_zeros({1}), t.flatten()}).slice(0, 1).view(t.sizes());
}

bool KernelsRunHere() { return CudaKernelsBuilt() && torch::cuda::is_available(); }

#define REQUIRE_KERNELS()                                                         \
  if (!KernelsRunHere()) {                                                        \
    GTEST_SKIP() << "the CUDA kernels need a CUDA build (CMake with nvcc) and a " \
                    "GPU; this machine has "                                      \
                 << (CudaKernelsBuilt() ? "no GPU" : "a build without them");     \
  }

const c10::Device kCuda(c10::kCUDA, 0);

// The rotary tables cos and sin for positions [0, t) and head dim d (theta 10000), [t, d] fp32
// on the GPU.
std::pair<at::Tensor, at::Tensor> RotaryTables(int64_t t, int64_t d) {
  const auto f32 = torch::device(kCuda).dtype(at::kFloat);
  const at::Tensor inv_freq =
      1.0 / torch::pow(10000.0, torch::arange(0, d, 2, f32) / static_cast<double>(d));
  const at::Tensor freqs = torch::outer(torch::arange(t, f32), inv_freq);
  const at::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

// ---- the CUDA kernels (GPU hosts) ----

TEST(FusedOpsTest, RmsNormMatchesReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(1);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {7, 1024}, {4099, 1000}, {33, 128}, {5, 97}, {3, 8192}, {65, 2048}, {9, 3072},
           {17, 4096}}) {
    for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = torch::randn({rows, cols}, torch::device(kCuda)).to(type);
      const at::Tensor w = torch::rand({cols}, torch::device(kCuda)) + 0.5;
      const at::Tensor g = torch::randn({rows, cols}, torch::device(kCuda));
      const double eps = 1e-6;
      auto fused = ValueAndGrads(
          [&](const auto& in) { return RmsNorm(in[0], in[1], eps, type, true); }, {x, w}, g);
      // The reference in double from the same inputs (the dtype rounding of the normalized
      // value is the kernel's, so compare against fp32 math for bf16).
      auto reference = ValueAndGrads(
          [&](const auto& in) { return RmsNormReference(in[0], in[1], eps); },
          {x.to(type == at::kFloat ? at::kDouble : at::kFloat), w.to(at::kDouble)}, g);
      ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                  "RMSNorm " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                      c10::toString(type));
    }
  }
}

// {y, x again} with both outputs' gradients: the kernel's dx adds x_again's gradient, so x's
// gradient must equal the reference norm's plus that gradient (both paths of the kernel, fp32
// and bf16). And with only one output used, the other's gradient is absent, not zero-filled.
TEST(FusedOpsTest, RmsNormAndResidualAddsTheResidualGradient) {
  REQUIRE_KERNELS();
  torch::manual_seed(10);
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{65, 2048}, {9, 1000}, {4099, 1024}}) {
    for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = torch::randn({rows, cols}, torch::device(kCuda)).to(type);
      const at::Tensor w = torch::rand({cols}, torch::device(kCuda)) + 0.5;
      const at::Tensor g = torch::randn({2, rows, cols}, torch::device(kCuda));
      const double eps = 1e-6;
      // Both outputs stacked in fp32, so one upstream gradient reaches each.
      auto fused = ValueAndGrads(
          [&](const auto& in) {
            const auto [y, again] = RmsNormAndResidual(in[0], in[1], eps, type, true);
            EXPECT_TRUE(again.equal(in[0]));
            return at::stack({y.to(at::kFloat), again.to(at::kFloat)});
          },
          {x, w}, g);
      auto reference = ValueAndGrads(
          [&](const auto& in) {
            return at::stack({RmsNormReference(in[0], in[1], eps).to(at::kFloat),
                              in[0].to(at::kFloat)});
          },
          {x.to(type == at::kFloat ? at::kDouble : at::kFloat), w.to(at::kDouble)}, g);
      ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                  "RMSNorm and residual " + std::to_string(rows) + "x" + std::to_string(cols) +
                      " " + c10::toString(type));
    }
  }
  const at::Tensor x = torch::randn({5, 64}, torch::device(kCuda)).requires_grad_(true);
  const at::Tensor w = (torch::rand({64}, torch::device(kCuda)) + 0.5).requires_grad_(true);
  auto [y, again] = RmsNormAndResidual(x, w, 1e-6, at::kFloat, true);
  static_cast<void>(y);
  (again * 3).sum().backward();  // the norm unused: x's gradient is 3, w gets none
  EXPECT_TRUE(x.grad().equal(torch::full_like(x, 3)));
  EXPECT_FALSE(w.grad().defined());
}

// The RMSNorm kernels' two paths at the decoder's shapes: 16-byte accesses (cols a multiple of
// 8, aligned rows: 1024, 2048, 3072) and one value per access (1000, 1023, or rows that start
// off a 16-byte boundary); rows not a multiple of a block's rows; x in fp32 with a bf16 output
// (the backward then reads bf16 dy beside fp32 x).
TEST(FusedOpsTest, RmsNormVectorAndScalarPathsMatchReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(9);
  struct Case {
    int64_t rows, cols;
    at::ScalarType x_type, out_type;
    bool misaligned;
  };
  const at::ScalarType f32 = at::kFloat, bf16 = at::kBFloat16;
  for (const Case& c : {Case{8193, 2048, bf16, bf16, false}, Case{8192, 1024, bf16, bf16, false},
                        Case{1027, 3072, bf16, bf16, false}, Case{513, 1023, bf16, bf16, false},
                        Case{777, 1000, f32, f32, false}, Case{301, 2048, f32, bf16, false},
                        Case{129, 2048, bf16, bf16, true}, Case{67, 3072, f32, f32, true}}) {
    const at::Tensor x = torch::randn({c.rows, c.cols}, torch::device(kCuda)).to(c.x_type);
    const at::Tensor w = torch::rand({c.cols}, torch::device(kCuda)) + 0.5;
    const at::Tensor g = torch::randn({c.rows, c.cols}, torch::device(kCuda));
    auto run_fused = [&](const std::vector<at::Tensor>& in) {
      return RmsNorm(c.misaligned ? Misaligned(in[0]) : in[0], in[1], 1e-6, c.out_type, true);
    };
    auto fused = ValueAndGrads(run_fused, {x, w}, g);
    auto reference =
        ValueAndGrads([&](const auto& in) { return RmsNormReference(in[0], in[1], 1e-6); },
                      {x.to(c.x_type == f32 ? at::kDouble : at::kFloat), w.to(at::kDouble)}, g);
    const bool exact = c.x_type == f32 && c.out_type == f32;
    ExpectClose(fused, reference, exact ? 1e-5 : 1e-2,
                "RMSNorm " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
                    c10::toString(c.x_type) + " -> " + c10::toString(c.out_type) +
                    (c.misaligned ? " misaligned" : ""));
    // The weight gradient is summed without atomics: the same bits on every run.
    auto again = ValueAndGrads(run_fused, {x, w}, g);
    EXPECT_TRUE(again[2].equal(fused[2])) << c.rows << "x" << c.cols << ": dweight changed";
  }
}

// SwiGLU and GeGLU (tanh GELU, Gemma's) against their references in double.
TEST(FusedOpsTest, SwiGluAndGeGluMatchReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(2);
  for (const bool gelu : {false, true}) {
    // Rows of several values: the backward writes dgate and dup side by side, one row of each
    // per row of 2 * cols (1001 columns: the one-value path; 3072: the vector path).
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{1}, {1001}, {257 * 3072}, {3, 1001}, {4, 3072}, {2, 5, 3072}}) {
      const std::string n = c10::str(at::IntArrayRef(shape));
      for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
        const at::Tensor gate = (3 * torch::randn(shape, torch::device(kCuda))).to(type);
        const at::Tensor up = torch::randn(shape, torch::device(kCuda)).to(type);
        const at::Tensor g = torch::randn(shape, torch::device(kCuda));
        auto fused = ValueAndGrads(
            [&](const auto& in) {
              return gelu ? GeGlu(in[0], in[1], true) : SwiGlu(in[0], in[1], true);
            },
            {gate, up}, g);
        auto reference = ValueAndGrads(
            [&](const auto& in) {
              return gelu ? GeGluReference(in[0], in[1]) : SwiGluReference(in[0], in[1]);
            },
            {gate.to(at::kDouble), up.to(at::kDouble)}, g);
        ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                    std::string(gelu ? "GeGLU" : "SwiGLU") + " " + n + " " +
                        c10::toString(type));
      }
    }
  }
}

// The backward that writes the product again (models/gated_down.h): its product is the forward
// kernel's bit for bit, written over dout; dgate and dup are those of SwiGlu's (GeGlu's) own
// backward bit for bit, side by side in one buffer. Aligned and misaligned rows.
TEST(FusedOpsTest, GatedBackwardRecomputingWritesTheForwardsProduct) {
  REQUIRE_KERNELS();
  torch::manual_seed(12);
  for (const bool gelu : {false, true}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 1001}, {4, 3072}}) {
      for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
        for (const bool misaligned : {false, true}) {
          const std::string n = std::string(gelu ? "GeGLU " : "SwiGLU ") +
                                c10::str(at::IntArrayRef(shape)) + " " + c10::toString(type) +
                                (misaligned ? " misaligned" : "");
          auto make = [&](double scale) {
            const at::Tensor t = (scale * torch::randn(shape, torch::device(kCuda))).to(type);
            return misaligned ? Misaligned(t) : t;
          };
          const at::Tensor gate = make(3).requires_grad_(), up = make(1).requires_grad_();
          const at::Tensor dout = make(1);
          const at::Tensor out = gelu ? GeGlu(gate, up, true) : SwiGlu(gate, up, true);
          const auto want = torch::autograd::grad({out}, {gate, up}, {dout});
          const at::Tensor scratch = misaligned ? Misaligned(dout) : dout.clone();
          const GatedGradients got =
              GatedBackwardRecomputing(gate.detach(), up.detach(), scratch, gelu, true);
          EXPECT_TRUE(got.product.equal(out.detach())) << n;
          EXPECT_EQ(got.product.data_ptr(), scratch.data_ptr()) << n << ": not written over dout";
          EXPECT_TRUE(got.dgate.equal(want[0])) << n;
          EXPECT_TRUE(got.dup.equal(want[1])) << n;
          EXPECT_EQ(got.dup.data_ptr(),
                    static_cast<char*>(got.dgate.data_ptr()) + shape[1] * got.dgate.element_size())
              << n << ": dgate and dup not side by side";
        }
      }
    }
  }
}

TEST(FusedOpsTest, QkNormRopeMatchesReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(3);
  struct Shape {
    int64_t b, t, h, d;
    bool unaligned = false;  // x one element past its memory's start: no whole-word loads
  };
  // Head dims 64, 96, 128 and 256 take the register-chunk kernels; 80 and 192 the general ones
  // (192: the general backward's 16-columns-a-lane instance).
  for (const Shape& s : {Shape{2, 33, 3, 128}, Shape{1, 17, 5, 96}, Shape{3, 9, 2, 64},
                         Shape{1, 2048, 16, 128}, Shape{2, 37, 3, 64}, Shape{4, 2048, 8, 128},
                         Shape{2, 33, 3, 256}, Shape{2, 19, 3, 80}, Shape{1, 11, 2, 192},
                         Shape{2, 33, 3, 128, true}, Shape{1, 7, 2, 64, true}}) {
    const std::pair<at::Tensor, at::Tensor> tables = RotaryTables(s.t, s.d);
    const at::Tensor &cos = tables.first, &sin = tables.second;
    for (const bool norm : {true, false}) {
      for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
        const at::Tensor x = torch::randn({s.b, s.t, s.h, s.d}, torch::device(kCuda)).to(type);
        const at::Tensor w = norm ? torch::rand({s.d}, torch::device(kCuda)) + 0.5 : at::Tensor();
        const at::Tensor g = torch::randn({s.b, s.h, s.t, s.d}, torch::device(kCuda));
        std::vector<at::Tensor> inputs = {x};
        if (norm) inputs.push_back(w);
        auto run = [&](bool fused, const std::vector<at::Tensor>& in) {
          const at::Tensor weight = norm ? in[1] : at::Tensor();
          at::Tensor input = in[0];
          if (fused && s.unaligned) {  // the same values one element past their memory's start
            input = at::cat({input.new_zeros({1}), input.flatten()}).narrow(0, 1, x.numel());
            input = input.view(x.sizes());
          }
          return fused ? QkNormRope(input, weight, 1e-6, cos, sin, type, true)
                       : QkNormRopeReference(in[0], weight, 1e-6, cos.to(in[0].scalar_type()),
                                             sin.to(in[0].scalar_type()), in[0].scalar_type());
        };
        auto fused = ValueAndGrads([&](const auto& in) { return run(true, in); }, inputs, g);
        // x's memory order: SDPA then writes its output in it, and o_proj's input is a view.
        EXPECT_TRUE(run(true, inputs).transpose(1, 2).is_contiguous());
        std::vector<at::Tensor> wide = {x.to(type == at::kFloat ? at::kDouble : at::kFloat)};
        if (norm) wide.push_back(w.to(at::kDouble));
        auto reference = ValueAndGrads([&](const auto& in) { return run(false, in); }, wide, g);
        ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                    "QK-norm + rotary d=" + std::to_string(s.d) + (norm ? " norm " : " no norm ") +
                        c10::toString(type));
      }
    }
  }
}

// QkvNormRope against two QkNormRope calls and v passed through: the same bits forward and
// backward (its backward writes q's and k's gradients into one buffer at that buffer's pitch and
// copies v's beside them), on the register-chunk kernels (head dims 64, 128) and the general ones
// (80), the chunk kernels' one-value path (96: no word divides a lane's 3 values), one token
// (T = 1, whose dimension's stride LibTorch may leave arbitrary), with and without the norm,
// GQA included.
TEST(FusedOpsTest, QkvNormRopeEqualsTwoQkNormRopes) {
  REQUIRE_KERNELS();
  torch::manual_seed(4);
  struct Shape {
    int64_t b, t, hq, hkv, d;
  };
  for (const Shape& s : {Shape{2, 33, 4, 2, 128}, Shape{1, 17, 3, 1, 64}, Shape{2, 19, 2, 2, 80},
                         Shape{2, 7, 2, 1, 96}, Shape{3, 1, 4, 2, 128}}) {
    const auto f32 = torch::device(kCuda).dtype(at::kFloat);
    const std::pair<at::Tensor, at::Tensor> tables = RotaryTables(s.t, s.d);
    const at::Tensor &cos = tables.first, &sin = tables.second;
    const std::vector<at::Tensor> grads = {torch::randn({s.b, s.hq, s.t, s.d}, f32),
                                           torch::randn({s.b, s.hkv, s.t, s.d}, f32),
                                           torch::randn({s.b, s.hkv, s.t, s.d}, f32)};
    for (const bool norm : {true, false}) {
      for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
        const std::vector<at::Tensor> inputs = {
            torch::randn({s.b, s.t, s.hq, s.d}, f32).to(type),
            torch::randn({s.b, s.t, s.hkv, s.d}, f32).to(type),
            torch::randn({s.b, s.hkv, s.t, s.d}, f32).to(type), torch::rand({s.d}, f32) + 0.5,
            torch::rand({s.d}, f32) + 0.5};
        // The three outputs, then the gradients of q, k, v and (with the norm) both weights.
        auto run = [&](bool together) {
          std::vector<at::Tensor> in = Leaves(inputs);
          const at::Tensor wq = norm ? in[3] : at::Tensor(), wk = norm ? in[4] : at::Tensor();
          std::vector<at::Tensor> out(3);
          if (together) {
            std::tie(out[0], out[1], out[2]) =
                QkvNormRope(in[0], in[1], in[2], wq, wk, 1e-6, cos, sin, type, true);
          } else {
            out = {QkNormRope(in[0], wq, 1e-6, cos, sin, type, true),
                   QkNormRope(in[1], wk, 1e-6, cos, sin, type, true), in[2]};
          }
          at::Tensor loss = torch::zeros({}, f32);
          for (size_t i = 0; i < 3; ++i) loss = loss + (out[i].to(at::kFloat) * grads[i]).sum();
          loss.backward();
          std::vector<at::Tensor> result;
          for (const at::Tensor& o : out) result.push_back(o.detach());
          for (size_t i = 0; i < (norm ? 5u : 3u); ++i) result.push_back(in[i].grad());
          return result;
        };
        const std::vector<at::Tensor> together = run(true), apart = run(false);
        const std::string what = "d=" + std::to_string(s.d) + (norm ? " norm " : " no norm ") +
                                 c10::toString(type);
        ASSERT_EQ(together.size(), apart.size()) << what;
        for (size_t i = 0; i < apart.size(); ++i) {
          ASSERT_TRUE(together[i].defined() && apart[i].defined()) << what << ": " << i;
          EXPECT_TRUE(together[i].equal(apart[i])) << what << ": output or gradient " << i;
        }
      }
    }
  }
}

TEST(FusedOpsTest, LinearCrossEntropyMatchesReferenceOnTheGpu) {
  REQUIRE_KERNELS();
  torch::manual_seed(4);
  const int64_t hidden = 256;
  // 50257: the row kernel's one-value path; the others its 16-byte path, up to rows longer than
  // any vocabulary here (151936 is Qwen's). Softcap 0: none; 1.5: Gemma 2's final cap, small
  // enough against these logits (|z| up to about 4) to bend most.
  for (const int64_t vocab : {int64_t{50257}, int64_t{50304}, int64_t{100008}, int64_t{151936},
                              int64_t{256000}, int64_t{819200}}) {
    const int64_t rows = vocab > 100000 ? 300 : 1000;
    at::Tensor targets = torch::randint(vocab, {rows}, torch::device(kCuda).dtype(at::kLong));
    targets.slice(0, 0, 100).fill_(-100);
    for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      for (const double softcap : {0.0, 1.5}) {
        const at::Tensor h = torch::randn({rows, hidden}, torch::device(kCuda));
        const at::Tensor w = 0.05 * torch::randn({vocab, hidden}, torch::device(kCuda));
        const at::Tensor one = torch::ones({}, torch::device(kCuda));
        auto fused = ValueAndGrads(
            [&](const auto& in) {
              return LinearCrossEntropySum(in[0], in[1], targets, -100, type, /*chunk_rows=*/300,
                                           softcap);
            },
            {h, w}, one);
        auto reference = ValueAndGrads(
            [&](const auto& in) {
              // fp32 logits for the reference under a cap: the fused kernel caps in fp32.
              return LinearCrossEntropySumReference(
                  in[0], in[1], targets, -100, softcap > 0 ? at::kFloat : type, softcap);
            },
            {h, w}, one);
        ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                    "linear cross-entropy vocab " + std::to_string(vocab) + " " +
                        c10::toString(type) + " softcap " + std::to_string(softcap));
      }
    }
  }
}

// Gemma 2's soft-capped attention softmax against its eager reference in double: causal and
// windowed, capped and not, rows the 16-byte path takes (T = 64) and rows it does not (T = 37).
TEST(FusedOpsTest, SoftcapSoftmaxMatchesReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(10);
  for (const int64_t t : {int64_t{1}, int64_t{37}, int64_t{64}, int64_t{1024}}) {
    for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
      for (const auto& [softcap, window] : {std::pair{2.0, int64_t{0}}, std::pair{50.0, int64_t{5}},
                                            std::pair{0.0, int64_t{0}}}) {
        const double scale = 0.3;
        const at::Tensor scores = (8 * torch::randn({2, 3, t, t}, torch::device(kCuda))).to(type);
        const at::Tensor g = torch::randn({2, 3, t, t}, torch::device(kCuda));
        auto fused = ValueAndGrads(
            [&](const auto& in) { return SoftcapSoftmax(in[0], scale, softcap, window, true); },
            {scores}, g);
        auto reference = ValueAndGrads(
            [&](const auto& in) { return SoftcapSoftmaxReference(in[0], scale, softcap, window); },
            {scores.to(at::kDouble)}, g);
        ExpectClose(fused, reference, type == at::kFloat ? 1e-5 : 1e-2,
                    "soft-capped softmax T=" + std::to_string(t) + " " + c10::toString(type) +
                        " softcap " + std::to_string(softcap) + " window " +
                        std::to_string(window));
      }
    }
  }
}

TEST(FusedOpsTest, ResidualAddMatchesReference) {
  REQUIRE_KERNELS();
  torch::manual_seed(8);
  for (const int64_t n : {int64_t{3}, int64_t{1025}, int64_t{8192 * 1024 + 2}}) {
    for (const at::ScalarType delta_type : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = torch::randn({n}, torch::device(kCuda));
      const at::Tensor d = torch::randn({n}, torch::device(kCuda)).to(delta_type);
      const at::Tensor g = torch::randn({n}, torch::device(kCuda));
      auto fused =
          ValueAndGrads([](const auto& in) { return ResidualAdd(in[0], in[1], true); }, {x, d}, g);
      auto reference = ValueAndGrads([](const auto& in) { return in[0] + in[1]; }, {x, d}, g);
      ExpectClose(fused, reference, 1e-6, "residual add n=" + std::to_string(n));
      EXPECT_EQ(fused[2].scalar_type(), delta_type);
    }
  }
}

// The kernel must give mul_out's values bit for bit: the same fp32 product, rounded once. Sizes
// with and without a tail of fewer than four, a view off the 16-byte alignment (the scalar
// path), and a scale that is not a power of two.
TEST(FusedOpsTest, ScaledCopyEqualsMulOut) {
  REQUIRE_KERNELS();
  torch::manual_seed(9);
  const at::Tensor scale = torch::full({}, 1.0 / 3000.0, torch::device(kCuda));
  for (const int64_t n : {int64_t{1}, int64_t{4099}, int64_t{8192 * 1024}}) {
    const at::Tensor buffer = torch::randn({n + 1}, torch::device(kCuda)) * 100;
    for (const at::Tensor& x : {buffer.narrow(0, 0, n), buffer.narrow(0, 1, n)}) {
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " offset " << x.storage_offset() << " "
                                        << dtype);
        const at::Tensor fused = ScaledCopy(x, scale, dtype);
        ASSERT_TRUE(fused.defined());
        at::Tensor reference = at::empty(x.sizes(), x.options().dtype(dtype));
        at::mul_out(reference, x, scale);
        EXPECT_EQ(fused.scalar_type(), dtype);
        EXPECT_TRUE(fused.equal(reference));
      }
    }
  }
  // Where it does not apply it says so by an undefined result.
  EXPECT_FALSE(ScaledCopy(torch::randn({4}, torch::device(kCuda)).to(at::kBFloat16), scale,
                          at::kFloat)
                   .defined());
}

// 10 words: the one-value path; 16 (fp32): the 16-byte path. A row with a whole vector of NaN
// has a NaN loss on both, with the gradient and without.
TEST(FusedOpsTest, CrossEntropyRowsMarksTargetsOutsideTheVocabulary) {
  REQUIRE_KERNELS();
  for (const int64_t vocab : {int64_t{10}, int64_t{16}}) {
    for (const bool write_grad : {false, true}) {
      const at::Tensor original = torch::randn({4, vocab}, torch::device(kCuda));
      original[3].slice(0, 4, 8).fill_(std::nan(""));  // one whole 16-byte vector
      at::Tensor logits = original.clone();
      const at::Tensor targets = torch::tensor({int64_t{1}, int64_t{-100}, vocab, int64_t{0}},
                                               torch::device(kCuda).dtype(at::kLong));
      const at::Tensor loss = CrossEntropyRowsInPlace(logits, targets, -100, write_grad).cpu();
      const std::string where =
          "vocab " + std::to_string(vocab) + (write_grad ? " with the gradient" : "");
      EXPECT_NEAR(loss[0].item<float>(),
                  (torch::logsumexp(original[0], 0) - original[0][1]).item<float>(), 1e-5)
          << where;
      EXPECT_EQ(loss[1].item<float>(), 0.f) << where;
      EXPECT_TRUE(std::isnan(loss[2].item<float>())) << where << ": a target past the vocabulary";
      EXPECT_TRUE(std::isnan(loss[3].item<float>())) << where << ": NaN logits";
      if (write_grad) {
        const at::Tensor want = torch::softmax(original[0], 0) -
                                torch::one_hot(torch::tensor(int64_t{1}), vocab).to(kCuda);
        EXPECT_TRUE(torch::allclose(logits[0], want, 1e-5, 1e-6)) << where;
        EXPECT_TRUE(torch::equal(logits[1], torch::zeros_like(logits[1]))) << where;
      }
    }
  }
}

// ---- everywhere ----

// The fused head + loss in fp32 (chunk_rows, softcap), and the eager one in double, with their
// gradients under the upstream `scale`.
std::vector<at::Tensor> Fp32Head(const at::Tensor& h, const at::Tensor& w,
                                 const at::Tensor& targets, const at::Tensor& scale,
                                 int64_t chunk, double softcap = 0.0) {
  return ValueAndGrads(
      [&](const auto& in) {
        return LinearCrossEntropySum(in[0], in[1], targets, -100, at::kFloat, chunk, softcap);
      },
      {h, w}, scale);
}
std::vector<at::Tensor> DoubleReferenceHead(const at::Tensor& h, const at::Tensor& w,
                                            const at::Tensor& targets, const at::Tensor& scale,
                                            double softcap = 0.0) {
  return ValueAndGrads(
      [&](const auto& in) {
        return LinearCrossEntropySumReference(in[0], in[1], targets, -100, at::kDouble, softcap);
      },
      {h.to(at::kDouble), w.to(at::kDouble)}, scale);
}

TEST(FusedOpsTest, LinearCrossEntropyMatchesReferenceFp32) {
  torch::manual_seed(5);
  const int64_t rows = 37, hidden = 16, vocab = 1001;
  at::Tensor targets = torch::randint(vocab, {rows}, at::kLong);
  targets.slice(0, 3, 9).fill_(-100);
  const at::Tensor h = torch::randn({rows, hidden});
  const at::Tensor w = 0.3 * torch::randn({vocab, hidden});
  const at::Tensor scale = torch::full({}, 0.25);
  const auto reference = DoubleReferenceHead(h, w, targets, scale);
  for (const int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{8}, int64_t{37}, int64_t{100}}) {
    ExpectClose(Fp32Head(h, w, targets, scale, chunk), reference, 1e-5,
                "chunk_rows " + std::to_string(chunk));
  }
}

// Gemma 2's final soft-capping inside the chunks, against the eager cap in double; and the cap
// must change the loss and gradients (a cap ignored would pass the comparison otherwise only if
// the logits never reached it, so these do: |z| up to about 6 against a cap of 2).
TEST(FusedOpsTest, LinearCrossEntropyWithASoftcapMatchesTheEagerCap) {
  torch::manual_seed(9);
  const int64_t rows = 23, hidden = 16, vocab = 301;
  at::Tensor targets = torch::randint(vocab, {rows}, at::kLong);
  targets.slice(0, 2, 5).fill_(-100);
  const at::Tensor h = torch::randn({rows, hidden});
  const at::Tensor w = 0.5 * torch::randn({vocab, hidden});
  const at::Tensor scale = torch::full({}, 0.7);
  const double softcap = 2.0;
  const auto reference = DoubleReferenceHead(h, w, targets, scale, softcap);
  for (const int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{23}}) {
    ExpectClose(Fp32Head(h, w, targets, scale, chunk, softcap), reference, 1e-5,
                "softcap, chunk_rows " + std::to_string(chunk));
  }
  const auto uncapped = DoubleReferenceHead(h, w, targets, scale);
  for (size_t i = 0; i < uncapped.size(); ++i) {
    EXPECT_GT(RelativeError(uncapped[i], reference[i]), 0.05) << "output " << i;
  }
}

TEST(FusedOpsTest, LinearCrossEntropyUnderBf16MatchesTheEagerHead) {
  torch::manual_seed(6);
  const int64_t rows = 29, hidden = 32, vocab = 517;
  const at::Tensor targets = torch::randint(vocab, {rows}, at::kLong);
  const at::Tensor h = torch::randn({rows, hidden});
  const at::Tensor w = 0.2 * torch::randn({vocab, hidden});
  const at::Tensor one = torch::ones({});
  AutocastGuard autocast(at::kCPU, at::kBFloat16);
  auto fused = ValueAndGrads(
      [&](const auto& in) {
        return LinearCrossEntropySum(in[0], in[1], targets, -100, at::kBFloat16, 10);
      },
      {h, w}, one);
  auto reference = ValueAndGrads(
      [&](const auto& in) {
        return LinearCrossEntropySumReference(in[0], in[1], targets, -100, at::kBFloat16);
      },
      {h, w}, one);
  ExpectClose(fused, reference, 1e-2, "bf16 autocast");
  EXPECT_EQ(fused[1].scalar_type(), at::kFloat) << "gradients come back in the inputs' dtype";
}

// Σ(a·b) / Σ(b·b): the scale that maps `b` onto `a` best. A gradient scaled by a rounded loss
// scale is off by the rounding whatever its elements' noise, which this exposes.
double FittedScale(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
  return (a64 * b64).sum().item<double>() / (b64 * b64).sum().item<double>();
}

// bf16 inputs under an upstream gradient of 1/3 (bf16 rounds it to 0.333984375, 2^-9 high):
// the gradients scale in fp32, so their fitted scale against a third of the gradients under an
// upstream 1 is 1 to well under that rounding; they equal the eager bf16 head's under the same
// 1/3; a second backward through the same graph adds the same gradients again, and a third
// finds them released. (Not against an fp32 head: on a CPU without AVX-512 (an AVX2 AMD EPYC,
// 2026-12-06), LibTorch 1.13's bf16 GEMM accumulates in bf16 unless its second operand is
// transposed, 3% off fp32 over 700 terms and biased low, in the eager head as in this one.)
TEST(FusedOpsTest, LinearCrossEntropyScalesBf16GradientsInFp32) {
  torch::manual_seed(9);
  const int64_t rows = 64, hidden = 96, vocab = 700;
  const at::Tensor targets = torch::randint(vocab, {rows}, at::kLong);
  const at::Tensor h = torch::randn({rows, hidden}).to(at::kBFloat16);
  const at::Tensor w = (0.1 * torch::randn({vocab, hidden})).to(at::kBFloat16);
  const auto fused_head = [&](const auto& in) {
    return LinearCrossEntropySum(in[0], in[1], targets, -100, at::kBFloat16, 16);
  };
  auto third = ValueAndGrads(fused_head, {h, w}, torch::full({}, 1.0 / 3));
  auto one = ValueAndGrads(fused_head, {h, w}, torch::ones({}));
  auto eager = ValueAndGrads(
      [&](const auto& in) {
        return LinearCrossEntropySumReference(in[0], in[1], targets, -100, at::kBFloat16);
      },
      {h, w}, torch::full({}, 1.0 / 3));
  for (int i = 1; i <= 2; ++i) {
    const char* what = i == 1 ? "dhidden" : "dweight";
    EXPECT_EQ(third[i].scalar_type(), at::kBFloat16);
    EXPECT_NEAR(FittedScale(third[i], one[i].to(at::kDouble) / 3), 1.0, 4e-4)
        << what << ": 2^-9 = 1.95e-3 would be the rounded scale";
    // On such a CPU both accumulate their products in bf16, each from its own operands (this
    // one's unscaled, the eager head's scaled): dhidden 1.9% apart there.
    EXPECT_LT(RelativeError(third[i], eager[i]), 3e-2) << what;
  }

  std::vector<at::Tensor> leaves = Leaves({h, w});
  const at::Tensor loss =
      LinearCrossEntropySum(leaves[0], leaves[1], targets, -100, at::kBFloat16, 16) / 3;
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor once_h = leaves[0].grad().clone(), once_w = leaves[1].grad().clone();
  leaves[0].mutable_grad().zero_();
  leaves[1].mutable_grad().zero_();
  loss.backward();
  EXPECT_TRUE(leaves[0].grad().equal(once_h)) << "the second backward scaled twice";
  EXPECT_TRUE(leaves[1].grad().equal(once_w)) << "the second backward scaled twice";
  // That backward did not retain the graph, so the saved fp32 gradients are gone.
  EXPECT_THROW(loss.backward(), c10::Error) << "the saved gradients outlived the backward";
}

TEST(FusedOpsTest, LinearCrossEntropyWithoutGradientsAndWithNothingCounted) {
  const at::Tensor h = torch::randn({6, 4});
  const at::Tensor w = torch::randn({11, 4});
  const at::Tensor targets = torch::tensor({1, 2, -100, 4, 5, 10}, at::kLong);
  at::Tensor no_grad;
  {
    torch::NoGradGuard guard;
    no_grad = LinearCrossEntropySum(h, w, targets, -100, at::kFloat, 4);
  }
  const at::Tensor reference = LinearCrossEntropySumReference(h, w, targets, -100, at::kFloat);
  EXPECT_LT(RelativeError(no_grad, reference), 1e-6);

  auto leaves = Leaves({h, w});
  const at::Tensor none = torch::full({6}, -100, at::kLong);
  at::Tensor loss = LinearCrossEntropySum(leaves[0], leaves[1], none, -100, at::kFloat, 4);
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.f);
  EXPECT_EQ(leaves[0].grad().abs().max().item<float>(), 0.f);
  EXPECT_EQ(leaves[1].grad().abs().max().item<float>(), 0.f);

  // No rows at all: no chunk writes the gradients, which must still be zeros, not whatever
  // uninitialized memory held.
  auto empty = Leaves({torch::randn({0, 4}), w});
  loss = LinearCrossEntropySum(empty[0], empty[1], torch::zeros({0}, at::kLong), -100, at::kFloat,
                               4);
  loss.backward();
  EXPECT_EQ(loss.item<float>(), 0.f);
  EXPECT_EQ(empty[0].grad().numel(), 0);
  EXPECT_EQ(empty[1].grad().abs().max().item<float>(), 0.f);
}

TEST(FusedOpsTest, WithoutKernelsTheFusedEntryPointsReturnTheReferences) {
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({2, 5, 3, 8});
  const at::Tensor w = torch::rand({8}) + 0.5;
  const at::Tensor emb = torch::randn({5, 8});
  EXPECT_TRUE(RmsNorm(x, w, 1e-6, at::kBFloat16, true).equal(RmsNormReference(x, w, 1e-6)));
  EXPECT_TRUE(SwiGlu(x, x * 2, true).equal(SwiGluReference(x, x * 2)));
  EXPECT_TRUE(GeGlu(x, x * 2, true).equal(GeGluReference(x, x * 2)));
  EXPECT_FALSE(GeGlu(x, x * 2, true).equal(SwiGlu(x, x * 2, true)));
  const at::Tensor scores = torch::randn({2, 3, 5, 5});
  EXPECT_TRUE(SoftcapSoftmax(scores, 0.5, 2.0, 2, true)
                  .equal(SoftcapSoftmaxReference(scores, 0.5, 2.0, 2)));
  EXPECT_TRUE(QkNormRope(x, w, 1e-6, emb.cos(), emb.sin(), at::kFloat, true)
                  .equal(QkNormRopeReference(x, w, 1e-6, emb.cos(), emb.sin(), at::kFloat)));
  const at::Tensor v = x.transpose(1, 2);
  const auto qkv = QkvNormRope(x, x * 2, v, w, w, 1e-6, emb.cos(), emb.sin(), at::kFloat, true);
  EXPECT_TRUE(std::get<0>(qkv).equal(
      QkNormRopeReference(x, w, 1e-6, emb.cos(), emb.sin(), at::kFloat)));
  EXPECT_TRUE(std::get<1>(qkv).equal(
      QkNormRopeReference(x * 2, w, 1e-6, emb.cos(), emb.sin(), at::kFloat)));
  EXPECT_TRUE(std::get<2>(qkv).is_same(v));
  EXPECT_FALSE(ScaledCopy(x, torch::ones({}), at::kBFloat16).defined());  // the CPU
}

// The recomputing backward's reference is autograd's backward of SwiGluReference
// (GeGluReference), and the CPU takes it whatever `fused` says, leaving dout as it was.
TEST(FusedOpsTest, GatedBackwardRecomputingReferenceIsAutogradsBackward) {
  torch::manual_seed(13);
  for (const bool gelu : {false, true}) {
    const at::Tensor gate = (3 * torch::randn({5, 7})).requires_grad_();
    const at::Tensor up = torch::randn({5, 7}).requires_grad_();
    const at::Tensor dout = torch::randn({5, 7});
    const at::Tensor out = gelu ? GeGluReference(gate, up) : SwiGluReference(gate, up);
    const auto want = torch::autograd::grad({out}, {gate, up}, {dout});
    const at::Tensor scratch = dout.clone();
    const GatedGradients got =
        GatedBackwardRecomputing(gate.detach(), up.detach(), scratch, gelu, true);
    const std::string n = gelu ? "GeGLU" : "SwiGLU";
    EXPECT_TRUE(got.product.equal(out.detach())) << n;
    EXPECT_TRUE(got.dgate.equal(want[0])) << n;
    EXPECT_TRUE(got.dup.equal(want[1])) << n;
    EXPECT_TRUE(scratch.equal(dout)) << n;
  }
}

// Rectangular scores have no defined query-to-key alignment here: refused, naming the shape,
// on the CPU and (where there is one) on the GPU, fused or not.
TEST(FusedOpsTest, SoftcapSoftmaxRefusesScoresThatAreNotSquare) {
  std::vector<at::Tensor> cases = {torch::randn({1, 2, 3, 5})};
  if (torch::cuda::is_available()) cases.push_back(cases[0].to(kCuda));
  for (const at::Tensor& scores : cases) {
    for (const bool fused : {false, true}) {
      try {
        SoftcapSoftmax(scores, 0.5, 2.0, 0, fused);
        ADD_FAILURE() << "rectangular scores were accepted on " << scores.device();
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("square"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("[1, 2, 3, 5]"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace cpptrain
