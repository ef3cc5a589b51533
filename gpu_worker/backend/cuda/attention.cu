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
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  ms = __fmul_rn(m, scale_log2);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float e = Ex2(__fmaf_rn(x[i], scale_log2, -ms));
    x[i] = !kMask || Key(i, t4) < lim ? e : 0.f;
  }
  float s[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = __fadd_rn(x[2 * i], x[2 * i + 1]);
#pragma unroll
  for (int w = 1; w < 8; w <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; i += 2 * w) s[i] = __fadd_rn(s[i], s[i + w]);
  }
  l = s[0];
  l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
  l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
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
};

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
// Prefill (final items): one CTA per (item, kv head) folds every tile of its rows in registers.
// Rows of the item x the kv head's G query heads give up to PrefillQueriesPerCta query rows
// (q-row qi is item row qi / G, head kvh * G + qi % G); warp w owns MT m16 tiles, q-rows
// [16 MT w, 16 MT (w + 1)), and lane (g, t4) the rows 16 (MT w + mt) + g (+ 8) of the m16n8k16
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
// fragments in registers when kQRegs (MT == 1).
template <int D, int MT, bool kMask, bool kQRegs>
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
      float ms, lt;
      RowSoftmax<kMask>(x, pos[mt][h] + 1 - ts, t4, scale_log2, ms, lt);
#pragma unroll
      for (int n = 0; n < kT / 8; ++n) {
        s[mt][n][2 * h] = x[2 * n];
        s[mt][n][2 * h + 1] = x[2 * n + 1];
      }
      valid[mt][h] = !kMask || ms != -INFINITY;
      w[mt][h] = Fold(m[mt][h], ms);
      if (valid[mt][h]) {
        l[mt][h] = FoldElem(l[mt][h], w[mt][h], lt);
        m[mt][h] = w[mt][h].m;
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

template <int D>
__global__ void __launch_bounds__(PrefillWarps<D>() * 32, 1) PrefillKernel(TileKernelArgs k) {
  WaitForPriorGrids();
  constexpr int MT = PrefillMT<D>(), NW = PrefillWarps<D>(), kThr = NW * 32;
  constexpr int kRows = PrefillQueriesPerCta(D), LD = D + 8, C = D / 8;
  constexpr bool kQRegs = MT == 1 && D <= 128;  // Q fragments in registers (else ldmatrix)
  extern __shared__ __align__(16) unsigned char smem[];
  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv;
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows, LD]
  __nv_bfloat16* KVs = Qs + kRows * LD;                        // stage s: K, V [kT, LD] each

  const int32_t* it = k.items + static_cast<int64_t>(blockIdx.x) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int kvh = blockIdx.y;
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
    if (ts <= wmax) {  // warp-uniform: some row of the warp sees a key of the tile
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

// ---------------------------------------------------------------------------------------------
// Prefill on Hopper tensor cores (wgmma, sm_90a; head_dim 128): the same items, rows and
// arithmetic as PrefillKernel, one CTA of two warpgroups per (item, kv head). Warpgroup wg owns
// q-rows [64 wg, 64 wg + 64) (warp w of it rows 16 w .. 16 w + 15, the mma.sync layout), so every
// per-row step below is PrefillTile's: S = Q K^T as 8 wgmma k16 steps from +0 (k over D
// ascending), RowSoftmax in the same lanes and key order, P rounded to bf16 as the register A
// operand of O_t = P V (4 k16 steps over the tile's keys, from +0), and the same Fold. wgmma's
// k16 step gives the bits of mma.sync m16n8k16's (WgmmaMatchesMmaSyncBitwise in
// cuda_attention_test), so this kernel, PrefillKernel and the split kernel agree bit for bit.
// Q and the K/V tiles sit in shared memory in the 128-byte swizzled layout of wgmma.cuh, K/V
// streamed through three stages with cp.async (paged blocks of 16 tokens rule out one bulk
// tensor copy per tile).
constexpr int kWgD = 128;
constexpr int kWgRows = 128;  // q-rows per CTA (== PrefillQueriesPerCta(128))
constexpr int kWgStages = 3;
constexpr int kWgRowBytes = kWgD * 2;
constexpr int kWgTileBytes = kT * kWgRowBytes;  // one K or V tile
constexpr size_t kWgSmemBytes =
    1024 + static_cast<size_t>(kWgRows) * kWgRowBytes + 2 * kWgStages * kWgTileBytes;
static_assert(PrefillQueriesPerCta(kWgD) == kWgRows, "wgmma prefill rows");

// The warpgroup helpers of the wgmma kernels (their bodies are compiled for sm_90a only).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S = Q K^T for one warpgroup (accumulators from +0, k over D ascending). dq, dk: descriptors of
// the warpgroup's Q rows and of the K tile; a k16 step or column half moves a descriptor's start
// address field by (byte offset) / 16 (offsets stay inside shared memory's 14-bit field).
// kQRows: the Q buffer's rows a column half (its second half starts kQRows * 128 bytes on).
template <int kQRows = kWgRows>
__device__ __forceinline__ void IssueQk(float (&sc)[32], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kc = 0; kc < kWgD / 16; ++kc) {
    const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
    Wgmma64x64SS(sc, dq + ((half * kQRows * 128 + kb) >> 4), dk + ((half * kT * 128 + kb) >> 4));
  }
}
// O_t = P V for one warpgroup (from +0, k over the tile's keys ascending); dv: the V tile's
// descriptor as an MN-major operand.
__device__ __forceinline__ void IssuePv(float (&ot)[64], const uint32_t (&pa)[kT / 16][4],
                                        uint64_t dv) {
#pragma unroll
  for (int kk = 0; kk < kT / 16; ++kk) Wgmma64x128RS(ot, pa[kk], dv + ((kk * 2048) >> 4));
}
template <int N>
__device__ __forceinline__ void Zero(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = 0.f;
}

// Tile softmax of a warpgroup's 64 x 64 scores (the wgmma accumulator layout: rows g and g + 8
// of each warp): RowSoftmax per row and the running (m, l) update, P rounded to bf16 into pa (the
// register A operand of P V), and the weights (w, valid) that fold the tile's O_t (WgFold).
template <bool kMask>
__device__ __forceinline__ void WgSoftmax(float (&sc)[32], const int (&pos)[2], int ts, int t4,
                                          float scale_log2, float (&m)[2], float (&l)[2],
                                          FoldWeights (&w)[2], bool (&valid)[2],
                                          uint32_t (&pa)[kT / 16][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x[16];
#pragma unroll
    for (int n = 0; n < kT / 8; ++n) {
      x[2 * n] = sc[4 * n + 2 * h];
      x[2 * n + 1] = sc[4 * n + 2 * h + 1];
    }
    float ms, lt;
    RowSoftmax<kMask>(x, pos[h] + 1 - ts, t4, scale_log2, ms, lt);
#pragma unroll
    for (int n = 0; n < kT / 8; ++n) {
      sc[4 * n + 2 * h] = x[2 * n];
      sc[4 * n + 2 * h + 1] = x[2 * n + 1];
    }
    valid[h] = !kMask || ms != -INFINITY;
    w[h] = Fold(m[h], ms);
    if (valid[h]) {
      l[h] = FoldElem(l[h], w[h], lt);
      m[h] = w[h].m;
    }
  }
#pragma unroll
  for (int kk = 0; kk < kT / 16; ++kk) {
    pa[kk][0] = PackBf16(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = PackBf16(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = PackBf16(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = PackBf16(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}
// Folds a tile's O_t into o with WgSoftmax's weights; kCheck: the tile was masked, so a row may
// have seen none of its keys (skipped: a bitwise no-op).
template <bool kCheck>
__device__ __forceinline__ void WgFold(float (&o)[64], const float (&ot)[64],
                                       const FoldWeights (&w)[2], const bool (&valid)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    if (!kCheck || valid[h]) o[i] = FoldElem(o[i], w[h], ot[i]);
  }
}
// Copies the item's Q rows (q-row qi: item row qi / G, head kvh * G + qi % G) into the swizzled
// Q tile; rows past nq are zeros. Threads t = first, first + stride, ... share the copies.
__device__ __forceinline__ void WgLoadQ(const TileKernelArgs& k, unsigned char* Qs, int row_begin,
                                        int nq, int kvh, int first, int stride) {
  constexpr int C = kWgD / 8;
  for (int i = first; i < kWgRows * C; i += stride) {
    const int qi = i / C, c = i % C;
    const __nv_bfloat16* src = QChunk<kWgD>(k, row_begin, nq, kvh, qi, c);
    CpAsync16Z(Qs + SwizzleOffset(kWgRows, qi, c),
               src ? src : reinterpret_cast<const __nv_bfloat16*>(k.a.q), src ? 16 : 0);
  }
}
// Positions of this lane's two rows of the warp's 16 q-rows from qi0 (-1 past nq), and the
// warp's lowest and highest position (INT_MAX / -1 when it has no row).
__device__ __forceinline__ void WgRowPositions(const TileKernelArgs& k, int row_begin, int nq,
                                               int qi0, int lane, int (&pos)[2], int& wmin,
                                               int& wmax) {
  const int G = k.a.num_q_heads / k.a.cache.num_kv_heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = qi0 + (lane >> 2) + 8 * h;
    pos[h] = qi < nq ? k.a.positions[k.item_rows[row_begin + qi / G]] : -1;
  }
  wmin = pos[0] < 0 ? INT_MAX : pos[0];
  wmax = max(pos[0], pos[1]);
  if (pos[1] >= 0) wmin = min(wmin, pos[1]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, off));
    wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
  }
}
// Writes this lane's rows of a warp's 16 q-rows (from q-row qi0) as bf16 o / l; row_of(qi): the
// token row of q-row qi.
template <class RowOf>
__device__ __forceinline__ void WgStoreRowsBy(const AttentionArgs& a, int nq, int kvh, int qi0,
                                              int lane, const float (&o)[64], const float (&l)[2],
                                              RowOf row_of) {
  const int G = a.num_q_heads / a.cache.num_kv_heads;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = qi0 + (lane >> 2) + 8 * h;
    if (qi >= nq) continue;
    const int row = row_of(qi);
    const float inv = __frcp_rn(l[h]);
    __nv_bfloat16* dst =
        out + static_cast<int64_t>(row) * a.num_q_heads * kWgD + (kvh * G + qi % G) * kWgD;
#pragma unroll
    for (int n = 0; n < kWgD / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + 8 * n + 2 * (lane & 3)) =
          PackBf16(__fmul_rn(o[4 * n + 2 * h], inv), __fmul_rn(o[4 * n + 2 * h + 1], inv));
    }
  }
}
// The item's rows (q-row qi: item row qi / G).
__device__ __forceinline__ void WgStoreRows(const TileKernelArgs& k, int row_begin, int nq, int kvh,
                                            int qi0, int lane, const float (&o)[64],
                                            const float (&l)[2]) {
  const int G = k.a.num_q_heads / k.a.cache.num_kv_heads;
  WgStoreRowsBy(k.a, nq, kvh, qi0, lane, o, l,
                [&](int qi) { return k.item_rows[row_begin + qi / G]; });
}

// One 64-key tile for one warpgroup (see PrefillTile for the arithmetic).
template <bool kMask>
__device__ __forceinline__ void PrefillTileWg(uint32_t q_smem, uint32_t k_smem, uint32_t v_smem,
                                              int ts, const int (&pos)[2], float scale_log2,
                                              float (&m)[2], float (&l)[2], float (&o)[64],
                                              int lane) {
  float s[32];
  Zero(s);
  FenceRegs(s);
  WgmmaFence();
  IssueQk(s, WgmmaDesc(q_smem, 16, 1024), WgmmaDesc(k_smem, 16, 1024));
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(s);
  FoldWeights w[2];
  bool valid[2];
  uint32_t pa[kT / 16][4];
  WgSoftmax<kMask>(s, pos, ts, lane & 3, scale_log2, m, l, w, valid, pa);
  float ot[64];
  Zero(ot);
  FenceRegs(ot);
  WgmmaFence();
  IssuePv(ot, pa, WgmmaDesc(v_smem, kT * 128, 1024));
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegs(ot);
  WgFold<kMask>(o, ot, w, valid);
}

#endif  // sm_90a

__global__ void __launch_bounds__(256, 1) PrefillWgmmaKernel(TileKernelArgs k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WaitForPriorGrids();
  constexpr int D = kWgD, kThr = 256, C = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);  // 1024-byte aligned atoms
  unsigned char* Qs = smem;                                          // [kWgRows] rows, swizzled
  unsigned char* KVs = Qs + kWgRows * kWgRowBytes;  // stage s: K at 2 s, V at 2 s + 1 (tiles)
  const uint32_t qs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(Qs));
  const uint32_t kv_addr = static_cast<uint32_t>(__cvta_generic_to_shared(KVs));
  __shared__ int wg_pos[2][2];  // per warpgroup: lowest, highest row position

  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv;
  const int32_t* it = k.items + static_cast<int64_t>(blockIdx.x) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int kvh = blockIdx.y;
  const int nq = row_count * G;  // <= kWgRows
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  if (tid < 4) wg_pos[tid >> 1][tid & 1] = (tid & 1) ? -1 : INT_MAX;
  WgLoadQ(k, Qs, row_begin, nq, kvh, tid, kThr);
  // K/V tile loads: thread tid copies chunk tid % C of keys tid / C + 16 r, r < 4.
  constexpr int kRowsPerPass = kThr / C, kR = kT / kRowsPerPass;
  const int cchunk = tid % C, j0 = tid / C;
  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k) + cchunk * 8;
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v) + cchunk * 8;
  int ids[kR];
  auto load_ids = [&](int t) {
    TileKeyRows<kR, kRowsPerPass>(a, table_offset, kv_len, kvh, t, j0, ids);
  };
  auto issue_tile = [&](int stage) {
    unsigned char* Kd = KVs + 2 * stage * kWgTileBytes;
    unsigned char* Vd = Kd + kWgTileBytes;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int off = SwizzleOffset(kT, j0 + r * kRowsPerPass, cchunk);
      const int64_t src = ids[r] < 0 ? 0 : static_cast<int64_t>(ids[r]) * D;
      const int bytes = ids[r] < 0 ? 0 : 16;
      CpAsync16Z(Kd + off, kc + src, bytes);
      CpAsync16Z(Vd + off, vc + src, bytes);
    }
  };

  int pos[2], wmin, wmax;
  WgRowPositions(k, row_begin, nq, warp * 16, lane, pos, wmin, wmax);
  __syncthreads();  // wg_pos initialized
  if (lane == 0) {
    atomicMin(&wg_pos[wg][0], wmin);
    atomicMax(&wg_pos[wg][1], wmax);
  }

  float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  const uint32_t q_wg = qs_addr + wg * 64 * 128;  // 64 rows = 8 atoms of 1024 bytes

  // Three stages, one barrier per tile: after the barrier that publishes tile t every warpgroup
  // is done with tile t - 1 (its wgmma waited), so tile t + 2 may be copied into that stage.
  load_ids(tile_begin);
  issue_tile(0);
  CpAsyncCommit();  // with Q
  if (tile_begin + 1 < tile_end) {
    load_ids(tile_begin + 1);
    issue_tile(1);
  }
  CpAsyncCommit();
  if (tile_begin + 2 < tile_end) load_ids(tile_begin + 2);
  int lo = INT_MAX, hi = -1;
  for (int t = tile_begin; t < tile_end; ++t) {
    const int i = t - tile_begin;
    CpAsyncWait<1>();
    FenceProxyAsync();  // cp.async writes, read next by wgmma (the async proxy)
    __syncthreads();
    if (i == 0) {
      lo = wg_pos[wg][0];
      hi = wg_pos[wg][1];
    }
    if (t + 2 < tile_end) {
      issue_tile((i + 2) % kWgStages);
      if (t + 3 < tile_end) load_ids(t + 3);
    }
    CpAsyncCommit();
    const int ts = t * kT;
    const uint32_t ks = kv_addr + 2 * ((i % kWgStages) * kWgTileBytes);
    const uint32_t vs = ks + kWgTileBytes;
    if (ts <= hi) {  // warpgroup-uniform: some row of the warpgroup sees a key of the tile
      if (ts + kT - 1 <= lo) {
        PrefillTileWg<false>(q_wg, ks, vs, ts, pos, k.scale_log2, m, l, o, lane);
      } else {
        PrefillTileWg<true>(q_wg, ks, vs, ts, pos, k.scale_log2, m, l, o, lane);
      }
    }
  }
  CpAsyncWait<0>();
  WgStoreRows(k, row_begin, nq, kvh, warp * 16, lane, o, l);
#else
  __trap();  // launched only on devices with sm_90a machine code (PrefillWgmmaAvailable)
#endif
}

// The warp-specialized form (v8): warpgroup 0 loads (its warp 0; the other three only give their
// registers back), warpgroups 1 and 2 compute (q-rows as above). K/V pieces of kPiece tokens (16:
// a paged block of 16 or part of one of 32; 64: a whole tile of a 64-token block) come by bulk
// tensor copy (TMA, 128-byte swizzle: the layout of wgmma.cuh) into kStages stages, each with a
// `full` mbarrier (the copies' bytes) and an `empty` one (one arrival per consumer warp when its
// wgmma reads of the stage are done). The load warp runs WsLoadTiles, each consumer warpgroup
// WsFoldTiles (below).
constexpr int kWsStages = 4;  // 6 measured no faster (H100, bench/kernels/NOTES.md)
constexpr int kWsThreads = 384;
constexpr size_t WsSmemBytes(int stages) {
  return 1024 + static_cast<size_t>(kWgRows) * kWgRowBytes + 2 * stages * kWgTileBytes;
}
constexpr int kPieceTokens =
    16;  // the copy unit for blocks of 16 or 32 tokens; 64 for blocks of 64

struct WsBarriers {
  uint64_t full[kWsStages];
  uint64_t empty[kWsStages];
};

template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The K/V stage ring of a warp-specialized kernel. The n-th tile through it (n counts every tile
// the ring has carried, across items) sits in stage n % kStages (K, then V: 2 * kWgTileBytes a
// stage from kv0); it has landed when the stage's `full` barrier completes phase
// (n / kStages) & 1, and the stage is free again when its `empty` barrier completes that phase.
struct WsRing {
  uint32_t full0;     // shared address of full[0] (barriers 8 bytes apart)
  uint32_t empty0;    // shared address of empty[0]
  uint32_t kv0;       // shared address of stage 0
  unsigned char* kv;  // the same, generic (the load warp's lane copies)
};

// The load warp's part: tiles [tile_begin, tile_begin + ntiles) of an item (kv head kvh) into the
// ring as its tiles n0, n0 + 1, ... Lane p copies piece p of a tile (p < the tile's TMA pieces;
// four boxes: K and V, two column halves), so the pieces' copies are issued side by side (one
// lane per box measured slower); its piece's cache row is read one tile ahead, so that a freed
// stage is refilled without waiting on a global load. Rows at or past kv_len's last kPiece-token
// boundary (only in an item's last tile) are copied by the lanes, zeros past kv_len, as
// PrefillKernel has them.
// The cache row (of the [blocks * kv heads * block_size, 128] tensor maps) where lane `lane`'s TMA
// piece of the item's tile i starts; 0 where the lane copies no piece of it.
template <int kPiece>
__device__ __forceinline__ int WsPieceRow(const AttentionArgs& a, int table_offset, int tile_begin,
                                          int ntiles, int kv_len, int kvh, int lane, int i) {
  const int hkv = a.cache.num_kv_heads, bs = a.cache.block_size;
  const int ts = (tile_begin + i) * kT;
  const int npf = max(0, min(kT / kPiece, (kv_len - ts) / kPiece));
  if (i >= ntiles || lane >= npf) return 0;
  const int tok = ts + lane * kPiece;
  return (a.block_ids[table_offset + tok / bs] * hkv + kvh) * bs + tok % bs;
}

// first_row: this lane's WsPieceRow of tile 0 (found by the caller, maybe ahead of time).
// kAsyncTail: the lanes copy the last tile's rows by cp.async, all in flight before one wait
// (the persistent decode kernel, where every item's last tile is usually partial: copied a load
// and a store at a time they took ~1 us per 2 keys); else by plain loads and stores (prefill,
// once per item; its load warp has 24 registers, which the cp.async form would spill).
template <int kStages, int kPiece, bool kAsyncTail>
__device__ __forceinline__ void WsLoadTiles(const AttentionArgs& a, const CUtensorMap* tk,
                                            const CUtensorMap* tv, const WsRing& ring, int n0,
                                            int table_offset, int tile_begin, int ntiles,
                                            int kv_len, int kvh, int lane, int first_row) {
  constexpr int D = kWgD, C = D / 8;
  const KvCacheView& cache = a.cache;
  const int hkv = cache.num_kv_heads, bs = cache.block_size;
  const __nv_bfloat16* kg = reinterpret_cast<const __nv_bfloat16*>(cache.k);
  const __nv_bfloat16* vg = reinterpret_cast<const __nv_bfloat16*>(cache.v);
  auto piece_row = [&](int i) {
    return WsPieceRow<kPiece>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, i);
  };
  int next_row = first_row;
  for (int i = 0; i < ntiles; ++i) {
    const int n = n0 + i, s = n % kStages, ts = (tile_begin + i) * kT;
    const int prow = next_row;
    next_row = piece_row(i + 1);
    if (n >= kStages) MbarWait(ring.empty0 + 8 * s, ((n / kStages) - 1) & 1);
    const uint32_t ks = ring.kv0 + 2 * s * kWgTileBytes, vs = ks + kWgTileBytes;
    const uint32_t full = ring.full0 + 8 * s;
    const int npf = max(0, min(kT / kPiece, (kv_len - ts) / kPiece));  // TMA pieces
    if (npf < kT / kPiece) {  // the item's last tile: rows from kPiece * npf copied by lanes
      unsigned char* Kd = ring.kv + 2 * s * kWgTileBytes;
      unsigned char* Vd = Kd + kWgTileBytes;
      const int j0 = npf * kPiece;
      for (int idx = lane; idx < (kT - j0) * C; idx += 32) {
        const int j = j0 + idx / C, c = idx % C, tok = ts + j;
        if (kAsyncTail) {  // cp.async, zero-filled past kv_len
          int64_t row = 0;
          if (tok < kv_len) {
            row = (static_cast<int64_t>(a.block_ids[table_offset + tok / bs]) * hkv + kvh) * bs +
                  tok % bs;
          }
          const int bytes = tok < kv_len ? 16 : 0;
          CpAsync16Z(Kd + SwizzleOffset(kT, j, c), kg + row * D + c * 8, bytes);
          CpAsync16Z(Vd + SwizzleOffset(kT, j, c), vg + row * D + c * 8, bytes);
          continue;
        }
        uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
        if (tok < kv_len) {
          const int64_t row =
              (static_cast<int64_t>(a.block_ids[table_offset + tok / bs]) * hkv + kvh) * bs +
              tok % bs;
          kx = *reinterpret_cast<const uint4*>(kg + row * D + c * 8);
          vx = *reinterpret_cast<const uint4*>(vg + row * D + c * 8);
        }
        *reinterpret_cast<uint4*>(Kd + SwizzleOffset(kT, j, c)) = kx;
        *reinterpret_cast<uint4*>(Vd + SwizzleOffset(kT, j, c)) = vx;
      }
      if (kAsyncTail) {
        CpAsyncCommit();
        CpAsyncWait<0>();
      }
      FenceProxyAsync();  // these shared-memory writes are read by wgmma (the async proxy)
      __syncwarp();
    }
    if (lane == 0) MbarArriveExpectTx(full, npf * (2 * 2 * kPiece * 128));
    __syncwarp();
    if (lane < npf) {
      const uint32_t off = lane * kPiece * 128;
      TmaLoad2d(ks + off, tk, 0, prow, full);
      TmaLoad2d(ks + kT * 128 + off, tk, 64, prow, full);
      TmaLoad2d(vs + off, tv, 0, prow, full);
      TmaLoad2d(vs + kT * 128 + off, tv, 64, prow, full);
    }
  }
}

// A consumer warpgroup's part: the item's tiles, its ring tiles n0, n0 + 1, ..., folded into
// (o, l) from the empty state. Q: the warpgroup's q-rows at shared address q_addr, kQRows rows a
// column half, 8-row groups q_sbo bytes apart; lo / hi: the warpgroup's lowest and highest row
// position (INT_MAX / -1 without rows); pos: this lane's two rows' positions (-1: none). A tile
// the warpgroup needs is one of a prefix of the item's tiles (positions grow with rows); per
// such tile it issues S_t = Q K_t^T together with the previous tile's O_{t-1} = P_{t-1} V_{t-1},
// then folds O_{t-1} and runs tile t's softmax: the fold order and every operation are
// PrefillTile's, only the schedule differs. Each stage read goes back to the load warp (one
// arrival per warp). kPingPong: the two warpgroups (wg 0 and 1) take turns issuing their MMAs
// (named barriers 2 and 3), so one's softmax overlaps the other's tensor-core work.
template <bool kPingPong, int kStages, int kQRows>
__device__ __forceinline__ void WsFoldTiles(const WsRing& ring, int n0, uint32_t q_addr,
                                            uint32_t q_sbo, int tile_begin, int ntiles, int lo,
                                            int hi, const int (&pos)[2], int wg, int lane,
                                            float scale_log2, float (&o)[64], float (&l)[2]) {
  const int t4 = lane & 3;
  // Tiles this warpgroup reads: a prefix of the item's (ts <= hi).
  const int nact = hi < 0 ? 0 : min(ntiles, max(0, (hi / kT) - tile_begin + 1));
  float m[2] = {-INFINITY, -INFINITY};
  l[0] = l[1] = 0.f;
  Zero(o);
  uint32_t pa[kT / 16][4];
  FoldWeights wp[2];
  bool vp[2] = {false, false};
  const uint64_t dq = WgmmaDesc(q_addr, 16, q_sbo);
  auto issue_qk = [&](float(&sc)[32], uint64_t dk) { IssueQk<kQRows>(sc, dq, dk); };
  auto stage = [&](int i) { return (n0 + i) % kStages; };
  auto wait_full = [&](int i) { MbarWait(ring.full0 + 8 * stage(i), ((n0 + i) / kStages) & 1); };
  auto desc_k = [&](int i) { return WgmmaDesc(ring.kv0 + 2 * stage(i) * kWgTileBytes, 16, 1024); };
  auto desc_v = [&](int i) {
    return WgmmaDesc(ring.kv0 + (2 * stage(i) + 1) * kWgTileBytes, kT * 128, 1024);
  };
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) MbarArrive(ring.empty0 + 8 * stage(i));
  };
  // Ping-pong turns: one per tile for each warpgroup, warpgroup 0 first; the last arrival of
  // warpgroup 1 would have no turn to open, so it is left out.
  auto turn_begin = [&]() {
    if (kPingPong) NamedBarSync(2 + wg, 256);
  };
  auto turn_end = [&](int i) {
    if (kPingPong && !(wg == 1 && i == ntiles - 1)) NamedBarArrive(2 + (1 - wg), 256);
  };
  // Tile i's softmax (P into pa, fold weights into wp / vp); mask_tag: std::true_type when some
  // key of the tile is past some row's position (the diagonal, the sequence's last tile).
  auto softmax = [&](auto mask_tag, float(&sc)[32], int i) {
    WgSoftmax<decltype(mask_tag)::value>(sc, pos, (tile_begin + i) * kT, t4, scale_log2, m, l, wp,
                                         vp, pa);
  };
  auto fold = [&](auto check_tag, const float(&ot)[64]) {
    WgFold<decltype(check_tag)::value>(o, ot, wp, vp);
  };
  using Masked = std::true_type;
  using Unmasked = std::false_type;
  // Tiles [0, nfull) are fully visible to every row of the warpgroup (ts + 63 <= lo).
  const int nfull = min(nact, max(0, (lo + 1) / kT - tile_begin));

  if (kPingPong && wg == 1) NamedBarArrive(2, 256);  // warpgroup 0 issues first
  if (nact > 0) {                                    // tile 0: S only
    wait_full(0);
    float sc[32];
    Zero(sc);
    FenceRegs(sc);
    turn_begin();
    WgmmaFence();
    issue_qk(sc, desc_k(0));
    WgmmaCommit();
    turn_end(0);
    WgmmaWait<0>();
    FenceRegs(sc);
    if (nfull > 0) {
      softmax(Unmasked{}, sc, 0);
    } else {
      softmax(Masked{}, sc, 0);
    }
  }
  // Tile i: S_i issued with P_{i-1} V_{i-1}; then the fold of tile i - 1 and the softmax of
  // tile i (one basic block, so the fold's independent FMAs fill the softmax's latencies),
  // then tile i - 1's stage goes back to the load warp.
  auto step = [&](auto prev_tag, auto cur_tag, int i) {
    wait_full(i);
    float sc[32], ot[64];
    Zero(sc);
    Zero(ot);
    FenceRegs(sc);
    FenceRegs(ot);
    turn_begin();
    WgmmaFence();
    issue_qk(sc, desc_k(i));
    IssuePv(ot, pa, desc_v(i - 1));
    WgmmaCommit();
    turn_end(i);
    WgmmaWait<0>();
    FenceRegs(sc);
    FenceRegs(ot);
    fold(prev_tag, ot);
    softmax(cur_tag, sc, i);
    release(i - 1);
  };
  int i = 1;
  for (; i < nfull; ++i) step(Unmasked{}, Unmasked{}, i);
  if (i < nact && i == nfull) step(Unmasked{}, Masked{}, i++);
  for (; i < nact; ++i) step(Masked{}, Masked{}, i);
  if (nact > 0) {  // P.V of the last tile read
    float ot[64];
    Zero(ot);
    FenceRegs(ot);
    WgmmaFence();
    IssuePv(ot, pa, desc_v(nact - 1));
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(ot);
    if (nact > nfull) {
      fold(Masked{}, ot);
    } else {
      fold(Unmasked{}, ot);
    }
    release(nact - 1);
  }
  for (int j = nact; j < ntiles; ++j) {  // tiles past this warpgroup's rows
    wait_full(j);
    turn_begin();
    turn_end(j);
    release(j);
  }
}

// The warp-specialized prefill form (v8, described above): one CTA per (item, kv head).
template <bool kPingPong, int kStages, int kPiece>
__global__ void __launch_bounds__(kWsThreads, 1)
    PrefillWsKernel(const TileKernelArgs k, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WaitForPriorGrids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ WsBarriers bars;
  __shared__ int wg_pos[2][2];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  unsigned char* Qs = smem;
  unsigned char* KVs = Qs + kWgRows * kWgRowBytes;  // stage s: K tile, then V tile
  const uint32_t qs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(Qs));
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars.full[0]));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars.empty[0]));
  const WsRing ring{full0, empty0, static_cast<uint32_t>(__cvta_generic_to_shared(KVs)), KVs};

  const AttentionArgs& a = k.a;
  const int G = a.num_q_heads / a.cache.num_kv_heads;
  const int32_t* it = k.items + static_cast<int64_t>(blockIdx.x) * kItemFields;
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
  const int kvh = blockIdx.y;
  const int nq = row_count * G;
  const int ntiles = tile_end - tile_begin;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full0 + 8 * s, 1);
      MbarInit(empty0 + 8 * s, 8);
    }
    MbarInitFence();
  }
  if (tid < 4) wg_pos[tid >> 1][tid & 1] = (tid & 1) ? -1 : INT_MAX;
  __syncthreads();

  if (warp < 4) {  // ------------------------------------------------------------------- loads
    SetMaxRegsDec<24>();
    if (warp != 0) return;
    WsLoadTiles<kStages, kPiece, false>(
        a, &tk, &tv, ring, 0, table_offset, tile_begin, ntiles, kv_len, kvh, lane,
        WsPieceRow<kPiece>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, 0));
  } else {  // --------------------------------------------------------------------- consumers
    SetMaxRegsInc<240>();
    const int cw = warp - 4, wg = cw >> 2;
    WgLoadQ(k, Qs, row_begin, nq, kvh, tid - 128, 256);
    CpAsyncCommit();
    int pos[2], wmin, wmax;
    WgRowPositions(k, row_begin, nq, cw * 16, lane, pos, wmin, wmax);
    if (lane == 0) {
      atomicMin(&wg_pos[wg][0], wmin);
      atomicMax(&wg_pos[wg][1], wmax);
    }
    CpAsyncWait<0>();
    FenceProxyAsync();
    NamedBarSync(1, 256);  // Q and wg_pos ready for both consumer warpgroups
    float o[64], l[2];
    WsFoldTiles<kPingPong, kStages, kWgRows>(ring, 0, qs_addr + wg * 64 * 128, 1024, tile_begin,
                                             ntiles, wg_pos[wg][0], wg_pos[wg][1], pos, wg, lane,
                                             k.scale_log2, o, l);
    WgStoreRows(k, row_begin, nq, kvh, cw * 16, lane, o, l);
  }
#else
  __trap();  // launched only on devices with sm_90a machine code (WgmmaAvailable)
#endif
}

// Decode rows on Hopper (sm_90a, head_dim 128): split form 3 (SplitForm), plans whose split
// items are all whole decode rows of at most kDwQRows q-rows (one row each, group <= 8,
// kFoldFinish from tile 0). The shared-memory split form copies each tile and then waits for it,
// so it reads at 83-96% of the copy bandwidth at contexts of 1k-4k (bench/kernels/RESULTS.md).
// Here a fixed grid (one CTA per SM) runs the items (x kv heads) persistently: each CTA's two
// consumer warpgroups take work items in turn, each fed by two warps of its own: an item warp
// that puts the next items' Q rows (into one of two 8-row swizzled buffers), positions, output
// rows, fields and first-tile cache rows into shared memory up to two items ahead, and a load
// warp whose ring of kDwStages K/V stages runs on into the next item while the consumer
// computes the current one. Per item the consumer runs PrefillWsKernel's tile loop
// (WsFoldTiles) from the empty state and writes the outputs: a row's bits are the prefill
// kernel's, which are the split kernel's (cuda_attention_test: PrefillKernelsAgreeBitwise,
// CachedPrefillEqualsColdPrefillBitwise, PersistentDecodeFormEqualsSplitFormsBitwise). Q is read
// with an 8-row-group stride of 0, so the warpgroup's 64 MMA rows repeat the buffer's 8; rows
// past nq have position -1 (every key masked) and are never stored.
constexpr int kDwStages = 3;
constexpr int kDwQRows = 8;
constexpr int kDwQBytes = kDwQRows * kWgRowBytes;
constexpr size_t kDwSmemBytes = 1024 + 2 * (2 * kDwQBytes + 2 * kDwStages * kWgTileBytes);

// An item as its item warp leaves it in shared memory for the load warp and the consumer.
struct DwItem {
  int table_offset, tile_begin, ntiles, kv_len, nq;
  int pos[kDwQRows];       // q-row positions, -1 past nq
  int row[kDwQRows];       // q-row qi's token row (output row)
  int first_row[kT / 16];  // lane p's WsPieceRow of tile 0
};
struct DwShared {
  uint64_t full[2][kDwStages];
  uint64_t empty[2][kDwStages];
  uint64_t item_full[2][2];   // consumer c's item buffer b filled (its item warp, one arrival)
  uint64_t item_empty[2][2];  // ... and done with (its consumer's four warps)
  DwItem item[2][2];
};

template <int kPiece>
__global__ void __launch_bounds__(kWsThreads, 1)
    DecodeWsKernel(const TileKernelArgs k, int items, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kT / kPiece <= kT / 16, "first_row holds a tile's pieces");
  // The count is read before the wait for the previous kernel (as in ForEachSplitItem).
  const int count = k.item_count != nullptr ? *k.item_count : items;
  WaitForPriorGrids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ DwShared sh;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // Consumer c's Q buffer b at (2 c + b) * kDwQBytes; its stages after the four Q buffers.
  auto q_offset = [](int c, int b) { return (2 * c + b) * kDwQBytes; };
  auto bar = [](uint64_t& b) { return static_cast<uint32_t>(__cvta_generic_to_shared(&b)); };
  auto ring_of = [&](int c) {
    const int off = 4 * kDwQBytes + c * 2 * kDwStages * kWgTileBytes;
    return WsRing{bar(sh.full[c][0]), bar(sh.empty[c][0]), smem_addr + off, smem + off};
  };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int c = 0; c < 2; ++c) {
      for (int s = 0; s < kDwStages; ++s) {
        MbarInit(bar(sh.full[c][s]), 1);
        MbarInit(bar(sh.empty[c][s]), 4);
      }
      for (int b = 0; b < 2; ++b) {
        MbarInit(bar(sh.item_full[c][b]), 1);
        MbarInit(bar(sh.item_empty[c][b]), 4);
      }
    }
    MbarInitFence();
  }
  // Q buffers start as zeros: rows past an item's q-rows are multiplied, never stored.
  for (int i = tid; i < 4 * kDwQBytes / 16; i += kWsThreads) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsync();
  __syncthreads();

  const AttentionArgs& a = k.a;
  const int hkv = a.cache.num_kv_heads, G = a.num_q_heads / hkv;
  const int works = count * hkv;  // (item, kv head) pairs, kv head fastest
  // Consumer c (and its two warps) take works 2 * blockIdx.x + c, + 2 * gridDim.x, ...
  // walk_items: consumer c's works in order, each once its item warp has filled item buffer b:
  // fn(item, work w, ring position n of its first tile, b, its tiles). The item buffer may be
  // refilled once the consumer has released it (item_empty): its tiles are read before fn.
  auto walk_items = [&](int c, auto fn) {
    int n = 0, j = 0;
    for (int w = 2 * blockIdx.x + c; w < works; w += 2 * gridDim.x, ++j) {
      const int b = j & 1;
      MbarWait(bar(sh.item_full[c][b]), (j >> 1) & 1);
      const DwItem& d = sh.item[c][b];
      const int ntiles = d.ntiles;
      fn(d, w, n, b, ntiles);
      n += ntiles;
    }
  };
  if (warp < 4) {  // --------------------------------------------------- item and load warps
    // 56 / 224 registers (ptxas: fewer for these warps, which walk items too, spill them; 4 bytes
    // spilled at 224 for the consumers); 56 * 128 + 224 * 256 <= 64K.
    SetMaxRegsDec<56>();
    const int c = warp & 1;
    if (warp >= 2) {  // item warp of consumer c
      int j = 0;
      for (int w = 2 * blockIdx.x + c; w < works; w += 2 * gridDim.x, ++j) {
        const int b = j & 1, item = w / hkv, kvh = w % hkv;
        const int32_t* it = k.items + static_cast<int64_t>(item) * kItemFields;
        const int table_offset = it[0], tile_begin = it[1], ntiles = it[2] - it[1];
        const int row_begin = it[3], nq = it[4] * G, kv_len = it[5];
        if (j >= 2) MbarWait(bar(sh.item_empty[c][b]), ((j >> 1) - 1) & 1);
        DwItem& d = sh.item[c][b];
        unsigned char* qbuf = smem + q_offset(c, b);
        for (int idx = lane; idx < nq * (kWgD / 8); idx += 32) {
          const int qi = idx / (kWgD / 8), cc = idx % (kWgD / 8);
          CpAsync16Z(qbuf + SwizzleOffset(kDwQRows, qi, cc),
                     QChunk<kWgD>(k, row_begin, nq, kvh, qi, cc), 16);
        }
        CpAsyncCommit();
        if (lane < kDwQRows) {
          const int row = lane < nq ? k.item_rows[row_begin + lane / G] : 0;
          d.row[lane] = row;
          d.pos[lane] = lane < nq ? a.positions[row] : -1;
        }
        if (lane < kT / 16) {
          d.first_row[lane] =
              WsPieceRow<kPiece>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, 0);
        }
        if (lane == 0) {
          d.table_offset = table_offset;
          d.tile_begin = tile_begin;
          d.ntiles = ntiles;
          d.kv_len = kv_len;
          d.nq = nq;
        }
        CpAsyncWait<0>();
        FenceProxyAsync();  // the Q rows are read by wgmma (the async proxy)
        __syncwarp();
        if (lane == 0) MbarArrive(bar(sh.item_full[c][b]));
      }
    } else {  // load warp of consumer c
      const WsRing ring = ring_of(c);
      walk_items(c, [&](const DwItem& d, int w, int n, int, int ntiles) {
        WsLoadTiles<kDwStages, kPiece, true>(a, &tk, &tv, ring, n, d.table_offset, d.tile_begin,
                                             ntiles, d.kv_len, w % hkv, lane,
                                             lane < kT / 16 ? d.first_row[lane] : 0);
      });
    }
  } else {  // --------------------------------------------------------------------- consumers
    SetMaxRegsInc<224>();
    const int c = (warp - 4) >> 2, cw = (warp - 4) & 3;
    const WsRing ring = ring_of(c);
    walk_items(c, [&](const DwItem& d, int w, int n, int b, int ntiles) {
      const int tile_begin = d.tile_begin, nq = d.nq;
      int pos[2], lo = INT_MAX, hi = -1;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qi = cw * 16 + (lane >> 2) + 8 * h;
        pos[h] = qi < kDwQRows ? d.pos[qi] : -1;
      }
      for (int r = 0; r < nq; ++r) {
        lo = min(lo, d.pos[r]);
        hi = max(hi, d.pos[r]);
      }
      float o[64], l[2];
      WsFoldTiles<false, kDwStages, kDwQRows>(ring, n, smem_addr + q_offset(c, b), 0, tile_begin,
                                              ntiles, lo, hi, pos, c, lane, k.scale_log2, o, l);
      int rows[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qi = cw * 16 + (lane >> 2) + 8 * h;
        rows[h] = qi < kDwQRows ? d.row[qi] : 0;
      }
      // Every S of the item has completed (WsFoldTiles waited on each) and its fields are read:
      // the item buffer may refill.
      __syncwarp();
      if (lane == 0) MbarArrive(bar(sh.item_empty[c][b]));
      WgStoreRowsBy(a, nq, w % hkv, cw * 16, lane, o, l,
                    [&](int qi) { return rows[(qi >> 3) & 1]; });
    });
  }
#else
  __trap();  // launched only on devices with sm_90a machine code (SplitForm 3 plans,
             // WgmmaAvailable)
#endif
}

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
template <int E, bool kPrefetch>
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

    // O_t = P V: job p = (m tile p / (D/16), n tiles 2 (p % (D/16)) and + 1), k over the tile's
    // keys in order.
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
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
    if (!fold) {
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
  if (fold) {  // the state after the item's last tile, as that tile's partial (or the output)
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
              static_cast<int64_t>(k.partial_base[row] + t) * hq + kvh * G + qi % G;
          *reinterpret_cast<float2*>(a.partial_o + slot * D + dim) =
              make_float2(run_o[j][hf][2 * h], run_o[j][hf][2 * h + 1]);
        }
      }
    }
    if (!finish && t4 == 0 && qs < nq) {
      const int row = k.item_rows[row_begin + qs / G];
      const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + kvh * G + qs % G;
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
template <int D, bool kFinish>
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
  // The state (m, l, o) of this lane's rows as the partial of tile t.
  auto write = [&](int t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qi = warp * 16 + g + 8 * h;
      if (qi >= nq) continue;
      const int row = k.item_rows[row_begin + qi / G];
      const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + kvh * G + qi % G;
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
    if (!fold && i > 0) reset();
    const int ts = t * kT;
    const __nv_bfloat16* Ks = KVs + (i % kStages) * 2 * kT * LD;
    const __nv_bfloat16* Vs = Ks + kT * LD;
    if (ts <= wmax) {  // warp-uniform: some row of the warp sees a key of the tile
      if (ts + kT - 1 <= wmin) {
        PrefillTile<D, 1, false, true>(nullptr, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o, lane);
      } else {
        PrefillTile<D, 1, true, true>(nullptr, Ks, Vs, qf, ts, pos, k.scale_log2, m, l, o, lane);
      }
    }
    if (!fold) write(t);
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
  } else if (fold) {
    write(tile_end - 1);  // the state after the item's last tile
  }
}

// The split items of this CTA: blockIdx.x, blockIdx.x + gridDim.x, ... below the item count:
// gridDim.x itself (one item per CTA), or, for a launch inside a CUDA graph, a count read on the
// device, so the same fixed grid serves every step. An item's arithmetic does not depend on which
// CTA runs it.
// The count is read before the wait for the previous kernel: like every plan array it is copied
// from the host ahead of the step's first kernel, never written by a kernel.
template <class RunItem>
__device__ __forceinline__ void ForEachSplitItem(const TileKernelArgs& k, RunItem run) {
  const int count = k.item_count != nullptr ? *k.item_count : static_cast<int>(gridDim.x);
  WaitForPriorGrids();
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) __syncthreads();  // the last item's readers are done
    run(item);
  }
}

// grid: (CTAs, num_kv_heads); items as ForEachSplitItem.
template <int D, bool kFinish>
__global__ void __launch_bounds__(kRegThreads) SplitRegKernel(TileKernelArgs k) {
  ForEachSplitItem(k, [&](int item) { SplitRegItem<D, kFinish>(k, item); });
}

// grid: (CTAs, num_kv_heads); items as ForEachSplitItem.
// 4 CTAs per SM (64 registers, shared memory for 4) where head_dim <= 128; head_dim 256's shared
// memory allows 2.
template <int E, bool kPrefetch>
__global__ void __launch_bounds__(kThreads, E == 8 ? 2 : 4) SplitKernel(TileKernelArgs k) {
  ForEachSplitItem(k, [&](int item) { SplitItem<E, kPrefetch>(k, item); });
}

// One warp per (split row, query head, 32 of the head's dims; lane: one dim): the Fold of the
// row's partials in tile order (a fold item's state stands for the tiles it folded). Every
// element's fold is the same sequence of operations whichever warp holds it; slicing the head
// puts E times the warps (and loads) in flight as one warp per head would.
template <int E>
__global__ void __launch_bounds__(kThreads)
    MergeKernel(AttentionArgs a, const int32_t* merge_list, int num_merge) {
  constexpr int D = E * 32;
  const int hq = a.num_q_heads;
  const int gw = blockIdx.x * kWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int entry = gw / (hq * E), qh = gw / E % hq, dim = gw % E * 32 + lane;
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
  float o = 0.f, m = -INFINITY, l = 0.f;
  // Loads run kBatch tiles ahead of the (strictly sequential) folds.
  constexpr int kBatch = 16;
  for (int t0 = 0; t0 < tiles; t0 += kBatch) {
    float ob[kBatch], mb[kBatch], lb[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t slot = static_cast<int64_t>(base + t0 + i) * hq + qh;
      const bool in = t0 + i < tiles;
      mb[i] = in ? a.partial_ml[2 * slot] : -INFINITY;
      lb[i] = in ? a.partial_ml[2 * slot + 1] : 0.f;
      ob[i] = in ? a.partial_o[slot * D + dim] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (mb[i] == -INFINITY) continue;
      if (m == -INFINITY) {  // the first state is taken as is (a fold item's state: exactly)
        m = mb[i];
        l = lb[i];
        o = ob[i];
        continue;
      }
      const FoldWeights w = Fold(m, mb[i]);
      l = FoldElem(l, w, lb[i]);
      o = FoldElem(o, w, ob[i]);
      m = w.m;
    }
  }
  OutRow(a, row, qh, D)[dim] = OutElem(o, __frcp_rn(l));
}

size_t SplitSmemBytes(int d) {
  return (2 * kT + kMaxQ) * (d + 8) * sizeof(__nv_bfloat16) + kMaxQ * LDP * sizeof(__nv_bfloat16) +
         kMaxQ * LDS * sizeof(float) + 2 * kMaxQ * sizeof(float);
}

int g_wgmma_variant = 0;
int WgmmaVariant() { return g_wgmma_variant; }
int g_split_variant = 0;

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

// Split form 3 on DecodeWsKernel: one CTA per SM (or SetDecodeWsCtas's count), at most one per two
// work items. *launched: false where the device has no sm_90a code or the blocks no 16-token
// pieces (the shared-memory form runs the same items then).
cudaError_t LaunchDecodeWs(const TileKernelArgs& k, const AttentionPlanView& plan,
                           cudaStream_t stream, bool* launched) {
  const KvCacheView& cache = k.a.cache;
  *launched = false;
  bool wgmma = false;
  cudaError_t err = WgmmaAvailable(&wgmma);
  if (err != cudaSuccess || !wgmma || cache.block_size % kPieceTokens != 0) return err;
  int device = 0, sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int piece = KvPiece(cache);
  CUtensorMap tk, tv;
  err = EncodeKvMaps(cache, piece, &tk, &tv);
  if (err != cudaSuccess) return err;
  auto kernel = piece == kT ? DecodeWsKernel<kT> : DecodeWsKernel<kPieceTokens>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDwSmemBytes);
  if (err != cudaSuccess) return err;
  // plan.num_split: the items, or with split_count the form-0 grid (which bounds them).
  const int64_t works = static_cast<int64_t>(plan.num_split) * cache.num_kv_heads;
  const int ctas = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(g_decode_ws_ctas > 0 ? g_decode_ws_ctas : sms, (works + 1) / 2)));
  *launched = true;
  return LaunchKernel(kernel, dim3(ctas), kWsThreads, kDwSmemBytes, stream, k, plan.num_split, tk,
                      tv);
}

template <int E>
cudaError_t LaunchForDim(const AttentionArgs& args, const AttentionPlanView& plan,
                         cudaStream_t stream) {
  constexpr int D = E * 32;
  const int G = args.num_q_heads / args.cache.num_kv_heads;
  // The split kernel's queries fill at most two m16 MMA tiles (the planner puts <= kMaxQ
  // (row, head) pairs in one item); a prefill item holds <= PrefillQueriesPerCta(D).
  if (G > kMaxQ || plan.max_final_rows * G > PrefillQueriesPerCta(D)) return cudaErrorInvalidValue;
  TileKernelArgs k{args, nullptr, plan.item_rows, plan.partial_base, args.scale * kLog2e, nullptr};
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
      CUtensorMap tk, tv;
      const int piece = v == 0 ? KvPiece(args.cache) : kPieceTokens;
      cudaError_t err = EncodeKvMaps(args.cache, piece, &tk, &tv);
      if (err != cudaSuccess) return err;
      // Variant 1: the ping-pong schedule (measured slower on an H100, kept for comparison).
      auto kernel = v == 1        ? PrefillWsKernel<true, kWsStages, kPieceTokens>
                    : piece == kT ? PrefillWsKernel<false, kWsStages, kT>
                                  : PrefillWsKernel<false, kWsStages, kPieceTokens>;
      const size_t smem = WsSmemBytes(kWsStages);
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      err = LaunchKernel(kernel, dim3(plan.num_final, args.cache.num_kv_heads), kWsThreads, smem,
                         stream, k, tk, tv);
      if (err != cudaSuccess) return err;
    } else {
      auto kernel = wgmma ? PrefillWgmmaKernel : PrefillKernel<D>;
      const size_t smem = wgmma ? kWgSmemBytes : PrefillSmemBytes<D>();
      cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      err = LaunchKernel(kernel, dim3(plan.num_final, args.cache.num_kv_heads),
                         wgmma ? 256 : PrefillWarps<D>() * 32, smem, stream, k);
      if (err != cudaSuccess) return err;
    }
  }
  if (plan.num_split > 0) {
    k.items = plan.split_items;
    k.item_count = plan.split_count;
    // The plan's form (variant 0; the register form only for head_dim <= 128), or the one a
    // benchmark variant forces (SetSplitVariant).
    auto launch = [&](auto kernel, size_t smem, int threads) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
      return LaunchKernel(kernel, dim3(plan.num_split, args.cache.num_kv_heads), threads, smem,
                          stream, k);
    };
    cudaError_t err = cudaSuccess;
    bool launched = false;
    if constexpr (D == kWgD) {
      if (g_split_variant == 0 && plan.split_form == 3) {
        err = LaunchDecodeWs(k, plan, stream, &launched);
      }
      if (err != cudaSuccess) return err;
    }
    if constexpr (D <= 128) {
      if (!launched && (g_split_variant == 3 || (g_split_variant == 0 && plan.split_form == 1))) {
        err = launch(g_split_variant == 3 ? SplitRegKernel<D, true> : SplitRegKernel<D, false>,
                     SplitRegSmemBytes<D>(), kRegThreads);
        launched = true;
      }
    }
    if (!launched) {
      err = launch(g_split_variant == 1 ? SplitKernel<E, true> : SplitKernel<E, false>,
                   SplitSmemBytes(D), kThreads);
    }
    if (err != cudaSuccess) return err;
  }
  // Forms 2 and 3: every split row was finished by its item (kFoldFinish): nothing to merge.
  if (plan.num_merge > 0 && plan.split_form < 2) {
    const int warps = plan.num_merge * args.num_q_heads * E;
    return LaunchKernel(MergeKernel<E>, (warps + kWarps - 1) / kWarps, kThreads, 0, stream, args,
                        plan.merge_list, plan.num_merge);
  }
  return cudaSuccess;
}

}  // namespace

void SetWgmmaPrefillVariant(int variant) { g_wgmma_variant = variant; }
void SetSplitVariant(int variant) { g_split_variant = variant; }
void SetDecodeWsCtas(int ctas) { g_decode_ws_ctas = ctas; }

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
