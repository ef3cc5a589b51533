// Paged attention kernels: one tile kernel (final or split mode) and the ordered merge.
// Every floating-point step of a tile's partial state and of the merge is written with explicit
// round-to-nearest intrinsics (__fmaf_rn, __fadd_rn, ...), which the compiler never contracts or
// reorders, so the same partial is computed bit for bit by whichever kernel or CTA shape runs it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "gpu_worker/backend/cuda/launchers.h"

namespace cascade::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kT = kTileTokens;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Xor butterfly: every lane adds the same pairs (a + b == b + a), so all lanes agree bitwise.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Loads E consecutive bf16 values as floats.
template <int E>
__device__ __forceinline__ void LoadBf16(const __nv_bfloat16* p, float (&x)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = __bfloat162float(p[e]);
}

// Merges state (lse_b, ob) into (lse, o). lse in log2 units; -inf marks an empty state, which
// contributes nothing (the first non-empty state is copied exactly).
template <int E>
__device__ __forceinline__ void MergeState(float& lse, float (&o)[E], float lse_b,
                                           const float (&ob)[E]) {
  if (lse_b == -INFINITY) return;
  if (lse == -INFINITY) {
    lse = lse_b;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = ob[e];
    return;
  }
  const float m = fmaxf(lse, lse_b);
  const float wa = exp2f(__fsub_rn(lse, m));
  const float wb = exp2f(__fsub_rn(lse_b, m));
  const float sum = __fadd_rn(wa, wb);
  const float inv = __frcp_rn(sum);
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = __fmul_rn(__fmaf_rn(o[e], wa, __fmul_rn(ob[e], wb)), inv);
  lse = __fadd_rn(m, log2f(sum));
}

// One warp: partial state of query `q` (D floats in shared memory) over the first `nv` keys of
// the tile in Ks/Vs ([kT, D + 8] bf16). Lane owns output dims [lane * E, lane * E + E).
// REQUIRES: 1 <= nv <= kT.
template <int E>
__device__ __forceinline__ void TilePartial(const float* q, const __nv_bfloat16* Ks,
                                            const __nv_bfloat16* Vs, int nv, float scale_log2,
                                            float* pscr, int lane, float (&o)[E], float& lse) {
  constexpr int D = E * 32, LD = D + 8, KPL = kT / 32;
  float acc[KPL];
#pragma unroll
  for (int i = 0; i < KPL; ++i) acc[i] = 0.f;
#pragma unroll 4
  for (int c = 0; c < D / 8; ++c) {
    const float4 qa = *reinterpret_cast<const float4*>(q + c * 8);
    const float4 qb = *reinterpret_cast<const float4*>(q + c * 8 + 4);
    const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int i = 0; i < KPL; ++i) {
      const int j = lane + 32 * i;
      if (j < nv) {
        const uint4 raw = *reinterpret_cast<const uint4*>(Ks + j * LD + c * 8);
        const __nv_bfloat16* kv = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i] = __fmaf_rn(qv[e], __bfloat162float(kv[e]), acc[i]);
      }
    }
  }
  float s[KPL];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < KPL; ++i) {
    s[i] = (lane + 32 * i < nv) ? __fmul_rn(acc[i], scale_log2) : -INFINITY;
    m = fmaxf(m, s[i]);
  }
  m = WarpMax(m);
  float l = 0.f;
#pragma unroll
  for (int i = 0; i < KPL; ++i) {
    const float p = (lane + 32 * i < nv) ? exp2f(__fsub_rn(s[i], m)) : 0.f;
    l = __fadd_rn(l, p);
    pscr[lane + 32 * i] = p;
  }
  l = WarpSum(l);
  __syncwarp();
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.f;
#pragma unroll 8
  for (int j = 0; j < nv; ++j) {
    const float p = pscr[j];
    float v[E];
    LoadBf16<E>(Vs + j * LD + lane * E, v);
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = __fmaf_rn(p, v[e], o[e]);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = __fdiv_rn(o[e], l);
  lse = __fadd_rn(m, log2f(l));
  __syncwarp();  // pscr is reused by this warp's next query
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

struct TileKernelArgs {
  AttentionArgs a;
  const int32_t* items;
  const int32_t* item_rows;
  const int32_t* partial_base;
  int max_rows;
  float scale_log2;
};

// grid: (num_items, num_kv_heads), kThreads threads. kFinal: fold all tiles of the item into the
// rows' outputs; else write one partial per (row, tile).
template <int E, bool kFinal>
__global__ void __launch_bounds__(kThreads) AttentionTileKernel(TileKernelArgs k) {
  constexpr int D = E * 32, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv, bs = cache.block_size;
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kT * LD;
  float* qs = reinterpret_cast<float*>(Vs + kT * LD);
  float* pscr = qs + k.max_rows * G * D;
  float* st_o = pscr + kWarps * kT;
  float* st_lse = st_o + k.max_rows * G * D;

  const int32_t* it = k.items + blockIdx.x * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int kvh = blockIdx.y;
  const int nq = row_count * G;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int i = tid; i < nq * (D / 8); i += kThreads) {
    const int qi = i / (D / 8), c = i % (D / 8);
    const int row = k.item_rows[row_begin + qi / G];
    const int qh = kvh * G + qi % G;
    const uint4 raw = *reinterpret_cast<const uint4*>(
        reinterpret_cast<const __nv_bfloat16*>(a.q) + static_cast<int64_t>(row) * a.q_row_stride +
        qh * D + c * 8);
    const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) qs[qi * D + c * 8 + e] = __bfloat162float(v[e]);
  }
  if (kFinal) {
    for (int i = tid; i < nq * D; i += kThreads) st_o[i] = 0.f;
    for (int i = tid; i < nq; i += kThreads) st_lse[i] = -INFINITY;
  }

  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k);
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v);
  for (int t = tile_begin; t < tile_end; ++t) {
    const int ts = t * kT;
    const int n_load = min(kT, kv_len - ts);
    __syncthreads();  // previous tile's readers are done (and q/state are initialized)
    for (int i = tid; i < n_load * (D / 8); i += kThreads) {
      const int j = i / (D / 8), c = i % (D / 8);
      const int tok = ts + j;
      const int64_t blk = a.block_ids[table_offset + tok / bs];
      const int64_t src = ((blk * hkv + kvh) * bs + tok % bs) * D + c * 8;
      CpAsync16(Ks + j * LD + c * 8, kc + src);
      CpAsync16(Vs + j * LD + c * 8, vc + src);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
    __syncthreads();
    for (int qi = warp; qi < nq; qi += kWarps) {
      const int row = k.item_rows[row_begin + qi / G];
      const int nv = min(n_load, a.positions[row] + 1 - ts);
      if (nv <= 0) continue;
      float o[E], lse;
      TilePartial<E>(qs + qi * D, Ks, Vs, nv, k.scale_log2, pscr + warp * kT, lane, o, lse);
      const int qh = kvh * G + qi % G;
      if (kFinal) {
        float so[E];
#pragma unroll
        for (int e = 0; e < E; ++e) so[e] = st_o[qi * D + lane * E + e];
        float slse = st_lse[qi];
        MergeState<E>(slse, so, lse, o);
#pragma unroll
        for (int e = 0; e < E; ++e) st_o[qi * D + lane * E + e] = so[e];
        __syncwarp();
        if (lane == 0) st_lse[qi] = slse;
        __syncwarp();
      } else {
        const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
#pragma unroll
        for (int e = 0; e < E; ++e) a.partial_o[slot * D + lane * E + e] = o[e];
        if (lane == 0) a.partial_lse[slot] = lse;
      }
    }
  }
  if (kFinal) {
    __syncthreads();
    for (int i = tid; i < nq * D; i += kThreads) {
      const int qi = i / D, d = i % D;
      const int row = k.item_rows[row_begin + qi / G];
      const int qh = kvh * G + qi % G;
      reinterpret_cast<__nv_bfloat16*>(a.out)[static_cast<int64_t>(row) * hq * D + qh * D + d] =
          __float2bfloat16(st_o[i]);
    }
  }
}

// One warp per (split row, query head): left fold of the row's tile partials in tile order.
template <int E>
__global__ void __launch_bounds__(kThreads) MergeKernel(AttentionArgs a, const int32_t* merge_list,
                                                        int num_merge) {
  constexpr int D = E * 32;
  const int hq = a.num_q_heads;
  const int gw = blockIdx.x * kWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int entry = gw / hq, qh = gw % hq;
  if (entry >= num_merge) return;
  const int row = merge_list[entry * 3], base = merge_list[entry * 3 + 1];
  const int tiles = merge_list[entry * 3 + 2];
  float o[E], lse = -INFINITY;
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.f;
  // Loads run kBatch tiles ahead of the (strictly sequential) merges.
  constexpr int kBatch = 8;
  for (int t0 = 0; t0 < tiles; t0 += kBatch) {
    float ob[kBatch][E], lb[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t slot = static_cast<int64_t>(base + t0 + i) * hq + qh;
      lb[i] = t0 + i < tiles ? a.partial_lse[slot] : -INFINITY;
#pragma unroll
      for (int e = 0; e < E; ++e) ob[i][e] = t0 + i < tiles ? a.partial_o[slot * D + lane * E + e] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) MergeState<E>(lse, o, lb[i], ob[i]);
  }
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + static_cast<int64_t>(row) * hq * D;
#pragma unroll
  for (int e = 0; e < E; ++e) out[qh * D + lane * E + e] = __float2bfloat16(o[e]);
}

template <int E>
cudaError_t LaunchForDim(const AttentionArgs& args, const AttentionPlanView& plan,
                         cudaStream_t stream) {
  constexpr int D = E * 32;
  const int G = args.num_q_heads / args.cache.num_kv_heads;
  TileKernelArgs k{args, nullptr, plan.item_rows, plan.partial_base, 0, args.scale * kLog2e};
  auto smem_bytes = [&](int max_rows, bool final_mode) {
    size_t b = 2 * kT * (D + 8) * sizeof(__nv_bfloat16) + max_rows * G * D * sizeof(float) +
               kWarps * kT * sizeof(float);
    if (final_mode) b += max_rows * G * (D + 1) * sizeof(float);
    return b;
  };
  if (plan.num_final > 0) {
    k.items = plan.final_items;
    k.max_rows = plan.max_final_rows;
    const size_t smem = smem_bytes(k.max_rows, true);
    cudaError_t err = cudaFuncSetAttribute(AttentionTileKernel<E, true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    AttentionTileKernel<E, true>
        <<<dim3(plan.num_final, args.cache.num_kv_heads), kThreads, smem, stream>>>(k);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (plan.num_split > 0) {
    k.items = plan.split_items;
    k.max_rows = plan.max_split_rows;
    const size_t smem = smem_bytes(k.max_rows, false);
    cudaError_t err = cudaFuncSetAttribute(AttentionTileKernel<E, false>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    AttentionTileKernel<E, false>
        <<<dim3(plan.num_split, args.cache.num_kv_heads), kThreads, smem, stream>>>(k);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (plan.num_merge > 0) {
    const int warps = plan.num_merge * args.num_q_heads;
    MergeKernel<E><<<(warps + kWarps - 1) / kWarps, kThreads, 0, stream>>>(args, plan.merge_list,
                                                                           plan.num_merge);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchAttention(const AttentionArgs& args, const AttentionPlanView& plan,
                            cudaStream_t stream) {
  switch (args.cache.head_dim) {
    case 32: return LaunchForDim<1>(args, plan, stream);
    case 64: return LaunchForDim<2>(args, plan, stream);
    case 128: return LaunchForDim<4>(args, plan, stream);
    case 256: return LaunchForDim<8>(args, plan, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cascade::cuda::internal
