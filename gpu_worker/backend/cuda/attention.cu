// Paged attention kernels: one tile kernel (final or split mode) and the ordered merge.
// Every floating-point step of a tile's partial state and of the merge is written with explicit
// round-to-nearest intrinsics (__fmaf_rn, __fadd_rn, ...), which the compiler never contracts or
// reorders, so the same partial is computed bit for bit by whichever kernel or CTA shape runs it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"

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

// Elementwise MergeState: the same operations in the same order on the same values as
// MergeState<E> (used by the merge kernel), so an in-CTA fold and the merge kernel agree bitwise.
// Returns the merged o; MergedLse gives the merged lse. REQUIRES: lse_b != -inf.
__device__ __forceinline__ float MergeElem(float lse, float o, float lse_b, float ob) {
  if (lse == -INFINITY) return ob;
  const float m = fmaxf(lse, lse_b);
  const float wa = exp2f(__fsub_rn(lse, m));
  const float wb = exp2f(__fsub_rn(lse_b, m));
  const float inv = __frcp_rn(__fadd_rn(wa, wb));
  return __fmul_rn(__fmaf_rn(o, wa, __fmul_rn(ob, wb)), inv);
}
__device__ __forceinline__ float MergedLse(float lse, float lse_b) {
  if (lse == -INFINITY) return lse_b;
  const float m = fmaxf(lse, lse_b);
  const float wa = exp2f(__fsub_rn(lse, m));
  const float wb = exp2f(__fsub_rn(lse_b, m));
  return __fadd_rn(m, log2f(__fadd_rn(wa, wb)));
}

// Tensor cores: D = A * B + C with A 16x16 bf16 (row-major fragments), B 16x8 bf16 (column
// fragments), C/D 16x8 f32. Each output element's accumulation is fixed by the instruction and
// depends only on its row of A and column of B, never on the other rows: a query's result does
// not depend on which other queries share the CTA (cascade == flat, cached == cold).
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A fragment of the 16x16 block at (r0, k0) of a row-major bf16 matrix with row stride ld.
__device__ __forceinline__ void LoadA(const __nv_bfloat16* m, int ld, int r0, int k0, int lane,
                                      uint32_t (&a)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const __nv_bfloat16* p = m + (r0 + g) * ld + k0 + 2 * t;
  a[0] = *reinterpret_cast<const uint32_t*>(p);
  a[1] = *reinterpret_cast<const uint32_t*>(p + 8 * ld);
  a[2] = *reinterpret_cast<const uint32_t*>(p + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(p + 8 * ld + 8);
}

constexpr int kMaxQ = kMaxQueriesPerCta;  // query rows of the MMA tiles (two m16 tiles)
constexpr int LDP = kT + 8;  // bf16 P row stride: 36 words, fragment loads hit 32 banks
constexpr int LDS = kT + 4;  // f32 score row stride

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
  const int32_t* item_count;  // device [1] or nullptr (see AttentionTileKernel)
};

// One work item of a CTA (kThreads threads, kv head blockIdx.y). kFinal: fold all tiles of the
// item into the rows' outputs; else write one partial per (row, tile). Per tile: S = Q K^T on
// tensor cores, a per-query softmax (warp per query; P rounded to bf16, l summed from the rounded
// P), then O = P V on tensor cores, divided by l. Keys past a query's position get p = 0; K/V rows
// past the loaded keys are zeroed (0 * garbage could be NaN).
template <int E, bool kFinal>
__device__ __forceinline__ void TileItem(const TileKernelArgs& k, int item) {
  constexpr int D = E * 32, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv, bs = cache.block_size;
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [kT, LD]
  __nv_bfloat16* Vs = Ks + kT * LD;                            // [kT, LD]
  __nv_bfloat16* Qs = Vs + kT * LD;                            // [kMaxQ, LD]
  __nv_bfloat16* Ps = Qs + kMaxQ * LD;                         // [kMaxQ, LDP]
  float* Ss = reinterpret_cast<float*>(Ps + kMaxQ * LDP);      // [kMaxQ, LDS]
  float* row_l = Ss + kMaxQ * LDS;                             // [kMaxQ]
  float* row_lse = row_l + kMaxQ;                              // [kMaxQ], -inf: no visible key
  float* st_lse = row_lse + kMaxQ;                             // [kMaxQ] (final)
  float* st_o = st_lse + kMaxQ;                                // [kMaxQ, D] (final)

  const int32_t* it = k.items + static_cast<int64_t>(item) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int kvh = blockIdx.y;
  const int nq = row_count * G;        // <= kMaxQ (the planner's rows_per_cta)
  const int mq = (nq + 15) / 16 * 16;  // MMA rows; rows [nq, mq) are zero
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  for (int i = tid; i < mq * (D / 8); i += kThreads) {
    const int qi = i / (D / 8), c = i % (D / 8);
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (qi < nq) {
      const int row = k.item_rows[row_begin + qi / G];
      const int qh = kvh * G + qi % G;
      raw = *reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(a.q) +
                                            static_cast<int64_t>(row) * a.q_row_stride + qh * D +
                                            c * 8);
    }
    *reinterpret_cast<uint4*>(Qs + qi * LD + c * 8) = raw;
  }
  for (int i = tid; i < mq * LDP; i += kThreads) Ps[i] = __float2bfloat16(0.f);
  if (kFinal) {
    for (int i = tid; i < nq * D; i += kThreads) st_o[i] = 0.f;
    for (int i = tid; i < nq; i += kThreads) st_lse[i] = -INFINITY;
  }

  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k);
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v);
  const uint16_t* Vu = reinterpret_cast<const uint16_t*>(Vs);
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
    for (int i = n_load * (D / 8) + tid; i < kT * (D / 8); i += kThreads) {
      const int j = i / (D / 8), c = i % (D / 8);
      *reinterpret_cast<uint4*>(Ks + j * LD + c * 8) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(Vs + j * LD + c * 8) = make_uint4(0, 0, 0, 0);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
    __syncthreads();

    // S = Q K^T: fragment f = (m tile f / (kT/8), n tile f % (kT/8)), k over D in order.
    for (int f = warp; f < (mq / 16) * (kT / 8); f += kWarps) {
      const int m0 = (f / (kT / 8)) * 16, n0 = (f % (kT / 8)) * 8;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t af[4];
        LoadA(Qs, LD, m0, k0, lane, af);
        const __nv_bfloat16* kp = Ks + (n0 + g) * LD + k0 + 2 * t4;
        Mma16816(c, af, *reinterpret_cast<const uint32_t*>(kp),
                 *reinterpret_cast<const uint32_t*>(kp + 8));
      }
      *reinterpret_cast<float2*>(Ss + (m0 + g) * LDS + n0 + 2 * t4) = make_float2(c[0], c[1]);
      *reinterpret_cast<float2*>(Ss + (m0 + g + 8) * LDS + n0 + 2 * t4) = make_float2(c[2], c[3]);
    }
    __syncthreads();

    // Softmax per query (one warp per query; lane owns keys lane and lane + 32).
    for (int qi = warp; qi < nq; qi += kWarps) {
      const int row = k.item_rows[row_begin + qi / G];
      const int nv = min(n_load, a.positions[row] + 1 - ts);
      if (nv <= 0) {
        Ps[qi * LDP + lane] = Ps[qi * LDP + lane + 32] = __float2bfloat16(0.f);
        if (lane == 0) row_lse[qi] = -INFINITY;
        continue;
      }
      float s[kT / 32];
      float m = -INFINITY;
#pragma unroll
      for (int i = 0; i < kT / 32; ++i) {
        const int j = lane + 32 * i;
        s[i] = j < nv ? __fmul_rn(Ss[qi * LDS + j], k.scale_log2) : -INFINITY;
        m = fmaxf(m, s[i]);
      }
      m = WarpMax(m);
      float l = 0.f;
#pragma unroll
      for (int i = 0; i < kT / 32; ++i) {
        const int j = lane + 32 * i;
        const __nv_bfloat16 p = __float2bfloat16_rn(j < nv ? exp2f(__fsub_rn(s[i], m)) : 0.f);
        l = __fadd_rn(l, __bfloat162float(p));
        Ps[qi * LDP + j] = p;
      }
      l = WarpSum(l);
      if (lane == 0) {
        row_l[qi] = l;
        row_lse[qi] = __fadd_rn(m, log2f(l));
      }
    }
    __syncthreads();

    // O = P V: fragment f = (m tile f / (D/8), n tile f % (D/8)), k over the tile's keys in order.
    for (int f = warp; f < (mq / 16) * (D / 8); f += kWarps) {
      const int m0 = (f / (D / 8)) * 16, n0 = (f % (D / 8)) * 8;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k0 = 0; k0 < kT; k0 += 16) {
        uint32_t af[4];
        LoadA(Ps, LDP, m0, k0, lane, af);
        const uint16_t* vp = Vu + (k0 + 2 * t4) * LD + n0 + g;
        const uint32_t b0 = vp[0] | (static_cast<uint32_t>(vp[LD]) << 16);
        const uint32_t b1 = vp[8 * LD] | (static_cast<uint32_t>(vp[9 * LD]) << 16);
        Mma16816(c, af, b0, b1);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qi = m0 + g + 8 * h;
        if (qi >= nq) continue;
        const float lse = row_lse[qi];
        if (lse == -INFINITY) continue;
        const float l = row_l[qi];
        const int d = n0 + 2 * t4;
        const float o0 = __fdiv_rn(c[2 * h], l), o1 = __fdiv_rn(c[2 * h + 1], l);
        if (kFinal) {
          const float old = st_lse[qi];
          st_o[qi * D + d] = MergeElem(old, st_o[qi * D + d], lse, o0);
          st_o[qi * D + d + 1] = MergeElem(old, st_o[qi * D + d + 1], lse, o1);
        } else {
          const int row = k.item_rows[row_begin + qi / G];
          const int qh = kvh * G + qi % G;
          const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
          *reinterpret_cast<float2*>(a.partial_o + slot * D + d) = make_float2(o0, o1);
        }
      }
    }
    if (kFinal) {
      __syncthreads();  // every element merged with the old lse
      for (int qi = tid; qi < nq; qi += kThreads) {
        if (row_lse[qi] != -INFINITY) st_lse[qi] = MergedLse(st_lse[qi], row_lse[qi]);
      }
    } else {
      for (int qi = tid; qi < nq; qi += kThreads) {
        if (row_lse[qi] == -INFINITY) continue;
        const int row = k.item_rows[row_begin + qi / G];
        const int qh = kvh * G + qi % G;
        a.partial_lse[static_cast<int64_t>(k.partial_base[row] + t) * hq + qh] = row_lse[qi];
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

// grid: (CTAs, num_kv_heads). Each CTA runs items blockIdx.x, blockIdx.x + gridDim.x, ... below
// the item count: gridDim.x itself (one item per CTA), or, for a launch inside a CUDA graph, a
// count read on the device, so the same fixed grid serves every step. An item's arithmetic does
// not depend on which CTA runs it.
template <int E, bool kFinal>
__global__ void __launch_bounds__(kThreads) AttentionTileKernel(TileKernelArgs k) {
  WaitForPriorGrids();
  const int count = k.item_count != nullptr ? *k.item_count : static_cast<int>(gridDim.x);
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) __syncthreads();  // the last item's readers are done
    TileItem<E, kFinal>(k, item);
  }
}

// One warp per (split row, query head): left fold of the row's tile partials in tile order.
template <int E>
__global__ void __launch_bounds__(kThreads)
    MergeKernel(AttentionArgs a, const int32_t* merge_list, int num_merge) {
  WaitForPriorGrids();
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
      for (int e = 0; e < E; ++e)
        ob[i][e] = t0 + i < tiles ? a.partial_o[slot * D + lane * E + e] : 0.f;
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
  // A CTA's queries fill at most two m16 MMA tiles: the planner puts <= kMaxQ (row, head) pairs
  // in one item when the GQA group is <= kMaxQ.
  if (args.num_q_heads / args.cache.num_kv_heads > kMaxQ) return cudaErrorInvalidValue;
  TileKernelArgs k{args,   nullptr, plan.item_rows, plan.partial_base, 0, args.scale * kLog2e,
                   nullptr};
  // The layout of AttentionTileKernel's shared memory (rows padded to kMaxQ, whatever max_rows).
  auto smem_bytes = [&](int /*max_rows*/, bool final_mode) {
    size_t b = (2 * kT + kMaxQ) * (D + 8) * sizeof(__nv_bfloat16) +
               kMaxQ * LDP * sizeof(__nv_bfloat16) + kMaxQ * LDS * sizeof(float) +
               3 * kMaxQ * sizeof(float);
    if (final_mode) b += kMaxQ * D * sizeof(float);
    return b;
  };
  if (plan.num_final > 0) {
    k.items = plan.final_items;
    k.max_rows = plan.max_final_rows;
    const size_t smem = smem_bytes(k.max_rows, true);
    cudaError_t err = cudaFuncSetAttribute(AttentionTileKernel<E, true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    err = LaunchKernel(AttentionTileKernel<E, true>, dim3(plan.num_final, args.cache.num_kv_heads),
                       kThreads, smem, stream, k);
    if (err != cudaSuccess) return err;
  }
  if (plan.num_split > 0) {
    k.items = plan.split_items;
    k.max_rows = plan.max_split_rows;
    k.item_count = plan.split_count;
    const size_t smem = smem_bytes(k.max_rows, false);
    cudaError_t err = cudaFuncSetAttribute(AttentionTileKernel<E, false>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    err = LaunchKernel(AttentionTileKernel<E, false>, dim3(plan.num_split, args.cache.num_kv_heads),
                       kThreads, smem, stream, k);
    if (err != cudaSuccess) return err;
  }
  if (plan.num_merge > 0) {
    const int warps = plan.num_merge * args.num_q_heads;
    return LaunchKernel(MergeKernel<E>, (warps + kWarps - 1) / kWarps, kThreads, 0, stream, args,
                        plan.merge_list, plan.num_merge);
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t SplitCtasPerWave(int head_dim, int num_kv_heads, int* ctas) {
  auto per_sm = [&](auto kernel, int e) {
    const int d = e * 32;
    const size_t smem = (2 * kT + kMaxQ) * (d + 8) * sizeof(__nv_bfloat16) +
                        kMaxQ * LDP * sizeof(__nv_bfloat16) + kMaxQ * LDS * sizeof(float) +
                        3 * kMaxQ * sizeof(float);
    int blocks = 0, device = 0, sms = 0;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem);
    if (err == cudaSuccess) err = cudaGetDevice(&device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    *ctas = std::max(1, blocks * sms / std::max(1, num_kv_heads));
    return err;
  };
  switch (head_dim) {
    case 32:
      return per_sm(AttentionTileKernel<1, false>, 1);
    case 64:
      return per_sm(AttentionTileKernel<2, false>, 2);
    case 128:
      return per_sm(AttentionTileKernel<4, false>, 4);
    case 256:
      return per_sm(AttentionTileKernel<8, false>, 8);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchAttention(const AttentionArgs& args, const AttentionPlanView& plan,
                            cudaStream_t stream) {
  switch (args.cache.head_dim) {
    case 32:
      return LaunchForDim<1>(args, plan, stream);
    case 64:
      return LaunchForDim<2>(args, plan, stream);
    case 128:
      return LaunchForDim<4>(args, plan, stream);
    case 256:
      return LaunchForDim<8>(args, plan, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cascade::cuda::internal
