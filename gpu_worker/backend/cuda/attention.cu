// Paged attention kernels: the prefill kernel (final items), the split kernel (per-tile partials of
// decode rows and cascade tiles) and the ordered merge.
// Every floating-point step of a tile's partial state and of the merge is written with explicit
// round-to-nearest intrinsics (__fmaf_rn, __fadd_rn, ...), which the compiler never contracts or
// reorders, so the same partial is computed bit for bit by whichever kernel or CTA shape runs it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"
#include "gpu_worker/backend/cuda/wgmma.cuh"

namespace cascade::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kT = kTileTokens;
constexpr float kLog2e = 1.4426950408889634f;

// The one exp2 of the attention arithmetic (tile softmax and fold): ex2.approx.ftz, the same
// instruction in every kernel, so every path gets the same bits. ex2(-inf) = +0.
__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Canonical key order of one query row inside a 64-key tile: lane t4 (of the 4 lanes that share
// the row, the m16n8k16 accumulator layout) holds keys Key(i, t4), i = 0..15, i.e. key 8n + 2t4 + c
// for n-tile n = i / 2 and column c = i % 2.
__device__ __forceinline__ int Key(int i, int t4) { return 8 * (i >> 1) + 2 * t4 + (i & 1); }

// The two reductions of a row's tile softmax, shared by RowSoftmax and RowSoftmaxInPlace: the max
// of the visible raw scores (keys < lim when kMask; -inf if none) over the thread's keys and the
// 4 lanes of the row, and the sum of the thread's p as a pairwise tree then the lanes' butterfly.
template <bool kMask>
__device__ __forceinline__ float RowMax(const float (&x)[16], int lim, int t4) {
  float mx[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float a = !kMask || Key(2 * i, t4) < lim ? x[2 * i] : -INFINITY;
    const float b = !kMask || Key(2 * i + 1, t4) < lim ? x[2 * i + 1] : -INFINITY;
    mx[i] = fmaxf(a, b);
  }
#pragma unroll
  for (int w = 4; w > 0; w >>= 1) {
#pragma unroll
    for (int i = 0; i < w; ++i) mx[i] = fmaxf(mx[i], mx[i + w]);
  }
  float m = mx[0];
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}
__device__ __forceinline__ float RowSum(const float (&x)[16]) {
  float s[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = __fadd_rn(x[2 * i], x[2 * i + 1]);
#pragma unroll
  for (int w = 1; w < 8; w <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; i += 2 * w) s[i] = __fadd_rn(s[i], s[i + w]);
  }
  float l = s[0];
  l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
  return __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
}
// The tile softmax of one row, shared by the prefill kernels and the split kernel. x: the thread's
// 16 raw scores S = q.k (canonical order), overwritten by p = 2^(S*scale_log2 - ms) (f32, not
// yet rounded to bf16; p = 0 for keys >= lim, which are masked when kMask). ms: the tile's max
// in scaled log2 units (-inf when the row sees no key of the tile; a max is exact in any order);
// l: the sum of the f32 p as a fixed pairwise tree over the thread's keys in canonical order
// (((p0 + p1) + (p2 + p3)) + ...), then over the 4 lanes by an xor butterfly ((l0 + l1) + (l2 +
// l3) on every lane): short dependency chains, the same order on every path. Every lane of the
// warp must call it.
template <bool kMask>
__device__ __forceinline__ void RowSoftmax(float (&x)[16], int lim, int t4, float scale_log2,
                                           float& ms, float& l) {
  ms = __fmul_rn(RowMax<kMask>(x, lim, t4), scale_log2);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float e = Ex2(__fmaf_rn(x[i], scale_log2, -ms));
    x[i] = !kMask || Key(i, t4) < lim ? e : 0.f;
  }
  l = RowSum(x);
}

// The fold of tile partials, in tile order, shared by the prefill kernel and the merge kernel.
// State (m, l, o): m the running max (scaled log2 units), l the running sum, o the unnormalized
// output; initially (-inf, 0, 0). A tile (ms, lt, ot) with ms > -inf (ot = P.V with the tile's own
// P, unnormalized) folds in as: mn = max(m, ms), a = 2^(m - mn), b = 2^(ms - mn),
// l = l*a + lt*b, o = o*a + ot*b, m = mn. A tile with ms = -inf (no visible key) is skipped.
// The result is o / l, as o * rcp(l).
struct FoldWeights {
  float a, b, m;
};
__device__ __forceinline__ FoldWeights Fold(float m, float ms) {
  const float mn = fmaxf(m, ms);
  return {Ex2(__fsub_rn(m, mn)), Ex2(__fsub_rn(ms, mn)), mn};
}
__device__ __forceinline__ float FoldElem(float o, const FoldWeights& w, float ot) {
  return __fmaf_rn(o, w.a, __fmul_rn(ot, w.b));
}

// The in-place step of a super-tile (attention.h, two levels), RowSoftmax's work for a state (m,
// l) that already holds the super-tile's earlier tiles: m' = max(m, the tile's max), P = 2^(S
// scale_log2 - m') (0 for masked keys; f32, rounded to bf16 by the caller), l = l * alpha + sum p
// with alpha = 2^(m - m') (one FMA; the sum in RowSoftmax's order), m = m'; the caller scales o
// by alpha and adds P V on the tensor cores. No visible key yet (m' = -inf): P = 0 and alpha = 0,
// the state stays empty; a tile with no visible key leaves a state as it is (alpha = 2^0 = 1,
// P = 0). From the empty state it is RowSoftmax exactly (m' is the tile's max, alpha = 0, l the
// sum, o = +0 * 0 + P V the tile's partial), so one tile a super-tile gives the one-level bits.
template <bool kMask>
__device__ __forceinline__ void RowSoftmaxInPlace(float (&x)[16], int lim, int t4, float scale_log2,
                                                  float& m, float& l, float& alpha) {
  const float mn = fmaxf(m, __fmul_rn(RowMax<kMask>(x, lim, t4), scale_log2));
  const float base = mn == -INFINITY ? 0.f : mn;  // no visible key yet: P = 0, alpha = 0
  alpha = Ex2(__fsub_rn(m, base));
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float e = Ex2(__fmaf_rn(x[i], scale_log2, -base));
    x[i] = !kMask || Key(i, t4) < lim ? e : 0.f;
  }
  l = __fmaf_rn(l, alpha, RowSum(x));
  m = mn;
}

// A row's output element from its final state: o / l as o * rcp(l), rounded to bf16. The merge
// kernel and a split CTA that finishes its rows (kFoldFinish) write it the same way; `inv` is
// __frcp_rn(l), computed once per row (a correctly rounded reciprocal is a call-like sequence
// that costs registers when repeated inside a register-heavy epilogue).
__device__ __forceinline__ __nv_bfloat16 OutElem(float o, float inv) {
  return __float2bfloat16_rn(__fmul_rn(o, inv));
}
__device__ __forceinline__ void StoreOutPair(__nv_bfloat16* dst, float o0, float o1, float inv) {
  __nv_bfloat162 v;
  v.x = OutElem(o0, inv);
  v.y = OutElem(o1, inv);
  *reinterpret_cast<__nv_bfloat162*>(dst) = v;
}
// Item field 6 (the fold mode) of split item `item`, read afresh: a kernel at its register cap
// reads it again after its tile loop instead of holding it through the loop (ptxas spilled).
__device__ __forceinline__ int ReloadFoldMode(const int32_t* items, int item) {
  int mode;
  asm volatile("ld.global.nc.b32 %0, [%1];\n"
               : "=r"(mode)
               : "l"(items + static_cast<int64_t>(item) * kItemFields + 6));
  return mode;
}

// The output row of (token row, query head).
__device__ __forceinline__ __nv_bfloat16* OutRow(const AttentionArgs& a, int row, int qh, int d) {
  return reinterpret_cast<__nv_bfloat16*>(a.out) +
         (static_cast<int64_t>(row) * a.num_q_heads + qh) * d;
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
// ldmatrix: four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
// The same from a 32-bit shared-memory address (one register instead of a generic pointer's two).
__device__ __forceinline__ void Ldsm4At(uint32_t (&r)[4], uint32_t s) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void Ldsm4TAt(uint32_t (&r)[4], uint32_t s) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

constexpr int kMaxQ = kMaxQueriesPerCta;  // query rows of the split kernel's MMA tiles
constexpr int LDP = kT + 8;  // bf16 P row stride: 36 words, fragment loads hit 32 banks
constexpr int LDS = kT + 4;  // f32 score row stride

// 16 bytes from gmem if `bytes` is 16, zeros if it is 0 (gmem is not read).
__device__ __forceinline__ void CpAsync16Z(void* smem, const void* gmem, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Cache rows (of head_dim elements) of the keys t * kT + j0 + r * kStep (r < R) of the sequence
// whose block table starts at table_offset; -1 for keys past kv_len. kShift: block_size divides
// kTileTokens, so it is a power of two: shifts instead of divisions (the shared-memory split
// kernel; the 255-register kernels keep the divisions, with which ptxas does not spill there).
template <int R, int kStep, bool kShift = false>
__device__ __forceinline__ void TileKeyRows(const AttentionArgs& a, int table_offset, int kv_len,
                                            int kvh, int t, int j0, int (&ids)[R]) {
  const int hkv = a.cache.num_kv_heads, bs = a.cache.block_size;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int tok = t * kT + j0 + r * kStep;
    ids[r] = -1;
    if (tok >= kv_len) continue;
    if (kShift) {
      const int shift = __ffs(bs) - 1;
      ids[r] =
          ((a.block_ids[table_offset + (tok >> shift)] * hkv + kvh) << shift) | (tok & (bs - 1));
    } else {
      ids[r] = (a.block_ids[table_offset + tok / bs] * hkv + kvh) * bs + tok % bs;
    }
  }
}

struct TileKernelArgs {
  AttentionArgs a;
  const int32_t* items;
  const int32_t* item_rows;
  const int32_t* partial_base;
  float scale_log2;
  const int32_t* item_count;  // device [1] or nullptr (see AttentionTileKernel)
  int super_tiles;            // AttentionPlan::super_tiles (G)
  // Split kernels launched right after the wide cascade kernel: 1, run the items without waiting
  // for it (ForEachSplitItem); 0, wait for the previous kernel first.
  int after_wide = 0;
  // The wide kernel's schedule (AttentionPlanView::wide_sched; one range of works a CTA) or
  // nullptr (PrefillWsKernel's snake).
  const int32_t* wide_sched = nullptr;
  // DecodeWsKernel's consumers in the decode-shaped form (WsFoldTilesN8): 1, or 0 (the 64-row
  // form); the same bits either way (SetDecodeWsN8).
  int dw_n8 = 0;
};

// A final (prefill) item's CTA: a 1-D grid of items x kv heads, the kv head fastest, so CTAs start
// in the items' order (the planner's, longest first) across all kv heads. With the kv head as the
// slower dimension, every kv head's items started longest first in turn: the last kv head's long
// items ran at the end on a few SMs (one prefill of 4096 tokens: a busiest SM at 1.24x its even
// share of tiles; bench/kernels/NOTES.md).
struct FinalCta {
  const int32_t* it;  // the item's fields
  int kvh;
};
__device__ __forceinline__ FinalCta FinalCtaOf(const TileKernelArgs& k) {
  const int hkv = k.a.cache.num_kv_heads, b = static_cast<int>(blockIdx.x);
  return {k.items + static_cast<int64_t>(b / hkv) * kItemFields, b % hkv};
}
// The grid FinalCtaOf decodes: one CTA per (final item, kv head).
dim3 FinalGrid(int num_final, const KvCacheView& cache) {
  return dim3(static_cast<unsigned>(num_final) * static_cast<unsigned>(cache.num_kv_heads));
}

// Chunk c (16 bytes) of q-row qi of an item (item row qi / G, query head kvh * G + qi % G), or
// nullptr for rows past nq.
template <int D>
__device__ __forceinline__ const __nv_bfloat16* QChunk(const TileKernelArgs& k, int row_begin,
                                                       int nq, int kvh, int qi, int c) {
  if (qi >= nq) return nullptr;
  const AttentionArgs& a = k.a;
  const int G = a.num_q_heads / a.cache.num_kv_heads;
  const int row = k.item_rows[row_begin + qi / G];
  return reinterpret_cast<const __nv_bfloat16*>(a.q) + static_cast<int64_t>(row) * a.q_row_stride +
         (kvh * G + qi % G) * D + c * 8;
}

// ---------------------------------------------------------------------------------------------
// Prefill (final items): one CTA per (item, kv head) (FinalCtaOf) folds every tile of its rows in
// registers. Rows of the item x the kv head's G query heads give up to PrefillQueriesPerCta query
// rows (q-row qi is item row qi / G, head kvh * G + qi % G); warp w owns MT m16 tiles, q-rows [16
// MT w, 16 MT (w + 1)), and lane (g, t4) the rows 16 (MT w + mt) + g (+ 8) of the m16n8k16
// accumulator layout. Per 64-key tile: S = Q K^T (k over D ascending), RowSoftmax, P rounded to
// bf16, and for each 16-column slice of O the tile's O_t = P V (k over the 64 keys ascending)
// folded into the running O at once (Fold): exactly the partial the split kernel writes and the
// fold the merge kernel does, so a row gets the same bits on every path. K/V tiles stream
// through two shared-memory stages with cp.async.
constexpr int kStages = 2;  // K/V stages (the loop below is written for 2)
constexpr int kPrefillMT = 1;
template <int D>
constexpr int PrefillMT() {
  return D > 128 ? 1 : kPrefillMT;
}
template <int D>
constexpr int PrefillWarps() {
  return PrefillQueriesPerCta(D) / (16 * PrefillMT<D>());
}
template <int D>
constexpr size_t PrefillSmemBytes() {
  return static_cast<size_t>(PrefillQueriesPerCta(D) + 2 * kStages * kT) * (D + 8) *
         sizeof(__nv_bfloat16);
}

// One tile for one warp: S, softmax, P.V and the fold. kMask: some key of the tile is past some
// row's position (or the tile is partial). Qw: the warp's first Q row in shared memory; qf: its
// fragments in registers when kQRegs (MT == 1). kInPlace: (m, l, o) is a super-tile's state,
// updated in place (RowSoftmaxInPlace; o scaled by alpha, then o += P V) instead of folded.
template <int D, int MT, bool kMask, bool kQRegs, bool kInPlace = false>
__device__ __forceinline__ void PrefillTile(const __nv_bfloat16* Qw, const __nv_bfloat16* Ks,
                                            const __nv_bfloat16* Vs,
                                            const uint32_t (&qf)[kQRegs ? D / 16 : 1][4], int ts,
                                            const int (&pos)[MT][2], float scale_log2,
                                            float (&m)[MT][2], float (&l)[MT][2],
                                            float (&o)[MT][D / 8][4], int lane) {
  constexpr int LD = D + 8;
  const int t4 = lane & 3;
  float s[MT][kT / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < kT / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
  }
  const __nv_bfloat16* kp = Ks + ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1);
  const __nv_bfloat16* qp = Qw + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kQRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) af[mt][i] = qf[kc][i];
      } else {
        Ldsm4(af[mt], qp + mt * 16 * LD + kc * 16);
      }
    }
#pragma unroll
    for (int np = 0; np < kT / 16; ++np) {
      uint32_t b[4];
      Ldsm4(b, kp + np * 16 * LD + kc * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma16816(s[mt][2 * np], af[mt], b[0], b[1]);
        Mma16816(s[mt][2 * np + 1], af[mt], b[2], b[3]);
      }
    }
  }
  FoldWeights w[MT][2];
  bool valid[MT][2];
  float alpha[MT][2];
  uint32_t pa[MT][kT / 16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x[16];
#pragma unroll
      for (int n = 0; n < kT / 8; ++n) {
        x[2 * n] = s[mt][n][2 * h];
        x[2 * n + 1] = s[mt][n][2 * h + 1];
      }
      if constexpr (kInPlace) {
        RowSoftmaxInPlace<kMask>(x, pos[mt][h] + 1 - ts, t4, scale_log2, m[mt][h], l[mt][h],
                                 alpha[mt][h]);
      } else {
        float ms, lt;
        RowSoftmax<kMask>(x, pos[mt][h] + 1 - ts, t4, scale_log2, ms, lt);
        valid[mt][h] = !kMask || ms != -INFINITY;
        w[mt][h] = Fold(m[mt][h], ms);
        if (valid[mt][h]) {
          l[mt][h] = FoldElem(l[mt][h], w[mt][h], lt);
          m[mt][h] = w[mt][h].m;
        }
      }
#pragma unroll
      for (int n = 0; n < kT / 8; ++n) {
        s[mt][n][2 * h] = x[2 * n];
        s[mt][n][2 * h + 1] = x[2 * n + 1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kT / 16; ++kk) {
      pa[mt][kk][0] = PackBf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][kk][1] = PackBf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][kk][2] = PackBf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][kk][3] = PackBf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
  }
  const __nv_bfloat16* vp = Vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
  if constexpr (kInPlace) {  // o = o * alpha, then o += P V (k over the tile's keys ascending)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mt][n][i] = __fmul_rn(o[mt][n][i], alpha[mt][i >> 1]);
      }
    }
#pragma unroll
    for (int nd = 0; nd < D / 16; ++nd) {
#pragma unroll
      for (int kk = 0; kk < kT / 16; ++kk) {
        uint32_t b[4];
        Ldsm4T(b, vp + kk * 16 * LD + nd * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma16816(o[mt][2 * nd], pa[mt][kk], b[0], b[1]);
          Mma16816(o[mt][2 * nd + 1], pa[mt][kk], b[2], b[3]);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int nd = 0; nd < D / 16; ++nd) {
    float c[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) c[mt][0][i] = c[mt][1][i] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kT / 16; ++kk) {
      uint32_t b[4];
      Ldsm4T(b, vp + kk * 16 * LD + nd * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma16816(c[mt][0], pa[mt][kk], b[0], b[1]);
        Mma16816(c[mt][1], pa[mt][kk], b[2], b[3]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i >> 1;
        if (valid[mt][h]) {
          o[mt][2 * nd][i] = FoldElem(o[mt][2 * nd][i], w[mt][h], c[mt][0][i]);
          o[mt][2 * nd + 1][i] = FoldElem(o[mt][2 * nd + 1][i], w[mt][h], c[mt][1][i]);
        }
      }
    }
  }
}

// K/V tile copies of the two-stage kernels (PrefillKernel, SplitRegKernel): thread tid copies the
// 16-byte chunk tid % C of rows tid / C + r * kRowsPerPass (r < kR) of a tile into a stage. The
// block ids of a tile are loaded (LoadIds) a tile ahead of its copies (Issue), so that issuing
// never waits on a global load.
template <int D, int kThr>
struct TileCopier {
  static constexpr int LD = D + 8, C = D / 8, kRowsPerPass = kThr / C, kR = kT / kRowsPerPass;
  static_assert(kThr % C == 0 && kT % kRowsPerPass == 0, "tile load shape");
  const AttentionArgs& a;
  int table_offset, kv_len, kvh, j0, cchunk;
  int ids[kR];  // cache row (of D elements) of each row's key, -1: past kv_len

  __device__ TileCopier(const AttentionArgs& args, int table, int len, int head, int tid)
      : a(args), table_offset(table), kv_len(len), kvh(head), j0(tid / C), cchunk(tid % C) {}
  __device__ __forceinline__ void LoadIds(int t) {
    TileKeyRows<kR, kRowsPerPass>(a, table_offset, kv_len, kvh, t, j0, ids);
  }
  // Copies the tile whose ids are loaded into K and V [kT, LD] at `kv` (V at kv + kT * LD).
  __device__ __forceinline__ void Issue(__nv_bfloat16* kv) const {
    const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(a.cache.k) + cchunk * 8;
    const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(a.cache.v) + cchunk * 8;
    __nv_bfloat16* Kd = kv + j0 * LD + cchunk * 8;
    __nv_bfloat16* Vd = Kd + kT * LD;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      // Keys past kv_len are zeros (P is 0 there, and 0 * garbage could be NaN).
      const int64_t src = ids[r] < 0 ? 0 : static_cast<int64_t>(ids[r]) * D;
      const int bytes = ids[r] < 0 ? 0 : 16;
      CpAsync16Z(Kd + r * kRowsPerPass * LD, kc + src, bytes);
      CpAsync16Z(Vd + r * kRowsPerPass * LD, vc + src, bytes);
    }
  }
};

// kSuper: the two-level order (k.super_tiles = G > 1, head_dim 128): each super-tile's state is
// accumulated in place (PrefillTile kInPlace) and folded into the row's at the super-tile's end.
template <int D, bool kSuper = false>
__global__ void __launch_bounds__(PrefillWarps<D>() * 32, 1) PrefillKernel(TileKernelArgs k) {
  WaitForPriorGrids();
  constexpr int MT = PrefillMT<D>(), NW = PrefillWarps<D>(), kThr = NW * 32;
  constexpr int kRows = PrefillQueriesPerCta(D), LD = D + 8, C = D / 8;
  // Q fragments in registers (else ldmatrix); not beside a second state (registers).
  constexpr bool kQRegs = MT == 1 && D <= 128 && !kSuper;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, LD]
  __nv_bfloat16* KVs = Qs + kRows * LD;                        // stage s: K, V [kT, LD] each

  const auto [it, kvh] = FinalCtaOf(k);
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int nq = row_count * G;  // <= kRows (the planner's rows per item)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2;

  for (int i = tid; i < kRows * C; i += kThr) {
    const int qi = i / C, c = i % C;
    const __nv_bfloat16* src = QChunk<D>(k, row_begin, nq, kvh, qi, c);
    CpAsync16Z(Qs + qi * LD + c * 8, src ? src : reinterpret_cast<const __nv_bfloat16*>(a.q),
               src ? 16 : 0);
  }
  TileCopier<D, kThr> copier(a, table_offset, kv_len, kvh, tid);
  auto load_ids = [&](int t) { copier.LoadIds(t); };
  auto issue_tile = [&](int stage) { copier.Issue(KVs + stage * 2 * kT * LD); };

  // This lane's rows; the warp's lowest and highest position (rows past nq excluded).
  int pos[MT][2];
  int wmin = INT_MAX, wmax = -1;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qi = (warp * MT + mt) * 16 + g + 8 * h;
      pos[mt][h] = qi < nq ? a.positions[k.item_rows[row_begin + qi / G]] : -1;
      if (qi < nq) wmin = min(wmin, pos[mt][h]);
      wmax = max(wmax, pos[mt][h]);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, off));
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
  }

  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  uint32_t qf[kQRegs ? D / 16 : 1][4];
  const __nv_bfloat16* Qw = Qs + warp * MT * 16 * LD;
  // kSuper: the current super-tile's state (empty at each super-tile's first tile) and its fold
  // into the row's state (m, l, o) at the super-tile's end (a state without a visible key, m =
  // -inf, is skipped, as the merge kernel skips such a partial).
  constexpr int SM = kSuper ? MT : 1, SN = kSuper ? D / 8 : 1;
  float so[SM][SN][4], sm[SM][2], sl[SM][2];
  auto super_reset = [&] {
#pragma unroll
    for (int mt = 0; mt < SM; ++mt) {
#pragma unroll
      for (int n = 0; n < SN; ++n) so[mt][n][0] = so[mt][n][1] = so[mt][n][2] = so[mt][n][3] = 0.f;
      sm[mt][0] = sm[mt][1] = -INFINITY;
      sl[mt][0] = sl[mt][1] = 0.f;
    }
  };
  auto super_fold = [&] {
#pragma unroll
    for (int mt = 0; mt < SM; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (sm[mt][h] == -INFINITY) continue;
        const FoldWeights w = Fold(m[mt][h], sm[mt][h]);
        l[mt][h] = FoldElem(l[mt][h], w, sl[mt][h]);
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          o[mt][n][2 * h] = FoldElem(o[mt][n][2 * h], w, so[mt][n][2 * h]);
          o[mt][n][2 * h + 1] = FoldElem(o[mt][n][2 * h + 1], w, so[mt][n][2 * h + 1]);
        }
        m[mt][h] = w.m;
      }
    }
  };
  const int ST = kSuper ? k.super_tiles : 1;  // tiles per super-tile

  // Two stages, one barrier per tile: after the barrier that publishes tile t, every warp is done
  // with tile t - 1, so tile t + 1 may be copied into its stage while tile t is computed.
  load_ids(tile_begin);
  issue_tile(0);
  CpAsyncCommit();  // with Q
  if (tile_begin + 1 < tile_end) load_ids(tile_begin + 1);
  for (int t = tile_begin; t < tile_end; ++t) {
    const int i = t - tile_begin;
    CpAsyncWait<0>();
    __syncthreads();
    if (t + 1 < tile_end) {
      issue_tile((i + 1) % kStages);
      CpAsyncCommit();
      if (t + 2 < tile_end) load_ids(t + 2);
    }
    if constexpr (kQRegs) {
      if (i == 0) {
#pragma unroll
        for (int kc2 = 0; kc2 < D / 16; ++kc2) {
          Ldsm4(qf[kc2],
                Qw + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + kc2 * 16 + 8 * (lane >> 4));
        }
      }
    }
    const int ts = t * kT;
    const __nv_bfloat16* Ks = KVs + (i % kStages) * 2 * kT * LD;
    const __nv_bfloat16* Vs = Ks + kT * LD;
    if constexpr (kSuper) {
      if (t % ST == 0) super_reset();  // final items start at tile 0
      if (ts <= wmax) {
        if (ts + kT - 1 <= wmin) {
          PrefillTile<D, MT, false, kQRegs, true>(Qw, Ks, Vs, qf, ts, pos, k.scale_log2, sm, sl, so,
                                                  lane);
        } else {
          PrefillTile<D, MT, true, kQRegs, true>(Qw, Ks, Vs, qf, ts, pos, k.scale_log2, sm, sl, so,
                                                 lane);
        }
      }
      if (t % ST == ST - 1 || t == tile_end - 1) super_fold();
    } else if (ts <= wmax) {  // warp-uniform: some row of the warp sees a key of the tile
      if (ts + kT - 1 <= wmin) {
        PrefillTile<D, MT, false, kQRegs>(Qw, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o, lane);
      } else {
        PrefillTile<D, MT, true, kQRegs>(Qw, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o, lane);
      }
    }
  }

  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qi = (warp * MT + mt) * 16 + g + 8 * h;
      if (qi >= nq) continue;
      const int row = k.item_rows[row_begin + qi / G];
      const float inv = __frcp_rn(l[mt][h]);
      __nv_bfloat16* dst = out + static_cast<int64_t>(row) * hq * D + (kvh * G + qi % G) * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + 8 * n + 2 * (lane & 3)) =
            PackBf16(__fmul_rn(o[mt][n][2 * h], inv), __fmul_rn(o[mt][n][2 * h + 1], inv));
      }
    }
  }
}

// The Hopper kernels, in this translation unit (see the file).
#include "gpu_worker/backend/cuda/attention_hopper.cuh"

// ---------------------------------------------------------------------------------------------
// Split items (decode rows, cascade tiles): one CTA (kThreads threads, kv head blockIdx.y) per
// item writes one partial per (row, query head, tile): O_t = P V unnormalized (f32) and
// (ms, l) (see RowSoftmax and Fold). S = Q K^T and O_t = P V on tensor cores with the prefill
// kernel's accumulation chains; the softmax runs 4 lanes per query in the prefill kernel's
// register layout and order (RowSoftmax), so a tile's partial is bitwise the prefill kernel's.
// Up to kMaxQ (row, head) pairs share the K/V tile load. A fold item (item field 6, only for
// tiles [0, tile_end) of its rows: a row's first tiles) instead folds its tiles' partials in tile
// order from the empty state, as the merge kernel would, and writes that state once, as the
// partial of its last tile; the merge starts from it (folding a state into the empty state is a
// copy), so the row's bits do not change and its partial traffic shrinks.
// K/V stream with cp.async into one K and one V buffer: with kPrefetch, tile t + 1's K is copied
// while tile t's softmax and P V run, its V while tile t + 1's S runs; else (the default: the
// prefetch measured no faster on an H100) each tile's K and V are copied at the start of its step,
// S waiting for K and P V for V.
// kSuper (k.super_tiles = G > 1, head_dim 128): every item accumulates each super-tile's state in
// place (RowSoftmaxInPlace in the softmax lanes, which all hold the row's running (m, l); O scaled
// by alpha and P V added in the P V lanes' registers) and writes it at the super-tile's end; a
// fold item spans one super-tile (the planner's), so its state is that super-tile's.
template <int E, bool kPrefetch, bool kSuper = false>
__device__ __forceinline__ void SplitItem(const TileKernelArgs& k, int item) {
  constexpr int D = E * 32, LD = D + 8;
  // P V jobs (an m16 tile x two n8 tiles) per warp at most (mq = kMaxQ); the fold item's running
  // O sits in the registers of the job's lanes.
  constexpr int kPairs =
      (kMaxQ / 16) * (D / 16) / kWarps > 0 ? (kMaxQ / 16) * (D / 16) / kWarps : 1;
  static_assert(kPairs * kWarps >= (kMaxQ / 16) * (D / 16), "fold registers cover every job");
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, G = hq / cache.num_kv_heads;
  const int ST = kSuper ? k.super_tiles : 1;                   // tiles per super-tile
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [kT, LD]
  __nv_bfloat16* Vs = Ks + kT * LD;                            // [kT, LD]
  __nv_bfloat16* Qs = Vs + kT * LD;                            // [kMaxQ, LD]
  __nv_bfloat16* Ps = Qs + kMaxQ * LD;                         // [kMaxQ, LDP]
  float* Ss = reinterpret_cast<float*>(Ps + kMaxQ * LDP);      // [kMaxQ, LDS]
  float* row_l = Ss + kMaxQ * LDS;                             // [kMaxQ]
  float* row_ms = row_l + kMaxQ;                               // [kMaxQ], -inf: no visible key
  // Fold items: the tile's Fold weights of q-row qi sit in the padding of its score row.
  float* fold_a = Ss + kT;  // fold_a[qi * LDS]
  float* fold_b = Ss + kT + 1;

  const int32_t* it = k.items + static_cast<int64_t>(item) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const bool fold = it[6] != kFoldNone;
  const int kvh = blockIdx.y;
  const int nq = row_count * G;        // <= kMaxQ (the planner's rows_per_cta)
  const int mq = (nq + 15) / 16 * 16;  // MMA rows; rows [nq, mq) are zero
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  // This thread's part of a tile copy (TileCopier's shape): 16-byte chunk cc of rows j0 + r *
  // kRowsPerPass. The rows' cache ids are found once per tile (TileKeyRows) for K and V.
  constexpr int kC = D / 8, kRowsPerPass = kThreads / kC, kR = kT / kRowsPerPass;
  static_assert(kThreads % kC == 0 && kT % kRowsPerPass == 0, "tile load shape");
  const int j0 = tid / kC, cc = tid % kC;
  int ids[kR];
  auto load_ids = [&](int t) {
    if (t < tile_end) TileKeyRows<kR, kRowsPerPass, true>(a, table_offset, kv_len, kvh, t, j0, ids);
  };
  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k) + cc * 8;
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v) + cc * 8;
  // Copies tile t (its ids loaded) of the K or V cache into dst (zeros past kv_len: P is 0 there,
  // and 0 * garbage could be NaN) as one cp.async group; past the item's tiles an empty group, so
  // every thread counts the same groups.
  auto load = [&](int t, __nv_bfloat16* dst, const __nv_bfloat16* src_cache) {
    if (t < tile_end) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int64_t src = ids[r] < 0 ? 0 : static_cast<int64_t>(ids[r]) * D;
        CpAsync16Z(dst + (j0 + r * kRowsPerPass) * LD + cc * 8, src_cache + src,
                   ids[r] < 0 ? 0 : 16);
      }
    }
    CpAsyncCommit();
  };
  if (kPrefetch) {
    load_ids(tile_begin);
    load(tile_begin, Ks, kc);
    load(tile_begin, Vs, vc);
  }

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
  // Fold items: the running (m, l) of q-row qi in the lane that runs its softmax (t4 = 0 of lane
  // group qi % 8 of warp qi / 8: one softmax pass covers the kMaxQ rows), O in the P V lanes.
  static_assert(kWarps * 8 >= kMaxQ, "one softmax pass");
  float run_m = -INFINITY, run_l = 0.f;
  float run_o[kPairs][2][4];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) run_o[j][0][i] = run_o[j][1][i] = 0.f;
  }
  // ldmatrix row addresses of this lane (PrefillTile's): A fragments of Q and P, B fragments of
  // K (one n8 tile, two k16 steps) and of V (transposed: two n8 tiles, one k16 step).
  const uint32_t qp = SmemAddr(Qs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));
  const uint32_t pp = SmemAddr(Ps + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LDP + 8 * (lane >> 4));
  const uint32_t kp = SmemAddr(Ks + (lane & 7) * LD + 8 * (lane >> 3));
  const uint32_t vp = SmemAddr(Vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));
  constexpr uint32_t kB = sizeof(__nv_bfloat16);  // bytes per element

  for (int t = tile_begin; t < tile_end; ++t) {
    const int ts = t * kT;
    const int n_load = min(kT, kv_len - ts);
    if (!kPrefetch) {
      load_ids(t);  // before the barrier: its global loads overlap the other warps' tail
      if (t != tile_begin) __syncthreads();  // the previous tile's readers are done
      load(t, Ks, kc);
      load(t, Vs, vc);
    }
    CpAsyncWait<1>();  // K_t has landed (V_t may still be in flight)
    __syncthreads();   // ... for every thread; Q, P and the fold state are initialized

    // S = Q K^T: job f = (m tile f / (kT/8), n tile f % (kT/8)), k over D in order.
    for (int f = warp; f < (mq / 16) * (kT / 8); f += kWarps) {
      const int m0 = (f / (kT / 8)) * 16, n0 = (f % (kT / 8)) * 8;
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 32) {
        uint32_t af[4], bf[4];
        Ldsm4At(bf, kp + (n0 * LD + k0) * kB);
        Ldsm4At(af, qp + (m0 * LD + k0) * kB);
        Mma16816(c, af, bf[0], bf[1]);
        Ldsm4At(af, qp + (m0 * LD + k0 + 16) * kB);
        Mma16816(c, af, bf[2], bf[3]);
      }
      *reinterpret_cast<float2*>(Ss + (m0 + g) * LDS + n0 + 2 * t4) = make_float2(c[0], c[1]);
      *reinterpret_cast<float2*>(Ss + (m0 + g + 8) * LDS + n0 + 2 * t4) = make_float2(c[2], c[3]);
    }
    __syncthreads();  // Ks is read: the next tile's K may come in
    if (kPrefetch) {
      load_ids(t + 1);  // tile t's copies are all issued: ids may move on
      load(t + 1, Ks, kc);
    }

    // Softmax: 8 queries per warp pass, 4 lanes per query (lane t4 holds keys Key(i, t4)).
    for (int q0 = warp * 8; q0 < nq; q0 += kWarps * 8) {  // warp-uniform
      const int qi = q0 + g;
      int lim = 0;
      if (qi < nq) lim = min(n_load, a.positions[k.item_rows[row_begin + qi / G]] + 1 - ts);
      float x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = qi < nq ? Ss[qi * LDS + Key(i, t4)] : 0.f;
      if constexpr (kSuper) {
        if (t % ST == 0) {  // a super-tile's first tile: the empty state
          run_m = -INFINITY;
          run_l = 0.f;
        }
        float alpha;
        RowSoftmaxInPlace<true>(x, lim, t4, k.scale_log2, run_m, run_l, alpha);
        if (qi < nq) {
#pragma unroll
          for (int i = 0; i < 16; ++i) Ps[qi * LDP + Key(i, t4)] = __float2bfloat16_rn(x[i]);
          if (t4 == 0) {
            row_l[qi] = run_l;
            row_ms[qi] = run_m;
            fold_a[qi * LDS] = alpha;
          }
        }
        continue;
      }
      float ms, lt;
      RowSoftmax<true>(x, lim, t4, k.scale_log2, ms, lt);
      if (qi < nq) {
#pragma unroll
        for (int i = 0; i < 16; ++i) Ps[qi * LDP + Key(i, t4)] = __float2bfloat16_rn(x[i]);
        if (t4 == 0) {
          row_l[qi] = lt;
          row_ms[qi] = ms;
          if (fold && ms != -INFINITY) {  // the merge kernel's fold, in its order
            const FoldWeights w = Fold(run_m, ms);
            fold_a[qi * LDS] = w.a;
            fold_b[qi * LDS] = w.b;
            run_l = FoldElem(run_l, w, lt);
            run_m = w.m;
          }
        }
      }
    }
    if (kPrefetch) {
      CpAsyncWait<1>();  // V_t has landed (K_{t+1} may still be in flight)
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();

    // kSuper: the super-tile's O = O * alpha + P V in the job's registers, written at the
    // super-tile's end (the item's last one after the loop).
    const bool super_end = kSuper && t % ST == ST - 1 && t != tile_end - 1;
    if constexpr (kSuper) {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int p = warp + j * kWarps;
        if (p >= (mq / 16) * (D / 16)) break;
        const int m0 = (p / (D / 16)) * 16, nd = p % (D / 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qi = m0 + g + 8 * h;
          const float al = qi < nq ? fold_a[qi * LDS] : 0.f;
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            // A super-tile's first tile starts from +0 (the other kernels' empty state).
            run_o[j][hf][2 * h] = t % ST == 0 ? 0.f : __fmul_rn(run_o[j][hf][2 * h], al);
            run_o[j][hf][2 * h + 1] = t % ST == 0 ? 0.f : __fmul_rn(run_o[j][hf][2 * h + 1], al);
          }
        }
#pragma unroll
        for (int kk = 0; kk < kT / 16; ++kk) {
          uint32_t af[4], bf[4];
          Ldsm4At(af, pp + (m0 * LDP + kk * 16) * kB);
          Ldsm4TAt(bf, vp + (kk * 16 * LD + nd * 16) * kB);
          Mma16816(run_o[j][0], af, bf[0], bf[1]);
          Mma16816(run_o[j][1], af, bf[2], bf[3]);
        }
        if (!super_end) continue;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qi = m0 + g + 8 * h;
            if (qi >= nq || row_ms[qi] == -INFINITY) continue;
            const int row = k.item_rows[row_begin + qi / G];
            const int64_t slot =
                static_cast<int64_t>(k.partial_base[row] + t / ST) * hq + kvh * G + qi % G;
            *reinterpret_cast<float2*>(a.partial_o + slot * D + nd * 16 + 8 * hf + 2 * t4) =
                make_float2(run_o[j][hf][2 * h], run_o[j][hf][2 * h + 1]);
          }
        }
      }
      if (super_end) {
        for (int qi = tid; qi < nq; qi += kThreads) {
          const int row = k.item_rows[row_begin + qi / G];
          const int64_t slot =
              static_cast<int64_t>(k.partial_base[row] + t / ST) * hq + kvh * G + qi % G;
          a.partial_ml[2 * slot] = row_ms[qi];
          a.partial_ml[2 * slot + 1] = row_l[qi];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < (kSuper ? 0 : kPairs); ++j) {
      const int p = warp + j * kWarps;
      if (p >= (mq / 16) * (D / 16)) break;
      const int m0 = (p / (D / 16)) * 16, nd = p % (D / 16);
      float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < kT / 16; ++kk) {
        uint32_t af[4], bf[4];
        Ldsm4At(af, pp + (m0 * LDP + kk * 16) * kB);
        Ldsm4TAt(bf, vp + (kk * 16 * LD + nd * 16) * kB);
        Mma16816(c[0], af, bf[0], bf[1]);
        Mma16816(c[1], af, bf[2], bf[3]);
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int n0 = nd * 16 + 8 * hf;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qi = m0 + g + 8 * h;
          if (qi >= nq || row_ms[qi] == -INFINITY) continue;
          if (fold) {
            const FoldWeights w{fold_a[qi * LDS], fold_b[qi * LDS], 0.f};
            run_o[j][hf][2 * h] = FoldElem(run_o[j][hf][2 * h], w, c[hf][2 * h]);
            run_o[j][hf][2 * h + 1] = FoldElem(run_o[j][hf][2 * h + 1], w, c[hf][2 * h + 1]);
            continue;
          }
          const int row = k.item_rows[row_begin + qi / G];
          const int qh = kvh * G + qi % G;
          const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
          *reinterpret_cast<float2*>(a.partial_o + slot * D + n0 + 2 * t4) =
              make_float2(c[hf][2 * h], c[hf][2 * h + 1]);
        }
      }
    }
    if (!kSuper && !fold) {
      for (int qi = tid; qi < nq; qi += kThreads) {
        const int row = k.item_rows[row_begin + qi / G];
        const int qh = kvh * G + qi % G;
        const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
        a.partial_ml[2 * slot] = row_ms[qi];
        a.partial_ml[2 * slot + 1] = row_l[qi];
      }
    }
    __syncthreads();  // Vs, Ps and the row state are read: the next tile's V may come in
    if (kPrefetch) load(t + 1, Vs, vc);
  }
  if (kSuper || fold) {  // the state after the item's last tile, as its partial (or the output)
    const int t = tile_end - 1;
    const bool finish = ReloadFoldMode(k.items, item) == kFoldFinish;
    const int qs = warp * 8 + g;  // the lane that holds q-row qs's running (m, l)
    if (finish) {  // rcp of the running l to the P V lanes (the last tile's row_l readers are done)
      if (t4 == 0 && qs < nq) row_l[qs] = __frcp_rn(run_l);  // 1 / l for the P V lanes
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int p = warp + j * kWarps;
      if (p >= (mq / 16) * (D / 16)) break;
      const int m0 = (p / (D / 16)) * 16, nd = p % (D / 16);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qi = m0 + g + 8 * h;
          if (qi >= nq) continue;
          const int row = k.item_rows[row_begin + qi / G];
          const int dim = nd * 16 + 8 * hf + 2 * t4;
          if (finish) {
            StoreOutPair(OutRow(a, row, kvh * G + qi % G, D) + dim, run_o[j][hf][2 * h],
                         run_o[j][hf][2 * h + 1], row_l[qi]);
            continue;
          }
          const int64_t slot =
              static_cast<int64_t>(k.partial_base[row] + t / ST) * hq + kvh * G + qi % G;
          *reinterpret_cast<float2*>(a.partial_o + slot * D + dim) =
              make_float2(run_o[j][hf][2 * h], run_o[j][hf][2 * h + 1]);
        }
      }
    }
    if (!finish && t4 == 0 && qs < nq) {
      const int row = k.item_rows[row_begin + qs / G];
      const int64_t slot =
          static_cast<int64_t>(k.partial_base[row] + t / ST) * hq + kvh * G + qs % G;
      a.partial_ml[2 * slot] = run_m;
      a.partial_ml[2 * slot + 1] = run_l;
    }
  }
}

// Split items, register form (head_dim <= 128; the default): one CTA of kRegWarps warps per
// item, warp w owning q-rows [16 w, 16 w + 16) with its Q fragments in registers, every tile
// computed by PrefillTile (S, softmax, P V and the fold in registers), K/V streaming through two
// shared-memory stages with one barrier per tile, as PrefillKernel does. A tile's partial is
// PrefillTile's fold of that tile into the empty state, which is the tile's (ms, l, O_t)
// exactly (2^(-inf) = 0, 2^0 = 1, and O_t is never -0), so the bits are SplitItem's; a fold item
// keeps the state across its tiles and writes it once, as SplitItem does.
constexpr int kRegWarps = kMaxQ / 16;
constexpr int kRegThreads = kRegWarps * 32;
template <int D>
constexpr size_t SplitRegSmemBytes() {
  return static_cast<size_t>(2 * kStages * kT) * (D + 8) * sizeof(__nv_bfloat16);
}

// kFinish: the instance that also runs kFoldFinish items (through shared memory, see the end);
// plans of the register form have none (PlanAttention finishes rows only for the shared-memory
// form), so only a form forced by SetSplitVariant runs it (held in registers through the loop,
// the mode alone made this 255-register kernel spill).
// kSuper (k.super_tiles > 1, head_dim 128): the state is the current super-tile's, accumulated in
// place (PrefillTile kInPlace), emptied at each super-tile's first tile and written at its end.
template <int D, bool kFinish, bool kSuper = false>
__device__ __forceinline__ void SplitRegItem(const TileKernelArgs& k, int item) {
  constexpr int LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv;
  __nv_bfloat16* KVs = reinterpret_cast<__nv_bfloat16*>(smem);  // stage s: K, V [kT, LD] each

  const int32_t* it = k.items + static_cast<int64_t>(item) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const bool fold = it[6] != kFoldNone;
  const int kvh = blockIdx.y;
  const int nq = row_count * G;  // <= kMaxQ
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

  TileCopier<D, kRegThreads> copier(a, table_offset, kv_len, kvh, tid);
  auto load_ids = [&](int t) { copier.LoadIds(t); };
  auto issue_tile = [&](int stage) { copier.Issue(KVs + stage * 2 * kT * LD); };
  load_ids(tile_begin);
  issue_tile(0);
  CpAsyncCommit();
  if (tile_begin + 1 < tile_end) load_ids(tile_begin + 1);

  // This lane's two q-rows: Q fragments (the m16n8k16 A layout, zeros past nq) and positions (-1
  // past nq: no key visible); the warp's lowest and highest position.
  int pos[1][2];
  const __nv_bfloat16* qrow[2];
  int wmin = INT_MAX, wmax = -1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = warp * 16 + g + 8 * h;
    qrow[h] = QChunk<D>(k, row_begin, nq, kvh, qi, 0);
    pos[0][h] = qi < nq ? a.positions[k.item_rows[row_begin + qi / G]] : -1;
    if (qi < nq) wmin = min(wmin, pos[0][h]);
    wmax = max(wmax, pos[0][h]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, off));
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
  }
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kc2 = 0; kc2 < D / 16; ++kc2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat16* q = qrow[i & 1];
      qf[kc2][i] = q == nullptr
                       ? 0u
                       : *reinterpret_cast<const uint32_t*>(q + kc2 * 16 + 8 * (i >> 1) + 2 * t4);
    }
  }

  float o[1][D / 8][4];
  float m[1][2], l[1][2];
  auto reset = [&] {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.f;
    m[0][0] = m[0][1] = -INFINITY;
    l[0][0] = l[0][1] = 0.f;
  };
  const int ST = kSuper ? k.super_tiles : 1;  // tiles per super-tile
  // The state (m, l, o) of this lane's rows as the partial of tile t (of its super-tile).
  auto write = [&](int t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qi = warp * 16 + g + 8 * h;
      if (qi >= nq) continue;
      const int row = k.item_rows[row_begin + qi / G];
      const int64_t slot =
          static_cast<int64_t>(k.partial_base[row] + t / ST) * hq + kvh * G + qi % G;
      if (m[0][h] != -INFINITY) {
        float* po = a.partial_o + slot * D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          *reinterpret_cast<float2*>(po + 8 * n) = make_float2(o[0][n][2 * h], o[0][n][2 * h + 1]);
        }
      }
      if (t4 == 0) {
        a.partial_ml[2 * slot] = m[0][h];
        a.partial_ml[2 * slot + 1] = l[0][h];
      }
    }
  };
  reset();

  for (int t = tile_begin; t < tile_end; ++t) {
    const int i = t - tile_begin;
    CpAsyncWait<0>();
    __syncthreads();  // tile t is in; every warp is done with tile t - 1's stage
    if (t + 1 < tile_end) {
      issue_tile((i + 1) % kStages);
      CpAsyncCommit();
      if (t + 2 < tile_end) load_ids(t + 2);
    }
    if (kSuper ? t % ST == 0 : !fold) {
      if (i > 0) reset();
    }
    const int ts = t * kT;
    const __nv_bfloat16* Ks = KVs + (i % kStages) * 2 * kT * LD;
    const __nv_bfloat16* Vs = Ks + kT * LD;
    if (ts <= wmax) {  // warp-uniform: some row of the warp sees a key of the tile
      if (ts + kT - 1 <= wmin) {
        PrefillTile<D, 1, false, true, kSuper>(nullptr, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o,
                                               lane);
      } else {
        PrefillTile<D, 1, true, true, kSuper>(nullptr, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o,
                                              lane);
      }
    }
    if (kSuper ? t % ST == ST - 1 && t != tile_end - 1 : !fold) write(t);
  }
  if (kFinish && ReloadFoldMode(k.items, item) == kFoldFinish) {  // the rows end here
    // Through shared memory (the K/V stages are free once every warp is done with them): the
    // state leaves the registers as write() stores it, and a plain loop writes o * rcp(l) (done
    // in the registers' epilogue, it made ptxas spill in this 255-register kernel).
    static_assert(SplitRegSmemBytes<D>() >= (kMaxQ * D + kMaxQ) * sizeof(float), "state fits");
    __syncthreads();
    float* so = reinterpret_cast<float*>(smem);  // [kMaxQ, D] f32, then l [kMaxQ]
    float* sl = so + kMaxQ * D;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qi = warp * 16 + g + 8 * h;
      if (qi >= nq) continue;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<float2*>(so + qi * D + 8 * n + 2 * t4) =
            make_float2(o[0][n][2 * h], o[0][n][2 * h + 1]);
      }
      if (t4 == 0) sl[qi] = l[0][h];
    }
    __syncthreads();
    for (int i = tid; i < nq * (D / 2); i += kRegThreads) {
      const int qi = i / (D / 2), c = 2 * (i % (D / 2));
      const int row = k.item_rows[row_begin + qi / G];
      StoreOutPair(OutRow(a, row, kvh * G + qi % G, D) + c, so[qi * D + c], so[qi * D + c + 1],
                   __frcp_rn(sl[qi]));
    }
  } else if (kSuper || fold) {
    write(tile_end - 1);  // the state after the item's last tile
  }
}

// The split items of this CTA: blockIdx.x, blockIdx.x + gridDim.x, ... below the item count:
// gridDim.x itself (one item per CTA), or, for a launch inside a CUDA graph, a count read on the
// device, so the same fixed grid serves every step. An item's arithmetic does not depend on which
// CTA runs it.
// The count is read before the wait for the previous kernel: like every plan array it is copied
// from the host ahead of the step's first kernel, never written by a kernel.
// After the wide cascade kernel (k.after_wide), the items run without waiting for it: they read
// Q and the KV cache, written by the kernels before it (complete once it let this kernel launch:
// it does so after its own wait), and write partials and rows of their own, none of which it
// reads or writes; so they overlap its long fold runs on the SMs those leave idle. The wait comes
// last, so the merge (which waits for this kernel) also finds the wide kernel's partials.
template <class RunItem>
__device__ __forceinline__ void ForEachSplitItem(const TileKernelArgs& k, RunItem run) {
  const int count = k.item_count != nullptr ? *k.item_count : static_cast<int>(gridDim.x);
  if (k.after_wide) {
    LetDependentsLaunch();
  } else {
    WaitForPriorGrids();
  }
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) __syncthreads();  // the last item's readers are done
    run(item);
  }
  if (k.after_wide) WaitForPriorGrid();
}

// grid: (CTAs, num_kv_heads); items as ForEachSplitItem.
template <int D, bool kFinish, bool kSuper = false>
__global__ void __launch_bounds__(kRegThreads) SplitRegKernel(TileKernelArgs k) {
  ForEachSplitItem(k, [&](int item) { SplitRegItem<D, kFinish, kSuper>(k, item); });
}

// grid: (CTAs, num_kv_heads); items as ForEachSplitItem.
// 4 CTAs per SM (64 registers, shared memory for 4) where head_dim <= 128; head_dim 256's shared
// memory allows 2.
template <int E, bool kPrefetch, bool kSuper = false>
__global__ void __launch_bounds__(kThreads, E == 8 ? 2 : 4) SplitKernel(TileKernelArgs k) {
  ForEachSplitItem(k, [&](int item) { SplitItem<E, kPrefetch, kSuper>(k, item); });
}

// E consecutive floats at p (16-byte aligned where E % 4 == 0, 8-byte where E == 2).
template <int E>
__device__ __forceinline__ void LoadDims(const float* p, float (&v)[E]) {
  if constexpr (E % 4 == 0) {
#pragma unroll
    for (int i = 0; i < E; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(p + i);
      v[i] = x.x;
      v[i + 1] = x.y;
      v[i + 2] = x.z;
      v[i + 3] = x.w;
    }
  } else if constexpr (E == 2) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    v[0] = x.x;
    v[1] = x.y;
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] = p[i];
  }
}

// One warp per (split row, query head); lane: the head's E consecutive dims: the Fold of the row's
// partials in tile order (a fold item's state stands for the tiles it folded). Every element's
// fold is the same sequence of operations whoever holds it, so the bits do not depend on the
// layout. One warp per head computes each partial's fold weights once for all its dims (with a
// warp per 32 dims, E warps computed them: the merge was instruction bound) and loads each partial
// as one 16-byte piece a lane. Loads run two batches ahead of the (strictly sequential) folds:
// batch b + 1 is loaded while batch b is folded.
template <int E>
__global__ void __launch_bounds__(kThreads)
    MergeKernel(AttentionArgs a, const int32_t* merge_list, int num_merge) {
  constexpr int D = E * 32;
  constexpr int kBatch = E >= 8 ? 4 : 8;
  const int hq = a.num_q_heads;
  const int gw = blockIdx.x * kWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int entry = gw / hq, qh = gw % hq;
  // The merge list is read before the wait for the previous kernel (the split kernel): it is
  // copied from the host ahead of the step's first kernel, never written by a kernel.
  int row = 0, base = 0, tiles = 0;
  if (entry < num_merge) {
    row = merge_list[entry * 3];
    base = merge_list[entry * 3 + 1];
    tiles = merge_list[entry * 3 + 2];
  }
  WaitForPriorGrids();
  if (tiles == 0) return;  // past the list, or finished by its fold item (kFoldFinish)
  float o[E], m = -INFINITY, l = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.f;
  struct Batch {
    float o[kBatch][E], m[kBatch], l[kBatch];
  };
  auto load = [&](Batch& b, int t0) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t slot = static_cast<int64_t>(base + t0 + i) * hq + qh;
      if (t0 + i < tiles) {
        const float2 ml = *reinterpret_cast<const float2*>(a.partial_ml + 2 * slot);
        b.m[i] = ml.x;
        b.l[i] = ml.y;
        LoadDims<E>(a.partial_o + slot * D + lane * E, b.o[i]);
      } else {
        b.m[i] = -INFINITY;
      }
    }
  };
  auto fold = [&](const Batch& b) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (b.m[i] == -INFINITY) continue;
      if (m == -INFINITY) {  // the first state is taken as is (a fold item's state: exactly)
        m = b.m[i];
        l = b.l[i];
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] = b.o[i][e];
        continue;
      }
      const FoldWeights w = Fold(m, b.m[i]);
      l = FoldElem(l, w, b.l[i]);
#pragma unroll
      for (int e = 0; e < E; ++e) o[e] = FoldElem(o[e], w, b.o[i][e]);
      m = w.m;
    }
  };
  Batch b0, b1;
  load(b0, 0);
  for (int t0 = 0; t0 < tiles; t0 += 2 * kBatch) {
    if (t0 + kBatch < tiles) load(b1, t0 + kBatch);
    fold(b0);
    if (t0 + kBatch >= tiles) break;
    if (t0 + 2 * kBatch < tiles) load(b0, t0 + 2 * kBatch);
    fold(b1);
  }
  const float inv = __frcp_rn(l);
  __nv_bfloat16* out = OutRow(a, row, qh, D) + lane * E;
  if constexpr (E == 1) {
    out[0] = OutElem(o[0], inv);
  } else {
#pragma unroll
    for (int e = 0; e < E; e += 2) StoreOutPair(out + e, o[e], o[e + 1], inv);
  }
}

size_t SplitSmemBytes(int d) {
  return (2 * kT + kMaxQ) * (d + 8) * sizeof(__nv_bfloat16) + kMaxQ * LDP * sizeof(__nv_bfloat16) +
         kMaxQ * LDS * sizeof(float) + 2 * kMaxQ * sizeof(float);
}

int g_wgmma_variant = 0;
int WgmmaVariant() { return g_wgmma_variant; }
int g_prefill_form = 0;  // the default form (variant 0): 0 or 1 (TunePrefillForm)
int g_split_variant = 0;
bool g_split_overlap_wide = true;
bool g_dw_n8 = false;  // measured no faster as a drop-in (bench/kernels/NOTES.md, session 32)
// DecodeWsKernel's half-stage ring (16-token pieces, one-level order, the 64-row consumers):
// SetDecodeWsHalfRing.
bool g_dw_half = true;
bool g_dw_half_cascade = false;  // ... on cascade steps too: SetDecodeWsHalfRingOnCascade

// A tensor map over one layer's K or V cache as rows of 128 bf16 ([num_blocks * kv heads *
// block_size, 128]), boxes of `piece` rows x 64 columns (one column half of a piece), 128-byte
// swizzle. cuTensorMapEncodeTiled comes through the runtime's driver entry point (no -lcuda).
cudaError_t EncodeKvMap(const void* base, int64_t rows, int piece, CUtensorMap* map) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kWgD), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {kWgRowBytes};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(piece)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Blocks of 64 tokens copy a whole tile per TMA box (4 copies per tile instead of 16).
int KvPiece(const KvCacheView& cache) { return cache.block_size % kT == 0 ? kT : kPieceTokens; }
// The tensor maps of one layer's K and V caches in pieces of `piece` rows (EncodeKvMap).
cudaError_t EncodeKvMaps(const KvCacheView& cache, int piece, CUtensorMap* tk, CUtensorMap* tv) {
  const int64_t rows = cache.num_blocks * cache.num_kv_heads * cache.block_size;
  const cudaError_t err = EncodeKvMap(cache.k, rows, piece, tk);
  return err == cudaSuccess ? EncodeKvMap(cache.v, rows, piece, tv) : err;
}

int g_decode_ws_ctas = 0;
int g_prefill_ws_ctas = 0;

// The current device's SM count (the persistent kernels' grids).
cudaError_t SmCount(int* sms) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  return err == cudaSuccess ? cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device)
                            : err;
}

// The PrefillWsKernel instance for a launch: the ping-pong schedule (prefill variant 1, 16-token
// pieces) or not, TMA pieces of a whole tile (piece == kT) or of 16 tokens, the fold order
// (super), and kSplit: wide cascade items (never ping-pong).
template <bool kSplit>
auto PrefillWsKernelFor(bool pingpong, int piece, bool super) {
  using Kernel = decltype(&PrefillWsKernel<false, kWsStages, kT, false, kSplit>);
  if constexpr (!kSplit) {
    if (pingpong) {
      return super ? Kernel(PrefillWsKernel<true, kWsStages, kPieceTokens, true>)
                   : Kernel(PrefillWsKernel<true, kWsStages, kPieceTokens>);
    }
  }
  if (super) {
    return piece == kT ? Kernel(PrefillWsKernel<false, kWsStages, kT, true, kSplit>)
                       : Kernel(PrefillWsKernel<false, kWsStages, kPieceTokens, true, kSplit>);
  }
  return piece == kT ? Kernel(PrefillWsKernel<false, kWsStages, kT, false, kSplit>)
                     : Kernel(PrefillWsKernel<false, kWsStages, kPieceTokens, false, kSplit>);
}

// A PrefillWsKernel instance over `items` items (x kv heads) of k.items, its K/V tensor maps in
// pieces of `piece` tokens: at most one CTA per SM (or SetPrefillWsCtas's count), none without a
// work; with a schedule (k.wide_sched) its `ctas` CTAs.
template <class Kernel>
cudaError_t LaunchPersistentWs(Kernel kernel, const TileKernelArgs& k, int items, int piece,
                               cudaStream_t stream, int ctas = 0) {
  CUtensorMap tk, tv;
  cudaError_t err = EncodeKvMaps(k.a.cache, piece, &tk, &tv);
  if (err != cudaSuccess) return err;
  const size_t smem = WsSmemBytes(kWsStages);
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  int sms = g_prefill_ws_ctas;
  if (sms <= 0) {
    err = SmCount(&sms);
    if (err != cudaSuccess) return err;
  }
  const int64_t works = static_cast<int64_t>(items) * k.a.cache.num_kv_heads;
  const int grid = ctas > 0 ? ctas : static_cast<int>(std::min<int64_t>(sms, works));
  return LaunchKernel(kernel, dim3(grid), kWsThreads, smem, stream, k, items, tk, tv);
}

// Split form 3 on DecodeWsKernel: one CTA per SM (or SetDecodeWsCtas's count), at most one per two
// work items. *launched: false where the device has no sm_90a code or the blocks no 16-token
// pieces (the shared-memory form runs the same items then). REQUIRES: plan.ws_work (Attention
// checks it).
cudaError_t LaunchDecodeWs(const TileKernelArgs& k, const AttentionPlanView& plan, int items,
                           cudaStream_t stream, bool* launched) {
  const KvCacheView& cache = k.a.cache;
  *launched = false;
  bool wgmma = false;
  cudaError_t err = WgmmaAvailable(&wgmma);
  if (err != cudaSuccess || !wgmma || cache.block_size % kPieceTokens != 0) return err;
  int sms = 0;
  err = SmCount(&sms);
  if (err != cudaSuccess) return err;
  const int piece = KvPiece(cache);
  CUtensorMap tk, tv;
  err = EncodeKvMaps(cache, piece, &tk, &tv);
  if (err != cudaSuccess) return err;
  auto kernel = piece == kT ? DecodeWsKernel<kT> : DecodeWsKernel<kPieceTokens>;
  if (k.super_tiles > 1) {
    kernel = piece == kT ? DecodeWsKernel<kT, true> : DecodeWsKernel<kPieceTokens, true>;
  } else if (piece != kT && g_dw_half && !g_dw_n8 && (plan.num_wide == 0 || g_dw_half_cascade)) {
    // Plain decode steps only: there the half ring made the engine's steps 2-5% shorter; a
    // cascade step's own tiles (after the wide kernel) keep whole stages, whose tree and shared
    // prefix rows ran 1-5% faster alone, the engine's cascade steps not measured on both
    // (bench/kernels/NOTES.md session 53).
    kernel = DecodeWsKernel<kPieceTokens, false, true>;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDwSmemBytes);
  if (err != cudaSuccess) return err;
  // items: the split items after any wide ones, or with split_count the form-0 grid (which bounds
  // them).
  const int64_t works = static_cast<int64_t>(items) * cache.num_kv_heads;
  const int ctas = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(g_decode_ws_ctas > 0 ? g_decode_ws_ctas : sms, (works + 1) / 2)));
  *launched = true;
  TileKernelArgs kd = k;
  kd.dw_n8 = g_dw_n8 ? 1 : 0;
  return LaunchKernel(kernel, dim3(ctas), kWsThreads, kDwSmemBytes, stream, kd, items, plan.ws_work,
                      tk, tv);
}

template <int E>
cudaError_t LaunchForDim(const AttentionArgs& args, const AttentionPlanView& plan,
                         cudaStream_t stream) {
  constexpr int D = E * 32;
  const int G = args.num_q_heads / args.cache.num_kv_heads;
  // The split kernel's queries fill at most two m16 MMA tiles (the planner puts <= kMaxQ
  // (row, head) pairs in one item); a prefill item holds <= PrefillQueriesPerCta(D).
  if (G > kMaxQ || plan.max_final_rows * G > PrefillQueriesPerCta(D)) return cudaErrorInvalidValue;
  // The two-level order runs at head_dim 128 only (ops.cc checks it with a message).
  const bool super = plan.super_tiles > 1;
  if (super && D != 128) return cudaErrorInvalidValue;
  TileKernelArgs k{args,    nullptr,         plan.item_rows, plan.partial_base, args.scale * kLog2e,
                   nullptr, plan.super_tiles};
  if (plan.num_final > 0) {
    k.items = plan.final_items;
    bool wgmma = false;
    if (D == kWgD && args.prefill_path != PrefillPath::kMmaSync) {
      const cudaError_t err = WgmmaAvailable(&wgmma);
      if (err != cudaSuccess) return err;
    }
    if (args.prefill_path == PrefillPath::kWgmma && !wgmma) return cudaErrorNotSupported;
    const int v = WgmmaVariant();
    if (wgmma && v != 2 && args.cache.block_size % kPieceTokens == 0) {
      // The ping-pong schedule (variant 1, or the default form 1) copies 16-token pieces.
      const bool pingpong = v == 1 || (v == 0 && g_prefill_form == 1);
      const int piece = pingpong ? kPieceTokens : KvPiece(args.cache);
      const cudaError_t err = LaunchPersistentWs(PrefillWsKernelFor<false>(pingpong, piece, super),
                                                 k, plan.num_final, piece, stream);
      if (err != cudaSuccess) return err;
    } else {
      // The two-warpgroup kernel (v7) keeps the one-level order: with super-tiles only the
      // warp-specialized kernel and mma.sync run prefill.
      if (super && wgmma) return cudaErrorNotSupported;
      auto kernel = wgmma ? PrefillWgmmaKernel : PrefillKernel<D>;
      if constexpr (D == 128) {
        if (super) kernel = PrefillKernel<D, true>;
      }
      const size_t smem = wgmma ? kWgSmemBytes : PrefillSmemBytes<D>();
      cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      err = LaunchKernel(kernel, FinalGrid(plan.num_final, args.cache),
                         wgmma ? 256 : PrefillWarps<D>() * 32, smem, stream, k);
      if (err != cudaSuccess) return err;
    }
  }
  // Wide cascade items (the plan's first num_wide split items): the persistent wgmma kernel with
  // 128 q-rows a CTA writes their partials (ops.cc checked that it runs here).
  if (plan.num_wide > 0) {
    if constexpr (D == kWgD) {
      const bool graph = plan.split_count != nullptr;
      if (graph ? plan.wide_items == nullptr || plan.wide_count == nullptr
                : plan.num_wide > plan.num_split) {
        return cudaErrorInvalidValue;
      }
      k.items = graph ? plan.wide_items : plan.split_items;
      k.item_count = graph ? plan.wide_count : nullptr;
      // The planner's schedule: its CTAs, each its range of works. Without one, graph mode runs a
      // CTA per SM (the count is read on the device; CTAs without a work end).
      const bool sched = plan.wide_sched != nullptr;
      if (sched && plan.wide_ctas < 1) return cudaErrorInvalidValue;
      k.wide_sched = plan.wide_sched;
      int bound = plan.num_wide;
      cudaError_t err = graph && !sched ? SmCount(&bound) : cudaSuccess;
      if (err != cudaSuccess) return err;
      const int piece = KvPiece(args.cache);
      err = LaunchPersistentWs(PrefillWsKernelFor<true>(false, piece, super), k, bound, piece,
                               stream, sched ? plan.wide_ctas : 0);
      if (err != cudaSuccess) return err;
    } else {
      return cudaErrorInvalidValue;
    }
  }
  // The split kernel: eager, the items after the wide ones; graph mode, split_items holds only
  // those (a fixed grid of num_split CTAs loops over *split_count of them).
  const int num_split =
      plan.split_count != nullptr ? plan.num_split : plan.num_split - plan.num_wide;
  if (num_split > 0) {
    k.items = plan.split_count != nullptr
                  ? plan.split_items
                  : plan.split_items + static_cast<int64_t>(plan.num_wide) * kItemFields;
    k.item_count = plan.split_count;
    // Right after the wide kernel (launched above): overlap it (ForEachSplitItem).
    k.after_wide = plan.num_wide > 0 && g_split_overlap_wide ? 1 : 0;
    // The plan's form (variant 0; the register form only for head_dim <= 128), or the one a
    // benchmark variant forces (SetSplitVariant).
    auto launch = [&](auto kernel, size_t smem, int threads) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
      return LaunchKernel(kernel, dim3(num_split, args.cache.num_kv_heads), threads, smem, stream,
                          k);
    };
    cudaError_t err = cudaSuccess;
    bool launched = false;
    // With super-tiles a form-3 plan's rows fold several super-tiles: only the persistent kernel
    // runs them (a benchmark's forced form would write partials past the rows' slots).
    if (super && plan.split_form == 3 && g_split_variant != 0) return cudaErrorNotSupported;
    if constexpr (D == kWgD) {
      if (g_split_variant == 0 && AttentionPlanView::OnPersistentDecode(plan.split_form)) {
        err = LaunchDecodeWs(k, plan, num_split, stream, &launched);
      }
      if (err != cudaSuccess) return err;
    }
    if constexpr (D <= 128) {
      if (!launched && (g_split_variant == 3 || (g_split_variant == 0 && plan.split_form == 1))) {
        auto kernel = g_split_variant == 3 ? SplitRegKernel<D, true> : SplitRegKernel<D, false>;
        if constexpr (D == 128) {
          if (super) {
            kernel = g_split_variant == 3 ? SplitRegKernel<D, true, true>
                                          : SplitRegKernel<D, false, true>;
          }
        }
        err = launch(kernel, SplitRegSmemBytes<D>(), kRegThreads);
        launched = true;
      }
    }
    if (!launched) {
      auto kernel = g_split_variant == 1 ? SplitKernel<E, true> : SplitKernel<E, false>;
      if constexpr (D == 128) {
        if (super) {
          kernel = g_split_variant == 1 ? SplitKernel<E, true, true> : SplitKernel<E, false, true>;
        }
      }
      err = launch(kernel, SplitSmemBytes(D), kThreads);
    }
    if (err != cudaSuccess) return err;
  }
  // Forms 2 and 3: every split row was finished by its item (kFoldFinish): nothing to merge.
  if (plan.num_merge > 0 && AttentionPlanView::Merges(plan.split_form)) {
    const int warps = plan.num_merge * args.num_q_heads;
    return LaunchKernel(MergeKernel<E>, (warps + kWarps - 1) / kWarps, kThreads, 0, stream, args,
                        plan.merge_list, plan.num_merge);
  }
  return cudaSuccess;
}

}  // namespace

void SetWgmmaPrefillVariant(int variant) { g_wgmma_variant = variant; }
int PrefillForm() { return g_prefill_form; }
void SetPrefillForm(int form) { g_prefill_form = form == 1 ? 1 : 0; }
void SetSplitVariant(int variant) { g_split_variant = variant; }
void SetSplitOverlapsWide(bool on) { g_split_overlap_wide = on; }
void SetDecodeWsN8(bool on) { g_dw_n8 = on; }
void SetDecodeWsHalfRing(bool on) { g_dw_half = on; }
void SetDecodeWsHalfRingOnCascade(bool on) { g_dw_half_cascade = on; }
void SetDecodeWsCtas(int ctas) { g_decode_ws_ctas = ctas; }
void SetPrefillWsCtas(int ctas) { g_prefill_ws_ctas = ctas; }
namespace {
// The timeline of the persistent prefill kernel (decode: false) or the persistent decode kernel.
cudaError_t SetTrace(bool decode, uint64_t* trace, int works) {
#if defined(CASCADE_WS_TRACE)
  const TraceBuf buf{trace, works};
  return decode ? cudaMemcpyToSymbol(g_dw_trace, &buf, sizeof(buf))
                : cudaMemcpyToSymbol(g_ws_trace, &buf, sizeof(buf));
#else
  (void)decode;
  (void)trace;
  (void)works;
  return cudaErrorNotSupported;
#endif
}
}  // namespace
cudaError_t SetWsTrace(uint64_t* trace, int works) { return SetTrace(false, trace, works); }
cudaError_t SetDwTrace(uint64_t* trace, int works) { return SetTrace(true, trace, works); }

// Compute capability 9.0 (H100, H200) runs this library's sm_90a machine code; newer GPUs run the
// compute_90 PTX, which has no wgmma.
cudaError_t WgmmaAvailable(bool* available) {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  *available = err == cudaSuccess && major == 9 && minor == 0;
  return err;
}

cudaError_t SplitCtasPerWave(int head_dim, int num_kv_heads, int split_form, int* ctas) {
  auto per_sm = [&](auto kernel, size_t smem, int threads) {
    int blocks = 0, device = 0, sms = 0;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
    if (err == cudaSuccess) err = cudaGetDevice(&device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    *ctas = std::max(1, blocks * sms / std::max(1, num_kv_heads));
    return err;
  };
  switch (head_dim) {
    case 32:
      return split_form == 1
                 ? per_sm(SplitRegKernel<32, false>, SplitRegSmemBytes<32>(), kRegThreads)
                 : per_sm(SplitKernel<1, false>, SplitSmemBytes(32), kThreads);
    case 64:
      return split_form == 1
                 ? per_sm(SplitRegKernel<64, false>, SplitRegSmemBytes<64>(), kRegThreads)
                 : per_sm(SplitKernel<2, false>, SplitSmemBytes(64), kThreads);
    case 128:
      return split_form == 1
                 ? per_sm(SplitRegKernel<128, false>, SplitRegSmemBytes<128>(), kRegThreads)
                 : per_sm(SplitKernel<4, false>, SplitSmemBytes(128), kThreads);
    case 256:
      return per_sm(SplitKernel<8, false>, SplitSmemBytes(256), kThreads);
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
