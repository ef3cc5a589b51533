// y[m, n] = x[m, k] * w[n, k]^T for decode-sized m (<= 64) on Hopper's warpgroup MMA, every
// output element accumulated the way the pinned cuBLASLt kernels accumulate it: one fp32
// accumulator, k ascending in steps of 16 (wgmma k16 steps give the bits of mma.sync m16n8k16
// steps: NOTES.md v7 probe; gemm.cc still compares each shape with the pinned algorithm before
// use).
//
// Why: at decode sizes the pinned large-tile algorithm runs a handful of CTAs per GEMM (an n = 1024
// projection at m = 64: ~8 CTAs streaming 0.5 MB each), 8-11 us against a 1.3-3.8 us bytes floor.
// Here one CTA (one warpgroup) owns N = 8 J output features for all m rows and the whole k loop, so
// an n = 1024 GEMM runs 128 CTAs; the k loop cannot be split (that would change the bits). wgmma
// issues its chain of dependent k16 steps back to back, yet on long k the chain still bounds a
// CTA (qwen3-0.6b's n = 1024 projections, k 2048-3072, are no faster than the pinned kernel), and
// at m = 32-64 every CTA reading all of x costs: gemm.cc times it against the pinned algorithm
// per weight shape and batch bucket and uses it only where it wins.
//
// Per stage (128 k): x's m rows (A) and the CTA's 8 J weight rows (B), both in the 128-byte
// swizzled K-major layout of wgmma.cuh, as two 64-k halves. The MMA is m64nNk16 with A and B
// from shared memory: rows >= m of the 64-row A tile read whatever follows the stage's x rows
// (other rows' data, never written to y: a row's outputs depend on its own A row only). S stages
// ring through cp.async; chunk c's MMAs run while chunks c + 1 .. c + S - 3 load.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"
#include "gpu_worker/backend/cuda/swiglu.cuh"
#include "gpu_worker/backend/cuda/wgmma.cuh"

namespace cascade::cuda::internal {
namespace {

constexpr int kKc = 128;       // k per stage
constexpr int kThreads = 128;  // one warpgroup
constexpr int kMaxM = 64;      // one wgmma M tile
// The A tile's rows past m read up to 64 rows x 128 bytes past a half's start: slack past the
// last stage keeps that inside the allocation.
constexpr int kSlack = 8192;
constexpr size_t kMaxSmem = 227u << 10;  // per CTA on sm_90

// x rows staged per stage: m rounded up to the 8-row swizzle atom.
__host__ __device__ inline int XRows(int m) { return (m + 7) / 8 * 8; }
// Bytes of one stage: x (two halves of XRows x 128 bytes), then the weights (two halves of 8 J x
// 128 bytes); every 1024-byte atom stays 1024-aligned.
__host__ __device__ inline int StageBytes(int j, int m) { return 256 * XRows(m) + 2048 * j; }
size_t SmemBytes(int j, int stages, int m) {
  return size_t{1024} + static_cast<size_t>(stages) * StageBytes(j, m) + kSlack;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// d (64 x 8 J, f32) += A (64 x 16, K-major, smem) * B (16 x 8 J as 8 J rows K-major, smem).
template <int J>
__device__ __forceinline__ void WgmmaSS(float (&d)[J][4], uint64_t a, uint64_t b);
template <>
__device__ __forceinline__ void WgmmaSS<1>(float (&d)[1][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void WgmmaSS<2>(float (&d)[2][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, "
      "1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "l"(a), "l"(b));
}
template <>
__device__ __forceinline__ void WgmmaSS<4>(float (&d)[4][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b));
}
#endif

std::atomic<int> g_early_chunks{2};

// Epilogues: bf16 or f32 y [m, n]; or kSiluMul: w is a gate_up weight in 8-row blocks
// (swiglu.cuh), y is act [m, n / 2] bf16 = SiluTimes of the bf16-rounded gate and up outputs,
// which a CTA of J >= 2 holds side by side (acc[j] gate, acc[j + 1] up for even j).
enum Out { kBf16Out = 0, kF32Out = 1, kSiluMul = 2 };

template <int J, int S, int kOut>
__global__ void __launch_bounds__(kThreads)
    DecodeGemmKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w, int m, int n, int k,
                     int ldk, void* __restrict__ y, int early) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(S >= 3, "a stage loads while one is read and one drains");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const int xrows = XRows(m), stage_bytes = StageBytes(J, m), xhalf = 128 * xrows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int f0 = blockIdx.x * 8 * J;
  // Split-K slice blockIdx.y: k columns [y k, (y + 1) k) of rows ldk apart, its f32 partial
  // product at y's [m, n] block of the output (one slice: the whole product).
  x += static_cast<int64_t>(blockIdx.y) * k;
  w += static_cast<int64_t>(blockIdx.y) * k;
  if constexpr (kOut == kF32Out)
    y = static_cast<float*>(y) + static_cast<int64_t>(blockIdx.y) * m * n;
  const int chunks = k / kKc;
  // Piece p (16 bytes, 0..15) of row r of a 128-k chunk: half p / 8, swizzled within its atom.
  auto at = [](int half_bytes, int r, int p) {
    const int q = p & 7;
    return (p >> 3) * half_bytes + (r >> 3) * 1024 + (r & 7) * 128 + ((q ^ (r & 7)) << 4);
  };
  auto issue_x = [&](int c) {
    const uint32_t st = base + (c % S) * stage_bytes;
    const int64_t k0 = static_cast<int64_t>(c) * kKc;
    for (int idx = tid; idx < m * 16; idx += kThreads) {  // x: m rows x 16 pieces
      const int r = idx >> 4, p = idx & 15;
      CpAsync16(st + at(xhalf, r, p), x + static_cast<int64_t>(r) * ldk + k0 + p * 8);
    }
  };
  auto issue_w = [&](int c) {
    const uint32_t ws = base + (c % S) * stage_bytes + 2 * xhalf;
    const int64_t k0 = static_cast<int64_t>(c) * kKc;
#pragma unroll
    for (int i = 0; i < J; ++i) {  // weights: 8 J rows x 16 pieces
      const int idx = tid + kThreads * i, r = idx >> 4, p = idx & 15;
      CpAsync16(ws + at(1024 * J, r, p), w + static_cast<int64_t>(f0 + r) * ldk + k0 + p * 8);
    }
  };
  // The weights of the first `early` chunks are copied before the wait for the previous kernel
  // (no kernel writes weights; under programmatic launch this CTA may start while that kernel
  // runs), so chunk 0's MMAs wait for x, which that kernel just wrote (L2), not for device memory.
  // Early chunks join chunk 0's copy group; the rest of the ring is issued as before.
  early = early < S - 2 ? early : S - 2;  // the ring's first stages, and k's chunks at most
  early = early < chunks ? early : chunks;
  for (int c = 0; c < early; ++c) issue_w(c);
  WaitForPriorGrids();
#pragma unroll
  for (int c = 0; c < S - 2; ++c) {
    if (c < chunks) {
      issue_x(c);
      if (c >= early) issue_w(c);
    }
    CpAsyncCommit();  // an empty group past the end keeps the wait count uniform
  }
  auto issue = [&](int c) {
    if (c < chunks) {
      issue_x(c);
      issue_w(c);
    }
    CpAsyncCommit();
  };

  float acc[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int c = 0; c < chunks; ++c) {
    CpAsyncWait<S - 3>();  // chunk c has landed (this thread's copies)
    FenceProxyAsync();     // ... and is visible to the wgmma operand reads
    WgmmaWait<1>();        // chunk c - 2's MMAs are done with its stage
    __syncthreads();       // every thread's copies of chunk c, every warp past chunk c - 2
    issue(c + S - 2);      // into chunk c - 2's stage
    const uint32_t st = base + (c % S) * stage_bytes, ws = st + 2 * xhalf;
    WgmmaFence();
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int h = s >> 2, kb = (s & 3) * 32;
      WgmmaSS<J>(acc, WgmmaDesc(st + h * xhalf + kb, 16, 1024),
                 WgmmaDesc(ws + h * 1024 * J + kb, 16, 1024));
    }
    WgmmaCommit();
  }
  WgmmaWait<0>();
#pragma unroll
  for (int j = 0; j < J; ++j) FenceRegs(acc[j]);
  // acc[j][0], [1]: row 16 warp + g, features f0 + 8 j + 2 t, + 1; acc[j][2], [3]: row + 8.
  const int g = lane >> 2, t = lane & 3;
  if constexpr (kOut == kSiluMul) {
    static_assert(J % 2 == 0, "a CTA holds gate and up blocks in pairs");
    auto bf = [](float v) { return __bfloat162float(__float2bfloat16_rn(v)); };
#pragma unroll
    for (int j = 0; j < J; j += 2) {
      const int f = f0 / 2 + 4 * j + 2 * t;  // act feature of acc[j][2 h], gate block j / 2
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * warp + g + 8 * h;
        if (row >= m) continue;
        const int64_t o = static_cast<int64_t>(row) * (n / 2) + f;
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + o) =
            __floats2bfloat162_rn(SiluTimes(bf(acc[j][2 * h]), bf(acc[j + 1][2 * h])),
                                  SiluTimes(bf(acc[j][2 * h + 1]), bf(acc[j + 1][2 * h + 1])));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int f = f0 + 8 * j + 2 * t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * warp + g + 8 * h;
        if (row >= m) continue;
        const int64_t o = static_cast<int64_t>(row) * n + f;
        if (kOut == kF32Out) {
          *reinterpret_cast<float2*>(static_cast<float*>(y) + o) =
              make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + o) =
              __floats2bfloat162_rn(acc[j][2 * h], acc[j][2 * h + 1]);
        }
      }
    }
  }
#else
  __trap();  // launched only where the sm_90a machine code runs (WgmmaAvailable)
#endif
}

template <int J, int S, int kOut>
cudaError_t Launch(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                   cudaStream_t stream) {
  const size_t smem = SmemBytes(J, S, m);
  cudaError_t err = cudaFuncSetAttribute(
      DecodeGemmKernel<J, S, kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(std::min(SmemBytes(J, S, kMaxM), kMaxSmem)));
  if (err != cudaSuccess) return err;
  return LaunchKernel(DecodeGemmKernel<J, S, kOut>, dim3(n / (8 * J), splits), kThreads, smem,
                      stream, x, w, m, n, k / splits, k, y,
                      g_early_chunks.load(std::memory_order_relaxed));
}

template <int J, int kOut>
cudaError_t LaunchStages(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, int stages,
                         void* y, cudaStream_t stream) {
  switch (stages) {
    case 4:
      return Launch<J, 4, kOut>(x, w, m, n, k, splits, y, stream);
    case 8:
      return Launch<J, 8, kOut>(x, w, m, n, k, splits, y, stream);
    default:
      return Launch<J, 16, kOut>(x, w, m, n, k, splits, y, stream);
  }
}

template <int kOut>
cudaError_t LaunchJ(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, int j,
                    int stages, void* y, cudaStream_t stream) {
  switch (j) {
    case 1:
      if constexpr (kOut == kSiluMul) {
        return cudaErrorInvalidValue;  // 8 rows: a gate block without its up block
      } else {
        return LaunchStages<1, kOut>(x, w, m, n, k, splits, stages, y, stream);
      }
    case 2:
      return LaunchStages<2, kOut>(x, w, m, n, k, splits, stages, y, stream);
    default:
      return LaunchStages<4, kOut>(x, w, m, n, k, splits, stages, y, stream);
  }
}

}  // namespace

void SetDecodeGemmEarlyChunks(int chunks) {
  g_early_chunks.store(chunks < 0 ? 0 : chunks, std::memory_order_relaxed);
}

DecodeGemmShape DecodeGemmPick(int m, int n, int k) {
  DecodeGemmShape p;
  // Features per CTA: as many as still leave >= 120 CTAs (about one per SM of an H100 / H200), so
  // the weights stream from every SM while x, read by every CTA, is read as few times as that
  // allows.
  p.j = 1;
  for (int j : {4, 2}) {
    if (n % (8 * j) == 0 && n / (8 * j) >= 120) {
      p.j = j;
      break;
    }
  }
  // Stages: as many as fit in 200 KB (more weight bytes in flight per SM), at least 4.
  p.stages = 4;
  for (int s : {16, 8}) {
    if (SmemBytes(p.j, s, m) <= (200u << 10)) {
      p.stages = s;
      break;
    }
  }
  (void)k;
  return p;
}

size_t DecodeGemmSmemBytes(int m, DecodeGemmShape shape) {
  return SmemBytes(shape.j, shape.stages, m);
}

cudaError_t LaunchDecodeGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y,
                             DecodeGemmOut out, DecodeGemmShape shape, cudaStream_t stream,
                             int splits) {
  if (m == 0) return cudaSuccess;
  if (shape.j == 0) shape = DecodeGemmPick(m, n, k / std::max(splits, 1));
  if (splits < 1 || splits > 65535 || (splits > 1 && out != DecodeGemmOut::kF32)) {
    return cudaErrorInvalidValue;
  }
  if (m < 0 || m > kMaxM || k % (kKc * splits) != 0 ||
      (shape.j != 1 && shape.j != 2 && shape.j != 4) || n % (8 * shape.j) != 0 ||
      (shape.stages != 4 && shape.stages != 8 && shape.stages != 16) ||
      SmemBytes(shape.j, shape.stages, m) > kMaxSmem) {
    return cudaErrorInvalidValue;
  }
  static const bool wgmma = [] {  // the process's device (one per worker process)
    bool available = false;
    return WgmmaAvailable(&available) == cudaSuccess && available;
  }();
  if (!wgmma) return cudaErrorNotSupported;
  switch (out) {
    case DecodeGemmOut::kF32:
      return LaunchJ<kF32Out>(x, w, m, n, k, splits, shape.j, shape.stages, y, stream);
    case DecodeGemmOut::kSiluMul:
      return LaunchJ<kSiluMul>(x, w, m, n, k, 1, shape.j, shape.stages, y, stream);
    default:
      return LaunchJ<kBf16Out>(x, w, m, n, k, 1, shape.j, shape.stages, y, stream);
  }
}

}  // namespace cascade::cuda::internal
