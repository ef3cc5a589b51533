// Probe (one GPU call; bench/kernels/NOTES.md, session 32): do the decode-shaped wgmma forms give
// the bits of the attention tile's forms? A decode work has at most 8 q-rows, yet the persistent
// decode kernel multiplies them as 64 MMA rows (m64n64 S = Q K^T, m64n128 O = P V). With the keys
// as the M side instead (S^T = K Q^T as m64n8k16, A = K and B = Q both K-major; O^T = V^T P^T as
// m64n8k16 per 64 dims, A = V MN-major, B = P^T K-major from shared memory) the tensor work per
// tile is 8x smaller and each thread holds 4 + 8 accumulators instead of 32 + 64. That design is
// worth building only if both forms give bitwise the same S and O as today's chains (the same
// products, the same k order; the tile's bits are the product's: cached == cold, cascade ==
// flat). This runs both on random bf16 tiles and prints the mismatches and each form's error
// against float64 (so a layout slip shows as an error, not as a mismatch). Exit 0 when every
// element agrees, 1 otherwise.
//   cuda_wgmma_swap_probe [trials (default 40)]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_worker/backend/cuda/wgmma.cuh"

namespace cascade::cuda::internal {
namespace {

constexpr int kKeys = 64, kD = 128, kQ = 8, kQ64 = 64;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Copies rows x 128 (or 64) bf16 from global into the 128-byte swizzled layout of wgmma.cuh.
__device__ void ToSmem(unsigned char* dst, const __nv_bfloat16* src, int rows, int cols) {
  const int chunks = cols / 8;
  for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    const int r = i / chunks, c = i % chunks;
    *reinterpret_cast<uint4*>(dst + SwizzleOffset(rows, r, c)) =
        *reinterpret_cast<const uint4*>(src + r * cols + c * 8);
  }
}

// Stores a warpgroup's m64 x 8N accumulator (element 4 n + e: row 16 warp + g + 8 (e >> 1),
// column 8 n + 2 t4 + (e & 1)) into dst from row row0 on, ld floats a row.
template <int N>
__device__ void StoreAcc(const float (&acc)[4 * N], float* dst, int ld, int row0, int warp, int g,
                         int t4) {
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < 4; ++e) {
      dst[(row0 + 16 * warp + g + 8 * (e >> 1)) * ld + 8 * n + 2 * t4 + (e & 1)] = acc[4 * n + e];
    }
  }
}
#endif

// One warpgroup: S = Q K^T (reference: 8 chained m64n64k16, Q as 64 rows; swap: 8 chained
// m64n8k16, K as A, Q's first 8 rows as B) and O = P V (reference: 4 chained m64n128k16 with P's
// register fragments; swap: per 64 dims 4 chained m64n8k16, V as MN-major A, P's first 8 rows as
// K-major B).
__global__ void __launch_bounds__(128)
    Probe(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
          const __nv_bfloat16* p, float* s_ref, float* s_swap, float* o_ref, float* o_swap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char raw[];
  const uint32_t base_raw = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  unsigned char* sm = raw + (((base_raw + 1023) & ~1023u) - base_raw);
  unsigned char* q64 = sm;               // 64 rows x 256 bytes
  unsigned char* q8 = q64 + kQ64 * 256;  // 8 rows x 256 bytes
  unsigned char* ks = q8 + 1024 * 2;     // 64 keys x 256 bytes
  unsigned char* vs = ks + kKeys * 256;  // 64 keys x 256 bytes
  unsigned char* p8 = vs + kKeys * 256;  // 8 rows x 128 bytes (64 keys)
  ToSmem(q64, q, kQ64, kD);
  ToSmem(q8, q, kQ, kD);
  ToSmem(ks, k, kKeys, kD);
  ToSmem(vs, v, kKeys, kD);
  ToSmem(p8, p, kQ, kKeys);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  auto addr = [](unsigned char* x) { return static_cast<uint32_t>(__cvta_generic_to_shared(x)); };
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  // S reference (IssueQk's chain).
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  const uint64_t dq64 = WgmmaDesc(addr(q64), 16, 1024), dk = WgmmaDesc(addr(ks), 16, 1024);
  const uint64_t dq8 = WgmmaDesc(addr(q8), 16, 1024);
  FenceRegs(s);
  WgmmaFence();
#pragma unroll
  for (int kc = 0; kc < kD / 16; ++kc) {
    const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
    Wgmma64x64SS(s, WgmmaDescAdd(dq64, half * kQ64 * 128 + kb),
                 WgmmaDescAdd(dk, half * kKeys * 128 + kb));
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(s);
  // S^T swap.
  float st[4] = {0.f, 0.f, 0.f, 0.f};
  FenceRegs(st);
  WgmmaFence();
#pragma unroll
  for (int kc = 0; kc < kD / 16; ++kc) {
    const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
    Wgmma64x8SS<0>(st, WgmmaDescAdd(dk, half * kKeys * 128 + kb),
                   WgmmaDescAdd(dq8, half * kQ * 128 + kb));
  }
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(st);
  StoreAcc<8>(s, s_ref, kKeys, 0, warp, g, t4);
  StoreAcc<1>(st, s_swap, kQ, 0, warp, g, t4);  // [key][q]

  // O reference (IssuePv's chain): P's A fragments from global (row 16 warp + g (+ 8), keys
  // 16 kk + 2 t4 (+ 1) and + 8).
  uint32_t pa[kKeys / 16][4];
  auto pk = [&](int r, int c) {
    __nv_bfloat162 h;
    h.x = p[r * kKeys + c];
    h.y = p[r * kKeys + c + 1];
    return *reinterpret_cast<uint32_t*>(&h);
  };
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const int r = 16 * warp + g, c = 16 * kk + 2 * t4;
    pa[kk][0] = pk(r, c);
    pa[kk][1] = pk(r + 8, c);
    pa[kk][2] = pk(r, c + 8);
    pa[kk][3] = pk(r + 8, c + 8);
  }
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  const uint64_t dv = WgmmaDesc(addr(vs), kKeys * 128, 1024);
  FenceRegs(o);
  FenceRegs(pa[0]);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) Wgmma64x128RS(o, pa[kk], WgmmaDescAdd(dv, kk * 2048));
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(o);
  StoreAcc<16>(o, o_ref, kD, 0, warp, g, t4);
  // O^T swap: per 64 dims h, A = V's column half h as MN-major (8-key groups 1024 bytes apart, a
  // k16 step two groups on), B = P^T (P's first 8 rows, K-major).
  const uint64_t dp = WgmmaDesc(addr(p8), 16, 1024);
  for (int h = 0; h < 2; ++h) {
    float ot[4] = {0.f, 0.f, 0.f, 0.f};
    FenceRegs(ot);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      Wgmma64x8SS<1>(ot, WgmmaDescAdd(dv, h * kKeys * 128 + kk * 2048), WgmmaDescAdd(dp, kk * 32));
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(ot);
    StoreAcc<1>(ot, o_swap, kQ, 64 * h, warp, g, t4);  // [dim][q]
  }
#else
  __trap();
#endif
}

uint16_t ToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

#define CHECK_CUDA(e)                                                                   \
  do {                                                                                  \
    const cudaError_t err = (e);                                                        \
    if (err != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err)); \
      std::exit(2);                                                                     \
    }                                                                                   \
  } while (0)

int Main(int trials) {
  int device = 0, major = 0, minor = 0, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device; nothing to probe\n");
    return 0;
  }
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    std::printf("compute capability %d.%d: no sm_90a wgmma here; nothing to probe\n", major, minor);
    return 0;
  }
  std::mt19937 rng(32);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const size_t nq = kQ64 * kD, nk = kKeys * kD, np = kQ64 * kKeys;
  std::vector<uint16_t> hq(nq), hk(nk), hv(nk), hp(np);
  void *dq, *dk, *dv, *dp, *ds, *dst, *dout, *dot;
  CHECK_CUDA(cudaMalloc(&dq, nq * 2));
  CHECK_CUDA(cudaMalloc(&dk, nk * 2));
  CHECK_CUDA(cudaMalloc(&dv, nk * 2));
  CHECK_CUDA(cudaMalloc(&dp, np * 2));
  CHECK_CUDA(cudaMalloc(&ds, kQ64 * kKeys * 4));
  CHECK_CUDA(cudaMalloc(&dst, kKeys * kQ * 4));
  CHECK_CUDA(cudaMalloc(&dout, kQ64 * kD * 4));
  CHECK_CUDA(cudaMalloc(&dot, kD * kQ * 4));
  const int smem = 1024 + kQ64 * 256 + 2048 + 2 * kKeys * 256 + kQ * 128;
  CHECK_CUDA(cudaFuncSetAttribute(Probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<float> s(kQ64 * kKeys), st(kKeys * kQ), o(kQ64 * kD), ot(kD * kQ);
  // One form's pair (a: the reference chain's element, b: the swapped chain's) against the
  // float64 product `exact` of magnitude `mag`: bits compared, each one's relative error kept.
  struct Tally {
    long bad = 0, n = 0;
    double err_ref = 0, err_swap = 0;
    void Add(float a, float b, double exact, double mag) {
      bad += std::memcmp(&a, &b, 4) != 0;
      ++n;
      err_ref = std::fmax(err_ref, std::fabs(a - exact) / (mag + 1e-300));
      err_swap = std::fmax(err_swap, std::fabs(b - exact) / (mag + 1e-300));
    }
  } ts, to;
  for (int t = 0; t < trials; ++t) {
    // Exponent spreads: Q, K and V entries scaled by 2^e, e uniform in [-spread, spread];
    // P in [0, 1) (a softmax's) with some exact zeros (masked keys).
    const int spread = t % 3 == 0 ? 0 : t % 3 == 1 ? 4 : 16;
    auto draw = [&](float x) {
      const int e = spread == 0 ? 0 : static_cast<int>(rng() % (2 * spread + 1)) - spread;
      return ToBf16(std::ldexp(x, e));
    };
    for (auto& x : hq) x = draw(normal(rng));
    for (auto& x : hk) x = draw(normal(rng));
    for (auto& x : hv) x = draw(normal(rng));
    for (auto& x : hp) x = rng() % 8 == 0 ? 0 : ToBf16(unit(rng));
    CHECK_CUDA(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dp, hp.data(), np * 2, cudaMemcpyHostToDevice));
    Probe<<<1, 128, smem>>>(
        static_cast<const __nv_bfloat16*>(dq), static_cast<const __nv_bfloat16*>(dk),
        static_cast<const __nv_bfloat16*>(dv), static_cast<const __nv_bfloat16*>(dp),
        static_cast<float*>(ds), static_cast<float*>(dst), static_cast<float*>(dout),
        static_cast<float*>(dot));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(st.data(), dst, st.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(ot.data(), dot, ot.size() * 4, cudaMemcpyDeviceToHost));
    for (int r = 0; r < kQ; ++r) {
      for (int j = 0; j < kKeys; ++j) {
        double exact = 0, mag = 0;
        for (int d = 0; d < kD; ++d) {
          const double x = static_cast<double>(FromBf16(hq[r * kD + d])) * FromBf16(hk[j * kD + d]);
          exact += x;
          mag += std::fabs(x);
        }
        ts.Add(s[r * kKeys + j], st[j * kQ + r], exact, mag);
      }
      for (int d = 0; d < kD; ++d) {
        double exact = 0, mag = 0;
        for (int j = 0; j < kKeys; ++j) {
          const double x =
              static_cast<double>(FromBf16(hp[r * kKeys + j])) * FromBf16(hv[j * kD + d]);
          exact += x;
          mag += std::fabs(x);
        }
        to.Add(o[r * kD + d], ot[d * kQ + r], exact, mag);
      }
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("wgmma swap probe on %s, %d trials (exponent spreads 0, 4, 16):\n", prop.name,
              trials);
  std::printf(
      "  S = Q K^T   m64n64k16 (Q as A) vs m64n8k16 (K as A): %ld of %ld differ; "
      "max |err| / sum|products| %.2e (m64n64) %.2e (m64n8)\n",
      ts.bad, ts.n, ts.err_ref, ts.err_swap);
  std::printf(
      "  O = P V     m64n128k16 (P as A, registers) vs m64n8k16 (V^T as A, MN-major): %ld of "
      "%ld differ; max |err| / sum|products| %.2e (m64n128) %.2e (m64n8)\n",
      to.bad, to.n, to.err_ref, to.err_swap);
  std::printf("%s\n", ts.bad == 0 && to.bad == 0 ? "bitwise: yes" : "bitwise: no");
  return ts.bad == 0 && to.bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cascade::cuda::internal

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 40;
  if (trials < 1) {
    std::fprintf(stderr, "usage: cuda_wgmma_swap_probe [trials >= 1]\n");
    return 2;
  }
  return cascade::cuda::internal::Main(trials);
}
