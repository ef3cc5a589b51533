// y[m, n] = x[m, k] * w[n, k]^T for few rows (m <= 16) on tensor cores, with each output
// element accumulated the way a non-split-K tensor-core GEMM accumulates it: one fp32
// accumulator, k ascending in steps of 16, each step one m16n8k16 MMA (D = A B + C). Whether its
// bits equal a given cuBLASLt kernel's is a property of the hardware that gemm.cc verifies at run
// time before using it (cached == cold needs prefill rows and decode rows to agree).
//
// Layout: A = x rows (16 x 16 per step, rows >= m are zero), B = 8 weight rows (16 k x 8 columns,
// "col" operand = weight rows contiguous in k), C = [16 x 8] = y[row][feature]. One warp owns
// 8, 16 or 32 features over one k slice; weights and x stream through a cp.async ring in shared
// memory ahead of the MMAs.
//
// Batch-invariant split-K (gemm.h): with S slices, CTA row blockIdx.y = s accumulates k columns
// [s k/S, (s+1) k/S) from zero and writes that fp32 partial product to y + s m n, the way a
// cuBLASLt strided-batched call over the same slices does; S = 1 is the unsplit GEMM.
// SplitReduceKernel then sums the partials in slice order (((p0 + p1) + p2) + ...).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"

namespace cascade::cuda::internal {
namespace {

constexpr int kChunk = 64;       // k per pipeline stage
constexpr int kStages = 8;       // stages in flight per warp
constexpr int kLd = kChunk + 8;  // padded smem row (bf16): fragment loads hit 32 banks
constexpr int kMaxTiles = 4;     // n8 tiles (independent MMA chains) per warp

// Shared memory of a CTA: kStages x (8 * tiles weight rows + m x rows) x kLd bf16.
size_t SmemBytes(int tiles, int m) {
  return size_t{kStages} * (8 * tiles + m) * kLd * sizeof(Bf16);
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ uint32_t Ld32(const Bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// One warp per CTA and 8 * kTiles features (n), as kTiles independent MMA chains (latency
// hiding); k streams through a kStages-deep ring of cp.async stages (weights [8 kTiles][kChunk],
// x [m][kChunk]); each chain runs its MMAs in k order on one accumulator per element.
// k is the row stride of x and w; this CTA's slice is k columns [blockIdx.y ks, + ks), and its
// output y + blockIdx.y m n (kF32Out only when ks < k).
template <bool kF32Out, int kTiles>
__global__ void __launch_bounds__(32)
    SmallGemmKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w, int m, int n, int k,
                    int ks, void* __restrict__ y) {
  WaitForPriorGrids();
  extern __shared__ __align__(16) Bf16 ring[];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const int f0 = blockIdx.x * 8 * kTiles;
  const int chunks = ks / kChunk;
  const int64_t kbase = static_cast<int64_t>(blockIdx.y) * ks;
  const int stage_elems = (8 * kTiles + m) * kLd;
  auto issue = [&](int c) {
    if (c < chunks) {
      Bf16* st = ring + (c % kStages) * stage_elems;
      const int64_t k0 = kbase + static_cast<int64_t>(c) * kChunk;
#pragma unroll
      for (int i = 0; i < 2 * kTiles; ++i) {  // weights: 8 kTiles rows x 8 pieces of 16 B
        const int idx = lane + 32 * i, r = idx >> 3, p = idx & 7;
        CpAsync16(st + r * kLd + p * 8, w + static_cast<int64_t>(f0 + r) * k + k0 + p * 8);
      }
      for (int idx = lane; idx < m * 8; idx += 32) {  // x: m rows x 8 pieces
        const int r = idx >> 3, p = idx & 7;
        CpAsync16(st + (8 * kTiles + r) * kLd + p * 8,
                  x + static_cast<int64_t>(r) * k + k0 + p * 8);
      }
    }
    CpAsyncCommit();  // an empty group past the end keeps the wait count uniform
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) issue(c);
  const bool r0 = g < m, r1 = g + 8 < m;
  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int c = 0; c < chunks; ++c) {
    CpAsyncWait<kStages - 2>();  // chunk c has landed (this lane's copies)
    __syncwarp();                // ... and every lane's; chunk c - 1's readers are done
    issue(c + kStages - 1);      // into chunk c - 1's stage
    const Bf16* ws = ring + (c % kStages) * stage_elems;
    const Bf16* xs = ws + 8 * kTiles * kLd;
#pragma unroll
    for (int j = 0; j < kChunk / 16; ++j) {
      const int kk = 16 * j + 2 * t;
      uint32_t a[4];
      a[0] = r0 ? Ld32(xs + g * kLd + kk) : 0u;
      a[1] = r1 ? Ld32(xs + (g + 8) * kLd + kk) : 0u;
      a[2] = r0 ? Ld32(xs + g * kLd + kk + 8) : 0u;
      a[3] = r1 ? Ld32(xs + (g + 8) * kLd + kk + 8) : 0u;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        const Bf16* wr = ws + (8 * i + g) * kLd + kk;
        Mma(acc[i], a, Ld32(wr), Ld32(wr + 8));
      }
    }
  }
  CpAsyncWait<0>();
  // acc[i][0], [1]: row g, features f0 + 8 i + 2t, + 1; acc[i][2], [3]: row g + 8.
  const int64_t ybase = static_cast<int64_t>(blockIdx.y) * m * n;
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int f = f0 + 8 * i + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = g + 8 * h;
      if (row >= m) continue;
      const int64_t at = ybase + static_cast<int64_t>(row) * n + f;
      if (kF32Out) {
        *reinterpret_cast<float2*>(static_cast<float*>(y) + at) =
            make_float2(acc[i][2 * h], acc[i][2 * h + 1]);
      } else {
        __nv_bfloat16* yo = static_cast<__nv_bfloat16*>(y);
        yo[at] = __float2bfloat16(acc[i][2 * h]);
        yo[at + 1] = __float2bfloat16(acc[i][2 * h + 1]);
      }
    }
  }
}

template <bool kF32Out, int kTiles>
cudaError_t Launch(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                   cudaStream_t stream) {
  const size_t smem = SmemBytes(kTiles, m);
  cudaError_t err =
      cudaFuncSetAttribute(SmallGemmKernel<kF32Out, kTiles>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes(kMaxTiles, 16));
  if (err != cudaSuccess) return err;
  return LaunchKernel(SmallGemmKernel<kF32Out, kTiles>, dim3(n / (8 * kTiles), splits), 32, smem,
                      stream, x, w, m, n, k, k / splits, y);
}

template <bool kF32Out>
cudaError_t LaunchTiles(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                        cudaStream_t stream) {
  // More chains per warp where n leaves enough warps to fill the chip anyway.
  if (n % 32 == 0 && n >= 32768) return Launch<kF32Out, 4>(x, w, m, n, k, splits, y, stream);
  if (n % 16 == 0 && n >= 16384) return Launch<kF32Out, 2>(x, w, m, n, k, splits, y, stream);
  return Launch<kF32Out, 1>(x, w, m, n, k, splits, y, stream);
}

constexpr int kReduceThreads = 256;

// y[i] = out(((p[i] + p[stride + i]) + p[2 stride + i]) + ...): the partials of one output element
// summed in slice order, one thread per 4 elements (count % 4 == 0). Rows never mix.
template <bool kF32Out>
__global__ void __launch_bounds__(kReduceThreads)
    SplitReduceKernel(const float* __restrict__ p, int splits, int64_t count,
                      void* __restrict__ y) {
  WaitForPriorGrids();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x) * 4;
  if (i >= count) return;
  float4 s = *reinterpret_cast<const float4*>(p + i);
  for (int j = 1; j < splits; ++j) {
    const float4 q = *reinterpret_cast<const float4*>(p + j * count + i);
    s.x += q.x;
    s.y += q.y;
    s.z += q.z;
    s.w += q.w;
  }
  if (kF32Out) {
    *reinterpret_cast<float4*>(static_cast<float*>(y) + i) = s;
  } else {
    __nv_bfloat162* yo = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + i);
    yo[0] = __floats2bfloat162_rn(s.x, s.y);
    yo[1] = __floats2bfloat162_rn(s.z, s.w);
  }
}

}  // namespace

cudaError_t LaunchSmallGemm(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                            bool f32_out, cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  if (m > 16 || n % 8 != 0 || splits < 1 || k % (kChunk * splits) != 0 || (splits > 1 && !f32_out))
    return cudaErrorInvalidValue;
  return f32_out ? LaunchTiles<true>(x, w, m, n, k, splits, y, stream)
                 : LaunchTiles<false>(x, w, m, n, k, splits, y, stream);
}

cudaError_t LaunchSplitReduce(const float* partials, int splits, int64_t count, void* y,
                              bool f32_out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count % 4 != 0 || splits < 1) return cudaErrorInvalidValue;
  const int64_t threads = count / 4;
  const int blocks = static_cast<int>((threads + kReduceThreads - 1) / kReduceThreads);
  return f32_out ? LaunchKernel(SplitReduceKernel<true>, blocks, kReduceThreads, 0, stream,
                                partials, splits, count, y)
                 : LaunchKernel(SplitReduceKernel<false>, blocks, kReduceThreads, 0, stream,
                                partials, splits, count, y);
}

}  // namespace cascade::cuda::internal
