// CUDA kernels for the decoder's memory-bound steps (kernels/launchers.h says what each
// computes). All arithmetic is fp32; inputs and outputs are fp32 or bf16. Built for sm_90 by
// CMake on GPU hosts; tools/nvcc_check.sh compiles this file wherever nvcc is installed (CI).
//
// Layout of the RMSNorm kernels: a team of threads per row, 16-byte accesses where the shape
// allows ("row layout" below). The QK-norm kernels: one warp per row (one head), eight warps
// per block; a lane walks the row in steps of 32, so a warp's loads are coalesced. Backward
// kernels run a grid-stride loop over rows, each block writing its partial weight gradient to
// its own row of a workspace, which a second kernel sums ("weight gradients in two stages").
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/launchers.h"

namespace cpptrain {
namespace kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = kWarp * kWarpsPerBlock;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16(v);
}

// `v` rounded to T, as the eager norm rounds the normalized value to the input's dtype.
template <typename T>
__device__ __forceinline__ float RoundTo(float v);
template <>
__device__ __forceinline__ float RoundTo<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float RoundTo<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// 16-byte vectors: kVec<T> values per load or store.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

__device__ __forceinline__ void LoadVec(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
__device__ __forceinline__ void LoadVec(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&q);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(pairs[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void StoreVec(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void StoreVec(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 q;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&q);
#pragma unroll
  for (int k = 0; k < 4; ++k) pairs[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p) = q;
}

// Four values at p in one store: 16 bytes of fp32 or 8 of bf16 (p aligned to that).
__device__ __forceinline__ void StoreFour(float* p, const float (&v)[4]) { StoreVec(p, v); }
__device__ __forceinline__ void StoreFour(__nv_bfloat16* p, const float (&v)[4]) {
  uint2 q;
  *reinterpret_cast<__nv_bfloat162*>(&q.x) = __floats2bfloat162_rn(v[0], v[1]);
  *reinterpret_cast<__nv_bfloat162*>(&q.y) = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) = q;
}

bool Aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Whether every pointer is 16-byte aligned and n a multiple of the vector width.
template <typename T>
bool Vectorizable(int64_t n, std::initializer_list<const void*> pointers) {
  return n % kVec<T> == 0 && Aligned16(pointers);
}

// kWidth values at p: one 16-byte vector (kVector, kWidth == kVec<T>) or one value.
template <bool kVector, typename T, int kWidth>
__device__ __forceinline__ void LoadRun(const T* p, float (&v)[kWidth]) {
  if constexpr (kVector) {
    LoadVec(p, v);
  } else {
    v[0] = Load(p, 0);
  }
}
template <bool kVector, typename T, int kWidth>
__device__ __forceinline__ void StoreRun(T* p, const float (&v)[kWidth]) {
  if constexpr (kVector) {
    StoreVec(p, v);
  } else {
    Store(p, 0, v[0]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Calls f(T{}) with T the C++ type of `type`.
template <typename F>
void WithType(ElementType type, F&& f) {
  if (type == ElementType::kFloat32) {
    f(float{});
  } else {
    f(__nv_bfloat16{});
  }
}

const char* LastError() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

int64_t BlocksFor(int64_t rows) { return (rows + kWarpsPerBlock - 1) / kWarpsPerBlock; }

int Multiprocessors() {
  int device = 0;
  int sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  return sms;
}

// Resident blocks of a grid-stride kernel per multiprocessor, at most: more adds no parallelism,
// only partial weight-gradient rows for SumPartialsKernel to read.
constexpr int kMaxBlocksPerSm = 4;

// Blocks of a grid-stride kernel: as many as are resident at once (up to kMaxBlocksPerSm per
// multiprocessor), and no more than its `groups` of rows.
template <typename Kernel>
int64_t ResidentBlocks(Kernel kernel, int threads, size_t smem, int64_t groups) {
  int per_sm = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
      cudaSuccess) {
    per_sm = 1;
  }
  const int64_t resident =
      static_cast<int64_t>(Multiprocessors()) * std::min(std::max(per_sm, 1), kMaxBlocksPerSm);
  return std::max<int64_t>(1, std::min(groups, resident));
}

// ---- weight gradients in two stages ----------------------------------------------------
//
// A backward kernel's block sums its rows' dweight contributions into one partial row of
// partials[blockIdx.x][cols] (no atomics: each block owns its row); SumPartialsKernel then sums
// the partial rows into dweight. The result is the same on every run.

// out[j] = sum over i < n of rows[i][j], rows in shared memory made visible by a barrier; every
// thread of the block takes part.
__device__ void SumRowsTo(const float* rows, int n, int cols, float* out) {
  const int threads = blockDim.x * blockDim.y;
  for (int j = threadIdx.y * blockDim.x + threadIdx.x; j < cols; j += threads) {
    float sum = 0.f;
    for (int i = 0; i < n; ++i) sum += rows[i * cols + j];
    out[j] = sum;
  }
}

// dweight[j] = sum over p < parts of partials[p][j]. Block (32, 32): a warp's lanes read 32
// adjacent columns of a partial row (coalesced) while the 32 warps split the rows.
__global__ void SumPartialsKernel(int parts, int cols, const float* partials, float* dweight) {
  __shared__ float sums[kWarp][kWarp + 1];
  const int j = blockIdx.x * kWarp + threadIdx.x;
  float sum = 0.f;
  if (j < cols) {
#pragma unroll 4
    for (int p = threadIdx.y; p < parts; p += kWarp) sum += partials[int64_t{p} * cols + j];
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float total = 0.f;
  for (int w = 0; w < kWarp; ++w) total += sums[w][threadIdx.x];
  dweight[j] = total;
}

// Writes dweight from the `parts` partial rows a backward kernel left in `partials`; runs on
// `stream` after that kernel.
const char* SumPartials(int64_t parts, int64_t cols, const float* partials, float* dweight,
                        cudaStream_t stream) {
  SumPartialsKernel<<<(cols + kWarp - 1) / kWarp, dim3(kWarp, kWarp), 0, stream>>>(
      static_cast<int>(parts), static_cast<int>(cols), partials, dweight);
  return LastError();
}

// ---- RMSNorm ---------------------------------------------------------------------------
//
// Row layout: a row is split into vectors of kWidth values (8: 16-byte accesses, where cols is
// a multiple of 8 and the pointers are aligned; 1: any shape). A team of blockDim.x threads (a
// multiple of the warp) takes one row, thread t owning the row's vectors t, t + blockDim.x, ...
// (kVecs of them), so that each access is coalesced across the warp and each thread keeps the
// same columns of weight and dweight in registers for every row. blockDim.y teams share a
// block; the block walks its rows in a grid-stride loop.

constexpr int kNormBlock = 512;  // threads of a norm block, at most
constexpr int kNormWarps = kNormBlock / kWarp;

__device__ __forceinline__ void LoadN(const float* p, float (&v)[1]) { v[0] = *p; }
__device__ __forceinline__ void LoadN(const __nv_bfloat16* p, float (&v)[1]) {
  v[0] = __bfloat162float(*p);
}
__device__ __forceinline__ void LoadN(const __nv_bfloat16* p, float (&v)[8]) { LoadVec(p, v); }
__device__ __forceinline__ void LoadN(const float* p, float (&v)[8]) {
  float low[4], high[4];
  LoadVec(p, low);
  LoadVec(p + 4, high);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[e] = low[e];
    v[e + 4] = high[e];
  }
}
__device__ __forceinline__ void StoreN(float* p, const float (&v)[1]) { *p = v[0]; }
__device__ __forceinline__ void StoreN(__nv_bfloat16* p, const float (&v)[1]) {
  *p = __float2bfloat16(v[0]);
}
__device__ __forceinline__ void StoreN(__nv_bfloat16* p, const float (&v)[8]) { StoreVec(p, v); }
__device__ __forceinline__ void StoreN(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// The first column of this thread's k-th vector.
template <int kWidth>
__device__ __forceinline__ int TileColumn(int k) {
  return (threadIdx.x + k * blockDim.x) * kWidth;
}

// This thread's vectors of `row`; zeros for columns at or past `limit` (0 for a row past the
// end: nothing is read).
template <int kWidth, int kVecs, typename T>
__device__ __forceinline__ void LoadTile(const T* row, int limit, float (&v)[kVecs][kWidth]) {
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int j = TileColumn<kWidth>(k);
    if (j < limit) {
      LoadN(row + j, v[k]);
    } else {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) v[k][e] = 0.f;
    }
  }
}

template <int kWidth, int kVecs, typename T>
__device__ __forceinline__ void StoreTile(T* row, int limit, const float (&v)[kVecs][kWidth]) {
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int j = TileColumn<kWidth>(k);
    if (j < limit) StoreN(row + j, v[k]);
  }
}

// The sum of v over this thread's team. Every thread of the block calls it equally often (it
// holds a barrier); `parity` alternates between calls, so that one barrier per call suffices.
__device__ __forceinline__ float TeamSum(float v, float (&scratch)[2][kNormWarps], int parity) {
  v = WarpSum(v);
  const int team_warps = blockDim.x / kWarp;
  float* team = scratch[parity] + threadIdx.y * team_warps;
  if (threadIdx.x % kWarp == 0) team[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < team_warps; ++w) total += team[w];
  return total;
}

// The rows of a block's grid-stride loop: each team's row, and whether it is past the end.
struct TeamRow {
  int64_t row;
  bool live;
};

__device__ __forceinline__ int64_t FirstTeamRow() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.y;
}
__device__ __forceinline__ int64_t TeamRowStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.y;
}

template <int kWidth, int kVecs, typename TX, typename TW, typename TY>
__global__ void __launch_bounds__(kNormBlock)
    RmsNormForwardKernel(int64_t rows, int cols, const TX* x, const TW* weight, float eps, TY* y,
                         float* rstd) {
  __shared__ float scratch[2][kNormWarps];
  float w[kVecs][kWidth];
  LoadTile<kWidth, kVecs>(weight, cols, w);
  int parity = 0;
  for (int64_t first = FirstTeamRow(); first < rows; first += TeamRowStride(), parity ^= 1) {
    const int64_t row = first + threadIdx.y;
    const int limit = row < rows ? cols : 0;
    float v[kVecs][kWidth];
    LoadTile<kWidth, kVecs>(x + row * cols, limit, v);
    float squares = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) squares += v[k][e] * v[k][e];
    }
    const float r = rsqrtf(TeamSum(squares, scratch, parity) / cols + eps);
    if (limit > 0 && threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) v[k][e] = w[k][e] * RoundTo<TX>(v[k][e] * r);
    }
    StoreTile<kWidth, kVecs>(y + row * cols, limit, v);
  }
}

// dx for the block's rows (plus dresidual's row where it is given, added in fp32 before the one
// rounding) and the block's partial dweight row (partials[blockIdx.x][cols]).
// Dynamic shared memory: [blockDim.y][cols] floats.
template <int kWidth, int kVecs, typename TDY, typename TX, typename TW>
__global__ void __launch_bounds__(kNormBlock)
    RmsNormBackwardKernel(int64_t rows, int cols, const TDY* dy, const TX* x, const TW* weight,
                          const float* rstd, const TX* dresidual, TX* dx, float* partials) {
  __shared__ float scratch[2][kNormWarps];
  extern __shared__ float4 norm_team_dweight[];  // float4: aligned for 16-byte stores
  float w[kVecs][kWidth], acc[kVecs][kWidth] = {};
  LoadTile<kWidth, kVecs>(weight, cols, w);
  int parity = 0;
  for (int64_t first = FirstTeamRow(); first < rows; first += TeamRowStride(), parity ^= 1) {
    const int64_t row = first + threadIdx.y;
    const int limit = row < rows ? cols : 0;
    const float r = limit > 0 ? rstd[row] : 0.f;
    float g[kVecs][kWidth], n[kVecs][kWidth];
    LoadTile<kWidth, kVecs>(dy + row * cols, limit, g);
    LoadTile<kWidth, kVecs>(x + row * cols, limit, n);
    // dx_j = r * (dy_j w_j - n_j * sum_k(dy_k w_k n_k) / cols) with n = x * r;
    // dweight_j = sum over rows of dy_j * n_j (n rounded to x's type, as the forward rounds).
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        n[k][e] *= r;
        dot += g[k][e] * w[k][e] * n[k][e];
        acc[k][e] += g[k][e] * RoundTo<TX>(n[k][e]);
      }
    }
    dot = TeamSum(dot, scratch, parity) / cols;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) g[k][e] = r * (g[k][e] * w[k][e] - n[k][e] * dot);
    }
    if (dresidual != nullptr) {
      LoadTile<kWidth, kVecs>(dresidual + row * cols, limit, n);
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int e = 0; e < kWidth; ++e) g[k][e] += n[k][e];
      }
    }
    StoreTile<kWidth, kVecs>(dx + row * cols, limit, g);
  }
  float* team_dweight = reinterpret_cast<float*>(norm_team_dweight);
  StoreTile<kWidth, kVecs>(team_dweight + threadIdx.y * cols, cols, acc);
  __syncthreads();
  SumRowsTo(team_dweight, blockDim.y, cols, partials + static_cast<int64_t>(blockIdx.x) * cols);
}

// A norm kernel's layout for rows of `cols` values: `team` threads per row, `teams` rows per
// block, each thread `per_thread` vectors of 8 values (vector) or single values.
struct RowLayout {
  bool vector;
  int per_thread;
  int team;
  int teams;
};

RowLayout LayoutFor(int64_t cols, bool vector) {
  const int64_t width = vector ? 8 : 1;
  const int per_thread =
      vector ? (cols <= 8 * kNormBlock ? 1 : 2) : (cols <= 4 * kNormBlock ? 4 : 16);
  const int64_t vectors = (cols / width + per_thread - 1) / per_thread;
  const int team = static_cast<int>(std::max<int64_t>(1, (vectors + kWarp - 1) / kWarp) * kWarp);
  return {vector, per_thread, team, std::max(1, kNormBlock / team)};
}
static_assert(kMaxNormCols <= 2 * 8 * kNormBlock && kMaxNormCols <= 16 * kNormBlock,
              "LayoutFor's widest rows must cover kMaxNormCols");

template <int kValue>
using Int = std::integral_constant<int, kValue>;

// Calls f(Int<kWidth>{}, Int<kVecs>{}) for `layout`.
template <typename F>
void WithLayout(const RowLayout& layout, F&& f) {
  if (layout.vector) {
    layout.per_thread == 1 ? f(Int<8>{}, Int<1>{}) : f(Int<8>{}, Int<2>{});
  } else {
    layout.per_thread == 4 ? f(Int<1>{}, Int<4>{}) : f(Int<1>{}, Int<16>{});
  }
}

// ---- SwiGLU and GeGLU -------------------------------------------------------------------

__device__ __forceinline__ float Silu(float g) { return g / (1.f + __expf(-g)); }

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// GELU's tanh approximation, 0.5 g (1 + tanh z) with z = sqrt(2 / pi) (g + 0.044715 g^3), is
// computed as g * sigmoid(2 z): the same function without the cancellation in 1 + tanh z where
// z << 0 (in fp32 that form is off by 4.5e-4 relative at g = -4, 30% at -5 and gives 0 at -6;
// this one stays within 4e-6). Each sigmoid comes from its own exponential (the backward's
// 1 - s too, so no cancellation there either); an exponential that overflows gives 0 or 1,
// never a NaN.
__device__ __forceinline__ float GeluTwoZ(float g) {
  return 2.f * kSqrt2OverPi * (g + kGeluCubic * g * g * g);
}

// The gate's activation: silu, or GELU's tanh approximation (kGelu, Gemma's gelu_pytorch_tanh).
template <bool kGelu>
__device__ __forceinline__ float Activation(float g) {
  if constexpr (kGelu) {
    return g * (1.f / (1.f + expf(-GeluTwoZ(g))));  // g * s, as the backward has it
  } else {
    return Silu(g);
  }
}

// kVector: n is a multiple of kVec<T> and the pointers are aligned (16-byte accesses).
template <typename T, bool kVector, bool kGelu>
__global__ void GatedForwardKernel(int64_t n, const T* gate, const T* up, T* out) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kWidth;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth; i < n;
       i += stride) {
    if constexpr (kVector) {
      float g[kVec<T>], u[kVec<T>], o[kVec<T>];
      LoadVec(gate + i, g);
      LoadVec(up + i, u);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) o[k] = Activation<kGelu>(g[k]) * u[k];
      StoreVec(out + i, o);
    } else {
      Store(out, i, Activation<kGelu>(Load(gate, i)) * Load(up, i));
    }
  }
}

// d(act(g) * u): du = d * act(g), dg = d * u * act'(g).
template <bool kGelu>
__device__ __forceinline__ void GatedGrad(float g, float u, float d, float& dg, float& du) {
  if constexpr (kGelu) {
    // With s = sigmoid(2 z): 0.5 (1 + tanh z) = s and 1 - tanh^2 z = 4 s (1 - s).
    const float two_z = GeluTwoZ(g);
    const float s = 1.f / (1.f + expf(-two_z)), complement = 1.f / (1.f + expf(two_z));
    du = d * g * s;
    const float dz = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * g * g);
    dg = d * u * (s + 2.f * g * s * complement * dz);
  } else {
    const float s = 1.f / (1.f + __expf(-g));
    du = d * g * s;
    dg = d * u * s * (1.f + g * (1.f - s));
  }
}

// dgate and dup of value i (row i / cols, column i % cols) go to row * pitch + column of their
// outputs: pitch == cols writes them as gate and up are laid out; pitch == 2 * cols with dup =
// dgate + cols writes them side by side in one [rows, 2 * cols] buffer, so the projection's
// input gradient is one matmul over the stacked weights (models/split_linear.cc). A non-null
// product gets act(gate) * up at value i, laid out as gate; it may be dout itself (each thread
// reads its values of dout before it writes the same values of product).
template <typename T, bool kVector, bool kGelu>
__global__ void GatedBackwardKernel(int64_t n, int64_t cols, int64_t pitch, const T* gate,
                                    const T* up, const T* dout, T* dgate, T* dup, T* product) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kWidth;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth; i < n;
       i += stride) {
    const int64_t o = pitch == cols ? i : (i / cols) * pitch + i % cols;
    if constexpr (kVector) {
      float g[kVec<T>], u[kVec<T>], d[kVec<T>], dg[kVec<T>], du[kVec<T>];
      LoadVec(gate + i, g);
      LoadVec(up + i, u);
      LoadVec(dout + i, d);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) GatedGrad<kGelu>(g[k], u[k], d[k], dg[k], du[k]);
      StoreVec(dgate + o, dg);
      StoreVec(dup + o, du);
      if (product != nullptr) {
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) d[k] = Activation<kGelu>(g[k]) * u[k];
        StoreVec(product + i, d);
      }
    } else {
      const float g = Load(gate, i), u = Load(up, i);
      float dg, du;
      GatedGrad<kGelu>(g, u, Load(dout, i), dg, du);
      Store(dgate, o, dg);
      Store(dup, o, du);
      if (product != nullptr) Store(product, i, Activation<kGelu>(g) * u);
    }
  }
}

int64_t ElementwiseBlocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>((n + kBlock - 1) / kBlock, 132 * 16));
}

// ---- QK-norm + rotary ------------------------------------------------------------------

// Row `row` of x [B, T, H, D] is a head of token (b, t); the output (and its gradient) keeps
// that row order, so only the position t is needed, for the rotary tables.
__device__ __forceinline__ int64_t PositionOf(int64_t row, int64_t seq, int64_t heads) {
  return (row / heads) % seq;
}

// Where row `row`'s dx starts when consecutive tokens' rows of dx lie `pitch` values apart
// (heads * dim for a contiguous [B, T, H, D] dx; more where dx is a block of columns of a wider
// buffer, as the gradients of q, k and v side by side are).
template <typename T>
__device__ __forceinline__ T* DxRow(T* dx, int64_t row, int64_t heads, int64_t dim,
                                    int64_t pitch) {
  return dx + (row / heads) * pitch + (row % heads) * dim;
}

template <typename TX, typename TW, typename TO>
__global__ void QkNormRopeForwardKernel(int64_t rows, int64_t seq, int64_t heads, int dim,
                                        const TX* x, const TW* weight, float eps, const float* cos,
                                        const float* sin, TO* out, float* rstd) {
  extern __shared__ float staged[];  // [kWarpsPerBlock][dim]
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= rows) return;
  const TX* xr = x + row * dim;
  float* y = staged + warp * dim;
  float r = 1.f;
  if (weight != nullptr) {
    float squares = 0.f;
    for (int j = lane; j < dim; j += kWarp) {
      const float v = Load(xr, j);
      squares += v * v;
    }
    r = rsqrtf(WarpSum(squares) / dim + eps);
    if (lane == 0) rstd[row] = r;
    for (int j = lane; j < dim; j += kWarp) y[j] = Load(weight, j) * RoundTo<TX>(Load(xr, j) * r);
  } else {
    for (int j = lane; j < dim; j += kWarp) y[j] = Load(xr, j);
  }
  __syncwarp();
  const int64_t t = PositionOf(row, seq, heads);
  const int half = dim / 2;
  const float* c = cos + t * dim;
  const float* s = sin + t * dim;
  TO* o = out + row * dim;
  for (int j = lane; j < dim; j += kWarp) {
    const float rotated = j < half ? -y[j + half] : y[j - half];
    Store(o, j, y[j] * c[j] + rotated * s[j]);
  }
}

// dx for the block's rows and, with a weight, the block's partial dweight row
// (partials[blockIdx.x][dim]). Each lane keeps its columns' dweight sums in registers
// (dim <= 32 * kPerLane).
template <int kPerLane, typename TO, typename TX, typename TW>
__global__ void QkNormRopeBackwardKernel(int64_t rows, int64_t seq, int64_t heads, int dim,
                                         const TO* dout, const TX* x, const TW* weight,
                                         const float* cos, const float* sin, const float* rstd,
                                         TX* dx, int64_t dx_pitch, float* partials) {
  // Per warp [dim] dout * sin and [dim] dy; at the end, per warp [dim] dweight sums.
  extern __shared__ float shared[];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  float* staged = shared + warp * 2 * dim;
  float* dy = staged + dim;
  const int half = dim / 2;
  float acc[kPerLane] = {};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows;
       row += stride) {
    const int64_t t = PositionOf(row, seq, heads);
    const TO* d = dout + row * dim;
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    __syncwarp();
    for (int j = lane; j < dim; j += kWarp) staged[j] = Load(d, j) * s[j];
    __syncwarp();
    // dy_k = dout_k cos_k + (k < half ? (dout sin)_{k+half} : -(dout sin)_{k-half})
    for (int j = lane; j < dim; j += kWarp) {
      dy[j] = Load(d, j) * c[j] + (j < half ? staged[j + half] : -staged[j - half]);
    }
    const TX* xr = x + row * dim;
    TX* dxr = DxRow(dx, row, heads, dim, dx_pitch);
    if (weight == nullptr) {
      for (int j = lane; j < dim; j += kWarp) Store(dxr, j, dy[j]);
      continue;
    }
    const float r = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      if (j < dim) {
        const float n = Load(xr, j) * r;
        dot += dy[j] * Load(weight, j) * n;
        acc[k] += dy[j] * RoundTo<TX>(n);
      }
    }
    dot = WarpSum(dot) / dim;
    for (int j = lane; j < dim; j += kWarp) {
      const float n = Load(xr, j) * r;
      Store(dxr, j, r * (dy[j] * Load(weight, j) - n * dot));
    }
  }
  if (weight == nullptr) return;
  __syncthreads();  // every warp is done with its staging rows, reused here
  float* warp_dweight = shared + warp * dim;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int j = lane + k * kWarp;
    if (j < dim) warp_dweight[j] = acc[k];
  }
  __syncthreads();
  SumRowsTo(shared, kWarpsPerBlock, dim, partials + static_cast<int64_t>(blockIdx.x) * dim);
}

// The raw bits of one T: what a chunk is loaded into before it is widened to fp32.
template <typename T>
struct BitsOf {
  using type = T;
};
template <>
struct BitsOf<__nv_bfloat16> {
  using type = unsigned short;
};
__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(unsigned short v) {
  return __bfloat162float(__ushort_as_bfloat16(v));
}
__device__ __forceinline__ void Narrow(float v, float& out) { out = v; }
__device__ __forceinline__ void Narrow(float v, unsigned short& out) {
  out = __bfloat16_as_ushort(__float2bfloat16(v));
}

// The widest word that divides a chunk of kBytes: 16, 8 or 4 bytes, 0 for none (6 or 12 bytes:
// head dim 96).
template <int kBytes>
constexpr int kWordBytes = kBytes % 16 == 0 ? 16 : kBytes == 8 ? 8 : kBytes == 4 ? 4 : 0;
template <int kBytes>
struct WordOf;
template <>
struct WordOf<4> {
  using type = unsigned int;
};
template <>
struct WordOf<8> {
  using type = uint2;
};
template <>
struct WordOf<16> {
  using type = uint4;
};

// A chunk of kChunk values of T as whole words (Chunk::kWords of Chunk::Word) or as raw bits;
// only for chunks a word divides (kWordBytes > 0).
template <int kChunk, typename T>
struct ChunkWords {
  using Word = typename WordOf<kWordBytes<kChunk * sizeof(T)>>::type;
  static constexpr int kWords = kChunk * static_cast<int>(sizeof(T)) / sizeof(Word);
  union Bits {
    Word words[kWords];
    typename BitsOf<T>::type values[kChunk];
  };
};

// kChunk consecutive values at p, widened to fp32: whole words when kVector (p aligned to the
// word, checked at launch), one value at a time otherwise.
template <bool kVector, int kChunk, typename T>
__device__ __forceinline__ void LoadChunk(const T* p, float (&v)[kChunk]) {
  if constexpr (kVector && kWordBytes<kChunk * sizeof(T)> > 0) {
    using C = ChunkWords<kChunk, T>;
    typename C::Bits u;
#pragma unroll
    for (int k = 0; k < C::kWords; ++k) {
      u.words[k] = reinterpret_cast<const typename C::Word*>(p)[k];
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = Widen(u.values[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) v[k] = Load(p, k);
  }
}
template <bool kVector, int kChunk, typename T>
__device__ __forceinline__ void StoreChunk(T* p, const float (&v)[kChunk]) {
  if constexpr (kVector && kWordBytes<kChunk * sizeof(T)> > 0) {
    using C = ChunkWords<kChunk, T>;
    typename C::Bits u;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) Narrow(v[k], u.values[k]);
#pragma unroll
    for (int k = 0; k < C::kWords; ++k) reinterpret_cast<typename C::Word*>(p)[k] = u.words[k];
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) Store(p, k, v[k]);
  }
}

// The same two kernels for head dims of kChunk * 32 (64, 96, 128, 256): lane l holds columns
// [l * kChunk, (l + 1) * kChunk) in registers, and the rotary partner of column j (j +- dim/2)
// sits at the same index in lane l ^ 16, so one shuffle replaces the shared-memory staging and
// every load of a row is issued at once (the loops above wait on memory three times a row).
// With kVector a lane's chunk of a row and of the rotary tables moves in whole words (8 bytes
// of bf16 and 16 of fp32 a lane at head dim 128: one load instruction each, not four).
// A warp takes `group` consecutive rows at a time (GroupRows: up to kMaxRows, dividing the
// heads, so the group is heads of one token) and issues all their loads before it computes:
// one row's 256 bytes of x (bf16, head dim 128) in flight per warp left the memory system idle
// between rows, and the group's one chunk of the tables is loaded once.
template <int kChunk>
constexpr int kForwardRows = kChunk <= 4 ? 4 : 2;  // 2 at head dim 256: registers
constexpr int kBackwardRows = 2;

// The rows a warp takes at once: the largest power of two up to max_rows (itself a power of
// two) that divides heads. rows (B * T * heads) is then a multiple of it, and a group never
// crosses a token. Odd heads (one key/value head, say) get one row a warp.
int GroupRows(int64_t heads, int max_rows) {
  int group = max_rows;
  while (heads % group != 0) group /= 2;
  return group;
}

// Rows [base, base + group) of a [rows, kChunk * 32] tensor into v[0..group), loads issued
// together; the rest of v is left alone.
template <bool kVector, int kMaxRows, int kChunk, typename T>
__device__ __forceinline__ void LoadGroup(const T* x, int64_t base, int group, int first,
                                          float (&v)[kMaxRows][kChunk]) {
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    if (i >= group) break;
    LoadChunk<kVector>(x + (base + i) * (kChunk * kWarp) + first, v[i]);
  }
}

template <bool kVector, int kChunk, typename TX, typename TW, typename TO>
__global__ void QkNormRopeForwardChunkKernel(int64_t rows, int64_t seq, int64_t heads, int group,
                                             const TX* x, const TW* weight, float eps,
                                             const float* cos, const float* sin, TO* out,
                                             float* rstd) {
  constexpr int kDim = kChunk * kWarp;
  constexpr int kMaxRows = kForwardRows<kChunk>;
  const int lane = threadIdx.x % kWarp;
  const int64_t base =
      (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp) * group;
  if (base >= rows) return;  // the whole warp: base depends on the warp only
  const int first = lane * kChunk;
  const int64_t table = PositionOf(base, seq, heads) * kDim + first;
  float v[kMaxRows][kChunk], c[kChunk], s[kChunk];
  LoadGroup<kVector>(x, base, group, first, v);
  LoadChunk<kVector>(cos + table, c);
  LoadChunk<kVector>(sin + table, s);
  float w[kChunk];
  if (weight != nullptr) {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) w[k] = Load(weight, first + k);
  }
  // Lanes 0-15 hold the first half: rotate_half gives them -y[j + half], the others y[j - half].
  const float sign = lane < kWarp / 2 ? -1.f : 1.f;
#pragma unroll
  for (int i = 0; i < kMaxRows; ++i) {
    if (i >= group) break;
    const int64_t row = base + i;
    if (weight != nullptr) {
      float squares = 0.f;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) squares += v[i][k] * v[i][k];
      const float r = rsqrtf(WarpSum(squares) / kDim + eps);
      if (lane == 0) rstd[row] = r;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[i][k] = w[k] * RoundTo<TX>(v[i][k] * r);
    }
    float o[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const float partner = __shfl_xor_sync(0xffffffffu, v[i][k], kWarp / 2);
      o[k] = v[i][k] * c[k] + sign * partner * s[k];
    }
    StoreChunk<kVector>(out + row * kDim + first, o);
  }
}

// One row of the backward: dx from dout (g), the rotary tables' chunk (c, s) and, with a
// weight, x (xv) and its rstd (r); adds the row's share of dweight to acc.
template <bool kVector, int kChunk, typename TX>
__device__ __forceinline__ void BackwardRow(const float (&g)[kChunk], const float (&c)[kChunk],
                                            const float (&s)[kChunk], const float (&xv)[kChunk],
                                            float r, const float (&w)[kChunk], bool weighted,
                                            float sign, TX* dxr, float (&acc)[kChunk]) {
  // dy_j = dout_j cos_j + (j < half ? (dout sin)_{j+half} : -(dout sin)_{j-half})
  float dy[kChunk];
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const float partner = __shfl_xor_sync(0xffffffffu, g[k] * s[k], kWarp / 2);
    dy[k] = g[k] * c[k] + sign * partner;
  }
  if (!weighted) {
    StoreChunk<kVector>(dxr, dy);
    return;
  }
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) {
    const float n = xv[k] * r;
    dot += dy[k] * w[k] * n;
    acc[k] += dy[k] * RoundTo<TX>(n);
  }
  dot = WarpSum(dot) / (kChunk * kWarp);
  float out[kChunk];
#pragma unroll
  for (int k = 0; k < kChunk; ++k) out[k] = r * (dy[k] * w[k] - xv[k] * r * dot);
  StoreChunk<kVector>(dxr, out);
}

template <bool kVector, int kChunk, typename TO, typename TX, typename TW>
__global__ void QkNormRopeBackwardChunkKernel(int64_t rows, int64_t seq, int64_t heads,
                                              int group, const TO* dout, const TX* x,
                                              const TW* weight, const float* cos,
                                              const float* sin, const float* rstd, TX* dx,
                                              int64_t dx_pitch, float* partials) {
  extern __shared__ float shared[];  // [kWarpsPerBlock][kDim] dweight sums at the end
  constexpr int kDim = kChunk * kWarp;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int first = lane * kChunk;
  const float sign = lane < kWarp / 2 ? 1.f : -1.f;
  const bool weighted = weight != nullptr;
  float w[kChunk], acc[kChunk] = {};
  if (weighted) {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) w[k] = Load(weight, first + k);
  }
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock * group;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * group;
       base < rows; base += step) {
    const int64_t table = PositionOf(base, seq, heads) * kDim + first;
    float g[kBackwardRows][kChunk], xv[kBackwardRows][kChunk], c[kChunk], s[kChunk];
    float r[kBackwardRows] = {};
    LoadGroup<kVector>(dout, base, group, first, g);
    LoadChunk<kVector>(cos + table, c);
    LoadChunk<kVector>(sin + table, s);
    if (weighted) {
      LoadGroup<kVector>(x, base, group, first, xv);
#pragma unroll
      for (int i = 0; i < kBackwardRows; ++i) {
        if (i < group) r[i] = rstd[base + i];
      }
    }
#pragma unroll
    for (int i = 0; i < kBackwardRows; ++i) {
      if (i >= group) break;
      TX* dxr = DxRow(dx, base + i, heads, kDim, dx_pitch) + first;
      BackwardRow<kVector>(g[i], c, s, xv[i], r[i], w, weighted, sign, dxr, acc);
    }
  }
  if (!weighted) return;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) shared[warp * kDim + first + k] = acc[k];
  __syncthreads();
  SumRowsTo(shared, kWarpsPerBlock, kDim, partials + static_cast<int64_t>(blockIdx.x) * kDim);
}

// Calls f(std::integral_constant<int, head_dim / 32>) where a chunk kernel covers head_dim;
// false (f not called) otherwise.
template <typename F>
bool WithChunk(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      f(std::integral_constant<int, 2>{});
      return true;
    case 96:
      f(std::integral_constant<int, 3>{});
      return true;
    case 128:
      f(std::integral_constant<int, 4>{});
      return true;
    case 256:
      f(std::integral_constant<int, 8>{});
      return true;
    default:
      return false;
  }
}

// ---- residual add ---------------------------------------------------------------------

// out = x + delta with x, out of one type and delta of another (the fp32 residual stream plus
// a bf16 branch under autocast), four elements per thread where n allows.
template <typename TX, typename TD>
__global__ void ResidualAddKernel(int64_t n, const TX* x, const TD* delta, TX* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = n / 4;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads;
       q += stride) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = Load(x, 4 * q + k) + Load(delta, 4 * q + k);
#pragma unroll
    for (int k = 0; k < 4; ++k) Store(out, 4 * q + k, v[k]);
  }
  for (int64_t i = 4 * quads + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    Store(out, i, Load(x, i) + Load(delta, i));
  }
}

// out = x * *scale (x fp32, the scale read on the device), in fp32 and rounded once to TO; four
// values per thread in one load and one store where kVector (x 16-byte aligned, out aligned to
// four of its values).
template <typename TO, bool kVector>
__global__ void ScaledCopyKernel(int64_t n, const float* x, const float* scale, TO* out) {
  const float c = *scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t quads = kVector ? n / 4 : 0;
  for (int64_t q = first; q < quads; q += stride) {
    float v[4];
    LoadVec(x + 4 * q, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] *= c;
    StoreFour(out + 4 * q, v);
  }
  for (int64_t i = 4 * quads + first; i < n; i += stride) Store(out, i, x[i] * c);
}

// ---- cross-entropy over logit rows ----------------------------------------------------

constexpr int kRowBlock = 512;

// Combines two (max, sum of exp(v - max)) pairs.
__device__ __forceinline__ void Combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float top = fmaxf(m, m2);
  s = s * expf(m - top) + s2 * expf(m2 - top);
  m = top;
}

// The (max, sum) pairs of a block of kRowBlock threads combined; every thread gets the result.
__device__ __forceinline__ void BlockCombine(float& m, float& s) {
  __shared__ float shared_m[kRowBlock / kWarp];
  __shared__ float shared_s[kRowBlock / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
  }
  __syncthreads();
  m = shared_m[0];
  s = shared_s[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) {
    Combine(m, s, shared_m[w], shared_s[w]);
  }
}

// The sum of v over a block of kRowBlock threads; every thread gets it.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float shared[kRowBlock / kWarp];
  v = WarpSum(v);
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += shared[w];
  return total;
}

// softcap * tanh(v / softcap) (Gemma 2's final logits) when softcap > 0, else v.
__device__ __forceinline__ float Softcapped(float v, float softcap) {
  return softcap > 0.f ? softcap * tanhf(v / softcap) : v;
}

// One block per row: loss[row] = logsumexp(c) - c[target] with c = Softcapped(z) (0 when
// ignored, NaN when the target is outside [0, vocab)); with write_grad, z is overwritten by
// d(loss)/dz = (softmax(c) - onehot(target)) * dc/dz (zeros when ignored), where dc/dz is
// 1 - tanh^2(z / softcap) under a cap and 1 without.
template <typename T, bool kVector>
__global__ void CrossEntropyRowsKernel(int64_t vocab, T* logits, const int64_t* targets,
                                       int64_t ignore_index, float softcap, float* loss,
                                       bool write_grad) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  T* z = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x * kWidth; j < vocab; j += blockDim.x * kWidth) {
    float v[kWidth];
    LoadRun<kVector>(z + j, v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) v[k] = Softcapped(v[k], softcap);
    float top = v[0];
#pragma unroll
    for (int k = 1; k < kWidth; ++k) top = fmaxf(top, v[k]);
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) part += __expf(v[k] - top);
    Combine(m, s, top, part);
  }
  BlockCombine(m, s);
  const float lse = m + logf(s);
  const int64_t target = targets[blockIdx.x];
  const bool counted = target != ignore_index;
  // A target outside the vocabulary (eager raises) makes the loss NaN rather than pass unseen.
  const bool valid = target >= 0 && target < vocab;
  if (threadIdx.x == 0) {
    loss[blockIdx.x] = !counted ? 0.f : valid ? lse - Softcapped(Load(z, target), softcap) : NAN;
  }
  if (!write_grad) return;
  __syncthreads();  // z[target] is read before it is overwritten
  for (int64_t j = threadIdx.x * kWidth; j < vocab; j += blockDim.x * kWidth) {
    float v[kWidth];
    LoadRun<kVector>(z + j, v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      float slope = 1.f;  // dc/dz
      if (softcap > 0.f) {
        const float t = tanhf(v[k] / softcap);
        v[k] = softcap * t;
        slope = 1.f - t * t;
      }
      v[k] = counted ? (__expf(v[k] - lse) - (j + k == target ? 1.f : 0.f)) * slope : 0.f;
    }
    StoreRun<kVector>(z + j, v);
  }
}

// ---- soft-capped attention softmax ------------------------------------------------------

// Whether query t may attend to key j: causal, and within the window when window > 0.
__device__ __forceinline__ bool Attends(int64_t t, int64_t j, int64_t window) {
  return j <= t && (window <= 0 || j > t - window);
}

// One block per row of scores [rows, keys], the row's query at position row % queries:
// probs = softmax over allowed keys of Softcapped(scores * scale, softcap) (0 where not
// allowed), in fp32, rounded once.
template <typename T, bool kVector>
__global__ void SoftcapSoftmaxForwardKernel(int64_t keys, int64_t queries, const T* scores,
                                            T* probs, float scale, float softcap, int64_t window) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t row = blockIdx.x, t = row % queries;
  const T* z = scores + row * keys;
  T* p = probs + row * keys;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x * kWidth; j < keys; j += blockDim.x * kWidth) {
    float v[kWidth];
    LoadRun<kVector>(z + j, v);
    float top = -INFINITY;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      v[k] = Attends(t, j + k, window) ? Softcapped(v[k] * scale, softcap) : -INFINITY;
      top = fmaxf(top, v[k]);
    }
    if (top == -INFINITY) continue;
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) part += __expf(v[k] - top);
    Combine(m, s, top, part);
  }
  BlockCombine(m, s);
  const float inverse = 1.f / s;
  for (int64_t j = threadIdx.x * kWidth; j < keys; j += blockDim.x * kWidth) {
    float v[kWidth];
    LoadRun<kVector>(z + j, v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      v[k] = Attends(t, j + k, window)
                 ? __expf(Softcapped(v[k] * scale, softcap) - m) * inverse
                 : 0.f;
    }
    StoreRun<kVector>(p + j, v);
  }
}

// dscores from dprobs: softmax's backward on the saved probs, times the cap's slope and the
// scale (1 - tanh^2(scores * scale / softcap)) * scale; 0 where not allowed.
template <typename T, bool kVector>
__global__ void SoftcapSoftmaxBackwardKernel(int64_t keys, int64_t queries, const T* scores,
                                             const T* probs, const T* dprobs, T* dscores,
                                             float scale, float softcap, int64_t window) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t row = blockIdx.x, t = row % queries, offset = row * keys;
  float dot = 0.f;
  for (int64_t j = threadIdx.x * kWidth; j < keys; j += blockDim.x * kWidth) {
    float p[kWidth], d[kWidth];
    LoadRun<kVector>(probs + offset + j, p);
    LoadRun<kVector>(dprobs + offset + j, d);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) dot += p[k] * d[k];
  }
  dot = BlockSum(dot);
  for (int64_t j = threadIdx.x * kWidth; j < keys; j += blockDim.x * kWidth) {
    float z[kWidth], p[kWidth], d[kWidth];
    LoadRun<kVector>(scores + offset + j, z);
    LoadRun<kVector>(probs + offset + j, p);
    LoadRun<kVector>(dprobs + offset + j, d);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      float slope = scale;
      if (softcap > 0.f) {
        const float c = tanhf(z[k] * scale / softcap);
        slope *= 1.f - c * c;
      }
      z[k] = Attends(t, j + k, window) ? p[k] * (d[k] - dot) * slope : 0.f;
    }
    StoreRun<kVector>(dscores + offset + j, z);
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename TX, typename TW, typename TY>
void RunRmsNormForward(const RowLayout& layout, int64_t rows, int cols, const void* x,
                       const void* weight, float eps, void* y, float* rstd, cudaStream_t stream) {
  WithLayout(layout, [&](auto width, auto vecs) {
    auto kernel = RmsNormForwardKernel<decltype(width)::value, decltype(vecs)::value, TX, TW, TY>;
    const dim3 block(layout.team, layout.teams);
    const int64_t blocks =
        ResidentBlocks(kernel, block.x * block.y, 0, CeilDiv(rows, layout.teams));
    kernel<<<blocks, block, 0, stream>>>(rows, cols, static_cast<const TX*>(x),
                                         static_cast<const TW*>(weight), eps, static_cast<TY*>(y),
                                         rstd);
  });
}

// Returns the blocks launched (the partial rows left in `workspace`), or 0 when `workspace`
// holds fewer than blocks * cols floats (nothing launched).
template <typename TDY, typename TX, typename TW>
int64_t RunRmsNormBackward(const RowLayout& layout, int64_t rows, int cols, const void* dy,
                           const void* x, const void* weight, const float* rstd,
                           const void* dresidual, void* dx, float* workspace,
                           int64_t workspace_floats, cudaStream_t stream) {
  int64_t blocks = 0;
  WithLayout(layout, [&](auto width, auto vecs) {
    auto kernel = RmsNormBackwardKernel<decltype(width)::value, decltype(vecs)::value, TDY, TX, TW>;
    const dim3 block(layout.team, layout.teams);
    const size_t smem = sizeof(float) * layout.teams * cols;
    blocks = ResidentBlocks(kernel, block.x * block.y, smem, CeilDiv(rows, layout.teams));
    if (blocks * cols > workspace_floats) {
      blocks = 0;
      return;
    }
    kernel<<<blocks, block, smem, stream>>>(
        rows, cols, static_cast<const TDY*>(dy), static_cast<const TX*>(x),
        static_cast<const TW*>(weight), rstd, static_cast<const TX*>(dresidual),
        static_cast<TX*>(dx), workspace);
  });
  return blocks;
}

// ---- AdamW over many tensors --------------------------------------------------------------
//
// One launch covers up to kAdamWTensors tensors, their pointers passed by value. The grid walks
// the tensors' concatenation in chunks of kAdamWChunk values; a block takes each of its chunks
// piece by piece (a piece ends where a tensor does), so every thread of a block works on the
// same tensor at a time and finds it by a scan that only moves forward. Each tensor takes a
// multiple of kAdamWVec places in the concatenation (the last few unused), so every piece starts
// on a group of kAdamWVec values: one 16-byte load or store of each fp32 list, 8 or 16 bytes of
// the gradient and 8 of the copy, where the tensor's pointers allow it.

constexpr int kAdamWTensors = 32;
constexpr int kAdamWVec = 4;     // values per group
constexpr int kAdamWGroups = 2;  // groups per thread in flight
constexpr int kAdamWChunk = kBlock * kAdamWVec * kAdamWGroups;

int64_t AdamWPlaces(int64_t numel) { return (numel + kAdamWVec - 1) / kAdamWVec * kAdamWVec; }

struct AdamWLaunch {
  AdamWTensor tensors[kAdamWTensors];
  int64_t start[kAdamWTensors + 1];  // start[i]: where tensor i begins in the concatenation
  int count;
};

struct AdamWFactors {
  float lr, coefficient, step_size, bias_correction2_sqrt;
};

// PyTorch's order of operations: decay, both moments, then the bias-corrected update.
__device__ __forceinline__ void AdamWUpdate(float& p, float& m, float& v, float g,
                                            const AdamWScalars& s, const AdamWFactors& f) {
  g *= f.coefficient;
  p -= f.lr * s.weight_decay * p;
  m = static_cast<float>(s.beta1) * m + (1.f - static_cast<float>(s.beta1)) * g;
  v = static_cast<float>(s.beta2) * v + (1.f - static_cast<float>(s.beta2)) * g * g;
  const float denom = sqrtf(v) / f.bias_correction2_sqrt + s.eps;
  p -= f.step_size * m / denom;
}

// Four values at p in one load of 16 (fp32) or 8 (bf16) bytes: StoreFour's counterpart.
__device__ __forceinline__ void LoadFour(const float* p, float (&v)[4]) { LoadVec(p, v); }
__device__ __forceinline__ void LoadFour(const __nv_bfloat16* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
  v[0] = low.x;
  v[1] = low.y;
  v[2] = high.x;
  v[3] = high.y;
}

// One group of a tensor: the state and the gradient of values [i, i + n), n <= kAdamWVec.
struct AdamWGroup {
  float p[kAdamWVec], m[kAdamWVec], v[kAdamWVec], g[kAdamWVec];
};

// Whether x's lists take whole groups in vector loads and stores.
template <typename TG>
__device__ __forceinline__ bool AdamWAligned(const AdamWTensor& x) {
  const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  return (address(x.param) | address(x.exp_avg) | address(x.exp_avg_sq)) % 16 == 0 &&
         address(x.grad) % (kAdamWVec * sizeof(TG)) == 0 && address(x.bf16_copy) % 8 == 0;
}

template <typename TG>
__device__ __forceinline__ void AdamWLoad(const AdamWTensor& x, int64_t i, int n, bool vector,
                                          AdamWGroup& a) {
  const TG* grad = static_cast<const TG*>(x.grad);
  if (vector && n == kAdamWVec) {
    LoadVec(x.param + i, a.p);
    LoadVec(x.exp_avg + i, a.m);
    LoadVec(x.exp_avg_sq + i, a.v);
    LoadFour(grad + i, a.g);
    return;
  }
#pragma unroll
  for (int k = 0; k < kAdamWVec; ++k) {
    if (k < n) {
      a.p[k] = x.param[i + k];
      a.m[k] = x.exp_avg[i + k];
      a.v[k] = x.exp_avg_sq[i + k];
      a.g[k] = Load(grad, i + k);
    }
  }
}

__device__ __forceinline__ void AdamWStore(const AdamWTensor& x, int64_t i, int n, bool vector,
                                           const AdamWGroup& a) {
  auto* copy = static_cast<__nv_bfloat16*>(x.bf16_copy);
  if (vector && n == kAdamWVec) {
    StoreVec(x.param + i, a.p);
    StoreVec(x.exp_avg + i, a.m);
    StoreVec(x.exp_avg_sq + i, a.v);
    if (copy != nullptr) StoreFour(copy + i, a.p);
    return;
  }
#pragma unroll
  for (int k = 0; k < kAdamWVec; ++k) {
    if (k < n) {
      x.param[i + k] = a.p[k];
      x.exp_avg[i + k] = a.m[k];
      x.exp_avg_sq[i + k] = a.v[k];
      if (copy != nullptr) copy[i + k] = __float2bfloat16_rn(a.p[k]);
    }
  }
}

// Values [begin, end) of tensor x (begin a multiple of kAdamWVec), kAdamWGroups groups per
// thread in flight: all loads, then the updates, then all stores.
template <typename TG>
__device__ void AdamWPiece(const AdamWTensor& x, int64_t begin, int64_t end,
                           const AdamWScalars& s, const AdamWFactors& f) {
  const bool vector = AdamWAligned<TG>(x);
  constexpr int64_t kStride = static_cast<int64_t>(kBlock) * kAdamWVec;
  for (int64_t base = begin + kAdamWVec * threadIdx.x; base < end; base += kAdamWChunk) {
    AdamWGroup a[kAdamWGroups];
    int n[kAdamWGroups];
#pragma unroll
    for (int k = 0; k < kAdamWGroups; ++k) {
      const int64_t i = base + k * kStride;
      n[k] = static_cast<int>(max(min(end - i, static_cast<int64_t>(kAdamWVec)), int64_t{0}));
      AdamWLoad<TG>(x, i, n[k], vector, a[k]);
    }
#pragma unroll
    for (int k = 0; k < kAdamWGroups; ++k) {
#pragma unroll
      for (int j = 0; j < kAdamWVec; ++j) {
        if (j < n[k]) AdamWUpdate(a[k].p[j], a[k].m[j], a[k].v[j], a[k].g[j], s, f);
      }
    }
#pragma unroll
    for (int k = 0; k < kAdamWGroups; ++k) AdamWStore(x, base + k * kStride, n[k], vector, a[k]);
  }
}

template <typename TG>
__global__ void __launch_bounds__(kBlock) AdamWKernel(const AdamWLaunch launch, AdamWScalars s) {
  AdamWFactors f;
  f.lr = s.device_lr != nullptr ? *s.device_lr : s.lr;
  f.coefficient = s.grad_coefficient != nullptr ? *s.grad_coefficient : 1.f;
  const int64_t total = launch.start[launch.count];
  int t = 0;
  int factors_of = -1;  // whose bias corrections f holds: two pows per tensor, not per chunk
  for (int64_t chunk = static_cast<int64_t>(blockIdx.x) * kAdamWChunk; chunk < total;
       chunk += static_cast<int64_t>(gridDim.x) * kAdamWChunk) {
    const int64_t chunk_end = min(chunk + kAdamWChunk, total);
    for (int64_t at = chunk; at < chunk_end;) {
      while (launch.start[t + 1] <= at) ++t;
      const AdamWTensor& x = launch.tensors[t];
      if (factors_of != t) {
        const double step = *x.step;
        f.step_size = static_cast<float>(f.lr / (1.0 - pow(s.beta1, step)));
        f.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(s.beta2, step)));
        factors_of = t;
      }
      const int64_t end = min(chunk_end, launch.start[t + 1]);
      AdamWPiece<TG>(x, at - launch.start[t], min(end - launch.start[t], x.numel), s, f);
      at = end;
    }
  }
}

constexpr const char* kSmallWorkspace =
    "the workspace holds fewer floats than NormBackwardWorkspaceFloats(rows, cols) asks for";

}  // namespace

int64_t NormBackwardWorkspaceFloats(int64_t rows, int64_t cols) {
  return std::min<int64_t>(rows, static_cast<int64_t>(Multiprocessors()) * kMaxBlocksPerSm) * cols;
}

const char* LaunchRmsNormForward(int64_t rows, int64_t cols, const void* x, ElementType x_type,
                                 const void* weight, ElementType weight_type, double eps, void* y,
                                 ElementType y_type, float* rstd, void* stream) {
  if (rows == 0 || cols == 0) return nullptr;
  const RowLayout layout = LayoutFor(cols, cols % 8 == 0 && Aligned16({x, weight, y}));
  WithType(x_type, [&](auto tx) {
    WithType(weight_type, [&](auto tw) {
      WithType(y_type, [&](auto ty) {
        RunRmsNormForward<decltype(tx), decltype(tw), decltype(ty)>(
            layout, rows, static_cast<int>(cols), x, weight, static_cast<float>(eps), y, rstd,
            static_cast<cudaStream_t>(stream));
      });
    });
  });
  return LastError();
}

const char* LaunchRmsNormBackward(int64_t rows, int64_t cols, const void* dy, ElementType dy_type,
                                  const void* x, ElementType x_type, const void* weight,
                                  ElementType weight_type, const float* rstd,
                                  const void* dresidual, void* dx, float* dweight,
                                  float* workspace, int64_t workspace_floats, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (rows == 0 || cols == 0) {
    return cudaMemsetAsync(dweight, 0, cols * sizeof(float), s) == cudaSuccess ? nullptr
                                                                               : LastError();
  }
  const RowLayout layout =
      LayoutFor(cols, cols % 8 == 0 && Aligned16({dy, x, weight, dresidual, dx}));
  int64_t parts = 0;
  WithType(dy_type, [&](auto tdy) {
    WithType(x_type, [&](auto tx) {
      WithType(weight_type, [&](auto tw) {
        parts = RunRmsNormBackward<decltype(tdy), decltype(tx), decltype(tw)>(
            layout, rows, static_cast<int>(cols), dy, x, weight, rstd, dresidual, dx,
            workspace, workspace_floats, s);
      });
    });
  });
  if (parts == 0) return kSmallWorkspace;
  if (const char* error = LastError()) return error;
  return SumPartials(parts, cols, workspace, dweight, s);
}

// One of the four forward kernels (vector or not, silu or GELU) for these pointers.
template <typename T>
auto GatedForward(int64_t n, bool gelu_tanh, std::initializer_list<const void*> pointers) {
  const bool vector = Vectorizable<T>(n, pointers);
  if (gelu_tanh) {
    return vector ? GatedForwardKernel<T, true, true> : GatedForwardKernel<T, false, true>;
  }
  return vector ? GatedForwardKernel<T, true, false> : GatedForwardKernel<T, false, false>;
}

// The vector kernels also need every row to start on a vector (cols and pitch multiples of it).
template <typename T>
auto GatedBackward(int64_t n, int64_t cols, int64_t pitch, bool gelu_tanh,
                   std::initializer_list<const void*> pointers) {
  const bool vector =
      Vectorizable<T>(n, pointers) && cols % kVec<T> == 0 && pitch % kVec<T> == 0;
  if (gelu_tanh) {
    return vector ? GatedBackwardKernel<T, true, true> : GatedBackwardKernel<T, false, true>;
  }
  return vector ? GatedBackwardKernel<T, true, false> : GatedBackwardKernel<T, false, false>;
}

const char* LaunchGatedForward(int64_t n, const void* gate, const void* up, void* out,
                               ElementType type, bool gelu_tanh, void* stream) {
  if (n == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = GatedForward<T>(n, gelu_tanh, {gate, up, out});
    kernel<<<ElementwiseBlocks(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        n, static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out));
  });
  return LastError();
}

const char* LaunchGatedBackward(int64_t n, int64_t cols, int64_t pitch, const void* gate,
                                const void* up, const void* dout, void* dgate, void* dup,
                                void* product, ElementType type, bool gelu_tanh, void* stream) {
  if (n == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = GatedBackward<T>(n, cols, pitch, gelu_tanh,
                                   {gate, up, dout, dgate, dup, product ? product : gate});
    kernel<<<ElementwiseBlocks(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        n, cols, pitch, static_cast<const T*>(gate), static_cast<const T*>(up),
        static_cast<const T*>(dout), static_cast<T*>(dgate), static_cast<T*>(dup),
        static_cast<T*>(product));
  });
  return LastError();
}

const char* LaunchQkNormRopeForward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    const void* x, ElementType x_type, const void* weight,
                                    ElementType weight_type, double eps, const float* cos,
                                    const float* sin, void* out, ElementType out_type, float* rstd,
                                    void* stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  const size_t smem = kWarpsPerBlock * head_dim * sizeof(float);
  WithType(x_type, [&](auto tx) {
    WithType(weight_type, [&](auto tw) {
      WithType(out_type, [&](auto to) {
        using TX = decltype(tx);
        using TW = decltype(tw);
        using TO = decltype(to);
        const bool chunked = WithChunk(head_dim, [&](auto chunk) {
          constexpr int kChunk = decltype(chunk)::value;
          const int group = GroupRows(heads, kForwardRows<kChunk>);
          auto run = [&](auto kernel) {
            kernel<<<BlocksFor(rows / group), kBlock, 0, s>>>(
                rows, seq, heads, group, static_cast<const TX*>(x), static_cast<const TW*>(weight),
                static_cast<float>(eps), cos, sin, static_cast<TO*>(out), rstd);
          };
          if (Aligned16({x, cos, sin, out})) {
            run(QkNormRopeForwardChunkKernel<true, kChunk, TX, TW, TO>);
          } else {
            run(QkNormRopeForwardChunkKernel<false, kChunk, TX, TW, TO>);
          }
        });
        if (chunked) return;
        QkNormRopeForwardKernel<TX, TW, TO><<<BlocksFor(rows), kBlock, smem, s>>>(
            rows, seq, heads, static_cast<int>(head_dim), static_cast<const TX*>(x),
            static_cast<const TW*>(weight), static_cast<float>(eps), cos, sin,
            static_cast<TO*>(out), rstd);
      });
    });
  });
  return LastError();
}

const char* LaunchQkNormRopeBackward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                     const void* dout, ElementType dout_type, const void* x,
                                     ElementType x_type, const void* weight,
                                     ElementType weight_type, const float* cos, const float* sin,
                                     const float* rstd, void* dx, int64_t dx_pitch,
                                     float* dweight, float* workspace, int64_t workspace_floats,
                                     void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t rows = batch * seq * heads;
  if (rows == 0 || head_dim == 0) {
    if (weight == nullptr) return nullptr;
    return cudaMemsetAsync(dweight, 0, head_dim * sizeof(float), s) == cudaSuccess ? nullptr
                                                                                   : LastError();
  }
  // One fp32 [head_dim] row for each warp of a block.
  const size_t warp_rows_bytes = kWarpsPerBlock * head_dim * sizeof(float);
  int64_t parts = 0;
  // `kernel` over the rows, `warp_rows` a warp at a time, with `smem` bytes of shared memory:
  // as many blocks as are resident or have rows (parts), unless their partial dweight rows
  // would not fit the workspace (parts stays 0).
  auto launch = [&](auto kernel, int64_t warp_rows, size_t smem, auto... args) {
    parts = ResidentBlocks(kernel, kBlock, smem, BlocksFor(CeilDiv(rows, warp_rows)));
    if (weight != nullptr && parts * head_dim > workspace_floats) {
      parts = 0;
      return;
    }
    kernel<<<parts, kBlock, smem, s>>>(args...);
  };
  WithType(dout_type, [&](auto to) {
    WithType(x_type, [&](auto tx) {
      WithType(weight_type, [&](auto tw) {
        using TO = decltype(to);
        using TX = decltype(tx);
        using TW = decltype(tw);
        const auto* d = static_cast<const TO*>(dout);
        const auto* xs = static_cast<const TX*>(x);
        const auto* w = static_cast<const TW*>(weight);
        auto* dxs = static_cast<TX*>(dx);
        const bool chunked = WithChunk(head_dim, [&](auto chunk) {
          constexpr int kChunk = decltype(chunk)::value;
          const int group = GroupRows(heads, kBackwardRows);
          // Every row of dx starts on a 16-byte boundary when its first does and the pitch
          // keeps it so.
          if (Aligned16({dout, x, cos, sin, dx}) && dx_pitch * sizeof(TX) % 16 == 0) {
            launch(QkNormRopeBackwardChunkKernel<true, kChunk, TO, TX, TW>, group,
                   warp_rows_bytes, rows, seq, heads, group, d, xs, w, cos, sin, rstd, dxs,
                   dx_pitch, workspace);
          } else {
            launch(QkNormRopeBackwardChunkKernel<false, kChunk, TO, TX, TW>, group,
                   warp_rows_bytes, rows, seq, heads, group, d, xs, w, cos, sin, rstd, dxs,
                   dx_pitch, workspace);
          }
        });
        if (chunked) return;
        // The general kernels stage two rows a warp (dout * sin and dy).
        launch(head_dim <= 4 * kWarp ? QkNormRopeBackwardKernel<4, TO, TX, TW>
                                     : QkNormRopeBackwardKernel<16, TO, TX, TW>,
               1, 2 * warp_rows_bytes, rows, seq, heads, static_cast<int>(head_dim), d, xs, w, cos,
               sin, rstd, dxs, dx_pitch, workspace);
      });
    });
  });
  if (parts == 0) return kSmallWorkspace;
  if (const char* error = LastError()) return error;
  return weight == nullptr ? nullptr : SumPartials(parts, head_dim, workspace, dweight, s);
}

const char* LaunchResidualAdd(int64_t n, const void* x, ElementType x_type, const void* delta,
                              ElementType delta_type, void* out, void* stream) {
  if (n == 0) return nullptr;
  WithType(x_type, [&](auto tx) {
    WithType(delta_type, [&](auto td) {
      using TX = decltype(tx);
      using TD = decltype(td);
      ResidualAddKernel<TX, TD>
          <<<ElementwiseBlocks(n / 4 + 1), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
              n, static_cast<const TX*>(x), static_cast<const TD*>(delta), static_cast<TX*>(out));
    });
  });
  return LastError();
}

const char* LaunchScaledCopy(int64_t n, const float* x, const float* scale, void* out,
                             ElementType out_type, void* stream) {
  if (n == 0) return nullptr;
  WithType(out_type, [&](auto to) {
    using TO = decltype(to);
    const bool vector = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(out) % (4 * sizeof(TO)) == 0;
    auto kernel = vector ? ScaledCopyKernel<TO, true> : ScaledCopyKernel<TO, false>;
    kernel<<<ElementwiseBlocks(vector ? n / 4 + 1 : n), kBlock, 0,
             static_cast<cudaStream_t>(stream)>>>(n, x, scale, static_cast<TO*>(out));
  });
  return LastError();
}

const char* LaunchCrossEntropyRows(int64_t rows, int64_t vocab, void* logits, ElementType type,
                                   const int64_t* targets, int64_t ignore_index, float softcap,
                                   float* loss, bool write_grad, void* stream) {
  if (rows == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(vocab, {logits}) ? CrossEntropyRowsKernel<T, true>
                                                   : CrossEntropyRowsKernel<T, false>;
    kernel<<<rows, kRowBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        vocab, static_cast<T*>(logits), targets, ignore_index, softcap, loss, write_grad);
  });
  return LastError();
}

const char* LaunchSoftcapSoftmaxForward(int64_t rows, int64_t keys, int64_t queries,
                                        const void* scores, void* probs, ElementType type,
                                        float scale, float softcap, int64_t window,
                                        void* stream) {
  if (rows == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(keys, {scores, probs}) ? SoftcapSoftmaxForwardKernel<T, true>
                                                         : SoftcapSoftmaxForwardKernel<T, false>;
    kernel<<<rows, kRowBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        keys, queries, static_cast<const T*>(scores), static_cast<T*>(probs), scale, softcap,
        window);
  });
  return LastError();
}

const char* LaunchSoftcapSoftmaxBackward(int64_t rows, int64_t keys, int64_t queries,
                                         const void* scores, const void* probs,
                                         const void* dprobs, void* dscores, ElementType type,
                                         float scale, float softcap, int64_t window,
                                         void* stream) {
  if (rows == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(keys, {scores, probs, dprobs, dscores})
                      ? SoftcapSoftmaxBackwardKernel<T, true>
                      : SoftcapSoftmaxBackwardKernel<T, false>;
    kernel<<<rows, kRowBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        keys, queries, static_cast<const T*>(scores), static_cast<const T*>(probs),
        static_cast<const T*>(dprobs), static_cast<T*>(dscores), scale, softcap, window);
  });
  return LastError();
}

const char* LaunchAdamW(const AdamWTensor* tensors, int64_t count, ElementType grad_type,
                        const AdamWScalars& scalars, void* stream) {
  for (int64_t first = 0; first < count; first += kAdamWTensors) {
    AdamWLaunch launch{};
    launch.count = static_cast<int>(std::min<int64_t>(kAdamWTensors, count - first));
    for (int i = 0; i < launch.count; ++i) {
      launch.tensors[i] = tensors[first + i];
      launch.start[i + 1] = launch.start[i] + AdamWPlaces(tensors[first + i].numel);
    }
    const int64_t chunks = CeilDiv(launch.start[launch.count], kAdamWChunk);
    if (chunks == 0) continue;
    WithType(grad_type, [&](auto tg) {
      using TG = decltype(tg);
      // Eight blocks of 256 fill a multiprocessor's 2048 threads.
      const int64_t blocks = std::min<int64_t>(chunks, 8 * static_cast<int64_t>(Multiprocessors()));
      AdamWKernel<TG><<<blocks, kBlock, 0, static_cast<cudaStream_t>(stream)>>>(launch, scalars);
    });
    if (const char* error = LastError()) return error;
  }
  return nullptr;
}

}  // namespace kernels
}  // namespace cpptrain
