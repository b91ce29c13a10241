// CUDA kernels for the decoder's memory-bound steps (kernels/launchers.h says what each
// computes). All arithmetic is fp32; inputs and outputs are fp32 or bf16. Built for sm_90 by
// CMake on GPU hosts; tools/nvcc_check.sh compiles this file wherever nvcc is installed (CI).
//
// Layout of the row kernels: one warp per row, eight warps per block; a lane walks the row in
// steps of 32, so a warp's loads are coalesced. Backward kernels run a grid-stride loop over
// rows and sum dweight per block in shared memory before one atomic add per column and block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>

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

// Whether every pointer is 16-byte aligned and n a multiple of the vector width.
template <typename T>
bool Vectorizable(int64_t n, std::initializer_list<const void*> pointers) {
  if (n % kVec<T> != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
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

// Blocks of a grid-stride backward: enough to fill the device a few times over.
int64_t BackwardBlocks(int64_t rows) {
  int device = 0;
  int sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  return std::max<int64_t>(1, std::min<int64_t>(BlocksFor(rows), 4 * sms));
}

// ---- RMSNorm ---------------------------------------------------------------------------

template <typename TX, typename TW, typename TY>
__global__ void RmsNormForwardKernel(int64_t rows, int cols, const TX* x, const TW* weight,
                                     float eps, TY* y, float* rstd) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const TX* xr = x + row * cols;
  float squares = 0.f;
  for (int j = lane; j < cols; j += kWarp) {
    const float v = Load(xr, j);
    squares += v * v;
  }
  const float r = rsqrtf(WarpSum(squares) / cols + eps);
  if (lane == 0) rstd[row] = r;
  TY* yr = y + row * cols;
  for (int j = lane; j < cols; j += kWarp) {
    Store(yr, j, Load(weight, j) * RoundTo<TX>(Load(xr, j) * r));
  }
}

// kPerLane > 0: each lane keeps its columns' dweight sums in registers (cols <= 32 * kPerLane);
// 0: the sums go through shared-memory atomics (any cols up to kMaxNormCols).
template <int kPerLane, typename TDY, typename TX, typename TW>
__global__ void RmsNormBackwardKernel(int64_t rows, int cols, const TDY* dy, const TX* x,
                                      const TW* weight, const float* rstd, TX* dx, float* dweight) {
  extern __shared__ float block_dweight[];  // [cols]
  for (int j = threadIdx.x; j < cols; j += blockDim.x) block_dweight[j] = 0.f;
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  float acc[kPerLane > 0 ? kPerLane : 1] = {};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       row < rows; row += stride) {
    const float r = rstd[row];
    const TDY* dyr = dy + row * cols;
    const TX* xr = x + row * cols;
    // dx_j = r * (g_j - n_j * sum_k(g_k n_k) / cols) with g = dy * weight, n = x * r.
    float dot = 0.f;
    if constexpr (kPerLane > 0) {
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int j = lane + k * kWarp;
        if (j < cols) {
          const float d = Load(dyr, j);
          const float n = Load(xr, j) * r;
          dot += d * Load(weight, j) * n;
          acc[k] += d * RoundTo<TX>(n);
        }
      }
    } else {
      for (int j = lane; j < cols; j += kWarp) {
        const float d = Load(dyr, j);
        const float n = Load(xr, j) * r;
        dot += d * Load(weight, j) * n;
        atomicAdd(&block_dweight[j], d * RoundTo<TX>(n));
      }
    }
    dot = WarpSum(dot) / cols;
    TX* dxr = dx + row * cols;
    for (int j = lane; j < cols; j += kWarp) {
      const float n = Load(xr, j) * r;
      Store(dxr, j, r * (Load(dyr, j) * Load(weight, j) - n * dot));
    }
  }
  if constexpr (kPerLane > 0) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      if (j < cols) atomicAdd(&block_dweight[j], acc[k]);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < cols; j += blockDim.x) atomicAdd(&dweight[j], block_dweight[j]);
}

// ---- SwiGLU ----------------------------------------------------------------------------

__device__ __forceinline__ float Silu(float g) { return g / (1.f + __expf(-g)); }

// kVector: n is a multiple of kVec<T> and the pointers are aligned (16-byte accesses).
template <typename T, bool kVector>
__global__ void SwiGluForwardKernel(int64_t n, const T* gate, const T* up, T* out) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kWidth;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth; i < n;
       i += stride) {
    if constexpr (kVector) {
      float g[kVec<T>], u[kVec<T>], o[kVec<T>];
      LoadVec(gate + i, g);
      LoadVec(up + i, u);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) o[k] = Silu(g[k]) * u[k];
      StoreVec(out + i, o);
    } else {
      Store(out, i, Silu(Load(gate, i)) * Load(up, i));
    }
  }
}

__device__ __forceinline__ void SwiGluGrad(float g, float u, float d, float& dg, float& du) {
  const float s = 1.f / (1.f + __expf(-g));
  du = d * g * s;
  dg = d * u * s * (1.f + g * (1.f - s));
}

template <typename T, bool kVector>
__global__ void SwiGluBackwardKernel(int64_t n, const T* gate, const T* up, const T* dout, T* dgate,
                                     T* dup) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kWidth;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth; i < n;
       i += stride) {
    if constexpr (kVector) {
      float g[kVec<T>], u[kVec<T>], d[kVec<T>], dg[kVec<T>], du[kVec<T>];
      LoadVec(gate + i, g);
      LoadVec(up + i, u);
      LoadVec(dout + i, d);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) SwiGluGrad(g[k], u[k], d[k], dg[k], du[k]);
      StoreVec(dgate + i, dg);
      StoreVec(dup + i, du);
    } else {
      float dg, du;
      SwiGluGrad(Load(gate, i), Load(up, i), Load(dout, i), dg, du);
      Store(dgate, i, dg);
      Store(dup, i, du);
    }
  }
}

int64_t ElementwiseBlocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>((n + kBlock - 1) / kBlock, 132 * 16));
}

// ---- QK-norm + rotary ------------------------------------------------------------------

// Row `row` of x [B, T, H, D] is head h of token (b, t); its output row in [B, H, T, D].
struct HeadRow {
  int64_t t;
  int64_t out_row;
};

__device__ __forceinline__ HeadRow Locate(int64_t row, int64_t seq, int64_t heads) {
  const int64_t h = row % heads;
  const int64_t bt = row / heads;
  const int64_t t = bt % seq;
  const int64_t b = bt / seq;
  return {t, (b * heads + h) * seq + t};
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
  const HeadRow at = Locate(row, seq, heads);
  const int half = dim / 2;
  const float* c = cos + at.t * dim;
  const float* s = sin + at.t * dim;
  TO* o = out + at.out_row * dim;
  for (int j = lane; j < dim; j += kWarp) {
    const float rotated = j < half ? -y[j + half] : y[j - half];
    Store(o, j, y[j] * c[j] + rotated * s[j]);
  }
}

// Each lane keeps its columns' dweight sums in registers (dim <= 32 * kPerLane).
template <int kPerLane, typename TO, typename TX, typename TW>
__global__ void QkNormRopeBackwardKernel(int64_t rows, int64_t seq, int64_t heads, int dim,
                                         const TO* dout, const TX* x, const TW* weight,
                                         const float* cos, const float* sin, const float* rstd,
                                         TX* dx, float* dweight) {
  // [dim] block dweight, then per warp [dim] dout * sin and [dim] dy.
  extern __shared__ float shared[];
  float* block_dweight = shared;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  float* staged = shared + dim + warp * 2 * dim;
  float* dy = staged + dim;
  if (weight != nullptr) {
    for (int j = threadIdx.x; j < dim; j += blockDim.x) block_dweight[j] = 0.f;
    __syncthreads();
  }
  const int half = dim / 2;
  float acc[kPerLane] = {};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows;
       row += stride) {
    const HeadRow at = Locate(row, seq, heads);
    const TO* d = dout + at.out_row * dim;
    const float* c = cos + at.t * dim;
    const float* s = sin + at.t * dim;
    __syncwarp();
    for (int j = lane; j < dim; j += kWarp) staged[j] = Load(d, j) * s[j];
    __syncwarp();
    // dy_k = dout_k cos_k + (k < half ? (dout sin)_{k+half} : -(dout sin)_{k-half})
    for (int j = lane; j < dim; j += kWarp) {
      dy[j] = Load(d, j) * c[j] + (j < half ? staged[j + half] : -staged[j - half]);
    }
    const TX* xr = x + row * dim;
    TX* dxr = dx + row * dim;
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
  if (weight != nullptr) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      if (j < dim) atomicAdd(&block_dweight[j], acc[k]);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(&dweight[j], block_dweight[j]);
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

// One block per row: loss[row] = logsumexp(z) - z[target] (0 when ignored, NaN when the target
// is outside [0, vocab)); with write_grad,
// z is overwritten by softmax(z) - onehot(target) (zeros when ignored).
template <typename T, bool kVector>
__global__ void CrossEntropyRowsKernel(int64_t vocab, T* logits, const int64_t* targets,
                                       int64_t ignore_index, float* loss, bool write_grad) {
  constexpr int kWidth = kVector ? kVec<T> : 1;
  __shared__ float shared_m[kRowBlock / kWarp];
  __shared__ float shared_s[kRowBlock / kWarp];
  T* z = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x * kWidth; j < vocab; j += blockDim.x * kWidth) {
    float v[kWidth];
    if constexpr (kVector) {
      LoadVec(z + j, v);
    } else {
      v[0] = Load(z, j);
    }
    float top = v[0];
#pragma unroll
    for (int k = 1; k < kWidth; ++k) top = fmaxf(top, v[k]);
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) part += __expf(v[k] - top);
    Combine(m, s, top, part);
  }
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
  const float lse = m + logf(s);
  const int64_t target = targets[blockIdx.x];
  const bool counted = target != ignore_index;
  // A target outside the vocabulary (eager raises) makes the loss NaN rather than pass unseen.
  const bool valid = target >= 0 && target < vocab;
  if (threadIdx.x == 0) {
    loss[blockIdx.x] = !counted ? 0.f : valid ? lse - Load(z, target) : NAN;
  }
  if (!write_grad) return;
  __syncthreads();  // z[target] is read before it is overwritten
  for (int64_t j = threadIdx.x * kWidth; j < vocab; j += blockDim.x * kWidth) {
    float v[kWidth];
    if constexpr (kVector) {
      LoadVec(z + j, v);
    } else {
      v[0] = Load(z, j);
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      v[k] = counted ? __expf(v[k] - lse) - (j + k == target ? 1.f : 0.f) : 0.f;
    }
    if constexpr (kVector) {
      StoreVec(z + j, v);
    } else {
      Store(z, j, v[0]);
    }
  }
}

}  // namespace

const char* LaunchRmsNormForward(int64_t rows, int64_t cols, const void* x, ElementType x_type,
                                 const void* weight, ElementType weight_type, double eps, void* y,
                                 ElementType y_type, float* rstd, void* stream) {
  if (rows == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  WithType(x_type, [&](auto tx) {
    WithType(weight_type, [&](auto tw) {
      WithType(y_type, [&](auto ty) {
        using TX = decltype(tx);
        using TW = decltype(tw);
        using TY = decltype(ty);
        RmsNormForwardKernel<TX, TW, TY><<<BlocksFor(rows), kBlock, 0, s>>>(
            rows, static_cast<int>(cols), static_cast<const TX*>(x), static_cast<const TW*>(weight),
            static_cast<float>(eps), static_cast<TY*>(y), rstd);
      });
    });
  });
  return LastError();
}

const char* LaunchRmsNormBackward(int64_t rows, int64_t cols, const void* dy, ElementType dy_type,
                                  const void* x, ElementType x_type, const void* weight,
                                  ElementType weight_type, const float* rstd, void* dx,
                                  float* dweight, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (cudaMemsetAsync(dweight, 0, cols * sizeof(float), s) != cudaSuccess) return LastError();
  if (rows == 0) return nullptr;
  WithType(dy_type, [&](auto tdy) {
    WithType(x_type, [&](auto tx) {
      WithType(weight_type, [&](auto tw) {
        using TDY = decltype(tdy);
        using TX = decltype(tx);
        using TW = decltype(tw);
        const dim3 grid(BackwardBlocks(rows));
        const size_t smem = cols * sizeof(float);
        const auto args = std::make_tuple(rows, static_cast<int>(cols), static_cast<const TDY*>(dy),
                                          static_cast<const TX*>(x), static_cast<const TW*>(weight),
                                          rstd, static_cast<TX*>(dx), dweight);
        auto launch = [&](auto kernel) {
          std::apply([&](auto... a) { kernel<<<grid, kBlock, smem, s>>>(a...); }, args);
        };
        // The weight gradient stays in registers up to 128 columns per lane (hidden 4096);
        // wider rows fall back to shared-memory atomics per element, several times slower.
        if (cols <= 4 * kWarp) {
          launch(RmsNormBackwardKernel<4, TDY, TX, TW>);
        } else if (cols <= 32 * kWarp) {
          launch(RmsNormBackwardKernel<32, TDY, TX, TW>);
        } else if (cols <= 64 * kWarp) {
          launch(RmsNormBackwardKernel<64, TDY, TX, TW>);
        } else if (cols <= 128 * kWarp) {
          launch(RmsNormBackwardKernel<128, TDY, TX, TW>);
        } else {
          launch(RmsNormBackwardKernel<0, TDY, TX, TW>);
        }
      });
    });
  });
  return LastError();
}

const char* LaunchSwiGluForward(int64_t n, const void* gate, const void* up, void* out,
                                ElementType type, void* stream) {
  if (n == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(n, {gate, up, out}) ? SwiGluForwardKernel<T, true>
                                                      : SwiGluForwardKernel<T, false>;
    kernel<<<ElementwiseBlocks(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        n, static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out));
  });
  return LastError();
}

const char* LaunchSwiGluBackward(int64_t n, const void* gate, const void* up, const void* dout,
                                 void* dgate, void* dup, ElementType type, void* stream) {
  if (n == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(n, {gate, up, dout, dgate, dup}) ? SwiGluBackwardKernel<T, true>
                                                                   : SwiGluBackwardKernel<T, false>;
    kernel<<<ElementwiseBlocks(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        n, static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dout),
        static_cast<T*>(dgate), static_cast<T*>(dup));
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
                                     const float* rstd, void* dx, float* dweight, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (weight != nullptr &&
      cudaMemsetAsync(dweight, 0, head_dim * sizeof(float), s) != cudaSuccess) {
    return LastError();
  }
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return nullptr;
  const size_t smem = (1 + 2 * kWarpsPerBlock) * head_dim * sizeof(float);
  WithType(dout_type, [&](auto to) {
    WithType(x_type, [&](auto tx) {
      WithType(weight_type, [&](auto tw) {
        using TO = decltype(to);
        using TX = decltype(tx);
        using TW = decltype(tw);
        auto kernel = head_dim <= 4 * kWarp ? QkNormRopeBackwardKernel<4, TO, TX, TW>
                                            : QkNormRopeBackwardKernel<16, TO, TX, TW>;
        kernel<<<BackwardBlocks(rows), kBlock, smem, s>>>(
            rows, seq, heads, static_cast<int>(head_dim), static_cast<const TO*>(dout),
            static_cast<const TX*>(x), static_cast<const TW*>(weight), cos, sin, rstd,
            static_cast<TX*>(dx), dweight);
      });
    });
  });
  return LastError();
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

const char* LaunchCrossEntropyRows(int64_t rows, int64_t vocab, void* logits, ElementType type,
                                   const int64_t* targets, int64_t ignore_index, float* loss,
                                   bool write_grad, void* stream) {
  if (rows == 0) return nullptr;
  WithType(type, [&](auto t) {
    using T = decltype(t);
    auto kernel = Vectorizable<T>(vocab, {logits}) ? CrossEntropyRowsKernel<T, true>
                                                   : CrossEntropyRowsKernel<T, false>;
    kernel<<<rows, kRowBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        vocab, static_cast<T*>(logits), targets, ignore_index, loss, write_grad);
  });
  return LastError();
}

}  // namespace kernels
}  // namespace cpptrain
