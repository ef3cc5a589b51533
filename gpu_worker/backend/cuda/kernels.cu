// Row-wise and element-wise kernels: embedding, RMSNorm (+ residual), q/k norm + RoPE, paged KV
// append, SwiGLU, row gather, argmax. Each row is handled by a fixed-shape block or warp with a
// fixed reduction order, so a row's result never depends on the other rows (batch invariance).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"
#include "gpu_worker/backend/cuda/swiglu.cuh"

namespace cascade::cuda::internal {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float Bf(const Bf16* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ void StoreBf(Bf16* p, int64_t i, float v) {
  reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v);
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
int Blocks(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

__global__ void EmbeddingKernel(const Bf16* table, const int32_t* ids, int hidden, float* out) {
  WaitForPriorGrids();
  const int64_t row = blockIdx.x;
  const int64_t src = static_cast<int64_t>(ids[row]) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) out[row * hidden + c] = Bf(table, src + c);
}

constexpr int kNormThreads = 256;

// The residual's increment at element i: a bf16 delta, or the bf16 rounding of the fp32 partial
// products of a split-K GEMM summed in slice order (the bits SplitReduce writes for a bf16 output).
struct Bf16Delta {
  const Bf16* p;
  __device__ __forceinline__ float operator()(int64_t i) const { return Bf(p, i); }
};
struct SplitDelta {
  const float* p;
  int splits;
  int64_t stride;  // elements between slices: n * d
  __device__ __forceinline__ float operator()(int64_t i) const {
    float s = p[i];
    for (int j = 1; j < splits; ++j) s += p[j * stride + i];
    return __bfloat162float(__float2bfloat16(s));
  }
};
// SplitDelta for a slice count known when the kernel is compiled: every slice's load is issued
// before the first add (with a run-time count each add waited for its load before the next load
// was issued: S dependent L2 round trips an element, measured 6.75 against 1.9 us a norm at batch
// 1 in a replay, bench/engine/NOTES.md run 21). The same sum in the same order, so the same bits.
template <int S>
struct SplitDeltaN {
  const float* p;
  int64_t stride;  // elements between slices: n * d
  __device__ __forceinline__ float operator()(int64_t i) const {
    float v[S];
#pragma unroll
    for (int j = 0; j < S; ++j) v[j] = p[j * stride + i];
    float s = v[0];
#pragma unroll
    for (int j = 1; j < S; ++j) s += v[j];
    return __bfloat162float(__float2bfloat16(s));
  }
};

// One block per row; thread sums are combined by warp butterflies, then warp sums in warp order.
// Thread t owns elements t, t + kNormThreads, ... and sums their squares in that order. kPer > 0:
// d <= kPer * kNormThreads, the row's values stay in registers, every load is issued before the
// first store (one memory round trip instead of one per element and a second pass over the
// residual); kPer == 0: any d, element by element. Both give the same bits.
template <typename Delta, int kPer>
__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* residual, Delta delta, bool add, const Bf16* weight, float eps, int d,
                     Bf16* out) {
  constexpr int kRegs = kPer > 0 ? kPer : 1;
  // The norm weight is read before the wait: no kernel writes weights, so its load overlaps the
  // previous kernel instead of adding a round trip after the reduction.
  float ws[kRegs];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = threadIdx.x + i * kNormThreads;
      ws[i] = c < d ? Bf(weight, c) : 0.f;
    }
  }
  WaitForPriorGrids();
  __shared__ float warp_sums[kNormThreads / 32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * d;
  float ss = 0.f;
  float xs[kRegs];
  if constexpr (kPer > 0) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = threadIdx.x + i * kNormThreads;
      if (c < d) {
        float x = residual[base + c];
        if (add) x += delta(base + c);
        xs[i] = x;
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = threadIdx.x + i * kNormThreads;
      if (c < d) {
        if (add) residual[base + c] = xs[i];
        ss = fmaf(xs[i], xs[i], ss);
      }
    }
  } else {
    for (int c = threadIdx.x; c < d; c += kNormThreads) {
      float x = residual[base + c];
      if (add) {
        x += delta(base + c);
        residual[base + c] = x;
      }
      ss = fmaf(x, x, ss);
    }
  }
  ss = WarpSum(ss);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
  const float inv = rsqrtf(total / d + eps);
  if constexpr (kPer > 0) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = threadIdx.x + i * kNormThreads;
      if (c < d) StoreBf(out, base + c, xs[i] * inv * ws[i]);
    }
  } else {
    for (int c = threadIdx.x; c < d; c += kNormThreads) {
      StoreBf(out, base + c, residual[base + c] * inv * Bf(weight, c));
    }
  }
}

// The AddRmsNormKernel instance for rows of d elements.
template <typename Delta>
auto NormKernelFor(int d) {
  return d <= 4 * kNormThreads    ? AddRmsNormKernel<Delta, 4>
         : d <= 8 * kNormThreads  ? AddRmsNormKernel<Delta, 8>
         : d <= 16 * kNormThreads ? AddRmsNormKernel<Delta, 16>
                                  : AddRmsNormKernel<Delta, 0>;
}

// One CTA of kRopeWarps warps per (token, group of kRopeWarps heads); warp w of group g takes
// head g * kRopeWarps + w of the q, k (and with kAppend v) heads. Lane holds elements lane + 32 k,
// so the rotate_half partner (i +- D/2) is in the same lane for D >= 64 and one xor-16 shuffle
// away for D == 32. The token's D/2 rotary angles are computed once per CTA (sincosf of the same
// float product as before, so the same bits) into shared memory, before the wait: positions and
// frequencies are step metadata no kernel writes. Row and head come from the grid, so no thread
// divides 64-bit indices.
// kAppend: also the fused paged KV append (see QkNormRopeAppend): warps of k heads write their
// rotated values to the token's cache slot as well, and one more warp per v head copies it there
// (16 bytes a lane); the bits written are the bits stored in qkv, so fused == QkNormRope then
// KvAppend.
constexpr int kRopeWarps = 8;

template <int E, bool kAppend>
__global__ void __launch_bounds__(kRopeWarps * 32)
    QkNormRopeKernel(Bf16* qkv, int row_stride, int hq, int hkv, const int32_t* positions,
                     const Bf16* q_norm, const Bf16* k_norm, float eps, const float* inv_freq,
                     const int32_t* slots, KvCacheView cache) {
  constexpr int D = E * 32, kHalf = D / 2;
  __shared__ float sin_s[kHalf], cos_s[kHalf];
  const int row = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int heads = kAppend ? hq + 2 * hkv : hq + hkv;
  const int head = blockIdx.y * kRopeWarps + (threadIdx.x >> 5);
  const bool rotated = head < hq + hkv;
  // Read before the wait, so these loads (and the angles) overlap the previous kernel: the head's
  // norm weights, the row's position and KV slot, the rotary frequencies (no kernel writes them).
  const int position = positions[row];
  if (blockIdx.y * kRopeWarps < hq + hkv && threadIdx.x < kHalf) {
    float s, c;
    sincosf(static_cast<float>(position) * inv_freq[threadIdx.x], &s, &c);
    sin_s[threadIdx.x] = s;
    cos_s[threadIdx.x] = c;
  }
  const Bf16* w = head < hq ? q_norm : k_norm;
  float wn[E];
  if (rotated) {
#pragma unroll
    for (int k = 0; k < E; ++k) wn[k] = w != nullptr ? Bf(w, lane + 32 * k) : 0.f;
  }
  const int slot = kAppend && head >= hq && head < heads ? slots[row] : -1;
  __syncthreads();
  WaitForPriorGrids();
  if (head >= heads) return;
  const int64_t base = static_cast<int64_t>(row) * row_stride + head * D;
  // Cache element 0 of (this kv head) at the row's slot; -1: no cache write.
  int64_t dst = -1;
  if (kAppend && head >= hq && slot >= 0) {
    const int kvh = rotated ? head - hq : head - hq - hkv;
    const int blk = slot / cache.block_size, off = slot % cache.block_size;
    dst = ((static_cast<int64_t>(blk) * cache.num_kv_heads + kvh) * cache.block_size + off) * D;
  }
  if (!rotated) {  // v head: copied as is, 16 bytes a lane
    if (dst >= 0 && lane < D / 8) {
      reinterpret_cast<uint4*>(cache.v + dst)[lane] =
          reinterpret_cast<const uint4*>(qkv + base)[lane];
    }
    return;
  }
  float x[E];
#pragma unroll
  for (int k = 0; k < E; ++k) x[k] = Bf(qkv, base + lane + 32 * k);
  if (w != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < E; ++k) ss = fmaf(x[k], x[k], ss);
    const float inv = rsqrtf(WarpSum(ss) / D + eps);
#pragma unroll
    for (int k = 0; k < E; ++k) x[k] = x[k] * inv * wn[k];
  }
  float y[E];
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const int i = lane + 32 * k;
    const bool low = i < kHalf;
    float partner;
    if constexpr (E == 1) {
      partner = __shfl_xor_sync(0xffffffffu, x[0], 16);
    } else {
      partner = low ? x[k + E / 2] : x[k - E / 2];
    }
    const int j = low ? i : i - kHalf;
    const float s = sin_s[j], c = cos_s[j];
    y[k] = low ? x[k] * c - partner * s : x[k] * c + partner * s;
  }
#pragma unroll
  for (int k = 0; k < E; ++k) StoreBf(qkv, base + lane + 32 * k, y[k]);
  if (kAppend && dst >= 0) {
#pragma unroll
    for (int k = 0; k < E; ++k) StoreBf(cache.k, dst + lane + 32 * k, y[k]);
  }
}

// One thread per 16 bytes of a k or v head.
__global__ void KvAppendKernel(const Bf16* qkv, int n, int row_stride, int k_offset, int v_offset,
                               const int32_t* slots, KvCacheView cache) {
  WaitForPriorGrids();
  const int chunks = cache.head_dim / 8;
  const int64_t per_token = static_cast<int64_t>(cache.num_kv_heads) * chunks;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= per_token * n) return;
  const int row = static_cast<int>(i / per_token);
  const int slot = slots[row];
  if (slot < 0) return;
  const int h = static_cast<int>((i % per_token) / chunks), c = static_cast<int>(i % chunks);
  const int64_t blk = slot / cache.block_size, off = slot % cache.block_size;
  const int64_t dst =
      ((blk * cache.num_kv_heads + h) * cache.block_size + off) * cache.head_dim + c * 8;
  const int64_t src = static_cast<int64_t>(row) * row_stride + h * cache.head_dim + c * 8;
  *reinterpret_cast<uint4*>(cache.k + dst) = *reinterpret_cast<const uint4*>(qkv + k_offset + src);
  *reinterpret_cast<uint4*>(cache.v + dst) = *reinterpret_cast<const uint4*>(qkv + v_offset + src);
}

// One thread per block of kGateUpBlock (8) features of a row: the gate's 16 bytes, the up's 16
// bytes right after them, 16 bytes out. Each element is SiluTimes of the same two values, rounded
// once, as DecodeGemm's fused epilogue stores it. Rows by blockIdx.y, then strided by gridDim.y.
static_assert(kGateUpBlock == 8, "SiluMulKernel moves a block of 8 features as 16 bytes");
constexpr int kSiluThreads = 128;

__global__ void __launch_bounds__(kSiluThreads)
    SiluMulKernel(const Bf16* gu, int n, int inter, Bf16* out) {
  WaitForPriorGrids();
  const int b = blockIdx.x * kSiluThreads + threadIdx.x;
  if (b >= inter / kGateUpBlock) return;
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const uint4* src = reinterpret_cast<const uint4*>(gu + r * 2 * inter) + 2 * b;
    const uint4 g4 = src[0], u4 = src[1];
    const bf16* g = reinterpret_cast<const bf16*>(&g4);
    const bf16* u = reinterpret_cast<const bf16*>(&u4);
    uint4 o4;
    bf16* o = reinterpret_cast<bf16*>(&o4);
#pragma unroll
    for (int e = 0; e < kGateUpBlock; ++e) {
      o[e] = __float2bfloat16(SiluTimes(__bfloat162float(g[e]), __bfloat162float(u[e])));
    }
    reinterpret_cast<uint4*>(out + r * inter)[b] = o4;
  }
}

// Pieces of kL2Piece bytes (the last one shorter), numbered across the regions; thread t of the
// grid takes pieces t, t + threads, ... Each piece is one bulk prefetch: the copy engine of the
// SM fetches it into L2 without the SM waiting, so the kernel ends as soon as it has issued them.
constexpr uint64_t kL2Piece = 32u << 10;
__global__ void PrefetchL2Kernel(L2Regions r) {
  const uint64_t threads = uint64_t{gridDim.x} * blockDim.x;
  uint64_t id = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int i = 0; i < r.count; ++i) {
    const uint64_t pieces = (r.bytes[i] + kL2Piece - 1) / kL2Piece;
    for (; id < pieces; id += threads) {
      const char* p = static_cast<const char*>(r.data[i]) + id * kL2Piece;
      const uint64_t left = r.bytes[i] - id * kL2Piece;
      const uint32_t size = static_cast<uint32_t>(left < kL2Piece ? left : kL2Piece);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(size) : "memory");
    }
    id -= pieces;  // the same thread's place in the next region's numbering
  }
}

__global__ void GatherRowsKernel(const Bf16* in, const int32_t* rows, int n, int d, Bf16* out) {
  WaitForPriorGrids();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(n) * d) return;
  const int64_t r = i / d, c = i % d;
  reinterpret_cast<bf16*>(out)[i] =
      reinterpret_cast<const bf16*>(in)[static_cast<int64_t>(rows[r]) * d + c];
}

// tokens[i] = sampled[feed[i]] where feed[i] >= 0 (a speculated step's inputs, from the step
// before it).
__global__ void FeedTokensKernel(int32_t* tokens, const int32_t* feed, const int32_t* sampled,
                                 int n) {
  WaitForPriorGrids();
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n && feed[i] >= 0) tokens[i] = sampled[feed[i]];
}

constexpr int kArgmaxThreads = 512;

__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// Block-wide best of the threads' (value, index) candidates: highest value, lowest index on
// ties; an index of `vocab` (no candidate) becomes 0. Every thread of the block must call it.
__device__ int BlockBest(float bv, int bi, int vocab) {
  __shared__ float sv[kArgmaxThreads];
  __shared__ int si[kArgmaxThreads];
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kArgmaxThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s &&
        Better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + s];
      si[threadIdx.x] = si[threadIdx.x + s];
    }
    __syncthreads();
  }
  return si[0] < vocab ? si[0] : 0;
}

__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const float* logits, int vocab, int32_t* out) {
  WaitForPriorGrids();
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int bi = vocab;
  for (int c = threadIdx.x; c < vocab; c += kArgmaxThreads) {
    const float v = row[c];
    if (!isnan(v) && Better(v, c, bv, bi)) bv = v, bi = c;
  }
  const int best = BlockBest(bv, bi, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

std::atomic<bool> g_programmatic_launch{true};

}  // namespace

bool ProgrammaticLaunchEnabled() { return g_programmatic_launch.load(std::memory_order_relaxed); }
void SetProgrammaticLaunch(bool on) { g_programmatic_launch.store(on, std::memory_order_relaxed); }

cudaError_t LaunchEmbeddingGather(const Bf16* table, const int32_t* ids, int n, int hidden,
                                  float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(EmbeddingKernel, n, 256, 0, stream, table, ids, hidden, out);
}

cudaError_t LaunchAddRmsNorm(float* residual, const Bf16* delta, const Bf16* weight, float eps,
                             int n, int d, Bf16* out, cudaStream_t stream, bool in_registers) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(in_registers ? NormKernelFor<Bf16Delta>(d) : AddRmsNormKernel<Bf16Delta, 0>,
                      n, kNormThreads, 0, stream, residual, Bf16Delta{delta}, delta != nullptr,
                      weight, eps, d, out);
}

cudaError_t LaunchAddRmsNormSplit(float* residual, const float* partials, int splits,
                                  const Bf16* weight, float eps, int n, int d, Bf16* out,
                                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t stride = static_cast<int64_t>(n) * d;
  auto launch = [&](auto delta) {
    return LaunchKernel(NormKernelFor<decltype(delta)>(d), n, kNormThreads, 0, stream, residual,
                        delta, true, weight, eps, d, out);
  };
  switch (splits) {
    case 2:
      return launch(SplitDeltaN<2>{partials, stride});
    case 4:
      return launch(SplitDeltaN<4>{partials, stride});
    case 8:
      return launch(SplitDeltaN<8>{partials, stride});
    default:
      return launch(SplitDelta{partials, splits, stride});
  }
}

namespace {

template <bool kAppend>
cudaError_t LaunchQkNormRopeImpl(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                                 const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                                 float eps, const float* inv_freq, const int32_t* slots,
                                 const KvCacheView& cache, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int hq = shape.num_q_heads, hkv = shape.num_kv_heads;
  const dim3 grid(n, (hq + (kAppend ? 2 : 1) * hkv + kRopeWarps - 1) / kRopeWarps);
  cudaError_t err = cudaSuccess;
#define CASCADE_QKROPE(E)                                                                 \
  err = LaunchKernel(QkNormRopeKernel<E, kAppend>, grid, kRopeWarps * 32, 0, stream, qkv, \
                     row_stride, hq, hkv, positions, q_norm, k_norm, eps, inv_freq, slots, cache)
  switch (shape.head_dim) {
    case 32:
      CASCADE_QKROPE(1);
      break;
    case 64:
      CASCADE_QKROPE(2);
      break;
    case 128:
      CASCADE_QKROPE(4);
      break;
    case 256:
      CASCADE_QKROPE(8);
      break;
    default:
      return cudaErrorInvalidValue;
  }
#undef CASCADE_QKROPE
  return err;
}

}  // namespace

cudaError_t LaunchQkNormRope(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                             const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                             float eps, const float* inv_freq, cudaStream_t stream) {
  return LaunchQkNormRopeImpl<false>(qkv, n, row_stride, shape, positions, q_norm, k_norm, eps,
                                     inv_freq, nullptr, KvCacheView{}, stream);
}

cudaError_t LaunchQkNormRopeAppend(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                                   const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                                   float eps, const float* inv_freq, const int32_t* slot_mapping,
                                   const KvCacheView& cache, cudaStream_t stream) {
  return LaunchQkNormRopeImpl<true>(qkv, n, row_stride, shape, positions, q_norm, k_norm, eps,
                                    inv_freq, slot_mapping, cache, stream);
}

cudaError_t LaunchKvAppend(const Bf16* qkv, int n, int row_stride, int k_offset, int v_offset,
                           const int32_t* slot_mapping, const KvCacheView& cache,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t threads = static_cast<int64_t>(n) * cache.num_kv_heads * (cache.head_dim / 8);
  return LaunchKernel(KvAppendKernel, Blocks(threads, 256), 256, 0, stream, qkv, n, row_stride,
                      k_offset, v_offset, slot_mapping, cache);
}

cudaError_t LaunchSiluMul(const Bf16* gu, int n, int inter, Bf16* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const dim3 grid(Blocks(inter / kGateUpBlock, kSiluThreads), std::min(n, 65535));
  return LaunchKernel(SiluMulKernel, grid, kSiluThreads, 0, stream, gu, n, inter, out);
}

cudaError_t LaunchPrefetchL2(const L2Regions& regions, int ctas, cudaStream_t stream) {
  if (regions.count == 0) return cudaSuccess;
  PrefetchL2Kernel<<<ctas, 32, 0, stream>>>(regions);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const Bf16* in, const int32_t* rows, int n, int d, Bf16* out,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(GatherRowsKernel, Blocks(static_cast<int64_t>(n) * d, 256), 256, 0, stream,
                      in, rows, n, d, out);
}

cudaError_t LaunchFeedTokens(int32_t* tokens, const int32_t* feed, const int32_t* sampled, int n,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(FeedTokensKernel, Blocks(n, 256), 256, 0, stream, tokens, feed, sampled, n);
}

cudaError_t LaunchArgmaxRows(const float* logits, int n, int vocab, int32_t* out,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(ArgmaxKernel, n, kArgmaxThreads, 0, stream, logits, vocab, out);
}

}  // namespace cascade::cuda::internal
