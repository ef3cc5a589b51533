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
// whose block table starts at table_offset; -1 for keys past kv_len.
template <int R, int kStep>
__device__ __forceinline__ void TileKeyRows(const AttentionArgs& a, int table_offset, int kv_len,
                                            int kvh, int t, int j0, int (&ids)[R]) {
  const int hkv = a.cache.num_kv_heads, bs = a.cache.block_size;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int tok = t * kT + j0 + r * kStep;
    ids[r] = -1;
    if (tok < kv_len) ids[r] = (a.block_ids[table_offset + tok / bs] * hkv + kvh) * bs + tok % bs;
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
  // K/V tile loads: thread tid copies the 16-byte chunk tid % C of rows j = tid / C + r *
  // kRowsPerPass (r < kR). The block ids of the next tile are loaded one tile ahead, so that
  // issuing a tile's copies never waits on a global load.
  constexpr int kRowsPerPass = kThr / C, kR = kT / kRowsPerPass;
  static_assert(kThr % C == 0 && kT % kRowsPerPass == 0, "tile load shape");
  const int cchunk = tid % C, j0 = tid / C;
  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k) + cchunk * 8;
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v) + cchunk * 8;
  int ids[kR];  // cache row (of D elements) of each row's key, -1: past kv_len
  auto load_ids = [&](int t) {
    TileKeyRows<kR, kRowsPerPass>(a, table_offset, kv_len, kvh, t, j0, ids);
  };
  auto issue_tile = [&](int stage) {
    __nv_bfloat16* Kd = KVs + stage * 2 * kT * LD + j0 * LD + cchunk * 8;
    __nv_bfloat16* Vd = Kd + kT * LD;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      // Keys past kv_len are zeros (P is 0 there, and 0 * garbage could be NaN).
      const int64_t src = ids[r] < 0 ? 0 : static_cast<int64_t>(ids[r]) * D;
      const int bytes = ids[r] < 0 ? 0 : 16;
      CpAsync16Z(Kd + r * kRowsPerPass * LD, kc + src, bytes);
      CpAsync16Z(Vd + r * kRowsPerPass * LD, vc + src, bytes);
    }
  };

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
__device__ __forceinline__ void IssueQk(float (&sc)[32], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kc = 0; kc < kWgD / 16; ++kc) {
    const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
    Wgmma64x64SS(sc, dq + ((half * kWgRows * 128 + kb) >> 4), dk + ((half * kT * 128 + kb) >> 4));
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
// Writes this lane's rows of a warp's 16 q-rows (from q-row qi0) as bf16 o / l.
__device__ __forceinline__ void WgStoreRows(const TileKernelArgs& k, int row_begin, int nq, int kvh,
                                            int qi0, int lane, const float (&o)[64],
                                            const float (&l)[2]) {
  const AttentionArgs& a = k.a;
  const int G = a.num_q_heads / a.cache.num_kv_heads;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = qi0 + (lane >> 2) + 8 * h;
    if (qi >= nq) continue;
    const int row = k.item_rows[row_begin + qi / G];
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
// wgmma reads of the stage are done). Rows at or past kv_len's last 16-token boundary (only in an
// item's last tile) are copied by the load warp's lanes, zeros past kv_len, as PrefillKernel has
// them. A tile a warpgroup needs is one of a prefix of the item's tiles (positions grow with rows);
// per such tile it issues S_t = Q K_t^T together with the previous tile's O_{t-1} = P_{t-1}
// V_{t-1}, then folds O_{t-1} and runs tile t's softmax: the fold order and every operation are
// PrefillTile's, only the schedule differs. kPingPong: the two warpgroups take turns issuing their
// MMAs (named barriers 2 and 3), so one's softmax overlaps the other's tensor-core work.
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

template <bool kPingPong, int kStages, int kPiece>
__global__ void __launch_bounds__(kWsThreads, 1)
    PrefillWsKernel(const TileKernelArgs k, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WaitForPriorGrids();
  constexpr int D = kWgD, C = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ WsBarriers bars;
  __shared__ int wg_pos[2][2];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  unsigned char* Qs = smem;
  unsigned char* KVs = Qs + kWgRows * kWgRowBytes;  // stage s: K tile, then V tile
  const uint32_t qs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(Qs));
  const uint32_t kv_addr = static_cast<uint32_t>(__cvta_generic_to_shared(KVs));
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars.full[0]));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(&bars.empty[0]));

  const AttentionArgs& a = k.a;
  const KvCacheView& cache = a.cache;
  const int hq = a.num_q_heads, hkv = cache.num_kv_heads, G = hq / hkv, bs = cache.block_size;
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
    const __nv_bfloat16* kg = reinterpret_cast<const __nv_bfloat16*>(cache.k);
    const __nv_bfloat16* vg = reinterpret_cast<const __nv_bfloat16*>(cache.v);
    // Lane p copies piece p of a tile (p < the tile's TMA pieces; four boxes: K and V, two column
    // halves), so the pieces' copies are issued side by side (one lane per box measured slower);
    // its piece's cache row is read one tile ahead, so that a freed stage is refilled without
    // waiting on a global load.
    auto piece_row = [&](int i) {
      const int ts = (tile_begin + i) * kT;
      const int npf = max(0, min(kT / kPiece, (kv_len - ts) / kPiece));
      if (i >= ntiles || lane >= npf) return 0;
      const int tok = ts + lane * kPiece;
      return (a.block_ids[table_offset + tok / bs] * hkv + kvh) * bs + tok % bs;
    };
    int next_row = piece_row(0);
    for (int i = 0; i < ntiles; ++i) {
      const int s = i % kStages, ts = (tile_begin + i) * kT;
      const int prow = next_row;
      next_row = piece_row(i + 1);
      if (i >= kStages) MbarWait(empty0 + 8 * s, ((i / kStages) - 1) & 1);
      const uint32_t ks = kv_addr + 2 * s * kWgTileBytes, vs = ks + kWgTileBytes;
      const int npf = max(0, min(kT / kPiece, (kv_len - ts) / kPiece));  // TMA pieces
      if (npf < kT / kPiece) {  // the item's last tile: rows from kPiece * npf copied by lanes
        unsigned char* Kd = KVs + 2 * s * kWgTileBytes;
        unsigned char* Vd = Kd + kWgTileBytes;
        const int j0 = npf * kPiece;
        for (int idx = lane; idx < (kT - j0) * C; idx += 32) {
          const int j = j0 + idx / C, c = idx % C, tok = ts + j;
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
        FenceProxyAsync();  // these st.shared are read by wgmma (the async proxy)
        __syncwarp();
      }
      if (lane == 0) MbarArriveExpectTx(full0 + 8 * s, npf * (2 * 2 * kPiece * 128));
      __syncwarp();
      if (lane < npf) {
        const uint32_t off = lane * kPiece * 128;
        TmaLoad2d(ks + off, &tk, 0, prow, full0 + 8 * s);
        TmaLoad2d(ks + kT * 128 + off, &tk, 64, prow, full0 + 8 * s);
        TmaLoad2d(vs + off, &tv, 0, prow, full0 + 8 * s);
        TmaLoad2d(vs + kT * 128 + off, &tv, 64, prow, full0 + 8 * s);
      }
    }
  } else {  // --------------------------------------------------------------------- consumers
    SetMaxRegsInc<240>();
    const int cw = warp - 4, wg = cw >> 2, t4 = lane & 3;
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
    const int lo = wg_pos[wg][0], hi = wg_pos[wg][1];
    // Tiles this warpgroup reads: a prefix of the item's (ts <= hi).
    const int nact = hi < 0 ? 0 : min(ntiles, max(0, (hi / kT) - tile_begin + 1));
    const uint32_t q_wg = qs_addr + wg * 64 * 128;
    const float scale_log2 = k.scale_log2;

    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    Zero(o);
    uint32_t pa[kT / 16][4];
    FoldWeights wp[2];
    bool vp[2] = {false, false};
    const uint64_t dq = WgmmaDesc(q_wg, 16, 1024);
    auto issue_qk = [&](float(&sc)[32], uint64_t dk) { IssueQk(sc, dq, dk); };
    auto desc_k = [&](int i) {
      return WgmmaDesc(kv_addr + 2 * (i % kStages) * kWgTileBytes, 16, 1024);
    };
    auto desc_v = [&](int i) {
      return WgmmaDesc(kv_addr + (2 * (i % kStages) + 1) * kWgTileBytes, kT * 128, 1024);
    };
    auto release = [&](int i) {
      __syncwarp();
      if (lane == 0) MbarArrive(empty0 + 8 * (i % kStages));
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
      MbarWait(full0, 0);
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
      MbarWait(full0 + 8 * (i % kStages), (i / kStages) & 1);
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
      MbarWait(full0 + 8 * (j % kStages), (j / kStages) & 1);
      turn_begin();
      turn_end(j);
      release(j);
    }
    WgStoreRows(k, row_begin, nq, kvh, cw * 16, lane, o, l);
  }
#else
  __trap();  // launched only on devices with sm_90a machine code (WgmmaAvailable)
#endif
}

// ---------------------------------------------------------------------------------------------
// Split items (decode rows, cascade tiles): one CTA (kThreads threads, kv head blockIdx.y) per
// item writes one partial per (row, query head, tile): O_t = P V unnormalized (f32) and
// (ms, l) (see RowSoftmax and Fold). S = Q K^T and O_t = P V on tensor cores with the prefill
// kernel's accumulation chains; the softmax runs 4 lanes per query in the prefill kernel's
// register layout and order (RowSoftmax), so a tile's partial is bitwise the prefill kernel's.
// Up to kMaxQ (row, head) pairs share the K/V tile load.
template <int E>
__device__ __forceinline__ void SplitItem(const TileKernelArgs& k, int item) {
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
  float* row_ms = row_l + kMaxQ;                               // [kMaxQ], -inf: no visible key

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

  const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(cache.k);
  const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(cache.v);
  const uint16_t* Vu = reinterpret_cast<const uint16_t*>(Vs);
  for (int t = tile_begin; t < tile_end; ++t) {
    const int ts = t * kT;
    const int n_load = min(kT, kv_len - ts);
    __syncthreads();  // previous tile's readers are done (and q is initialized)
    for (int i = tid; i < kT * (D / 8); i += kThreads) {
      const int j = i / (D / 8), c = i % (D / 8);
      const int tok = ts + j;
      int64_t src = 0;
      if (j < n_load) {
        const int64_t blk = a.block_ids[table_offset + tok / bs];
        src = ((blk * hkv + kvh) * bs + tok % bs) * D + c * 8;
      }
      CpAsync16Z(Ks + j * LD + c * 8, kc + src, j < n_load ? 16 : 0);
      CpAsync16Z(Vs + j * LD + c * 8, vc + src, j < n_load ? 16 : 0);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
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
        }
      }
    }
    __syncthreads();

    // O_t = P V: fragment f = (m tile f / (D/8), n tile f % (D/8)), k over the tile's keys.
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
        if (qi >= nq || row_ms[qi] == -INFINITY) continue;
        const int row = k.item_rows[row_begin + qi / G];
        const int qh = kvh * G + qi % G;
        const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
        *reinterpret_cast<float2*>(a.partial_o + slot * D + n0 + 2 * t4) =
            make_float2(c[2 * h], c[2 * h + 1]);
      }
    }
    for (int qi = tid; qi < nq; qi += kThreads) {
      const int row = k.item_rows[row_begin + qi / G];
      const int qh = kvh * G + qi % G;
      const int64_t slot = static_cast<int64_t>(k.partial_base[row] + t) * hq + qh;
      a.partial_ml[2 * slot] = row_ms[qi];
      a.partial_ml[2 * slot + 1] = row_l[qi];
    }
  }
}

// grid: (CTAs, num_kv_heads). Each CTA runs items blockIdx.x, blockIdx.x + gridDim.x, ... below
// the item count: gridDim.x itself (one item per CTA), or, for a launch inside a CUDA graph, a
// count read on the device, so the same fixed grid serves every step. An item's arithmetic does
// not depend on which CTA runs it.
template <int E>
__global__ void __launch_bounds__(kThreads) SplitKernel(TileKernelArgs k) {
  WaitForPriorGrids();
  const int count = k.item_count != nullptr ? *k.item_count : static_cast<int>(gridDim.x);
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    if (item != static_cast<int>(blockIdx.x)) __syncthreads();  // the last item's readers are done
    SplitItem<E>(k, item);
  }
}

// One warp per (split row, query head): the Fold of the row's tile partials in tile order.
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
  float o[E], m = -INFINITY, l = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = 0.f;
  // Loads run kBatch tiles ahead of the (strictly sequential) folds.
  constexpr int kBatch = 8;
  for (int t0 = 0; t0 < tiles; t0 += kBatch) {
    float ob[kBatch][E], mb[kBatch], lb[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t slot = static_cast<int64_t>(base + t0 + i) * hq + qh;
      const bool in = t0 + i < tiles;
      mb[i] = in ? a.partial_ml[2 * slot] : -INFINITY;
      lb[i] = in ? a.partial_ml[2 * slot + 1] : 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) ob[i][e] = in ? a.partial_o[slot * D + lane * E + e] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (mb[i] == -INFINITY) continue;
      const FoldWeights w = Fold(m, mb[i]);
      l = FoldElem(l, w, lb[i]);
#pragma unroll
      for (int e = 0; e < E; ++e) o[e] = FoldElem(o[e], w, ob[i][e]);
      m = w.m;
    }
  }
  const float inv = __frcp_rn(l);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out) + static_cast<int64_t>(row) * hq * D;
#pragma unroll
  for (int e = 0; e < E; ++e)
    out[qh * D + lane * E + e] = __float2bfloat16_rn(__fmul_rn(o[e], inv));
}

size_t SplitSmemBytes(int d) {
  return (2 * kT + kMaxQ) * (d + 8) * sizeof(__nv_bfloat16) + kMaxQ * LDP * sizeof(__nv_bfloat16) +
         kMaxQ * LDS * sizeof(float) + 2 * kMaxQ * sizeof(float);
}

int g_wgmma_variant = 0;
int WgmmaVariant() { return g_wgmma_variant; }

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
      const int64_t rows = args.cache.num_blocks * args.cache.num_kv_heads * args.cache.block_size;
      // Blocks of 64 tokens copy a whole tile per TMA box (4 copies per tile instead of 16).
      const int piece = v == 0 && args.cache.block_size % kT == 0 ? kT : kPieceTokens;
      cudaError_t err = EncodeKvMap(args.cache.k, rows, piece, &tk);
      if (err == cudaSuccess) err = EncodeKvMap(args.cache.v, rows, piece, &tv);
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
    const size_t smem = SplitSmemBytes(D);
    cudaError_t err =
        cudaFuncSetAttribute(SplitKernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    err = LaunchKernel(SplitKernel<E>, dim3(plan.num_split, args.cache.num_kv_heads), kThreads,
                       smem, stream, k);
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

void SetWgmmaPrefillVariant(int variant) { g_wgmma_variant = variant; }

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

cudaError_t SplitCtasPerWave(int head_dim, int num_kv_heads, int* ctas) {
  auto per_sm = [&](auto kernel, int e) {
    const size_t smem = SplitSmemBytes(e * 32);
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
      return per_sm(SplitKernel<1>, 1);
    case 64:
      return per_sm(SplitKernel<2>, 2);
    case 128:
      return per_sm(SplitKernel<4>, 4);
    case 256:
      return per_sm(SplitKernel<8>, 8);
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
