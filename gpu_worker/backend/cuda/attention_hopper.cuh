// The Hopper (sm_90a, wgmma + TMA) attention kernels: the two-warpgroup and warp-specialized
// prefill kernels and the persistent decode kernel, with the warpgroup helpers they share.
// Not a standalone header: attention.cu includes it inside cascade::cuda::internal's anonymous
// namespace, after the tile helpers (RowSoftmax, Fold, QChunk, TileKernelArgs, ...) it uses, so
// the kernels stay in that one translation unit.
#pragma once

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
    Wgmma64x64SS(sc, WgmmaDescAdd(dq, half * kQRows * 128 + kb),
                 WgmmaDescAdd(dk, half * kT * 128 + kb));
  }
}
// O_t = P V for one warpgroup (from +0, k over the tile's keys ascending); dv: the V tile's
// descriptor as an MN-major operand.
__device__ __forceinline__ void IssuePv(float (&ot)[64], const uint32_t (&pa)[kT / 16][4],
                                        uint64_t dv) {
#pragma unroll
  for (int kk = 0; kk < kT / 16; ++kk) Wgmma64x128RS(ot, pa[kk], WgmmaDescAdd(dv, kk * 2048));
}
template <int N>
__device__ __forceinline__ void Zero(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = 0.f;
}

// A warpgroup's f32 P (the wgmma accumulator layout of its 64 x 64 scores) rounded to bf16 as the
// register A operand of P V.
__device__ __forceinline__ void WgPackP(const float (&sc)[32], uint32_t (&pa)[kT / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kT / 16; ++kk) {
    pa[kk][0] = PackBf16(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = PackBf16(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = PackBf16(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = PackBf16(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}
// Tile softmax of a warpgroup's 64 x 64 scores (the wgmma accumulator layout: rows g and g + 8
// of each warp): RowSoftmax per row and the running (m, l) update, P rounded to bf16 into pa (the
// register A operand of P V), and the weights (w, valid) that fold the tile's O_t (WgFold).
// kHalves 1: only the lane's first row (g; the persistent decode kernel's 8 q-rows), the second
// row's scores are packed into pa as they are (that row's results are never stored).
template <bool kMask, int kHalves = 2>
__device__ __forceinline__ void WgSoftmax(float (&sc)[32], const int (&pos)[2], int ts, int t4,
                                          float scale_log2, float (&m)[2], float (&l)[2],
                                          FoldWeights (&w)[2], bool (&valid)[2],
                                          uint32_t (&pa)[kT / 16][4]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
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
  WgPackP(sc, pa);
}
// Folds a tile's O_t into o with WgSoftmax's weights; kCheck: the tile was masked, so a row may
// have seen none of its keys (skipped: a bitwise no-op). kHalves 1: the lane's first row only.
template <bool kCheck, int kHalves = 2>
__device__ __forceinline__ void WgFold(float (&o)[64], const float (&ot)[64],
                                       const FoldWeights (&w)[2], const bool (&valid)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    if (h >= kHalves) continue;
    if (!kCheck || valid[h]) o[i] = FoldElem(o[i], w[h], ot[i]);
  }
}
// WgSoftmax's layout with the in-place step (RowSoftmaxInPlace) against a super-tile's state (m,
// l): P into pa, each row's scale factor for the state's O into alpha.
template <bool kMask, int kHalves = 2>
__device__ __forceinline__ void WgSoftmaxInPlace(float (&sc)[32], const int (&pos)[2], int ts,
                                                 int t4, float scale_log2, float (&m)[2],
                                                 float (&l)[2], float (&alpha)[2],
                                                 uint32_t (&pa)[kT / 16][4]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    float x[16];
#pragma unroll
    for (int n = 0; n < kT / 8; ++n) {
      x[2 * n] = sc[4 * n + 2 * h];
      x[2 * n + 1] = sc[4 * n + 2 * h + 1];
    }
    RowSoftmaxInPlace<kMask>(x, pos[h] + 1 - ts, t4, scale_log2, m[h], l[h], alpha[h]);
#pragma unroll
    for (int n = 0; n < kT / 8; ++n) {
      sc[4 * n + 2 * h] = x[2 * n];
      sc[4 * n + 2 * h + 1] = x[2 * n + 1];
    }
  }
  WgPackP(sc, pa);
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
// The split kernel's partial of a consumer lane's q-row half h (WgStoreRowsBy's layout): O
// unnormalized at partial_o's `slot`, (m, l) beside it (from the lane of t4 0).
__device__ __forceinline__ void WgStorePartial(const AttentionArgs& a, int64_t slot, int lane,
                                               const float (&o)[64], int h, float m, float l) {
  const int t4 = lane & 3;
  float* dst = a.partial_o + slot * kWgD + 2 * t4;
#pragma unroll
  for (int n = 0; n < kWgD / 8; ++n) {
    *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[4 * n + 2 * h], o[4 * n + 2 * h + 1]);
  }
  if (t4 == 0) {
    a.partial_ml[2 * slot] = m;
    a.partial_ml[2 * slot + 1] = l;
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
  const auto [it, kvh] = FinalCtaOf(k);
  const int table_offset = it[0], tile_begin = it[1], tile_end = it[2], row_begin = it[3];
  const int row_count = it[4], kv_len = it[5];
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

// The warp-specialized form (v8): warpgroup 0 loads (warps 0 and 1 copy K/V tiles, warps 2 and 3
// a work's Q rows and positions; all four give registers back), warpgroups 1 and 2 compute
// (q-rows as above). K/V pieces of kPiece tokens (16: a paged block of 16 or part of one of 32;
// 64: a whole tile of a 64-token block) come by bulk tensor copy (TMA, 128-byte swizzle: the
// layout of wgmma.cuh) into kStages stages, each with a `full` mbarrier (the copies' bytes) and an
// `empty` one (one arrival per consumer warp when its wgmma reads of the stage are done). The load
// warps run WsLoadTiles, each consumer warpgroup WsFoldTiles (below).
constexpr int kWsStages = 4;  // 6 measured no faster (H100, bench/kernels/NOTES.md)
// Load warps of the prefill kernel: warp w copies ring tiles w, w + kWsLoadWarps, ... (each stage
// is filled by one warp at a time, so the barriers are as with one). One warp held 16-token blocks
// at 0.92-0.93x of the 64-token-block rate: its per-tile chain (wait for the stage, the next
// tile's cache rows, sixteen box copies from four lanes) paced the consumers
// (bench/kernels/NOTES.md).
constexpr int kWsLoadWarps = 2;
constexpr int kWsThreads = 384;
// Two Q buffers (the persistent prefill kernel's current work and the next), then the stages.
constexpr size_t WsSmemBytes(int stages) {
  return 1024 + 2 * static_cast<size_t>(kWgRows) * kWgRowBytes + 2 * stages * kWgTileBytes;
}
constexpr int kPieceTokens =
    16;  // the copy unit for blocks of 16 or 32 tokens; 64 for blocks of 64

// Warp-specialized register split. The increase draws only on registers that warps of the same
// CTA gave back with the decrease (from the kernel's launch count, ptxas' "Used N registers"):
// it blocks until they are there, so an increase larger than the decreases release hangs the
// kernel (a three-consumer decode kernel did, bench/kernels/NOTES.md session 33).
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
  uint32_t full0;       // shared address of full[0] (barriers 8 bytes apart)
  uint32_t empty0;      // shared address of empty[0]
  uint32_t kv0;         // shared address of stage 0
  unsigned char* kv;    // the same, generic (the load warp's lane copies)
  uint32_t zero_v = 0;  // a half-stage ring's zeroed V half (below): shared address
};

// The load warp's part: tiles [tile_begin, tile_begin + ntiles) of an item (kv head kvh) into the
// ring as its tiles n0, n0 + 1, ... Lane p copies piece p of a tile (p < the tile's TMA pieces;
// four boxes: K and V, two column halves), so the pieces' copies are issued side by side (one
// lane per box measured slower); its piece's cache row is read one tile ahead, so that a freed
// stage is refilled without waiting on a global load. An item's last tile: see kTmaTail below.
// The TMA pieces of a tile starting at token ts: its whole kPiece-token pieces below kv_len, or
// with kTmaTail (the persistent decode kernel) every piece holding a token below kv_len, the
// last one maybe partial: its rows past kv_len are the cache block's unused slots (the piece
// never leaves its block: block sizes are multiples of kPiece).
template <int kPiece, bool kTmaTail>
__device__ __forceinline__ int WsTmaPieces(int kv_len, int ts) {
  const int rows = kTmaTail ? kv_len - ts + kPiece - 1 : kv_len - ts;
  return max(0, min(kT / kPiece, rows / kPiece));
}
// The half-stage ring (the persistent decode kernel with 16-token pieces, one-level order): the
// same shared memory as kStages stages, cut into 2 kStages half-stages of kHalfRows keys (K, then
// V: kHalfRows rows a column half, kWgTileBytes a half-stage), each with its own `full` and
// `empty` barrier. A whole tile takes two consecutive half-stages (keys 0-31, 32-63), a work's
// last tile of at most kHalfRows keys one: so a consumer's ring holds a short work's partial
// last tile in half the bytes, and the next work's first tile is copied sooner (a stage is held
// from its copy's issue until its tile is folded, whatever the tile holds; bench/kernels/NOTES.md
// sessions 50-51). Measured (session 53): inside the engine's decode replays the kernel takes
// 0.96x the time and steps are 2-5% shorter; alone its rows are 1-5% slower (a work's first tile
// is there at once, but each tile costs its consumer more). The n-th half-stage through the ring
// sits in slot n % (2 kStages); a work's tile i starts at half-stage n0 + 2 i (every tile but the
// last is whole). Bits: S of a tile is two m64n32k16 chains (keys 0-31 and 32-63, an element's k16
// chain over the head dims does not depend on N) and P V's k16 steps over keys 32-63 read the
// second half-stage, or the zeroed V half (zero_v) where the tile has one, so every MMA sees the
// operands the whole stage gave (its rows past kv_len zeroed there too; WsZeroVTail).
constexpr int kHalfRows = kT / 2;
// The half-stages a tile starting at token ts takes (its TMA pieces of 16 tokens: up to two fill
// the first half, three or four both).
__device__ __forceinline__ int WsTileHalves(int kv_len, int ts) {
  return WsTmaPieces<kPieceTokens, true>(kv_len, ts) > 2 ? 2 : 1;
}
// The half-stages of a work: its whole tiles' two each and its last tile's.
__device__ __forceinline__ int WsWorkHalves(int kv_len, int tile_begin, int ntiles) {
  return ntiles <= 0 ? 0 : 2 * (ntiles - 1) + WsTileHalves(kv_len, (tile_begin + ntiles - 1) * kT);
}

// The cache row (of the [blocks * kv heads * block_size, 128] tensor maps) where lane `lane`'s TMA
// piece of the item's tile i starts; 0 where the lane copies no piece of it.
template <int kPiece, bool kTmaTail = false>
__device__ __forceinline__ int WsPieceRow(const AttentionArgs& a, int table_offset, int tile_begin,
                                          int ntiles, int kv_len, int kvh, int lane, int i) {
  const int hkv = a.cache.num_kv_heads, bs = a.cache.block_size;
  const int ts = (tile_begin + i) * kT;
  const int npf = WsTmaPieces<kPiece, kTmaTail>(kv_len, ts);
  if (i >= ntiles || lane >= npf) return 0;
  const int tok = ts + lane * kPiece;
  return (a.block_ids[table_offset + tok / bs] * hkv + kvh) * bs + tok % bs;
}

// One TMA piece (kPiece cache rows from `row`) into a stage or half-stage whose K and V parts
// (ks, vs) hold `rows` rows a column half: four boxes, K and V, two column halves, at byte `off`
// of each column half; their bytes arrive on `full`.
__device__ __forceinline__ void WsTmaPiece(uint32_t ks, uint32_t vs, int rows, uint32_t off,
                                           const CUtensorMap* tk, const CUtensorMap* tv, int row,
                                           uint32_t full) {
  TmaLoad2d(ks + off, tk, 0, row, full);
  TmaLoad2d(ks + rows * 128 + off, tk, 64, row, full);
  TmaLoad2d(vs + off, tv, 0, row, full);
  TmaLoad2d(vs + rows * 128 + off, tv, 64, row, full);
}

// first_row: this lane's WsPieceRow of tile `first` (found by the caller, maybe ahead of time);
// the warp copies tiles first, first + step, ... (several load warps share an item's tiles).
// kTmaTail (the persistent decode kernel, where every item's last tile is usually partial): the
// last tile comes by TMA too, whole pieces (WsTmaPieces), and its rows past kv_len are left as
// they land or as the stage held them; the consumer zeroes V's there (WsZeroVTail) and every
// q-row masks those keys (up to kPiece - 1 rows more are read; the same bits). Before, the
// lanes copied the tail by cp.async, zeros past kv_len, and waited for it before the next tile:
// the three-level tree row ran 1.13x faster back to back without that (68.4-68.5 vs 76.9-78.2
// us, every GPU test passing in the call), the short decode rows within 2% (so the wait was not
// what bounds them; bench/kernels/NOTES.md session 52). Else (prefill, once per item; its load
// warp has 24 registers) the rows from the last whole piece are copied by plain loads and
// stores, zeros past kv_len, as PrefillKernel has them.
template <int kStages, int kPiece, bool kTmaTail>
__device__ __forceinline__ void WsLoadTiles(const AttentionArgs& a, const CUtensorMap* tk,
                                            const CUtensorMap* tv, const WsRing& ring, int n0,
                                            int table_offset, int tile_begin, int ntiles,
                                            int kv_len, int kvh, int lane, int first_row,
                                            int first = 0, int step = 1) {
  constexpr int D = kWgD, C = D / 8;
  const KvCacheView& cache = a.cache;
  const int hkv = cache.num_kv_heads, bs = cache.block_size;
  const __nv_bfloat16* kg = reinterpret_cast<const __nv_bfloat16*>(cache.k);
  const __nv_bfloat16* vg = reinterpret_cast<const __nv_bfloat16*>(cache.v);
  auto piece_row = [&](int i) {
    return WsPieceRow<kPiece, kTmaTail>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, i);
  };
  int next_row = first_row;
  for (int i = first; i < ntiles; i += step) {
    const int n = n0 + i, s = n % kStages, ts = (tile_begin + i) * kT;
    const int prow = next_row;
    next_row = piece_row(i + step);
    if (n >= kStages) MbarWait(ring.empty0 + 8 * s, ((n / kStages) - 1) & 1);
    const uint32_t ks = ring.kv0 + 2 * s * kWgTileBytes, vs = ks + kWgTileBytes;
    const uint32_t full = ring.full0 + 8 * s;
    const int npf = WsTmaPieces<kPiece, kTmaTail>(kv_len, ts);
    const uint32_t tma_bytes = npf * (2 * 2 * kPiece * 128);
    if (!kTmaTail && npf < kT / kPiece) {  // the item's last tile: rows from kPiece * npf by lanes
      unsigned char* Kd = ring.kv + 2 * s * kWgTileBytes;
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
      FenceProxyAsync();  // these shared-memory writes are read by wgmma (the async proxy)
      __syncwarp();
    }
    if (lane == 0) MbarArriveExpectTx(full, tma_bytes);
    __syncwarp();
    if (lane < npf) WsTmaPiece(ks, vs, kT, lane * kPiece * 128, tk, tv, prow, full);  // piece p
  }
}

// WsLoadTiles for a half-stage ring of kHalves slots (kPieceTokens pieces, the last tile by TMA
// as with kTmaTail): tile i into half-stages n0 + 2 i and, where it has more than kHalfRows keys,
// n0 + 2 i + 1; lane p copies piece p into half p / 2 once that half-stage is free. Each
// half-stage's `full` barrier expects the bytes of its own pieces.
template <int kHalves>
__device__ __forceinline__ void WsLoadHalves(const CUtensorMap* tk, const CUtensorMap* tv,
                                             const WsRing& ring, int n0, const AttentionArgs& a,
                                             int table_offset, int tile_begin, int ntiles,
                                             int kv_len, int kvh, int lane, int first_row) {
  constexpr int kPiece = kPieceTokens, kHalfPieces = kHalfRows / kPiece;
  int next_row = first_row;
  for (int i = 0; i < ntiles; ++i) {
    const int ts = (tile_begin + i) * kT;
    const int prow = next_row;
    next_row =
        WsPieceRow<kPiece, true>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, i + 1);
    const int npf = WsTmaPieces<kPiece, true>(kv_len, ts);
    const int nh = npf > kHalfPieces ? 2 : 1;
    for (int h = 0; h < nh; ++h) {
      const int n = n0 + 2 * i + h, s = n % kHalves;
      if (n >= kHalves) MbarWait(ring.empty0 + 8 * s, ((n / kHalves) - 1) & 1);
      const uint32_t ks = ring.kv0 + s * kWgTileBytes, vs = ks + kWgTileBytes / 2;
      const uint32_t full = ring.full0 + 8 * s;
      const int pieces = min(kHalfPieces, npf - h * kHalfPieces);
      if (lane == 0) MbarArriveExpectTx(full, pieces * (2 * 2 * kPiece * 128));
      __syncwarp();
      if (lane / kHalfPieces == h && lane < npf) {  // piece `lane`
        WsTmaPiece(ks, vs, kHalfRows, (lane % kHalfPieces) * kPiece * 128, tk, tv, prow, full);
      }
    }
  }
}

// A kTmaTail ring's tile of `valid` rows (keys below kv_len; < kT: the item's last tile) has K
// and V rows past them that are not the item's keys: the cache block's unused slots or whatever
// the stage held, possibly not finite. Their keys are masked for every q-row of a decode work
// (positions < kv_len), by selects, so K's rows there are never read as values; V's are
// multiplied by P = 0, which gives the zero-filled stage's +0 only if they are finite. So the
// consumer warpgroup (its 128 threads, named barrier bar_id) zeroes V's rows [valid, kT) once
// the tile has landed and before its P V: the operands of every MMA are then what the
// zero-filled copy gave. A no-op for whole tiles.
// v: the V tile (or half) of `rows` rows a column half.
__device__ __forceinline__ void WsZeroVRows(unsigned char* v, int rows, int valid, int bar_id) {
  if (valid >= rows) return;
  const int z = max(valid, 0), per_half = (rows - z) * 8;  // 16-byte chunks of a column half
  v += z * 128;
  for (int idx = threadIdx.x & 127; idx < 2 * per_half; idx += 128) {
    const int h = idx >= per_half;
    *reinterpret_cast<uint4*>(v + h * rows * 128 + (idx - h * per_half) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  FenceProxyAsync();  // read by wgmma (the async proxy)
  NamedBarSync(bar_id, 128);
}
__device__ __forceinline__ void WsZeroVTail(const WsRing& ring, int stage, int valid, int bar_id) {
  WsZeroVRows(ring.kv + (2 * stage + 1) * kWgTileBytes, kT, valid, bar_id);
}

// A consumer warp's pass over ring tile n that another warpgroup computes (a kFoldPair item),
// or past the rows': waits for it to land and gives its stage back, as WsFoldTiles does past
// its rows.
template <int kStages>
__device__ __forceinline__ void WsSkipTile(const WsRing& ring, int n, int lane) {
  MbarWait(ring.full0 + 8 * (n % kStages), (n / kStages) & 1);
  __syncwarp();
  if (lane == 0) MbarArrive(ring.empty0 + 8 * (n % kStages));
}

// The persistent decode kernel's consumer in the decode-shaped form (k.dw_n8): the keys (S) and
// the head dims (O) as the MMA's 64 rows and the work's <= 8 q-rows as its 8 columns, so each
// thread holds 4 scores and 8 outputs where the 64-row form (WsFoldTiles with kRowWarp) holds the
// 8 q-rows repeated over 64 rows. The same bits (bench/kernels/wgmma_swap_probe.cu: S^T = K Q^T
// and O^T = V^T P^T as chained m64n8k16 equal the 64-row chains; the rest below is RowSoftmax's
// and the fold's arithmetic on the same values). Per tile: S^T by 8 m64n8k16 (K as A, Q as B);
// the raw scores to shared memory; the sum warp (lanes 4 q + t4, RowSoftmax's layout) runs
// RowSoftmax for q-row q over them (the max and the sum in its order) and publishes ms; every
// thread computes P = 2^(S scale - ms) for its 4 scores (RowSoftmax's formula), writes them as
// bf16 P^T (the B operand), and folds its 8 outputs with Fold(m, ms); O^T by 2 x 4 m64n8k16 (V
// as an MN-major A, one 64-dim half each). Shared memory a consumer (kN8ScratchBytes): P^T (8
// rows x 128 bytes, one swizzled atom), S (f32 [8][64]), ms [8], l [8].
constexpr int kN8ScratchBytes = 4096;
constexpr int kN8QRows = 8;  // the Q buffer's rows (DecodeWsKernel's kDwQRows)
struct N8Scratch {
  unsigned char* base;  // 1024-byte aligned
  uint32_t addr;        // its shared-memory address
  __device__ __forceinline__ float* S() const { return reinterpret_cast<float*>(base + 1024); }
  __device__ __forceinline__ float* Ms() const { return reinterpret_cast<float*>(base + 3072); }
  __device__ __forceinline__ float* L() const { return reinterpret_cast<float*>(base + 3104); }
};
// Tiles [tile_begin, tile_begin + ntiles) of a decode work folded from the empty state by one
// consumer warpgroup (named barrier bar_id, 128 threads): o[4 h + e] is the output at head dim
// 64 h + 16 cw + g + 8 (e >> 1) of q-row 2 t4 + (e & 1) (g = lane / 4, t4 = lane % 4), m[f] the
// running max of q-row 2 t4 + f; the sum warp's lanes also hold q-row lane / 4's (row_m, row_l).
// pos: the positions of q-rows 2 t4 and 2 t4 + 1, row_pos q-row lane / 4's (-1 past the work's
// q-rows); lo / hi: the lowest and highest of the work's q-rows' positions.
template <int kStages>
__device__ __forceinline__ void WsFoldTilesN8(const WsRing& ring, int n0, uint32_t q_addr,
                                              const N8Scratch& x, int bar_id, int tile_begin,
                                              int ntiles, int lo, int hi, const int (&pos)[2],
                                              int row_pos, bool sum_warp, int cw, int lane,
                                              float scale_log2, float (&o)[8], float (&m)[2],
                                              float& row_m, float& row_l, int kv_len) {
  const int g = lane >> 2, t4 = lane & 3;
  const int nact = hi < 0 ? 0 : min(ntiles, max(0, (hi / kT) - tile_begin + 1));
  const int nfull = min(nact, max(0, (lo + 1) / kT - tile_begin));
  Zero(o);
  m[0] = m[1] = row_m = -INFINITY;
  row_l = 0.f;
  const uint64_t dq = WgmmaDesc(q_addr, 16, 1024), dp = WgmmaDesc(x.addr, 16, 1024);
  auto stage = [&](int i) { return (n0 + i) % kStages; };
  auto wait_full = [&](int i) { MbarWait(ring.full0 + 8 * stage(i), ((n0 + i) / kStages) & 1); };
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) MbarArrive(ring.empty0 + 8 * stage(i));
  };
  // S^T of tile i (key 16 cw + g + 8 (e >> 1), q-row 2 t4 + (e & 1)) issued into st once the
  // tile landed, not waited for.
  auto issue_s = [&](int i, float(&st)[4]) {
    const uint32_t kv = ring.kv0 + 2 * stage(i) * kWgTileBytes;
    wait_full(i);
    WsZeroVTail(ring, stage(i), kv_len - (tile_begin + i) * kT, bar_id);  // (a kTmaTail ring)
    Zero(st);
    FenceRegs(st);
    WgmmaFence();
#pragma unroll
    for (int kc = 0; kc < kWgD / 16; ++kc) {
      const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
      Wgmma64x8SS<0>(st, WgmmaDescAdd(WgmmaDesc(kv, 16, 1024), half * kT * 128 + kb),
                     WgmmaDescAdd(dq, half * kN8QRows * 128 + kb));
    }
    WgmmaCommit();
  };
  float st[4];  // the current tile's S^T (complete when its tile step starts)
  if (nact > 0) {
    issue_s(0, st);
    WgmmaWait<0>();
    FenceRegs(st);
  }
  // Tile i's step: the next tile's S^T is issued beside this tile's softmax and P V (its copy
  // waited for first), so its MMAs overlap them.
  auto tile = [&](auto mask_tag, int i) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const int ts = (tile_begin + i) * kT;
    const uint32_t kv = ring.kv0 + 2 * stage(i) * kWgTileBytes;
    const bool next = i + 1 < nact;
    float sn[4];
    float* S = x.S();
#pragma unroll
    for (int e = 0; e < 4; ++e) S[(2 * t4 + (e & 1)) * kT + 16 * cw + g + 8 * (e >> 1)] = st[e];
    if (next) issue_s(i + 1, sn);
    NamedBarSync(bar_id, 128);
    if (sum_warp) {  // q-row g's softmax in RowSoftmax's layout and order
      float r[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) r[j] = S[g * kT + Key(j, t4)];
      float ms, lt;
      RowSoftmax<kMask>(r, row_pos + 1 - ts, t4, scale_log2, ms, lt);
      if (t4 == 0) x.Ms()[g] = ms;
      const FoldWeights w = Fold(row_m, ms);
      if (!kMask || ms != -INFINITY) {
        row_l = FoldElem(row_l, w, lt);
        row_m = w.m;
      }
    }
    NamedBarSync(bar_id, 128);
    // This thread's q-rows: their fold weights and P (bf16) into P^T.
    float ms[2];
    FoldWeights w[2];
    bool valid[2];
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      ms[f] = x.Ms()[2 * t4 + f];
      valid[f] = !kMask || ms[f] != -INFINITY;
      w[f] = Fold(m[f], ms[f]);
      if (valid[f]) m[f] = w[f].m;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int f = e & 1, key = 16 * cw + g + 8 * (e >> 1);
      const float p =
          !kMask || key < pos[f] + 1 - ts ? Ex2(__fmaf_rn(st[e], scale_log2, -ms[f])) : 0.f;
      *reinterpret_cast<__nv_bfloat16*>(x.base + SwizzleOffset(8, 2 * t4 + f, key >> 3) +
                                        (key & 7) * 2) = __float2bfloat16_rn(p);
    }
    FenceProxyAsync();  // P^T is read by wgmma (the async proxy)
    NamedBarSync(bar_id, 128);
    float ot[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    FenceRegs(ot[0]);
    FenceRegs(ot[1]);
    WgmmaFence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int kk = 0; kk < kT / 16; ++kk) {
        Wgmma64x8SS<1>(
            ot[h],
            WgmmaDescAdd(WgmmaDesc(kv + kWgTileBytes, kT * 128, 1024), h * kT * 128 + kk * 2048),
            WgmmaDescAdd(dp, kk * 32));
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();  // (this tile's P V and the next tile's S^T)
    FenceRegs(ot[0]);
    FenceRegs(ot[1]);
    release(i);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int f = e & 1;
        if (!kMask || valid[f]) o[4 * h + e] = FoldElem(o[4 * h + e], w[f], ot[h][e]);
      }
    }
    if (next) {
      FenceRegs(sn);
#pragma unroll
      for (int e = 0; e < 4; ++e) st[e] = sn[e];
    }
  };
  for (int i = 0; i < ntiles; ++i) {
    if (i >= nact) {  // past every q-row's position
      WsSkipTile<kStages>(ring, n0 + i, lane);
    } else if (i < nfull) {
      tile(std::false_type{}, i);
    } else {
      tile(std::true_type{}, i);
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
// kRowWarp (the persistent decode kernel, whose <= 8 q-rows repeat over the 64 MMA rows): only
// the warp with `active` runs the softmax and the fold, for its lanes' first rows (the rest
// issue the MMAs and release stages, their results never stored): the same arithmetic for those
// rows, a quarter of the warpgroup's and half of that warp's instructions.
// kHalf (the persistent decode kernel with 16-token pieces): the ring is a half-stage ring of
// kStages slots (above WsLoadHalves), n0 the half-stage of the first tile.
template <bool kPingPong, int kStages, int kQRows, bool kRowWarp = false, bool kHalf = false>
__device__ __forceinline__ void WsFoldTiles(const WsRing& ring, int n0, uint32_t q_addr,
                                            uint32_t q_sbo, int tile_begin, int ntiles, int lo,
                                            int hi, const int (&pos)[2], int wg, int lane,
                                            float scale_log2, float (&o)[64], float (&l)[2],
                                            bool active = true, float* m_out = nullptr,
                                            uint64_t* phases = nullptr, int kv_len = INT_MAX) {
  static_assert(!kHalf || (kRowWarp && !kPingPong), "the half-stage ring: the decode consumer");
  constexpr int kHalves = kRowWarp ? 1 : 2;
  // Trace builds with `phases` (3 cycle sums: WsTraceSlot kTrWg0PhaseWait..Math): each tile's
  // wait for its stage, its MMAs from issue to the wait's return, and the rest of its step.
#if defined(CASCADE_WS_TRACE)
  uint64_t ph_wait = 0, ph_mma = 0, ph_math = 0, ph_t = 0;
  auto ph_mark = [&](uint64_t& sum) {
    const uint64_t now = clock64();
    if (ph_t != 0) sum += now - ph_t;
    ph_t = now;
  };
#define WS_PHASE(sum)                    \
  do {                                   \
    if (phases != nullptr) ph_mark(sum); \
  } while (0)
#else
#define WS_PHASE(sum) ((void)0)
#endif
  const int t4 = lane & 3;
  // Tiles this warpgroup reads: a prefix of the item's (ts <= hi).
  const int nact = hi < 0 ? 0 : min(ntiles, max(0, (hi / kT) - tile_begin + 1));
  float m[2] = {-INFINITY, -INFINITY};
  l[0] = l[1] = 0.f;
  Zero(o);
  uint32_t pa[kT / 16][4];
  if (kRowWarp) {  // the inactive warps' P operands (their rows' products are never read)
#pragma unroll
    for (int kk = 0; kk < kT / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  }
  FoldWeights wp[2];
  bool vp[2] = {false, false};
  const uint64_t dq = WgmmaDesc(q_addr, 16, q_sbo);
  // Ring slots: tile i's stage, or with kHalf its first half-stage (and the next one where the
  // tile has two: nh(i)).
  auto stage = [&](int i) { return kHalf ? (n0 + 2 * i) % kStages : (n0 + i) % kStages; };
  auto nh = [&](int i) { return kHalf ? WsTileHalves(kv_len, (tile_begin + i) * kT) : 1; };
  auto slot = [&](int i, int h) { return kHalf ? (n0 + 2 * i + h) % kStages : stage(i); };
  auto phase = [&](int i, int h) {
    return (kHalf ? (n0 + 2 * i + h) / kStages : (n0 + i) / kStages) & 1;
  };
  auto half_addr = [&](int i, int h) { return ring.kv0 + slot(i, h) * kWgTileBytes; };
  // S_i: one chain over the tile's 64 keys, or with kHalf one of 32 keys a half-stage (into sc's
  // accumulators of keys 0-31 and 32-63). A one-half tile's keys 32-63 are past kv_len, masked
  // for every row: their chain reads the zeroed V half as K (issued all the same: a wgmma on a
  // divergent path serializes every wgmma of the kernel).
  auto issue_qk = [&](float(&sc)[32], int i) {
    if constexpr (kHalf) {
      const uint64_t k0 = WgmmaDesc(half_addr(i, 0), 16, 1024);
      const uint64_t k1 = WgmmaDesc(nh(i) == 2 ? half_addr(i, 1) : ring.zero_v, 16, 1024);
#pragma unroll
      for (int kc = 0; kc < kWgD / 16; ++kc) {
        const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
        Wgmma64x32SS<0>(sc, WgmmaDescAdd(dq, half * kQRows * 128 + kb),
                        WgmmaDescAdd(k0, half * kHalfRows * 128 + kb));
      }
#pragma unroll
      for (int kc = 0; kc < kWgD / 16; ++kc) {
        const uint32_t half = kc >> 2, kb = (kc & 3) * 32;
        Wgmma64x32SS<16>(sc, WgmmaDescAdd(dq, half * kQRows * 128 + kb),
                         WgmmaDescAdd(k1, half * kHalfRows * 128 + kb));
      }
    } else {
      IssueQk<kQRows>(sc, dq, WgmmaDesc(ring.kv0 + 2 * stage(i) * kWgTileBytes, 16, 1024));
    }
  };
  // O_i = P_i V_i: with kHalf the k16 steps over keys 32-63 read the second half-stage, or the
  // zeroed V half where the tile has one.
  auto issue_pv = [&](float(&ot)[64], int i) {
    if constexpr (kHalf) {
      const uint32_t v0 = half_addr(i, 0) + kWgTileBytes / 2;
      const uint32_t v1 = nh(i) == 2 ? half_addr(i, 1) + kWgTileBytes / 2 : ring.zero_v;
#pragma unroll
      for (int kk = 0; kk < kT / 16; ++kk) {
        const uint32_t v = kk < kT / 32 ? v0 : v1;
        Wgmma64x128RS(ot, pa[kk],
                      WgmmaDescAdd(WgmmaDesc(v, kHalfRows * 128, 1024), (kk % (kT / 32)) * 2048));
      }
    } else {
      IssuePv(ot, pa, WgmmaDesc(ring.kv0 + (2 * stage(i) + 1) * kWgTileBytes, kT * 128, 1024));
    }
  };
  auto wait_full = [&](int i) {
    WS_PHASE(ph_math);  // (the previous step's rest ends here)
    const int halves = nh(i);
    for (int h = 0; h < halves; ++h) MbarWait(ring.full0 + 8 * slot(i, h), phase(i, h));
    WS_PHASE(ph_wait);
  };
  // A tile this warpgroup computes has landed; a kTmaTail ring's (kv_len given) last tile gets
  // V's rows past kv_len zeroed (WsZeroVTail, named barrier 1 + wg: not ping-pong's; with the
  // default kv_len every tile is whole to it, a no-op). With kHalf the rows past kv_len of its
  // last half-stage (the keys of a second half-stage, where it has none, are the zeroed V half's).
  auto land = [&](int i) {
    wait_full(i);
    const int valid = kv_len - (tile_begin + i) * kT;
    if constexpr (kHalf) {
      const int h = nh(i) - 1;
      WsZeroVRows(ring.kv + slot(i, h) * kWgTileBytes + kWgTileBytes / 2, kHalfRows,
                  valid - h * kHalfRows, 1 + wg);
    } else {
      WsZeroVTail(ring, stage(i), valid, 1 + wg);
    }
  };
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0) {
      const int halves = nh(i);
      for (int h = 0; h < halves; ++h) MbarArrive(ring.empty0 + 8 * slot(i, h));
    }
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
    if (kRowWarp && !active) return;
    WgSoftmax<decltype(mask_tag)::value, kHalves>(sc, pos, (tile_begin + i) * kT, t4, scale_log2, m,
                                                  l, wp, vp, pa);
  };
  auto fold = [&](auto check_tag, const float(&ot)[64]) {
    if (kRowWarp && !active) return;
    WgFold<decltype(check_tag)::value, kHalves>(o, ot, wp, vp);
  };
  using Masked = std::true_type;
  using Unmasked = std::false_type;
  // Tiles [0, nfull) are fully visible to every row of the warpgroup (ts + 63 <= lo).
  const int nfull = min(nact, max(0, (lo + 1) / kT - tile_begin));

  if (kPingPong && wg == 1) NamedBarArrive(2, 256);  // warpgroup 0 issues first
  if (nact > 0) {                                    // tile 0: S only
    land(0);
    float sc[32];
    Zero(sc);
    FenceRegs(sc);
    turn_begin();
    WgmmaFence();
    issue_qk(sc, 0);
    WgmmaCommit();
    turn_end(0);
    WgmmaWait<0>();
    WS_PHASE(ph_mma);
    FenceRegs(sc);
    if (nfull > 0) {
      softmax(Unmasked{}, sc, 0);
    } else {
      softmax(Masked{}, sc, 0);
    }
  }
  // Tile i: S_i issued with P_{i-1} V_{i-1}; once they are done tile i - 1's stage goes back to
  // the load warp (its copies then overlap this tile's math), then the fold of tile i - 1 and
  // the softmax of tile i (one basic block, so the fold's independent FMAs fill the softmax's
  // latencies).
  auto step = [&](auto prev_tag, auto cur_tag, int i) {
    land(i);
    float sc[32], ot[64];
    Zero(sc);
    Zero(ot);
    FenceRegs(sc);
    FenceRegs(ot);
    turn_begin();
    WgmmaFence();
    issue_qk(sc, i);
    issue_pv(ot, i - 1);
    WgmmaCommit();
    turn_end(i);
    WgmmaWait<0>();
    WS_PHASE(ph_mma);
    FenceRegs(sc);
    FenceRegs(ot);
    release(i - 1);
    fold(prev_tag, ot);
    softmax(cur_tag, sc, i);
  };
  int i = 1;
  for (; i < nfull; ++i) step(Unmasked{}, Unmasked{}, i);
  if (i < nact && i == nfull) step(Unmasked{}, Masked{}, i++);
  for (; i < nact; ++i) step(Masked{}, Masked{}, i);
  if (nact > 0) {  // P.V of the last tile read
    WS_PHASE(ph_math);
    float ot[64];
    Zero(ot);
    FenceRegs(ot);
    WgmmaFence();
    issue_pv(ot, nact - 1);
    WgmmaCommit();
    WgmmaWait<0>();
    WS_PHASE(ph_mma);
    FenceRegs(ot);
    release(nact - 1);
    if (nact > nfull) {
      fold(Masked{}, ot);
    } else {
      fold(Unmasked{}, ot);
    }
    WS_PHASE(ph_math);
  }
#if defined(CASCADE_WS_TRACE)
  if (phases != nullptr) {
    phases[0] = ph_wait;
    phases[1] = ph_mma;
    phases[2] = ph_math;
  }
#endif
#undef WS_PHASE
  for (int j = nact; j < ntiles; ++j) {  // tiles past this warpgroup's rows
    wait_full(j);
    turn_begin();
    turn_end(j);
    release(j);
  }
  if (m_out != nullptr) {  // the state's max (a split partial's m)
    m_out[0] = m[0];
    m_out[1] = m[1];
  }
}

// WsFoldTiles with the two-level order (super_tiles > 1, attention.h): P_{t-1} V_{t-1} is added
// in place into the current super-tile's O (scaled first by tile t - 1's alpha, or +0 at a
// super-tile's first tile), and the super-tile is folded into the row where tile t - 1 ends it:
// the order and every operation are PrefillKernel's with kSuper (PrefillTile kInPlace and its
// super-tile folds), only the schedule differs. With super_tiles 1 it gives WsFoldTiles' bits
// (each tile from +0 is its partial; checked on an H200) but ran prefill about 25% slower than
// WsFoldTiles (277 vs 369 TFLOP/s at N=4096, two calls; bench/kernels/NOTES.md), so the
// one-level order keeps WsFoldTiles.
template <bool kPingPong, int kStages, int kQRows, bool kRowWarp = false>
__device__ __forceinline__ void WsSuperTiles(const WsRing& ring, int n0, uint32_t q_addr,
                                             uint32_t q_sbo, int tile_begin, int ntiles, int lo,
                                             int hi, const int (&pos)[2], int wg, int lane,
                                             float scale_log2, int super_tiles, float (&o)[64],
                                             float (&l)[2], bool active = true,
                                             float* m_out = nullptr, int kv_len = INT_MAX) {
  constexpr int kHalves = kRowWarp ? 1 : 2;
  const int t4 = lane & 3;
  const bool rows = !kRowWarp || active;  // this warp runs the softmax and the folds
  // Tiles this warpgroup reads: a prefix of the item's (ts <= hi).
  const int nact = hi < 0 ? 0 : min(ntiles, max(0, (hi / kT) - tile_begin + 1));
  // The row state (m, l, o) and the current super-tile's (sm, sl, so; attention.h: accumulated in
  // place, folded into the row's at the super-tile's end). With super_tiles 1 every tile is a
  // super-tile: so is the tile's partial O_t from +0 and the fold is PrefillTile's.
  float m[2] = {-INFINITY, -INFINITY};
  l[0] = l[1] = 0.f;
  Zero(o);
  float sm[2] = {-INFINITY, -INFINITY}, sl[2] = {0.f, 0.f}, alpha[2] = {0.f, 0.f};
  float so[64];
  Zero(so);
  uint32_t pa[kT / 16][4];
  if (kRowWarp) {  // the inactive warps' P operands (their rows' products are never read)
#pragma unroll
    for (int kk = 0; kk < kT / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  }
  const uint64_t dq = WgmmaDesc(q_addr, 16, q_sbo);
  auto issue_qk = [&](float(&sc)[32], uint64_t dk) { IssueQk<kQRows>(sc, dq, dk); };
  auto stage = [&](int i) { return (n0 + i) % kStages; };
  auto wait_full = [&](int i) { MbarWait(ring.full0 + 8 * stage(i), ((n0 + i) / kStages) & 1); };
  auto land = [&](int i) {  // as WsFoldTiles'
    wait_full(i);
    WsZeroVTail(ring, stage(i), kv_len - (tile_begin + i) * kT, 1 + wg);
  };
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
  // Tile i's softmax against the super-tile state (P into pa, its scale factor into alpha); a
  // super-tile's first tile starts from the empty state. mask_tag: std::true_type when some key
  // of the tile is past some row's position (the diagonal, the sequence's last tile).
  auto softmax = [&](auto mask_tag, float(&sc)[32], int i) {
    if (!rows) return;
    if ((tile_begin + i) % super_tiles == 0) {
      sm[0] = sm[1] = -INFINITY;
      sl[0] = sl[1] = 0.f;
    }
    WgSoftmaxInPlace<decltype(mask_tag)::value, kHalves>(sc, pos, (tile_begin + i) * kT, t4,
                                                         scale_log2, sm, sl, alpha, pa);
  };
  // Before tile i's P V goes into so: so scaled by tile i's alpha, or +0 at a super-tile's first.
  auto rescale = [&](int i) {
    if (!rows) return;
    if ((tile_begin + i) % super_tiles == 0) {
      Zero(so);
    } else {
#pragma unroll
      for (int e = 0; e < 64; ++e) {
        const int h = (e >> 1) & 1;
        if (h < kHalves) so[e] = __fmul_rn(so[e], alpha[h]);
      }
    }
  };
  // After tile i's P V: at its super-tile's end (or the warpgroup's last tile), the fold of the
  // super-tile's state into the row's (skipped for a row that saw none of its keys).
  auto fold_super = [&](int i) {
    if (!rows || ((tile_begin + i + 1) % super_tiles != 0 && i != nact - 1)) return;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      if (sm[h] == -INFINITY) continue;
      const FoldWeights w = Fold(m[h], sm[h]);
      l[h] = FoldElem(l[h], w, sl[h]);
#pragma unroll
      for (int e = 0; e < 64; ++e) {
        if (((e >> 1) & 1) == h) o[e] = FoldElem(o[e], w, so[e]);
      }
      m[h] = w.m;
    }
  };
  using Masked = std::true_type;
  using Unmasked = std::false_type;
  // Tiles [0, nfull) are fully visible to every row of the warpgroup (ts + 63 <= lo).
  const int nfull = min(nact, max(0, (lo + 1) / kT - tile_begin));

  if (kPingPong && wg == 1) NamedBarArrive(2, 256);  // warpgroup 0 issues first
  if (nact > 0) {                                    // tile 0: S only
    land(0);
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
  // Tile i: S_i issued with P_{i-1} V_{i-1} (into so, scaled first); once they are done tile
  // i - 1's stage goes back to the load warp (its copies then overlap this tile's math), then
  // tile i - 1's super-tile fold where it ends one and the softmax of tile i.
  auto step = [&](auto cur_tag, int i) {
    land(i);
    float sc[32];
    Zero(sc);
    rescale(i - 1);
    FenceRegs(sc);
    FenceRegs(so);
    turn_begin();
    WgmmaFence();
    issue_qk(sc, desc_k(i));
    IssuePv(so, pa, desc_v(i - 1));
    WgmmaCommit();
    turn_end(i);
    WgmmaWait<0>();
    FenceRegs(sc);
    FenceRegs(so);
    release(i - 1);
    fold_super(i - 1);
    softmax(cur_tag, sc, i);
  };
  int i = 1;
  for (; i < nfull; ++i) step(Unmasked{}, i);
  for (; i < nact; ++i) step(Masked{}, i);
  if (nact > 0) {  // P.V of the last tile read
    rescale(nact - 1);
    FenceRegs(so);
    WgmmaFence();
    IssuePv(so, pa, desc_v(nact - 1));
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(so);
    release(nact - 1);
    fold_super(nact - 1);
  }
  for (int j = nact; j < ntiles; ++j) {  // tiles past this warpgroup's rows
    wait_full(j);
    turn_begin();
    turn_end(j);
    release(j);
  }
  if (m_out != nullptr) {  // the state's max (a split partial's m)
    m_out[0] = m[0];
    m_out[1] = m[1];
  }
}

// The warp-specialized prefill form (v8, described above), persistent: a fixed grid (at most one
// CTA per SM) walks the (item, kv head) works, CTA c taking works c, 2P - 1 - c, 2P + c, ... of the
// plan's order (P CTAs; a snake over the longest-first items, which balances them as well as
// taking from a counter would: the causal items of one sequence differ by one tile a step). Every
// warp walks the same list. The load warps' ring runs on from one work into the next (warp w
// copies the ring's tiles n = w mod 2), so a work's first tiles land while the one before is still
// being computed; two item warps (2 and 3, one per consumer warpgroup's 64 q-rows) copy a work's
// Q rows into one of two Q buffers and put its rows' positions and output rows into shared memory
// while the consumers compute the work before. Launching a CTA per work cost about 13 tiles'
// time a work (the CTA's start, its Q rows and first tiles, its end: bench/kernels/NOTES.md).
// kSuper: the two-level order (k.super_tiles > 1: WsSuperTiles), else WsFoldTiles.
// kSplit: the works are wide cascade items (AttentionPlanView::num_wide; decode rows reading
// shared tiles, 128 / group rows an item): each writes its state after its tiles, from the empty
// state, as the split kernel's partial at the slot of its last tile (a fold item's run from tile
// 0, or one super-tile: the partial the split kernel writes, which folding into the empty state
// copies), or with kFoldFinish its rows' outputs.
constexpr int kPwItemBufs = 2;
// A per-work timeline of this kernel (bench only: builds configured with -DCASCADE_WS_TRACE=ON,
// bench/kernels/ws_trace.py reads it): lane 0 of the item, load and consumer warps stamp clock64
// at the points below into work w's kWsTraceSlots slots, the CTA its clock64 and globaltimer at
// its start and end after the works (so cycles convert to time); the product build compiles none
// of it (PW_STAMP is empty).
#if defined(CASCADE_WS_TRACE)
enum WsTraceSlot {
  kTrItemBegin,    // item warp 0: work taken
  kTrItemBuffer,   // ... its buffer free (the consumers read its work of two before)
  kTrItemRows,     // ... (before kTrItemBuffer) its fields, rows, positions and slot bases read
  kTrItemFull,     // ... the Q rows landed: item_full arrival
  kTrItem1Buffer,  // item warp 1: its buffer free
  kTrItem1Full,    // ... its Q rows landed
  kTrLoadBegin,    // load warp 0: its first tile of the work to issue (may wait for a stage)
  kTrLoadEnd,      // ... its last tile of the work issued
  kTrWg0Wait,      // consumer warpgroup 0 (warp 4): waits for the work's item buffer
  kTrWg0Start,     // ... the item is there
  kTrWg0Tiles,     // ... its tile loop done
  kTrWg0Stored,    // ... its outputs or partials stored
  kTrWg1Start,     // consumer warpgroup 1 (warp 8): the item is there
  kTrWg1Tiles,     // ... its tile loop done
  kTrWg1Stored,    // ... stored
  // Warpgroup 0's tile loop of a plain work (not a pair, one-level order) by phase, cycles summed
  // over its tiles (durations, not stamps): waiting for the tiles to land; from its MMAs' issue
  // to their wait's return; the rest (stage release, fold, softmax).
  kTrWg0PhaseWait,
  kTrWg0PhaseMma,
  kTrWg0PhaseMath,
  kTrMeta,  // cta | j << 12 | ntiles << 32 | q-rows << 48 | fold << 60 (item warp 0)
  kWsTraceSlots
};
static_assert(kWsTraceSlots == kTraceSlotsPerWork, "launchers.h: the bench's trace layout");
// A kernel's timeline buffer (SetWsTrace, SetDwTrace): [works][kWsTraceSlots] stamps, then 4 a
// CTA; stamps == nullptr: none.
struct TraceBuf {
  uint64_t* stamps;
  int works;
  __device__ __forceinline__ void Stamp(int w, int slot, uint64_t v) const {
    if (stamps != nullptr && w < works) stamps[static_cast<int64_t>(w) * kWsTraceSlots + slot] = v;
  }
  // This CTA's 4 stamps (clock64 and globaltimer at its start and end).
  __device__ __forceinline__ uint64_t* Cta() const {
    return stamps + static_cast<int64_t>(works) * kWsTraceSlots + blockIdx.x * 4;
  }
  __device__ __forceinline__ void StampCta(int slot, uint64_t v) const {
    if (stamps != nullptr) Cta()[slot] = v;
  }
};
__device__ TraceBuf g_ws_trace = {nullptr, 0};
__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define PW_STAMP(lane, w, slot) \
  if ((lane) == 0) g_ws_trace.Stamp((w), (slot), static_cast<uint64_t>(clock64()))
#else
#define PW_STAMP(lane, w, slot) ((void)0)
#endif
struct PwItem {
  int tile_begin, ntiles, nq, kvh, fold;
  int lo[2], hi[2];    // a consumer warpgroup's lowest and highest row position (INT_MAX / -1)
  int pos[kWgRows];    // q-row positions, -1 past nq
  int row[kWgRows];    // q-row qi's token row (output row)
  int pbase[kWgRows];  // its row's first partial slot (k.partial_base) where the work writes some
};
struct PwShared {
  uint64_t full[kWsStages];
  uint64_t empty[kWsStages];
  uint64_t item_full[kPwItemBufs];   // item buffer b filled (both item warps)
  uint64_t item_empty[kPwItemBufs];  // ... and read (the eight consumer warps)
  PwItem item[kPwItemBufs];
};
// The j-th work of this CTA (the snake above), and how many works it has of `works`.
__device__ __forceinline__ int PwWork(int j) {
  const int c = static_cast<int>(blockIdx.x), P = static_cast<int>(gridDim.x);
  return j * P + ((j & 1) ? P - 1 - c : c);
}
__device__ __forceinline__ int PwWorks(int works) {
  const int c = static_cast<int>(blockIdx.x), P = static_cast<int>(gridDim.x);
  const int rounds = works / P, last = (rounds & 1) ? P - 1 - c : c;
  return rounds + (last < works % P ? 1 : 0);
}

template <bool kPingPong, int kStages, int kPiece, bool kSuper = false, bool kSplit = false>
__global__ void __launch_bounds__(kWsThreads, 1)
    PrefillWsKernel(const TileKernelArgs k, int items, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Graph mode (wide items): the count on the device, written before the graph ran (read before
  // the wait, as in ForEachSplitItem).
  if (k.item_count != nullptr) items = *k.item_count;
  // The planner's schedule, like the count the host's (read before the wait).
  int range0 = -1, range1 = 0;
  if (kSplit && k.wide_sched != nullptr) {
    range0 = k.wide_sched[blockIdx.x];
    range1 = k.wide_sched[blockIdx.x + 1];
  }
  // Each warp waits for the previous kernel where it first needs what that kernel wrote (Q, the
  // KV cache): the item and load warps read their first work's fields, rows, positions and first
  // cache rows (metadata, ops.h) before, so those round trips overlap the previous kernel's tail
  // (a wide chain's first tile had waited ~5 us for them after the wait).
#if defined(CASCADE_WS_TRACE)
  if (threadIdx.x == 0) {
    g_ws_trace.StampCta(0, static_cast<uint64_t>(clock64()));
    g_ws_trace.StampCta(1, GlobalTimer());
  }
#endif
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ PwShared sh;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  // Q buffer b at b * kWgRows * kWgRowBytes; the K/V stages after them.
  unsigned char* KVs = smem + kPwItemBufs * kWgRows * kWgRowBytes;
  const uint32_t qs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto bar = [](uint64_t& b) { return static_cast<uint32_t>(__cvta_generic_to_shared(&b)); };
  const WsRing ring{bar(sh.full[0]), bar(sh.empty[0]),
                    static_cast<uint32_t>(__cvta_generic_to_shared(KVs)), KVs};

  const AttentionArgs& a = k.a;
  const int hkv = a.cache.num_kv_heads, G = a.num_q_heads / hkv;
  // Works (item, kv head): kv head fastest (FinalCtaOf's order), the CTA's j-th the snake's
  // (PwWork). With the planner's schedule (wide items, AttentionPlan::wide_sched) this CTA's are
  // the range [wide_sched[c], wide_sched[c + 1]), kv head slowest (one pass over the items per kv
  // head: the planner spaces the long items out within a pass, so that consecutive ranges
  // balance).
  const int njobs = range0 >= 0 ? range1 - range0 : PwWorks(items * hkv);
  auto work_of = [range0](int j) { return range0 >= 0 ? range0 + j : PwWork(j); };
  auto item_of = [=](int w) { return range0 >= 0 ? w % items : w / hkv; };
  auto kvh_of = [=](int w) { return range0 >= 0 ? w / items : w % hkv; };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(bar(sh.full[s]), 1);
      MbarInit(bar(sh.empty[s]), 8);
    }
    for (int b = 0; b < kPwItemBufs; ++b) {
      MbarInit(bar(sh.item_full[b]), 2);
      MbarInit(bar(sh.item_empty[b]), 8);
    }
    MbarInitFence();
  }
  __syncthreads();

  if (warp < 4) {  // ---------------------------------------------------- load and item warps
    // 24 / 240 registers for prefill; the wide kernel's (kSplit) item warps hold more across
    // their buffer wait (a work's metadata, the work before's key), and at 24 they spilled ~144
    // bytes a thread whose reloads sat after the wait: 40 / 232 there (ptxas: 24 bytes spilled
    // over the kernel), shared prefix 51.6-51.8 vs 53.1 us back to back (session 34).
    SetMaxRegsDec<kSplit ? 40 : 24>();
    if (warp < kWsLoadWarps) {  // load warp: the ring's tiles n = warp, warp + 2, ...
      int n = 0;
      for (int j = 0; j < njobs; ++j) {
        const int w = work_of(j);
        const int32_t* it = k.items + static_cast<int64_t>(item_of(w)) * kItemFields;
        const int kvh = kvh_of(w);
        const int table_offset = it[0], tile_begin = it[1], ntiles = it[2] - it[1];
        const int kv_len = it[5];
        const int first = (warp - n) & 1;  // the item's first tile at ring position n = warp mod 2
        if (warp == 0) PW_STAMP(lane, w, kTrLoadBegin);
        const int first_row =
            WsPieceRow<kPiece>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, first);
        if (j == 0) WaitForPriorGrids();  // (the cache rows are the previous kernel's)
        WsLoadTiles<kStages, kPiece, false>(a, &tk, &tv, ring, n, table_offset, tile_begin, ntiles,
                                            kv_len, kvh, lane, first_row, first, kWsLoadWarps);
        if (warp == 0) PW_STAMP(lane, w, kTrLoadEnd);
        n += ntiles;
      }
    } else {  // item warp u = warp - 2: q-rows [64 u, 64 u + 64) of each work
      const int u = warp - 2;
      int prev_rows = -1, prev_key = -1;  // the work before's first item row and (nq, kvh, kind)
      for (int j = 0; j < njobs; ++j) {
        const int w = work_of(j);
        const int b = j % kPwItemBufs;
        if (u == 0) PW_STAMP(lane, w, kTrItemBegin);
        const int32_t* it = k.items + static_cast<int64_t>(item_of(w)) * kItemFields;
        const int kvh = kvh_of(w);
        // Every field in registers before the buffer wait (its memory clobber would make the
        // compiler load them again after it: a global round trip after the buffer freed).
        const int tile_begin = it[1], tile_end = it[2], row_begin = it[3], nq = it[4] * G;
        const int fold = it[6];
        // Partials: each row's slot base too (the consumers' stores), read beside its position.
        const bool part = kSplit && fold != kFoldFinish;
        // A wide work on the same rows, kv head and kind as the one before (consecutive one-tile
        // works of a shared run: the planner's ranges walk a kv head's items in order) takes its
        // Q rows, positions and slot bases from its buffer by a shared-memory copy instead of two
        // more dependent global round trips (prefill's works never share rows).
        const int key = nq << 16 | kvh << 1 | (part ? 1 : 0);
        const bool same = kSplit && j > 0 && row_begin == prev_rows && key == prev_key;
        prev_rows = row_begin;
        prev_key = key;
        // The lane's q-rows 64 u + lane, + 32: their rows, positions and slot bases, read before
        // the work's buffer is free (the fields, rows and positions are metadata, ops.h), so that
        // once it is only the Q copies (or the copy from the buffer before) are left: the shared
        // prefix's one-tile works had waited on these round trips after the buffer freed.
        int row[2] = {-1, -1}, p[2] = {-1, -1}, pb[2] = {0, 0};
        if (!same) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qi = 64 * u + lane + 32 * h;
            row[h] = qi < nq ? k.item_rows[row_begin + qi / G] : -1;
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            p[h] = row[h] >= 0 ? a.positions[row[h]] : -1;
            pb[h] = part && row[h] >= 0 ? k.partial_base[row[h]] : 0;
          }
        }
#if defined(CASCADE_WS_TRACE)
        if (u == 0) {  // the metadata arrived: the shuffle waits for every lane's, the stamp for it
          const int v = __shfl_xor_sync(0xffffffffu, p[0] ^ p[1] ^ pb[0] ^ pb[1], 1);
          if (lane == 0) {
            if (v == INT_MIN) g_ws_trace.Stamp(w, kTrMeta, 0);  // (never)
            g_ws_trace.Stamp(w, kTrItemRows, static_cast<uint64_t>(clock64()));
            g_ws_trace.Stamp(w, kTrMeta,
                             blockIdx.x | static_cast<uint64_t>(j & 0xfffff) << 12 |
                                 static_cast<uint64_t>((tile_end - tile_begin) & 0xffff) << 32 |
                                 static_cast<uint64_t>(nq & 0xfff) << 48 |
                                 static_cast<uint64_t>(fold & 0xf) << 60);
          }
        }
#endif
        if (j == 0) WaitForPriorGrids();  // (Q is the previous kernel's)
        if (j >= kPwItemBufs) {           // buffer b's work j - 2 read by the consumers
          MbarWait(bar(sh.item_empty[b]), ((j - kPwItemBufs) / kPwItemBufs) & 1);
        }
        PW_STAMP(lane, w, u == 0 ? kTrItemBuffer : kTrItem1Buffer);
        PwItem& d = sh.item[b];
        unsigned char* Qs = smem + b * kWgRows * kWgRowBytes;
        int wmin = INT_MAX, wmax = -1;
        if (same) {
          static_assert(kPwItemBufs == 2, "work j - 1 is in buffer b ^ 1");
          const PwItem& e = sh.item[b ^ 1];
          const unsigned char* Qe = smem + (b ^ 1) * kWgRows * kWgRowBytes;
          // This warp's 64 rows are 8 KB in each column half of the swizzled buffer
          // (SwizzleOffset): 1024 16-byte pieces.
          for (int i = lane; i < 1024; i += 32) {
            const int off = (i >> 9) * kWgRows * 128 + u * 8192 + (i & 511) * 16;
            *reinterpret_cast<uint4*>(Qs + off) = *reinterpret_cast<const uint4*>(Qe + off);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qi = 64 * u + lane + 32 * h;
            d.row[qi] = e.row[qi];
            d.pos[qi] = e.pos[qi];
            d.pbase[qi] = e.pbase[qi];
          }
          wmin = e.lo[u];
          wmax = e.hi[u];
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qi = 64 * u + lane + 32 * h;
            const __nv_bfloat16* src = row[h] >= 0
                                           ? reinterpret_cast<const __nv_bfloat16*>(a.q) +
                                                 static_cast<int64_t>(row[h]) * a.q_row_stride +
                                                 (kvh * G + qi % G) * kWgD
                                           : reinterpret_cast<const __nv_bfloat16*>(a.q);
#pragma unroll 1
            for (int cc = 0; cc < kWgD / 8; ++cc) {
              CpAsync16Z(Qs + SwizzleOffset(kWgRows, qi, cc), src + (row[h] >= 0 ? cc * 8 : 0),
                         row[h] >= 0 ? 16 : 0);
            }
          }
          CpAsyncCommit();
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int qi = 64 * u + lane + 32 * h;
            d.row[qi] = row[h];
            d.pos[qi] = p[h];
            d.pbase[qi] = pb[h];
            if (p[h] >= 0) {
              wmin = min(wmin, p[h]);
              wmax = max(wmax, p[h]);
            }
          }
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) {
            wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, off));
            wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
          }
        }
        if (lane == 0) {
          d.lo[u] = wmin;
          d.hi[u] = wmax;
          if (u == 0) {
            d.tile_begin = tile_begin;
            d.ntiles = tile_end - tile_begin;
            d.nq = nq;
            d.kvh = kvh;
            d.fold = fold;
          }
        }
        CpAsyncWait<0>();
        FenceProxyAsync();  // the Q rows are read by wgmma (the async proxy)
        __syncwarp();
        PW_STAMP(lane, w, u == 0 ? kTrItemFull : kTrItem1Full);
        if (lane == 0) MbarArrive(bar(sh.item_full[b]));
      }
    }
  } else {  // --------------------------------------------------------------------- consumers
    SetMaxRegsInc<kSplit ? 232 : 240>();
    WaitForPriorGrids();  // (nothing to do before their first work: they store after the items)
    const int cw = warp - 4, wg = cw >> 2;
    int n = 0;
    for (int j = 0; j < njobs; ++j) {
      const int b = j % kPwItemBufs;
#if defined(CASCADE_WS_TRACE)  // (the work recomputed at each stamp: no register held)
      if (cw == 0) PW_STAMP(lane, work_of(j), kTrWg0Wait);
#endif
      MbarWait(bar(sh.item_full[b]), (j / kPwItemBufs) & 1);
#if defined(CASCADE_WS_TRACE)
      if (cw % 4 == 0) PW_STAMP(lane, work_of(j), wg == 0 ? kTrWg0Start : kTrWg1Start);
#endif
      const PwItem& d = sh.item[b];
      const int tile_begin = d.tile_begin, ntiles = d.ntiles;
      // kFoldPair: both warpgroups take the item's q-rows (at most 64: warpgroup 0's), each its
      // own tile of the two, each written as its own partial.
      const bool pair = kSplit && !kSuper && d.fold == kFoldPair;
      const int qi0 = (pair ? cw & 3 : cw) * 16 + (lane >> 2);  // this lane's q-rows qi0, qi0 + 8
      const int pos[2] = {d.pos[qi0], d.pos[qi0 + 8]};
      const uint32_t q_addr = qs_addr + b * kWgRows * kWgRowBytes + (pair ? 0 : wg * 64 * 128);
      float o[64], l[2], m[2];
      if (pair) {  // warpgroup wg computes ring tile n + wg (the item's tile wg), passes the other
        if (wg == 1) WsSkipTile<kStages>(ring, n, lane);
        WsFoldTiles<kPingPong, kStages, kWgRows>(ring, n + wg, q_addr, 1024, tile_begin + wg, 1,
                                                 d.lo[0], d.hi[0], pos, wg, lane, k.scale_log2, o,
                                                 l, true, m);
        if (wg == 0) WsSkipTile<kStages>(ring, n + 1, lane);
      } else if constexpr (kSuper) {
        WsSuperTiles<kPingPong, kStages, kWgRows>(ring, n, q_addr, 1024, tile_begin, ntiles,
                                                  d.lo[wg], d.hi[wg], pos, wg, lane, k.scale_log2,
                                                  k.super_tiles, o, l, true, kSplit ? m : nullptr);
      } else {
#if defined(CASCADE_WS_TRACE)
        uint64_t phases[3] = {0, 0, 0};
#else
        uint64_t* phases = nullptr;
#endif
        WsFoldTiles<kPingPong, kStages, kWgRows>(ring, n, q_addr, 1024, tile_begin, ntiles,
                                                 d.lo[wg], d.hi[wg], pos, wg, lane, k.scale_log2, o,
                                                 l, true, kSplit ? m : nullptr, phases);
#if defined(CASCADE_WS_TRACE)
        if (cw == 0 && lane == 0) {
          for (int p = 0; p < 3; ++p) g_ws_trace.Stamp(work_of(j), kTrWg0PhaseWait + p, phases[p]);
        }
#endif
      }
      n += ntiles;
#if defined(CASCADE_WS_TRACE)
      if (cw % 4 == 0) PW_STAMP(lane, work_of(j), wg == 0 ? kTrWg0Tiles : kTrWg1Tiles);
#endif
      // Every MMA of the work has completed (each was waited for); its fields are read before
      // the item buffer may refill.
      const int nq = d.nq, kvh = d.kvh, row0 = d.row[qi0], row1 = d.row[qi0 + 8];
      const bool partial = kSplit && d.fold != kFoldFinish;
      const int pbase0 = d.pbase[qi0], pbase1 = d.pbase[qi0 + 8];
      __syncwarp();
      if (lane == 0) MbarArrive(bar(sh.item_empty[b]));
      if (partial) {  // the split kernel's partial: O unnormalized, (m, l), at the last tile's slot
        const int hq = a.num_q_heads;
        const int last =
            pair ? tile_begin + wg : (tile_begin + ntiles - 1) / (kSuper ? k.super_tiles : 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qi = qi0 + 8 * h;
          if (qi >= nq) continue;
          const int64_t slot =
              static_cast<int64_t>((h ? pbase1 : pbase0) + last) * hq + kvh * G + qi % G;
          WgStorePartial(a, slot, lane, o, h, m[h], l[h]);
        }
      } else {
        WgStoreRowsBy(a, nq, kvh, cw * 16, lane, o, l,
                      [&](int qi) { return qi >= qi0 + 8 ? row1 : row0; });
      }
#if defined(CASCADE_WS_TRACE)
      if (cw % 4 == 0) PW_STAMP(lane, work_of(j), wg == 0 ? kTrWg0Stored : kTrWg1Stored);
#endif
    }
  }
#if defined(CASCADE_WS_TRACE)
  __syncthreads();
  if (threadIdx.x == 0) {
    g_ws_trace.StampCta(2, static_cast<uint64_t>(clock64()));
    g_ws_trace.StampCta(3, GlobalTimer());
  }
#endif
#else
  __trap();  // launched only on devices with sm_90a machine code (WgmmaAvailable)
#endif
}

// Decode rows on Hopper (sm_90a, head_dim 128): split form 3 (SplitForm), plans whose split
// items are all whole decode rows of at most kDwQRows q-rows (one row each, group <= 8,
// kFoldFinish from tile 0), and split form 6, the rows' own tiles after wide cascade items (one
// row an item): an item that does not finish its rows writes the split kernel's partials, one per
// slot (a tile, or a super-tile) from the empty state, or one at its last tile's slot for a fold
// from tile 0, and the merge folds them. The shared-memory split form copies each tile and then
// waits for it, so it reads at 83-96% of the copy bandwidth at contexts of 1k-4k
// (bench/kernels/RESULTS.md). Here a fixed grid (one CTA per SM) runs the items (x kv heads)
// persistently: each CTA's two consumer warpgroups take (item, kv head) works in the plan's order
// (longest first), the first three rounds dealt out (the second in reverse) and the rest from a
// shared counter (a greedy longest-processing-time schedule, so rows of mixed lengths end
// together), each fed by two warps of its own: an item warp that takes the consumer's next work
// once it is on the one before (two before, after a short work: kDwShortTiles) and puts its Q rows
// (into one of kDwItemBufs 8-row swizzled buffers), positions, output rows, fields and first-tile
// cache rows into shared memory, and a load warp whose ring of kDwStages K/V stages runs on into
// the next work while the consumer computes the current one. Per item the consumer runs
// PrefillWsKernel's tile loop (WsFoldTiles) from the empty state and writes the outputs: a row's
// bits are the prefill kernel's, which are the split kernel's (cuda_attention_test:
// PrefillKernelsAgreeBitwise, CachedPrefillEqualsColdPrefillBitwise,
// PersistentDecodeFormEqualsSplitFormsBitwise). Q is read with an 8-row-group stride of 0, so the
// warpgroup's 64 MMA rows repeat the buffer's 8: one warp of the four (its lanes' first rows) runs
// the softmax and fold and stores the rows; the others only take part in the MMAs (measured: the
// consumer's instructions, not the copies, bound short rows; bench/kernels/NOTES.md).
constexpr int kDwStages = 3;
constexpr int kDwQRows = 8;
static_assert(kDwQRows == kN8QRows, "the decode-shaped consumer's Q columns");
constexpr int kDwQBytes = kDwQRows * kWgRowBytes;
// Item buffers per consumer: its current work and up to two taken ahead (kDwShortTiles).
constexpr int kDwItemBufs = 3;
// A consumer's item warp takes a work two ahead of it (not one) after a work of at most this
// many tiles: finding a work (the counter, its fields, its row, then Q and its first cache
// rows: four dependent global round trips) takes about as long as a consumer needs for a work
// of three tiles, which then waited on it (bench/kernels/NOTES.md); long works keep one ahead,
// so that the last works go to whichever consumers are free first.
constexpr int kDwShortTiles = 8;
// (then each consumer's scratch of the decode-shaped form, WsFoldTilesN8)
constexpr size_t kDwSmemBytes =
    1024 + 2 * (kDwItemBufs * kDwQBytes + 2 * kDwStages * kWgTileBytes + kN8ScratchBytes);

// DecodeWsKernel's per-work timeline (bench only, as PrefillWsKernel's: builds configured with
// -DCASCADE_WS_TRACE=ON, `cuda_attention_bench --trace`, bench/kernels/ws_trace.py --dw): lane 0
// of consumer c's item warp and of its row warp stamp clock64 at the points below into work w's
// kWsTraceSlots slots of g_dw_trace, each CTA its clock64 and globaltimer at its start and end.
#if defined(CASCADE_WS_TRACE)
enum DwTraceSlot {
  kDwTrTake,    // item warp: its buffer free, about to take a work
  kDwTrTaken,   // ... the work's index known (the counter answered)
  kDwTrRows,    // ... the work's rows' positions read (its Q copies in flight)
  kDwTrFull,    // ... its Q rows landed: item_full arrival
  kDwTrStart,   // consumer (row warp): the work is there
  kDwTrStored,  // ... its tiles folded and its partials or rows stored
  kDwTrTile0,   // ... its first tile landed (a trace-only wait on the stage)
  // The row warp's tile loops of the work (64-row consumer form) by phase, cycles summed over its
  // tiles (durations, not stamps; WsFoldTiles' `phases`): waiting for the tiles to land (and, on
  // a kTmaTail ring, zeroing V's tail rows); from its MMAs' issue to their wait's return; the
  // rest (release, fold, softmax).
  kDwTrPhaseWait,
  kDwTrPhaseMma,
  kDwTrPhaseMath,
  kDwTrMeta = kWsTraceSlots - 1,  // cta | c << 12 | j << 13 | tiles << 32 | q-rows << 48 | fold
};
__device__ TraceBuf g_dw_trace = {nullptr, 0};
#define DW_STAMP(lane, w, slot) \
  if ((lane) == 0) g_dw_trace.Stamp((w), (slot), static_cast<uint64_t>(clock64()))
#else
#define DW_STAMP(lane, w, slot) ((void)0)
#endif

// An item as its item warp leaves it in shared memory for the load warp and the consumer.
struct DwItem {
  int work;  // the (item, kv head) work (item * kv heads + kv head); -1: no more (the walk ends)
  int table_offset, tile_begin, ntiles, kv_len, nq;
  int fold;                // item field 6 (kFoldNone / kFoldPartial / kFoldFinish)
  int pos[kDwQRows];       // q-row positions, -1 past nq
  int row[kDwQRows];       // q-row qi's token row (output row)
  int first_row[kT / 16];  // lane p's WsPieceRow of tile 0
};
struct DwShared {
  uint64_t full[2][2 * kDwStages];  // (2 kDwStages: a half-stage ring's)
  uint64_t empty[2][2 * kDwStages];
  uint64_t item_full[2][kDwItemBufs];   // consumer c's item buffer b filled (its item warp)
  uint64_t item_empty[2][kDwItemBufs];  // ... and done with (its consumer's four warps)
  DwItem item[2][kDwItemBufs];
};

// work: [2] device ints, zero at launch: the next work to take, and the item warps that found
// none left; the last of those sets both back to zero for the next launch (so a graph replays
// the kernel as it is; launches that share `work` must not overlap). kSuper: the two-level order
// (WsSuperTiles), else WsFoldTiles. kHalf (16-token pieces, the one-level order, the 64-row
// consumer form): each consumer's ring is a half-stage ring (WsLoadHalves), whose zeroed V half
// sits where the decode-shaped form's scratch would be (that form does not run then).
template <int kPiece, bool kSuper = false, bool kHalf = false>
__global__ void __launch_bounds__(kWsThreads, 1)
    DecodeWsKernel(const TileKernelArgs k, int items, int* work,
                   const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kT / kPiece <= kT / 16, "first_row holds a tile's pieces");
  static_assert(!kHalf || (kPiece == kPieceTokens && !kSuper), "the half-stage ring's form");
  static_assert(2 * kN8ScratchBytes >= kWgTileBytes / 2, "the zeroed V half");
  constexpr int kRing = kHalf ? 2 * kDwStages : kDwStages;  // ring slots a consumer
  constexpr int kTileSlots = kHalf ? 2 : 1;                 // ... a whole tile takes
  // The count is read before the wait for the previous kernel (as in ForEachSplitItem).
  const int count = k.item_count != nullptr ? *k.item_count : items;
  // After the wide cascade kernel (k.after_wide): as ForEachSplitItem, run without waiting for it
  // (the items read Q and the KV cache, complete once it let this kernel launch, and write
  // partials and rows it does not touch); wait for it last, for the merge. Else each warp waits
  // for the previous kernel where it first needs what that kernel wrote (Q, the KV cache, the
  // counter `work`): the item and load warps read their first work's fields, rows, positions and
  // first cache rows (metadata, ops.h) before, so those round trips overlap the previous
  // kernel's tail instead of following it.
  if (k.after_wide) LetDependentsLaunch();
  auto wait_prior = [&] {
    if (!k.after_wide) WaitForPriorGrids();
  };
#if defined(CASCADE_WS_TRACE)
  if (threadIdx.x == 0) {
    g_dw_trace.StampCta(0, static_cast<uint64_t>(clock64()));
    g_dw_trace.StampCta(1, GlobalTimer());
  }
#endif
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ DwShared sh;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // Consumer c's Q buffer b at (kDwItemBufs c + b) * kDwQBytes; the stages after the Q buffers.
  auto q_offset = [](int c, int b) { return (kDwItemBufs * c + b) * kDwQBytes; };
  auto bar = [](uint64_t& b) { return static_cast<uint32_t>(__cvta_generic_to_shared(&b)); };
  auto ring_of = [&](int c) {
    const int off = 2 * kDwItemBufs * kDwQBytes + c * 2 * kDwStages * kWgTileBytes;
    const uint32_t zero_v =
        kHalf ? smem_addr + 2 * kDwItemBufs * kDwQBytes + 2 * 2 * kDwStages * kWgTileBytes : 0;
    return WsRing{bar(sh.full[c][0]), bar(sh.empty[c][0]), smem_addr + off, smem + off, zero_v};
  };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    for (int c = 0; c < 2; ++c) {
      for (int s = 0; s < kRing; ++s) {
        MbarInit(bar(sh.full[c][s]), 1);
        MbarInit(bar(sh.empty[c][s]), 4);
      }
      for (int b = 0; b < kDwItemBufs; ++b) {
        MbarInit(bar(sh.item_full[c][b]), 1);
        MbarInit(bar(sh.item_empty[c][b]), 4);
      }
    }
    MbarInitFence();
  }
  // Q buffers start as zeros: rows past an item's q-rows are multiplied, never stored.
  for (int i = tid; i < 2 * kDwItemBufs * kDwQBytes / 16; i += kWsThreads) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  }
  if (kHalf) {  // the zeroed V half (read by P V for a one-half tile's keys 32-63)
    unsigned char* z = smem + 2 * kDwItemBufs * kDwQBytes + 2 * 2 * kDwStages * kWgTileBytes;
    for (int i = tid; i < kWgTileBytes / 2 / 16; i += kWsThreads) {
      reinterpret_cast<uint4*>(z)[i] = make_uint4(0, 0, 0, 0);
    }
  }
  FenceProxyAsync();
  __syncthreads();

  const AttentionArgs& a = k.a;
  const int hkv = a.cache.num_kv_heads, G = a.num_q_heads / hkv;
  const int works = count * hkv;  // (item, kv head) pairs, kv head fastest
  // walk_items: consumer c's works in order, each once its item warp has filled item buffer b
  // (the j-th work in buffer j % kDwItemBufs), until the buffer that says there are no more:
  // fn(item, work w, ring position n of its first tile, b, its tiles). The item buffer may be
  // refilled once the consumer has released it (item_empty): its tiles are read before fn.
  // j0, n0: the first work to walk and its first tile's ring position (the load warp walks from
  // work 1 where it found work 0 itself).
  auto walk_items = [&](int c, auto fn, int j0 = 0, int n0 = 0) {
    int n = n0;
    for (int j = j0;; ++j) {
      const int b = j % kDwItemBufs;
      MbarWait(bar(sh.item_full[c][b]), (j / kDwItemBufs) & 1);
      const DwItem& d = sh.item[c][b];
      const int w = d.work;
      if (w < 0) break;
      const int ntiles = d.ntiles;
      // (read before fn: the buffer may refill once fn released it)
      const int slots = kHalf ? WsWorkHalves(d.kv_len, d.tile_begin, ntiles) : ntiles;
      fn(d, w, n, b, ntiles);
      n += slots;
    }
  };
  if (warp < 4) {  // --------------------------------------------------- item and load warps
    // 56 / 224 registers (ptxas: fewer for these warps, which walk items too, spill them; 4 bytes
    // spilled at 224 for the consumers). setmaxnreg.inc takes only what this CTA's setmaxnreg.dec
    // released from the launch count (168 at 384 threads), and blocks until it is there: 128 x
    // (168 - 56) released = 256 x (224 - 168) taken. A larger increase hangs (session 33).
    SetMaxRegsDec<56>();
    const int c = warp & 1;
    // Consumer c's index among the grid's (consumer 0 of every CTA first): its first work.
    const int cs = c * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
    if (warp >= 2) {                                   // item warp of consumer c
      const int nc = 2 * static_cast<int>(gridDim.x);  // consumers
      int prev_tiles = 0;                              // of the work taken last
      int prev_w = 0;                                  // its index
      for (int j = 0;; ++j) {
        const int b = j % kDwItemBufs;
        // Work j is taken once the consumer is on work j - 1 (it has finished j - 2), or on
        // j - 2 after a short work (kDwShortTiles): so it holds at most one work ahead (two
        // after short ones) and the last works go to whichever consumers are free first.
        // Buffer b is free then (its work j - 3 finished).
        // Two ahead only while more than two rounds of works are left after the last one taken:
        // at the end a consumer holding two short works while others are idle would end late.
        const bool one_ahead = prev_tiles > kDwShortTiles || works - prev_w <= 2 * nc;
        if (j >= kDwItemBufs || (j >= 2 && one_ahead)) {
          const int f = one_ahead ? j - 2 : j - 3;  // the work to finish
          MbarWait(bar(sh.item_empty[c][f % kDwItemBufs]), (f / kDwItemBufs) & 1);
        }
#if defined(CASCADE_WS_TRACE)
        const uint64_t t_take = clock64();
#endif
        DwItem& d = sh.item[c][b];
        // The first three rounds of works are dealt out without the counter, one work per
        // consumer a round, consumer 0 of every CTA first (so that a step of fewer works than
        // consumers spreads them over the SMs), the second round in reverse (the plan is longest
        // first: the consumer with the longest first work gets the shortest second); the rest
        // from the counter.
        int w = j == 0 ? cs : j == 1 ? 2 * nc - 1 - cs : 2 * nc + cs;
        if (j >= 3) {
          if (lane == 0) w = 3 * nc + atomicAdd(&work[0], 1);
          w = __shfl_sync(0xffffffffu, w, 0);
        }
        if (w >= works) {
          if (j == 0) wait_prior();
          if (lane == 0) {
            d.work = -1;
            MbarArrive(bar(sh.item_full[c][b]));
            // This warp takes no more: the last of the grid's item warps to get here resets the
            // counter (every take of this launch happened before its count: fences between).
            __threadfence();
            if (atomicAdd(&work[1], 1) == 2 * static_cast<int>(gridDim.x) - 1) {
              __threadfence();
              atomicExch(&work[0], 0);
              atomicExch(&work[1], 0);
            }
          }
          break;
        }
#if defined(CASCADE_WS_TRACE)
        if (lane == 0) g_dw_trace.Stamp(w, kDwTrTake, t_take);
        DW_STAMP(lane, w, kDwTrTaken);
#endif
        const int item = w / hkv, kvh = w % hkv;
        const int32_t* it = k.items + static_cast<int64_t>(item) * kItemFields;
        const int table_offset = it[0], tile_begin = it[1], ntiles = it[2] - it[1];
        const int row_begin = it[3], nq = it[4] * G, kv_len = it[5];
        prev_tiles = ntiles;
        prev_w = w;
        // Lane q's row and position (q < kDwQRows); for work 0 read before the wait, for the
        // others after the Q copies are issued (beside them).
        int q_row = 0, q_pos = -1;
        auto read_rows = [&] {
          if (lane < kDwQRows && lane < nq) {
            q_row = k.item_rows[row_begin + lane / G];
            q_pos = a.positions[q_row];
          }
        };
        if (j == 0) {
          read_rows();
          wait_prior();
        }
        unsigned char* qbuf = smem + q_offset(c, b);
        for (int idx = lane; idx < nq * (kWgD / 8); idx += 32) {
          const int qi = idx / (kWgD / 8), cc = idx % (kWgD / 8);
          CpAsync16Z(qbuf + SwizzleOffset(kDwQRows, qi, cc),
                     QChunk<kWgD>(k, row_begin, nq, kvh, qi, cc), 16);
        }
        CpAsyncCommit();
        if (j != 0) read_rows();
        if (lane < kDwQRows) {
          d.row[lane] = q_row;
          d.pos[lane] = q_pos;
        }
#if defined(CASCADE_WS_TRACE)  // (lane 0 stored its position: it arrived)
        DW_STAMP(lane, w, kDwTrRows);
        if (lane == 0) {
          g_dw_trace.Stamp(w, kDwTrMeta,
                           blockIdx.x | static_cast<uint64_t>(c) << 12 |
                               static_cast<uint64_t>(j & 0x7ffff) << 13 |
                               static_cast<uint64_t>(ntiles & 0xffff) << 32 |
                               static_cast<uint64_t>(nq & 0xfff) << 48 |
                               static_cast<uint64_t>(it[6] & 0xf) << 60);
        }
#endif
        if (lane < kT / 16) {
          d.first_row[lane] =
              WsPieceRow<kPiece, true>(a, table_offset, tile_begin, ntiles, kv_len, kvh, lane, 0);
        }
        if (lane == 0) {
          d.work = w;
          d.table_offset = table_offset;
          d.tile_begin = tile_begin;
          d.ntiles = ntiles;
          d.kv_len = kv_len;
          d.nq = nq;
          d.fold = it[6];
        }
        CpAsyncWait<0>();
        FenceProxyAsync();  // the Q rows are read by wgmma (the async proxy)
        __syncwarp();
        DW_STAMP(lane, w, kDwTrFull);
        if (lane == 0) MbarArrive(bar(sh.item_full[c][b]));
      }
    } else {  // load warp of consumer c
      const WsRing ring = ring_of(c);
      // Work 0 is dealt out (the consumer's index): its fields and first cache rows are read
      // here, beside the item warp, so its first tiles are copied without waiting for its Q rows
      // and positions (two global round trips less before a launch's first tile).
      const int w0 = cs;
      if (w0 >= works) return;  // the item warp tells the consumer the same
      const int32_t* it = k.items + static_cast<int64_t>(w0 / hkv) * kItemFields;
      const int table_offset = it[0], tile_begin = it[1], ntiles = it[2] - it[1], kv_len = it[5];
      const int first_row =
          WsPieceRow<kPiece, true>(a, table_offset, tile_begin, ntiles, kv_len, w0 % hkv, lane, 0);
      wait_prior();  // (its cache rows are the previous kernel's)
      auto load = [&](int n, int table_offset, int tile_begin, int ntiles, int kv_len, int kvh,
                      int first_row) {
        if constexpr (kHalf) {
          WsLoadHalves<kRing>(&tk, &tv, ring, n, a, table_offset, tile_begin, ntiles, kv_len, kvh,
                              lane, first_row);
        } else {
          WsLoadTiles<kDwStages, kPiece, true>(a, &tk, &tv, ring, n, table_offset, tile_begin,
                                               ntiles, kv_len, kvh, lane, first_row);
        }
      };
      load(0, table_offset, tile_begin, ntiles, kv_len, w0 % hkv, first_row);
      walk_items(
          c,
          [&](const DwItem& d, int w, int n, int, int ntiles) {
            load(n, d.table_offset, d.tile_begin, ntiles, d.kv_len, w % hkv,
                 lane < kT / 16 ? d.first_row[lane] : 0);
          },
          1, kHalf ? WsWorkHalves(kv_len, tile_begin, ntiles) : ntiles);
    }
  } else {  // --------------------------------------------------------------------- consumers
    SetMaxRegsInc<224>();
    wait_prior();  // (nothing to do before their first work: they store after the item warps)
    const int c = (warp - 4) >> 2, cw = (warp - 4) & 3;
    const WsRing ring = ring_of(c);
    // The warp of this consumer that holds its q-rows: every 8-row group of the 64 MMA rows
    // repeats the item's 8 (Q's group stride is 0), so any warp's first rows are the q-rows;
    // ranks 2 and 3 put the two consumers' row warps on different schedulers, beside the item
    // warps (warps 2, 3) rather than the load warps (0, 1).
    const bool row_warp = cw == 2 + c;
    const int unit = kSuper ? k.super_tiles : 1;  // tiles per partial slot
    // The decode-shaped form (one-level order): its scratch after both consumers' rings.
    const bool n8 = !kSuper && !kHalf && k.dw_n8 != 0;
    const int n8_off =
        2 * kDwItemBufs * kDwQBytes + 2 * 2 * kDwStages * kWgTileBytes + c * kN8ScratchBytes;
    const N8Scratch scratch{smem + n8_off, smem_addr + n8_off};
    walk_items(c, [&](const DwItem& d, int w, int n, int b, int ntiles) {
      if (row_warp) DW_STAMP(lane, w, kDwTrStart);
#if defined(CASCADE_WS_TRACE)
      if (row_warp) {  // when the work's first tile landed (WsFoldTiles waits for it again)
        MbarWait(ring.full0 + 8 * (n % kRing), (n / kRing) & 1);
        DW_STAMP(lane, w, kDwTrTile0);
      }
#endif
      const int tile_begin = d.tile_begin, nq = d.nq, fold = d.fold, kv_len = d.kv_len;
      const int pos[2] = {row_warp ? d.pos[lane >> 2] : -1, -1};  // -1 past nq
      int lo = INT_MAX, hi = -1;
      for (int r = 0; r < nq; ++r) {
        lo = min(lo, d.pos[r]);
        hi = max(hi, d.pos[r]);
      }
      const int row = d.row[lane >> 2];
      const int kvh = w % hkv;
      // Segments: the whole item where it folds (from tile 0: kFoldPartial, kFoldFinish), else
      // one per partial slot (a tile, or a super-tile), each from the empty state, as the split
      // kernel writes them. The ring holds the item's tiles in order; each segment takes its own.
      const int tile_end = tile_begin + ntiles;
      if (n8) {
        // This thread's q-rows 2 t4 + f: positions, output rows and first partial slots, read
        // before the item buffer is given back.
        const int t4 = lane & 3, g = lane >> 2, hq = a.num_q_heads;
        int posf[2], rowf[2], pbase[2];
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          const int q = 2 * t4 + f;
          posf[f] = d.pos[q];
          rowf[f] = d.row[q];
          pbase[f] = fold != kFoldFinish && q < nq ? k.partial_base[rowf[f]] : 0;
        }
        const int row_pos = d.pos[g];
        const int pbase_g = fold != kFoldFinish && row_warp && g < nq ? k.partial_base[row] : 0;
        for (int t0 = tile_begin; t0 < tile_end;) {
          const int t1 = fold != kFoldNone ? tile_end : min(tile_end, t0 + 1);
          float o8[8], mf[2], row_m, row_l;
          WsFoldTilesN8<kDwStages>(ring, n + t0 - tile_begin, smem_addr + q_offset(c, b), scratch,
                                   1 + c, t0, t1 - t0, lo, hi, posf, row_pos, row_warp, cw, lane,
                                   k.scale_log2, o8, mf, row_m, row_l, kv_len);
          if (t1 == tile_end) {  // (every MMA of the item waited for; its fields read)
            __syncwarp();
            if (lane == 0) MbarArrive(bar(sh.item_empty[c][b]));
          }
          if (fold == kFoldFinish) {  // o / l, each q-row's l from the sum warp
            if (row_warp && t4 == 0) scratch.L()[g] = row_l;
            NamedBarSync(1 + c, 128);
            __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(a.out);
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              const int q = 2 * t4 + f;
              if (q >= nq) continue;
              const float inv = __frcp_rn(scratch.L()[q]);
              __nv_bfloat16* dst =
                  out + static_cast<int64_t>(rowf[f]) * hq * kWgD + (kvh * G + q % G) * kWgD;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int e = f; e < 4; e += 2) {
                  dst[64 * h + 16 * cw + g + 8 * (e >> 1)] =
                      __float2bfloat16_rn(__fmul_rn(o8[4 * h + e], inv));
                }
              }
            }
          } else {  // the split kernel's partial at the slot of the segment's last tile
#pragma unroll
            for (int f = 0; f < 2; ++f) {
              const int q = 2 * t4 + f;
              if (q >= nq) continue;
              const int64_t slot = static_cast<int64_t>(pbase[f] + (t1 - 1)) * hq + kvh * G + q % G;
              float* dst = a.partial_o + slot * kWgD;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int e = f; e < 4; e += 2)
                  dst[64 * h + 16 * cw + g + 8 * (e >> 1)] = o8[4 * h + e];
              }
            }
            if (row_warp && t4 == 0 && g < nq) {
              const int64_t slot = static_cast<int64_t>(pbase_g + (t1 - 1)) * hq + kvh * G + g % G;
              a.partial_ml[2 * slot] = row_m;
              a.partial_ml[2 * slot + 1] = row_l;
            }
          }
          t0 = t1;
        }
        if (row_warp) DW_STAMP(lane, w, kDwTrStored);
        return;
      }
#if defined(CASCADE_WS_TRACE)
      uint64_t ph_sum[3] = {0, 0, 0};
#endif
      for (int t0 = tile_begin; t0 < tile_end;) {
        const int t1 = fold != kFoldNone ? tile_end : min(tile_end, (t0 / unit + 1) * unit);
        float o[64], l[2], m[2];
#if defined(CASCADE_WS_TRACE)
        uint64_t ph[3] = {0, 0, 0};
        uint64_t* phases = row_warp ? ph : nullptr;
#else
        uint64_t* phases = nullptr;
#endif
        if constexpr (kSuper) {
          WsSuperTiles<false, kDwStages, kDwQRows, true>(
              ring, n + t0 - tile_begin, smem_addr + q_offset(c, b), 0, t0, t1 - t0, lo, hi, pos, c,
              lane, k.scale_log2, k.super_tiles, o, l, row_warp, m, kv_len);
        } else {
          WsFoldTiles<false, kRing, kDwQRows, true, kHalf>(
              ring, n + kTileSlots * (t0 - tile_begin), smem_addr + q_offset(c, b), 0, t0, t1 - t0,
              lo, hi, pos, c, lane, k.scale_log2, o, l, row_warp, m, phases, kv_len);
#if defined(CASCADE_WS_TRACE)
          for (int p = 0; p < 3; ++p) ph_sum[p] += ph[p];
#endif
        }
        if (t1 == tile_end) {
          // Every S of the item has completed (WsFoldTiles waited on each) and its fields are
          // read: the item buffer may refill.
          __syncwarp();
          if (lane == 0) MbarArrive(bar(sh.item_empty[c][b]));
        }
        if (row_warp && fold == kFoldFinish) {
          WgStoreRowsBy(a, nq, kvh, 0, lane, o, l, [&](int) { return row; });
        } else if (row_warp && (lane >> 2) < nq) {
          // The split kernel's partial (O unnormalized, m, l) at the slot of the segment's last
          // tile; a row that saw none of the segment's keys writes the empty state, as it does.
          const int qi = lane >> 2;
          const int64_t slot =
              static_cast<int64_t>(k.partial_base[row] + (t1 - 1) / unit) * a.num_q_heads +
              kvh * G + qi % G;
          WgStorePartial(a, slot, lane, o, 0, m[0], l[0]);
        }
        t0 = t1;
      }
      if (row_warp) DW_STAMP(lane, w, kDwTrStored);
#if defined(CASCADE_WS_TRACE)
      if (row_warp && lane == 0) {
        for (int p = 0; p < 3; ++p) g_dw_trace.Stamp(w, kDwTrPhaseWait + p, ph_sum[p]);
      }
#endif
    });
#if defined(CASCADE_WS_TRACE)  // the CTA's end: its later consumer's
    if (row_warp && lane == 0 && g_dw_trace.stamps != nullptr) {
      auto* cta = reinterpret_cast<unsigned long long*>(g_dw_trace.Cta());
      atomicMax(cta + 2, static_cast<unsigned long long>(clock64()));
      atomicMax(cta + 3, static_cast<unsigned long long>(GlobalTimer()));
    }
#endif
  }
  if (k.after_wide) WaitForPriorGrid();  // for the merge: the wide kernel's partials
#else
  __trap();  // launched only on devices with sm_90a machine code (SplitForm 3 and 6 plans,
             // WgmmaAvailable)
#endif
}
