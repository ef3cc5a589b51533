// The device side of engine/sample_rule.h's rule: a cluster of CTAs per logits row draws the row's
// token (and its logprobs) with no row copied to the host. When the batch is small a row is split
// over up to 8 CTAs (one thread block cluster, each CTA a contiguous slice of the vocabulary), so
// the per-token work of a few rows does not sit on a few SMs; the CTAs combine through
// distributed shared memory, and every combined value is an integer sum or a (key, id) maximum,
// so the result does not depend on the split. Thresholds (top-k, top-p) are found by radix
// selection over the rule's order keys: each level histograms the keys of a shrinking interval
// into 2048 bins with integer atomics (counts, or fixed-point weights for top-p), summed over the
// cluster in a fixed order, so the result is exact whatever order threads add in. The first
// level's bins are even in value over the row's range (at most 30 below the max: lower values
// weigh nothing and share bin 0), later ones even in key; once a CTA's share of the interval
// fits kCap it copies it (keys and ids) to shared memory and reads only that. The pass that
// copies also draws from the tokens above the interval (kept whatever the threshold) and adds
// the logprobs' weights, so the draw ends on the kept candidates (Copy). Top-k (k <= kThreads)
// starts from a lower bound on its threshold, the k-th largest per-thread best of the first
// pass, and its first level copies every key above it at once where they fit
// (Copy::optimistic). Where the cluster's candidates hold every key of an interval and number at
// most kSmallN (top-k from its bound, then top-p over what top-k kept), the threshold is read off
// them ranked (ExactSelect) instead of levels of histograms. The draw skips the
// exact Gumbel noise of a token that a bound shows cannot beat its warp's best: first one read
// off the uniform's leading one bits (GumbelCoarse, no logarithm), then GumbelUpper (both are
// checked for every value of the stream by a test). Passes hand four tokens at a time
// (ForEachQuad) so their independent arithmetic interleaves. The top logprobs come from one
// list per warp (WarpTop), ranked per CTA and then over the cluster by (key desc, id asc).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "gpu_worker/backend/cuda/launchers.h"
#include "gpu_worker/backend/cuda/pdl.cuh"
#include "gpu_worker/engine/sample_rule.h"

namespace cascade::cuda::internal {
namespace {

namespace cg = cooperative_groups;
using engine::SampleSpec;
using u64 = unsigned long long;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;
constexpr int kCap = 2048;    // candidates held in shared memory (per CTA)
constexpr int kMaxSplit = 8;  // CTAs per row at most (a portable cluster size)
constexpr int kLp = engine::kMaxLogprobs;
constexpr int kRankWords = 4;
// SelectKey ranks the cluster's candidates directly (ExactSelect) where they hold every key of the
// interval and number at most this many.
constexpr int kSmallN = 1024;

// Fixed-point weights (< 2^42) are histogrammed as four 11-bit pieces in 32-bit counters, whose
// sums cannot overflow below 2^21 tokens: 32-bit shared atomics are native, 64-bit ones are a
// compare-and-swap loop that serializes under the contention of a flat distribution.
constexpr int kPieceBits = 11, kPieces = 4;

// Dynamic shared memory of one CTA; the penalty bitmap ([ceil(vocab / 32)] words) follows, then
// the bitmap's rank base per group of kRankWords words (how many bits precede the group).
// Fields marked (cluster) are read or written by the other CTAs of the row's cluster.
struct Smem {
  // (cluster) this CTA's weight pieces per bin; ExactSelect's scratch where no histogram is built
  uint32_t mass[kPieces][kBins];
  uint32_t cnt[kBins];      // (cluster) this CTA's counts per bin
  uint32_t tot_cnt[kBins];  // (cluster) the row's counts per bin, summed over the cluster
  u64 tot_mass[kBins];      // (cluster) the row's weights per bin
  uint32_t cand_key[kCap];  // SelectKey's candidates of this CTA's slice: keys and ids
  int32_t cand_id[kCap];
  uint32_t lp_key[kWarps * kLp];  // the warps' top logprob keys; on rank 0, then the cluster's
  int32_t lp_id[kWarps * kLp];
  uint32_t top_key[kLp];  // (cluster) this CTA's top logprob keys, ranked
  int32_t top_id[kLp];
  u64 red64[kWarps];
  uint32_t red_key[kWarps];
  int32_t red_id[kWarps];
  float red_score[kWarps];
  // (cluster) each CTA's partial results, written once per launch.
  uint32_t x_best_key, x_max_raw, x_min_key, x_topk_bound;
  int32_t x_best_id, x_draw_id;
  float x_draw_score;
  u64 x_weight_sum;
  int x_ncand;  // (cluster) this CTA's candidates for ExactSelect, > kCap: not all of them
  uint32_t lo, hi, pop;
  int bin;
  u64 above;
  int ncand;
  int nsmall, small_at;  // ExactSelect's
  // (cluster) score rows: this CTA's tokens ranked at or above the scored one. Last: placed
  // beside x_weight_sum it moved the other fields and the drawn instance spilled 28 bytes more.
  u64 x_rank;
};
static_assert(sizeof(Smem::mass) >= (2 * kSmallN + 2) * sizeof(u64), "ExactSelect's scratch");

__device__ __forceinline__ u64 Mass(const Smem& sh, int b) {
  u64 m = 0;
#pragma unroll
  for (int p = 0; p < kPieces; ++p) m += static_cast<u64>(sh.mass[p][b]) << (p * kPieceBits);
  return m;
}

__device__ __forceinline__ u64 BlockSum(u64 v, Smem& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red64[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < kWarps; ++w) t += sh.red64[w];
  return t;
}

__device__ __forceinline__ bool KeyBefore(uint32_t k2, int i2, uint32_t k, int i) {
  return k2 > k || (k2 == k && i2 < i);
}

// Block max of (key desc, id asc); every thread gets the winner.
__device__ __forceinline__ void BlockBestKey(uint32_t& key, int& id, Smem& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    if (KeyBefore(k2, i2, key, id)) key = k2, id = i2;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_key[threadIdx.x >> 5] = key, sh.red_id[threadIdx.x >> 5] = id;
  __syncthreads();
  key = sh.red_key[0], id = sh.red_id[0];
  for (int w = 1; w < kWarps; ++w) {
    if (KeyBefore(sh.red_key[w], sh.red_id[w], key, id)) key = sh.red_key[w], id = sh.red_id[w];
  }
}

// (score desc, id asc) over ids >= 0 (id -1: nothing).
__device__ __forceinline__ bool ScoreBefore(float s2, int i2, float s, int i) {
  return i2 >= 0 && (i < 0 || s2 > s || (s2 == s && i2 < i));
}

// Block max of (score desc, id asc); every thread gets the winner.
__device__ __forceinline__ void BlockBestScore(float& score, int& id, Smem& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float s2 = __shfl_xor_sync(0xffffffffu, score, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, id, o);
    if (ScoreBefore(s2, i2, score, id)) score = s2, id = i2;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
    sh.red_score[threadIdx.x >> 5] = score, sh.red_id[threadIdx.x >> 5] = id;
  __syncthreads();
  score = sh.red_score[0], id = sh.red_id[0];
  for (int w = 1; w < kWarps; ++w) {
    if (ScoreBefore(sh.red_score[w], sh.red_id[w], score, id))
      score = sh.red_score[w], id = sh.red_id[w];
  }
}

// Bounds on the rule's Gumbel noise (engine::GumbelNoise) for the draw's pruning: kGumbelMax is
// above the noise of every u the stream gives ((j + 0.5) / 2^24: at most ~17.33), GumbelUpper(u)
// above that u's noise (the fast logarithms' error, ~1e-5 here, is far inside the slack; from
// u > 0.99 -ln u is too small for the fast log's absolute error, so no bound is claimed). The
// test GumbelBoundsHoldForEveryUniform checks both for all 2^24 values on the device.
constexpr float kGumbelMax = 17.5f;
constexpr float kGumbelSlack = 1.0f / 256.0f;
__device__ __forceinline__ float GumbelUpper(float u) {
  const float g = __fadd_ru(-__logf(-__logf(u)), kGumbelSlack);
  return u > 0.99f ? INFINITY : g;
}
// A coarser bound from the uniform's bits j alone, without a logarithm: with L leading ones in
// its 24 bits (L < 24), u < 1 - 2^-(L+1), so -ln u > 2^-(L+1) and the noise -ln(-ln u) is below
// (L + 1) ln 2 (plus a slack for the rule's logarithms). Checked for all 2^24 values with the
// others.
__device__ __forceinline__ float GumbelCoarse(uint32_t j) {
  const int ones = __clz(~(j << 8));  // leading ones of the 24 bits (24: all)
  return ones >= 24 ? INFINITY : __fmaf_ru(static_cast<float>(ones + 1), 0.6931472f, kGumbelSlack);
}

// This CTA's slice of the row: tokens [begin, end) (multiples of 4 where the row is read as
// float4). f(v, z[v]) for each, 16-byte loads where the row allows; a thread meets its ids in
// ascending order.
struct Slice {
  int begin, end;
};
__device__ __forceinline__ Slice SliceOf(int vocab, int part, int parts) {
  const int units = (vocab & 3) == 0 ? vocab >> 2 : vocab;
  const int scale = (vocab & 3) == 0 ? 4 : 1;
  const int b = static_cast<int>(static_cast<int64_t>(units) * part / parts);
  const int e = static_cast<int>(static_cast<int64_t>(units) * (part + 1) / parts);
  return {b * scale, e * scale};
}
// Calls f(v0, q, n) for the slice's tokens a quad at a time: tokens v0 .. v0 + 3 with values
// q.x .. q.w where the row is read as float4 (n = 4), else one token (v0, q.x) (n = 1); n = 0 for
// lanes past the slice's end, so the lanes of a warp stay in step and f and step() (once per
// round) may use warp collectives. A thread meets its ids in ascending order. Handing f four
// tokens at once lets it interleave their independent arithmetic.
template <class F, class Step>
__device__ __forceinline__ void ForEachQuad(const float* z, int vocab, Slice sl, F&& f,
                                            Step&& step) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int first = static_cast<int>(threadIdx.x) - lane;
  if ((vocab & 3) == 0) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    const int end = sl.end >> 2;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int i = (sl.begin >> 2) + first + lane;
    float4 q = i < end ? z4[i] : zero;  // the next round's quad is loaded before f runs
#pragma unroll 1
    for (int i0 = (sl.begin >> 2) + first; i0 < end; i0 += kThreads, i += kThreads) {
      const float4 next = i + kThreads < end ? z4[i + kThreads] : zero;
      f(4 * i, q, i < end ? 4 : 0);
      step();
      q = next;
    }
  } else {
#pragma unroll 1
    for (int v0 = sl.begin + first; v0 < sl.end; v0 += kThreads) {
      const int v = v0 + lane;
      const bool ok = v < sl.end;
      f(v, make_float4(ok ? z[v] : 0.0f, 0.0f, 0.0f, 0.0f), ok ? 1 : 0);
      step();
    }
  }
}
__device__ __forceinline__ float QuadAt(const float4& q, int j) {
  return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
}

// A thread's part of the draw (rule step 4): the best (score desc, id asc) of the tokens offered,
// score = value + GumbelNoise(TokenUniformAt(start, id)). bar is the best exact score of the warp
// so far (its order key; 0: none yet; Step() refreshes it, every lane in step): a token whose
// value plus the largest noise, or plus a bound on its own noise, is below it cannot be drawn
// (its exact score is lower still), so its exact noise is not computed: the same result, and
// after the first rounds few lanes of a warp compute one. Every token offered must be kept.
struct Draw {
  uint64_t start = 0;
  float best_score = 0.0f;
  int draw_id = -1;
  uint32_t bar = 0;
  __device__ __forceinline__ void Take(int v, float s) {
    if (draw_id < 0 || s > best_score || (s == best_score && v < draw_id))
      best_score = s, draw_id = v;
  }
  // Tokens v0 + j with score keys k[j], where keep[j].
  __device__ __forceinline__ void Quad(int v0, const uint32_t (&k)[4], const bool (&keep)[4]) {
    const float best = engine::KeyValue(bar);
    float value[4];
    bool need[4], any = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      value[j] = engine::KeyValue(k[j]);
      need[j] = keep[j] && (bar == 0 || !(engine::AddF(value[j], kGumbelMax) < best));
      any = any || need[j];
    }
    if (!any) return;
    uint32_t bits[4];    // the quad's uniforms' bits side by side, then the rare exact noise
    bool close = false;  // a token the coarse bound keeps: the finer bound decides
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      bits[j] = engine::TokenBitsAt(start, v0 + j);
      need[j] = need[j] && (bar == 0 || !(engine::AddF(value[j], GumbelCoarse(bits[j])) < best));
      close = close || need[j];
    }
    if (!close) return;
    float u[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u[j] = engine::UniformOf(bits[j]);
      need[j] = need[j] && (bar == 0 || !(engine::AddF(value[j], GumbelUpper(u[j])) < best));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (need[j]) Take(v0 + j, engine::AddF(value[j], engine::GumbelNoise(u[j])));
    }
  }
  __device__ __forceinline__ void One(int v, uint32_t k) {
    Take(v,
         engine::AddF(engine::KeyValue(k), engine::GumbelNoise(engine::TokenUniformAt(start, v))));
  }
  __device__ __forceinline__ void Step() {
    bar = __reduce_max_sync(0xffffffffu, draw_id >= 0 ? engine::OrderKey(best_score) : 0u);
  }
};

// A warp's top n (<= 32) (key, id) pairs by (key desc, id asc), held one per lane: lane l < n
// has rank l (sentinels: key 0, id INT_MAX, past every real key). Every lane calls Offer alike;
// the pairs offered enter in lane order, and the list does not depend on the order they come in.
struct WarpTop {
  uint32_t key = 0, last_key = 0;  // last_*: rank n - 1's pair, in every lane
  int id = INT_MAX, last_id = INT_MAX;
  __device__ __forceinline__ void Offer(uint32_t k, int v, bool ok, int n) {
    unsigned want = __ballot_sync(0xffffffffu, ok && KeyBefore(k, v, last_key, last_id));
    const int lane = static_cast<int>(threadIdx.x & 31);
    while (want != 0) {
      const int src = __ffs(want) - 1;
      want &= want - 1;
      const uint32_t nk = __shfl_sync(0xffffffffu, k, src);
      const int nv = __shfl_sync(0xffffffffu, v, src);
      if (!KeyBefore(nk, nv, last_key, last_id)) continue;  // an earlier one raised the bar
      const int pos = __popc(__ballot_sync(0xffffffffu, lane < n && KeyBefore(key, id, nk, nv)));
      const uint32_t up_key = __shfl_up_sync(0xffffffffu, key, 1);
      const int up_id = __shfl_up_sync(0xffffffffu, id, 1);
      if (lane == pos) {
        key = nk, id = nv;
      } else if (lane > pos && lane < n) {
        key = up_key, id = up_id;
      }
      last_key = __shfl_sync(0xffffffffu, key, n - 1);
      last_id = __shfl_sync(0xffffffffu, id, n - 1);
    }
  }
};

// Sums every CTA's histogram into every CTA's tot_cnt (and tot_mass): CTA r adds up bins
// [r * kBins / C, (r + 1) * kBins / C) over the ranks in order and stores the sums in each CTA.
// REQUIRES: every CTA's cnt/mass complete (the first cluster sync makes them visible); after
// the second, every CTA may read tot_* and overwrite its own cnt/mass.
__device__ void MergeHistograms(Smem& sh, bool by_mass, cg::cluster_group& cl) {
  const int parts = static_cast<int>(cl.num_blocks()), rank = static_cast<int>(cl.block_rank());
  cl.sync();
  const int per = kBins / parts;
  for (int i = threadIdx.x; i < per; i += kThreads) {
    const int b = rank * per + i;
    uint32_t c = 0;
    u64 m = 0;
    for (int r = 0; r < parts; ++r) {
      const Smem* o = cl.map_shared_rank(&sh, r);
      c += o->cnt[b];
      if (by_mass) m += Mass(*o, b);
    }
    for (int r = 0; r < parts; ++r) {
      Smem* o = cl.map_shared_rank(&sh, r);
      o->tot_cnt[b] = c;
      if (by_mass) o->tot_mass[b] = m;
    }
  }
  cl.sync();
}

// A level's bins, each one key interval (the bin is monotone in the key): even in key, (k - lo) >>
// shift, or even in value over [base, base + kBins / scale], values below base in bin 0. Keys of
// NaN (only below -inf's) fall in bin 0 as well.
struct Binning {
  uint32_t lo = 0;
  int shift = 0;
  bool by_value = false;
  float base = 0.0f, scale = 0.0f;
  __device__ __forceinline__ int Of(uint32_t k) const {
    if (!by_value) return static_cast<int>((k - lo) >> shift);
    const float f = engine::MulF(engine::AddF(engine::KeyValue(k), -base), scale);
    if (!(f >= 1.0f)) return 0;
    return f >= static_cast<float>(kBins - 1) ? kBins - 1 : static_cast<int>(f);
  }
};

// The smallest key in [lo, hi] whose bin is >= b, or hi + 1 where none. A warp's 32 lanes each
// test one key of the interval a round (the bin is monotone in the key), so each round cuts it to
// a 32nd: 7 rounds for 2^32 keys. Every lane of the warp calls it and gets the result.
__device__ uint64_t FirstKeyOfBin(const Binning& bins, uint32_t lo, uint32_t hi, int b) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  uint64_t l = lo, h = uint64_t{hi} + 1;  // the result is in [l, h]
  while (l < h) {
    const uint64_t step = (h - l + 31) / 32;
    const uint64_t probe = l + step * (lane + 1) - 1;  // lane 31's is >= h - 1
    const bool at_or_after = probe >= h || bins.Of(static_cast<uint32_t>(probe)) >= b;
    const unsigned m = __ballot_sync(0xffffffffu, at_or_after);
    if (m == 0) {  // none of [l, h) is: the result is h
      l = h;
      break;
    }
    const int f = __ffs(m) - 1;
    h = min(h, l + step * (f + 1) - 1);
    l = f > 0 ? l + step * f : l;
  }
  return l;
}

// The largest key t in [lo, hi] such that `above0` plus the sum of f over the row's elements
// with key in [t, hi] reaches the target; f = 1 (count) or KeyWeight(key, m) (by_mass). The
// target is `count_target`, or NeedMass(total mass in [lo, hi], top_p) by mass. A count target
// above the count in [lo, hi] gives lo. key_of(v, z) is the element's key. known_pop: how many
// elements [lo, hi] holds in the whole row, or -1; *count_ge (count mode): how many have a key
// >= the result, or -1 where not known. min_value: the row's least value (bins of the first
// level start there). Every CTA of the cluster calls it alike and gets the same result (the
// decisions read only the merged histograms); which CTAs read shared memory instead of the row
// may differ (each decides by its own count), not what they add.
// How the pass that copies this CTA's candidates (keys and ids) to shared memory serves the
// caller, per CTA (see SelectKey).
struct Copy {
  bool visit = false;   // in: that pass calls visit(v0, q, n, k, hi, gathering) per quad of the
                        // slice (k: the keys) and visit_step() once per round
  bool gather = false;  // in (count mode): copy every key >= lo there, not only [lo, hi],
                        // where the row's count above the interval leaves room
  bool start_in_smem = false;  // in: the candidates (ncand) already hold all of [lo, hi]
  // in (count mode): the first level tries to copy every key >= lo (its interval is [lo, row
  // max]) whatever their number, for a caller that expects few (a lower bound near the top);
  // where this CTA's share overflows kCap it goes on as without it. Its pass then visits with
  // `gathering` (no draw: the copy holds every key above the result) and so adds the weights.
  bool optimistic = false;
  int ncand = 0;  // in/out: how many candidates
  // in/out: ExactSelect ranked the cluster's candidates (x_ncand published), which hold every key
  // >= its result in every CTA
  bool small = false;
  bool visited = false;          // out: visit was called in the pass that copied
  bool gathered = false;         // out: the candidates hold every key >= the result
  bool weights_visited = false;  // out: a pass visited with `gathering` (weights only) and then
                                 // overflowed; a later visit must not add the weights again
};

// Block-wide exclusive prefix sum of v, through red[kWarps] (shared memory); *total (where given):
// the block's sum.
template <typename T>
__device__ __forceinline__ T BlockExclusiveSum(T v, T* red, T* total = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  __syncthreads();
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += red[w];
    all += red[w];
  }
  if (total != nullptr) *total = all;
  return before + incl - v;
}

// A SelectKey level's result read off the cluster's candidates directly, where they hold every
// key of the row in [lo, hi] (each CTA's first x_ncand candidates; at most kSmallN of them in
// [lo, hi]): each CTA copies the cluster's keys in [lo, hi] and ranks them by (key desc, id asc)
// (ids are distinct, so the ranks are). The result is the largest key t whose suffix (`above`,
// what the keys above hi add, plus the ranked ones >= t) reaches the target: in count mode the key
// of rank target - above - 1, by mass the key at which the ranked weights' running sum first
// reaches it; at the first level (`first`) by mass, the target is NeedMass of their total. The
// suffix changes only at candidates' keys, so that is the key the levels of histograms narrow
// to; every CTA ranks the same set and gets it. REQUIRES: a cluster sync after the candidates and
// x_ncand were written; neither changes before the cluster syncs again.
__device__ uint32_t ExactSelect(Smem& sh, cg::cluster_group& cl, uint32_t lo, uint32_t hi,
                                bool by_mass, float m, u64 above, u64 target, bool first,
                                float top_p, int64_t* count_ge) {
  u64* packed = reinterpret_cast<u64*>(&sh.mass[0][0]);  // (key << 32) | ~id: one compare ranks
  u64* ranked = packed + kSmallN + 2;                    // (past the pad)
  if (threadIdx.x == 0) sh.nsmall = 0;
  __syncthreads();
  const int parts = static_cast<int>(cl.num_blocks());
  for (int r = 0; r < parts; ++r) {
    const Smem* o = cl.map_shared_rank(&sh, r);
    const int n = o->x_ncand;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint32_t k = o->cand_key[i];
      if (k >= lo && k <= hi) {
        packed[atomicAdd(&sh.nsmall, 1)] =
            (u64{k} << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(o->cand_id[i]));
      }
    }
  }
  __syncthreads();
  const int n = sh.nsmall;
  if (threadIdx.x == 0) packed[n] = 0;  // pads the pairs read below: 0 ranks after every entry
  __syncthreads();
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(packed);
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const u64 p = packed[i];
    int rank = 0;
    for (int j = 0; j < (n + 1) / 2; ++j) {
      const ulonglong2 q = pairs[j];
      rank += (q.x > p) + (q.y > p);
    }
    ranked[rank] = p;
  }
  __syncthreads();
  auto key_at = [&](int i) { return static_cast<uint32_t>(ranked[i] >> 32); };
  uint32_t result = lo;
  if (!by_mass) {
    if (above + n < target) {  // (the first level only: a later one's interval holds the target)
      *count_ge = static_cast<int64_t>(above + n);
    } else {
      const uint32_t t = key_at(static_cast<int>(target - above) - 1);
      for (int i = threadIdx.x; i < n; i += kThreads) {  // the last rank with a key >= t
        if (key_at(i) >= t && (i + 1 == n || key_at(i + 1) < t)) sh.small_at = i;
      }
      __syncthreads();
      *count_ge = static_cast<int64_t>(above) + sh.small_at + 1;
      result = t;
    }
  } else {
    constexpr int kPer = kSmallN / kThreads;  // a thread's run of ranks
    const int i0 = min(n, static_cast<int>(threadIdx.x) * kPer);
    const int i1 = min(n, i0 + kPer);
    u64 w[kPer], run = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      w[j] = i0 + j < i1 ? engine::KeyWeight(key_at(i0 + j), m) : 0;
      run += w[j];
    }
    u64 total = 0;
    u64 acc = above + BlockExclusiveSum(run, sh.red64, &total);
    if (first) target = engine::NeedMass(total, top_p);
    if (above + total < target) {  // (the first level only) uniform: every thread has the total
      *count_ge = static_cast<int64_t>(total);
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (acc < target && acc + w[j] >= target) sh.small_at = i0 + j;  // once in the block
        acc += w[j];
      }
      __syncthreads();
      result = key_at(sh.small_at);
    }
  }
  __syncthreads();  // sh.small_at and the scratch read before a later use overwrites them
  return result;
}

// Publishes this CTA's candidate count for ExactSelect (more than kCap: not all of them) and
// returns the cluster's total, or kSmallN + 1 where some CTA's are not all. Every CTA calls it
// alike (a cluster sync).
__device__ int ClusterCandidates(Smem& sh, cg::cluster_group& cl, int ncand) {
  if (threadIdx.x == 0) sh.x_ncand = ncand;
  cl.sync();
  int total = 0;
  for (int r = 0; r < static_cast<int>(cl.num_blocks()); ++r) {
    const int c = cl.map_shared_rank(&sh, r)->x_ncand;
    total = c > kCap ? kSmallN + 1 : min(total + c, kSmallN + 1);
    if (total > kSmallN) break;
  }
  return total;
}

// With cp.visit, the pass in which a CTA copies its share of [lo, hi] also visits: the result is
// <= that hi, so the caller can draw from the keys above it there (all kept) and later from the
// candidates at or above the result. With cp.gather the copy takes every key >= lo, so the
// candidates at or above the result are all of this CTA's (visit says so with gathering).
template <class KeyOf, class Visit, class VisitStep>
__device__ uint32_t SelectKey(Smem& sh, cg::cluster_group& cl, const float* z, int vocab, Slice sl,
                              KeyOf&& key_of, uint32_t lo, uint32_t hi, bool by_mass, float m,
                              u64 count_target, float top_p, int64_t known_pop, float min_value,
                              int64_t* count_ge, Copy& cp, Visit&& visit, VisitStep&& visit_step) {
  *count_ge = -1;
  cp.visited = cp.gathered = cp.weights_visited = false;
  bool in_smem = cp.start_in_smem, first = true;
  // The candidates that the caller's previous SelectKey ranked hold this interval too.
  if (cp.small && lo < hi) {
    return ExactSelect(sh, cl, lo, hi, by_mass, m, 0, count_target, true, top_p, count_ge);
  }
  cp.small = false;
  // The cluster's count of keys in [lo, hi] where known (uniform), -1 where not: the first
  // level's from the caller, a later one's from the merged histogram.
  int64_t pop = known_pop;
  bool collect = !in_smem && known_pop >= 0 && known_pop <= kCap, gathering = false;
  // The optimistic first level (count mode): gather every key >= lo, kCap at most.
  bool optimistic = !in_smem && !collect && cp.optimistic && !by_mass;
  if (optimistic) collect = gathering = true;
  int ncand = in_smem ? cp.ncand : 0;
  u64 above = 0, target = count_target;
  while (lo < hi) {
    // Few keys in the interval: every CTA copies its share in this level's pass (or holds it
    // already), and ExactSelect ranks them after it: no histogram.
    const bool small = pop >= 0 && pop <= kSmallN;
    Binning bins;
    bins.lo = lo;
    bins.shift = max(0, 32 - __clz(hi - lo) - 11);
    if (first) {  // even in value over [max(min, lo, max - 30), max] where that is finite
      const float top = engine::KeyValue(hi);
      float base = fmaxf(engine::AddF(top, -30.0f), min_value);
      const float lo_value = engine::KeyValue(lo);  // NaN for NaN keys: fmaxf skips it
      base = fmaxf(base, lo_value);
      const float width = engine::AddF(top, -base);
      const float scale = engine::DivF(static_cast<float>(kBins), width);
      if (isfinite(top) && isfinite(base) && width > 0.0f && isfinite(scale)) {
        bins.by_value = true, bins.base = base, bins.scale = scale;
      }
    }
    for (int i = threadIdx.x; i < (small ? 0 : kBins); i += kThreads) {
      sh.cnt[i] = 0;
      if (by_mass) {
#pragma unroll
        for (int p = 0; p < kPieces; ++p) sh.mass[p][i] = 0;
      }
    }
    if (threadIdx.x == 0) sh.ncand = 0;
    __syncthreads();
    // Adds keys k[0, n) (n <= 4): their bins and weights first (independent of each other and
    // branch-free, so they interleave), then the atomics.
    auto add = [&](const uint32_t(&k)[4], int v0, int n) {
      bool in[4], take[4], any = false;
      int b[4];
      uint64_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        in[j] = j < n && k[j] >= lo && k[j] <= hi;
        take[j] = collect && (gathering ? j < n && k[j] >= lo : in[j]);
        any = any || in[j] || take[j];
      }
      if (!any) return;  // most tokens after the first level
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        b[j] = in[j] ? bins.Of(k[j]) : 0;
        w[j] = by_mass && in[j] ? engine::KeyWeight(k[j], m) : 0;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // This CTA's share: <= kCap of them, except in an optimistic level, which stops
        // adding once the count passed kCap (read without the atomic: it only grows).
        if (take[j] && (!optimistic || *reinterpret_cast<volatile int*>(&sh.ncand) <= kCap)) {
          const int slot = atomicAdd(&sh.ncand, 1);
          if (slot < kCap) {
            sh.cand_key[slot] = k[j];
            sh.cand_id[slot] = v0 + j;
          }
        }
        if (!in[j] || small) continue;
        atomicAdd(&sh.cnt[b[j]], 1u);
        if (by_mass && w[j] != 0) {  // (most pieces of a weight are not 0: no test of each)
#pragma unroll
          for (int p = 0; p < kPieces; ++p) {
            const uint32_t piece =
                static_cast<uint32_t>(w[j] >> (p * kPieceBits)) & ((1u << kPieceBits) - 1);
            atomicAdd(&sh.mass[p][b[j]], piece);
          }
        }
      }
    };
    if (in_smem) {
      for (int i = threadIdx.x; i < (small ? 0 : ncand); i += kThreads) {
        const uint32_t k[4] = {sh.cand_key[i], 0, 0, 0};
        add(k, 0, 1);
      }
    } else {
      const bool visiting = cp.visit && collect;  // uniform over the CTA
      ForEachQuad(
          z, vocab, sl,
          [&](int v0, float4 q, int n) {
            uint32_t k[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) k[j] = j < n ? key_of(v0 + j, QuadAt(q, j)) : 0;
            add(k, v0, n);
            if (visiting) visit(v0, q, n, k, hi, gathering);
          },
          [&] {
            if (visiting) visit_step();
          });
      cp.visited = cp.visited || visiting;
    }
    // Rank the candidates where the interval's keys are few, or where the optimistic level
    // copied every CTA's keys >= lo and the cluster's are few.
    if (small || optimistic) {
      __syncthreads();  // this CTA's copy is complete
      const int mine = in_smem ? ncand : sh.ncand;
      if (ClusterCandidates(sh, cl, mine) <= kSmallN || small) {
        if (!in_smem) cp.ncand = mine, cp.gathered = gathering;
        // Only the optimistic level's copies hold every key >= the result in every CTA, so that a
        // following SelectKey over [result, hi] may rank them again without a pass.
        cp.small = optimistic;
        return ExactSelect(sh, cl, lo, hi, by_mass, m, above, target, first, top_p, count_ge);
      }
    }
    MergeHistograms(sh, by_mass, cl);
    if (optimistic && sh.ncand > kCap) {  // overflowed: this CTA goes on as without it
      cp.weights_visited = cp.visited;
      cp.visited = false;
      collect = gathering = false;
    }
    optimistic = false;
    if (collect) {
      ncand = cp.ncand = sh.ncand;
      cp.gathered = gathering;
      in_smem = true, collect = false;
    }
    // The bin holding the target: the highest b whose suffix (above plus the bins >= b) reaches
    // it. Each thread holds kBins / kThreads consecutive bins; one scan gives every thread the
    // suffix from its first bin (and the total), and the thread whose bins hold b finds it.
    constexpr int kPer = kBins / kThreads;
    const int b0 = static_cast<int>(threadIdx.x) * kPer;
    u64 v[kPer], chunk = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      v[j] = by_mass ? sh.tot_mass[b0 + j] : sh.tot_cnt[b0 + j];
      chunk += v[j];
    }
    u64 total = 0;
    const u64 suffix = [&] {  // bins >= b0
      const u64 before = BlockExclusiveSum(chunk, sh.red64, &total);
      return total - before;
    }();
    if (first) {
      if (by_mass) target = engine::NeedMass(total, top_p);
      if (total < target) {  // uniform over the cluster: every thread has the same total
        *count_ge = static_cast<int64_t>(total);
        return lo;
      }
      first = false;
    }
    // The interval holds the target: some thread's suffix reaches it.
    if (above + suffix >= target && (b0 + kPer == kBins || above + suffix - chunk < target)) {
      u64 acc = above + suffix - chunk;  // the bins above this thread's
      int b = b0;
#pragma unroll
      for (int j = kPer - 1; j >= 0; --j) {
        if (acc + v[j] >= target) {
          b = b0 + j;
          break;
        }
        acc += v[j];
      }
      sh.above = acc;
      sh.bin = b;
      sh.pop = sh.tot_cnt[b];
      if (!bins.by_value) {
        const uint64_t nlo = uint64_t{lo} + (uint64_t{static_cast<uint32_t>(b)} << bins.shift);
        const uint64_t nhi = nlo + (uint64_t{1} << bins.shift) - 1;
        sh.lo = static_cast<uint32_t>(nlo);
        sh.hi = static_cast<uint32_t>(nhi < hi ? nhi : hi);
      }
    }
    if (bins.by_value) {  // the bin's keys: two warps search in parallel
      __syncthreads();
      const int warp = threadIdx.x >> 5, b = sh.bin;
      if (warp == 0) {
        const uint64_t nlo = FirstKeyOfBin(bins, lo, hi, b);
        if (threadIdx.x == 0) sh.lo = static_cast<uint32_t>(nlo);
      } else if (warp == 1) {
        const uint64_t nhi = b + 1 < kBins ? FirstKeyOfBin(bins, lo, hi, b + 1) - 1 : hi;
        if (threadIdx.x == 32) sh.hi = static_cast<uint32_t>(nhi < hi ? nhi : hi);
      }
    }
    __syncthreads();
    lo = sh.lo, hi = sh.hi, above = sh.above;
    collect = !in_smem && sh.cnt[sh.bin] <= kCap;  // this CTA's share of the next interval
    // ... or with the keys above it, which the row holds `above` of (count mode).
    gathering = collect && cp.gather && !by_mass && above + sh.cnt[sh.bin] <= kCap;
    if (!by_mass) *count_ge = static_cast<int64_t>(above + sh.pop);
    pop = sh.pop;
    __syncthreads();  // sh.* read before the next level overwrites them
  }
  return lo;
}

// Ranks n candidates (keys[i], ids[i]) by (key desc, id asc) and calls put(rank, i) for those
// ranked below n_lp. Sentinel entries (key 0, id INT_MAX) may tie with each other; they rank
// past every real key (a real key is > 0).
template <class Put>
__device__ __forceinline__ void RankTop(const uint32_t* keys, const int32_t* ids, int n, int n_lp,
                                        Put&& put) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t k = keys[i];
    const int id = ids[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += KeyBefore(keys[j], ids[j], k, id);
    if (rank < n_lp) put(rank, i);
  }
}

// The score key of token v (value x) listed in a counted row: its entry's count and bias found
// by its rank in the shared-memory bitmap (SampleRow's, with the bits before each group of
// kRankWords words after it). A row lists few of its tokens, so this runs rarely; out of line, and
// taking the kernel's parameters (the constant bank holds them) rather than SampleRow's
// pointers, so that the passes' loops hold none of its values in registers (inlined, the counted
// instance spilled in them).
__device__ __noinline__ uint32_t ListedKey(float x, int v, int vocab, const SampleSpec* specs,
                                           const int32_t* penalty_counts,
                                           const float* penalty_bias) {
  extern __shared__ uint4 smem_raw[];
  const SampleSpec& sp = specs[blockIdx.x / cg::this_cluster().num_blocks()];
  const uint32_t* bitmap = reinterpret_cast<const uint32_t*>(reinterpret_cast<Smem*>(smem_raw) + 1);
  const uint32_t* rank_base = bitmap + (vocab + 31) / 32;
  const int w = v >> 5, g = w / kRankWords;
  uint32_t r = rank_base[g] + __popc(bitmap[w] & ((1u << (v & 31)) - 1u));
  for (int j = g * kRankWords; j < w; ++j) r += __popc(bitmap[j]);
  const float bias = engine::UsesBias(sp) ? penalty_bias[sp.penalty_start + r] : 0.0f;
  return engine::ScoreKey(x, true, penalty_counts[sp.penalty_start + r], bias, sp,
                          engine::InvTemperature(sp));
}

// One row's share (this CTA's slice) of SampleKernel's work. kCounted: the row's listed tokens
// carry entries (UsesEntries: generated counts, and logit biases where biased), looked up by
// rank; a separate instance, so rows without them run the plain path's code.
// kScore: the instance for score rows (SampleSpec::score_token): no penalties, filters or draw;
// the row's token is the scored one, with its logprobs and rank. The other instance never sees
// one (SampleKernel), so its code is what it was before score rows existed.
template <bool kCounted, bool kScore = false>
__device__ __forceinline__ void SampleRow(const float* logits, int vocab, const SampleSpec& sp,
                                          const SampleSpec* specs, const int32_t* penalty_tokens,
                                          const int32_t* penalty_counts, const float* penalty_bias,
                                          int32_t* out, engine::RowLogprobs* lp_out, Smem& sh) {
  const int words = (vocab + 31) / 32, groups = (words + kRankWords - 1) / kRankWords;
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(&sh + 1);
  uint32_t* rank_base = bitmap + words;
  cg::cluster_group cl = cg::this_cluster();
  const int parts = static_cast<int>(cl.num_blocks()), rank = static_cast<int>(cl.block_rank());
  const int row = blockIdx.x / parts;
  const Slice sl = SliceOf(vocab, rank, parts);
  const float* z = logits + static_cast<int64_t>(row) * vocab;
  const bool pen = !kScore && engine::UsesPenalty(sp);
  constexpr bool counted = kCounted;
  if (pen) {  // the whole row's bitmap (a slice may hold any listed token)
    for (int i = threadIdx.x; i < words; i += kThreads) bitmap[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < sp.penalty_count; i += kThreads) {
      const int t = penalty_tokens[sp.penalty_start + i];
      atomicOr(&bitmap[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
  }
  if constexpr (counted) {
    // The listed tokens ascend, so a listed token's rank among the bitmap's bits is its index in
    // the list: each thread sums a run of groups, then the block's exclusive sum.
    const int per = (groups + kThreads - 1) / kThreads;
    const int g0 = min(groups, static_cast<int>(threadIdx.x) * per), g1 = min(groups, g0 + per);
    uint32_t bits = 0;
    for (int w = g0 * kRankWords; w < min(words, g1 * kRankWords); ++w) bits += __popc(bitmap[w]);
    uint32_t run = BlockExclusiveSum(bits, sh.red_key);
    for (int g = g0; g < g1; ++g) {
      rank_base[g] = run;
      for (int w = g * kRankWords; w < min(words, (g + 1) * kRankWords); ++w) {
        run += __popc(bitmap[w]);
      }
    }
    __syncthreads();
  }
  const float inv_t = engine::InvTemperature(sp);
  auto key_of = [&](int v, float x) {
    const bool listed = pen && ((bitmap[v >> 5] >> (v & 31)) & 1u);
    if constexpr (counted) {
      if (!listed) return engine::ScoreKey(x, false, 0, 0.0f, sp, inv_t);
      return ListedKey(x, v, vocab, specs, penalty_counts, penalty_bias);
    } else {
      return engine::ScoreKey(x, listed, 0, 0.0f, sp, inv_t);
    }
  };
  auto raw_key = [](int, float x) { return engine::OrderKey(engine::Canon(x)); };
  const bool greedy = kScore || sp.temperature == 0.0f;
  const bool filters = !kScore && engine::HasFilters(sp, vocab);
  const int n_lp = min(sp.logprobs, vocab);
  const bool want_lp = kScore || n_lp > 0;  // the weight sum (lse) is needed
  // Score rows: the scored token's raw key, and how many of this thread's tokens rank at or above
  // it (vLLM's rank counts ties).
  uint32_t score_key = 0;
  u64 rank_count = 0;
  if constexpr (kScore) score_key = engine::OrderKey(engine::Canon(z[sp.score_token]));

  // Pass 1: the best score key (greedy's token, the filters' max), the least score key (where the
  // filters' bins start), the max raw key, and each warp's top n_lp raw keys by (key desc, id
  // asc) (few tokens enter the warp's list once it has seen a few hundred).
  uint32_t best_key = 0, max_raw = 0, min_key = UINT32_MAX;
  uint32_t thread_best = 0;  // this thread's own best score key (0: no token)
  int best_id = vocab;
  WarpTop top;
  if (greedy || filters || n_lp > 0) {
    uint32_t rk = 0;
    const int per = (vocab & 3) == 0 ? 4 : 1;  // tokens per quad (uniform)
    ForEachQuad(
        z, vocab, sl,
        [&](int v0, float4 q, int n) {
          uint32_t r[4] = {0, 0, 0, 0};
          bool enters = false;  // one of this lane's tokens would enter the warp's list
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j >= per) break;
            const int v = v0 + j;
            if (j < n) {
              const uint32_t k = key_of(v, QuadAt(q, j));
              if (k > best_key || (k == best_key && v < best_id)) best_key = k, best_id = v;
              min_key = min(min_key, k);
              r[j] = raw_key(v, QuadAt(q, j));
              if constexpr (kScore) rank_count += r[j] >= score_key ? 1 : 0;
              rk = max(rk, r[j]);
              enters = enters || KeyBefore(r[j], v, top.last_key, top.last_id);
            }
          }
          // Offers of tokens that cannot enter change nothing: one vote for the quad, and the
          // per-token offers only where a lane has one that can (rare once the list filled).
          if (n_lp > 0 && __any_sync(0xffffffffu, enters)) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (j >= per) break;
              top.Offer(r[j], v0 + j, j < n, n_lp);
            }
          }
        },
        [] {});
    thread_best = best_key;
    BlockBestKey(best_key, best_id, sh);
    int unused = 0;
    BlockBestKey(rk, unused, sh);
    max_raw = rk;
    if (filters) {
      uint32_t neg_min = ~min_key;
      BlockBestKey(neg_min, unused, sh);
      min_key = ~neg_min;
    }
  }
  if (n_lp > 0) {
    // The warps' lists are the candidates [warp * n_lp, + n_lp); the CTA ranks them into
    // top_key/top_id.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane < n_lp) sh.lp_key[warp * n_lp + lane] = top.key, sh.lp_id[warp * n_lp + lane] = top.id;
    if (threadIdx.x < n_lp) sh.top_key[threadIdx.x] = 0, sh.top_id[threadIdx.x] = INT_MAX;
    __syncthreads();
    RankTop(sh.lp_key, sh.lp_id, kWarps * n_lp, n_lp,
            [&](int rk, int i) { sh.top_key[rk] = sh.lp_key[i], sh.top_id[rk] = sh.lp_id[i]; });
  }
  // Top-k with k <= kThreads: a lower bound on the row's k-th largest score key, this CTA's k-th
  // largest per-thread best (k distinct tokens are at or above it), then the largest over the
  // cluster. Few keys lie above it where the row's tokens are spread over the threads (about k
  // a CTA for values in no particular order), so top-k's first level can copy them all
  // (Copy::optimistic) and the row is read once less. Any bound gives the same threshold.
  uint32_t topk_bound = 0;
  if (filters && engine::HasTopK(sp, vocab) && sp.top_k <= kThreads) {
    uint64_t l = 0, h = UINT32_MAX;  // the largest t with #(thread_best >= t) >= k
    while (l < h) {
      const uint64_t mid = (l + h + 1) >> 1;
      if (__syncthreads_count(thread_best >= mid) >= sp.top_k) {
        l = mid;
      } else {
        h = mid - 1;
      }
    }
    topk_bound = static_cast<uint32_t>(l);
  }
  // The cluster's best and max (every CTA reads every CTA's, in rank order).
  if (threadIdx.x == 0) {
    sh.x_best_key = best_key, sh.x_best_id = best_id, sh.x_max_raw = max_raw;
    sh.x_min_key = min_key, sh.x_topk_bound = topk_bound;
  }
  cl.sync();
  for (int r = 0; r < parts; ++r) {
    const Smem* o = cl.map_shared_rank(&sh, r);
    if (KeyBefore(o->x_best_key, o->x_best_id, best_key, best_id))
      best_key = o->x_best_key, best_id = o->x_best_id;
    max_raw = max(max_raw, o->x_max_raw);
    min_key = min(min_key, o->x_min_key);
    topk_bound = max(topk_bound, o->x_topk_bound);
  }
  const float min_value = engine::KeyValue(min_key);

  // The filters' threshold, then the draw with the logprobs' weight sum. The pass in which a
  // filter's SelectKey copies this CTA's candidates also does what it can of both: the weights
  // of every token, and the draw from the tokens above the candidates (all kept) where no later
  // filter may still drop them; top-k copies every key above its interval too where they fit,
  // so that top-p then starts from them. The kept candidates are drawn afterwards; a pass of its
  // own does what is left (min-p alone, or a CTA whose candidates never fitted).
  const float max_z = engine::KeyValue(max_raw);
  Draw draw;
  draw.start = engine::StreamStart(sp.seed, sp.position);
  u64 weight_sum = 0;
  // KeyWeight(raw key of z, max_z) without the key's round trip: KeyValue(OrderKey(Canon(z))) is
  // Canon(z), and FixedWeight(AddF(Canon(z), -max_z)) is FixedWeight(AddF(z, -max_z)) for every
  // z (NaN and -inf weigh 0 either way; -0 and +0 give the same weight).
  auto add_weights = [&](int v0, float4 q, int n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j < n) weight_sum += engine::FixedWeight(engine::AddF(QuadAt(q, j), -max_z));
    }
  };
  bool visit_draw = false, visit_weights = false;  // what the next SelectKey's visit does
  Copy cp;
  auto visit = [&](int v0, float4 q, int n, const uint32_t(&k)[4], uint32_t hi, bool gathering) {
    if (visit_draw && !gathering) {
      bool keep[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) keep[j] = j < n && k[j] > hi;
      draw.Quad(v0, k, keep);
    }
    if (visit_weights && !cp.weights_visited) add_weights(v0, q, n);
  };
  auto visit_step = [&] {
    if (visit_draw) draw.Step();
  };
  uint32_t floor_key = 0;
  bool weights_done = false, cands_cover = false;  // cands_cover: candidates + drawn = kept
  if (filters) {                                   // (temperature rows only: greedy has none)
    if (sp.min_p > 0.0f) floor_key = engine::MinPKey(best_key, sp.min_p);
    int64_t kept = -1;  // elements >= floor_key, where known
    const bool top_p = sp.top_p < 1.0f;
    if (engine::HasTopK(sp, vocab)) {
      visit_draw = !top_p, visit_weights = n_lp > 0;
      cp.visit = true, cp.gather = true;
      const uint32_t lo = max(floor_key, topk_bound);
      cp.optimistic = lo > 0;  // (from 0 every key is in range: it could not fit)
      floor_key =
          SelectKey(sh, cl, z, vocab, sl, key_of, lo, best_key, false, 0.0f,
                    static_cast<u64>(sp.top_k), 1.0f, -1, min_value, &kept, cp, visit, visit_step);
      cp.optimistic = false;
      weights_done = (cp.visited || cp.weights_visited) && visit_weights;
      cands_cover = cp.gathered || (cp.visited && visit_draw);
    }
    if (top_p) {
      int64_t unused = 0;  // few kept by top-k: top-p's first level already gathers them
      visit_draw = true, visit_weights = n_lp > 0 && !weights_done;
      cp.visit = true, cp.gather = false, cp.start_in_smem = cp.gathered;
      floor_key = SelectKey(sh, cl, z, vocab, sl, key_of, floor_key, best_key, true,
                            engine::KeyValue(best_key), 0, sp.top_p, kept, min_value, &unused, cp,
                            visit, visit_step);
      weights_done = weights_done || (cp.visited && visit_weights);
      cands_cover = cp.start_in_smem || cp.visited;
    }
  }
  if (cands_cover) {
    for (int i = threadIdx.x; i < cp.ncand; i += kThreads) {
      if (sh.cand_key[i] >= floor_key) draw.One(sh.cand_id[i], sh.cand_key[i]);
    }
  }
  const bool draw_pass = !greedy && !cands_cover, weights_pass = want_lp && !weights_done;
  if (draw_pass || weights_pass) {
    ForEachQuad(
        z, vocab, sl,
        [&](int v0, float4 q, int n) {
          if (draw_pass) {
            uint32_t k[4];
            bool keep[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              k[j] = j < n ? key_of(v0 + j, QuadAt(q, j)) : 0;
              keep[j] = j < n && k[j] >= floor_key;
            }
            draw.Quad(v0, k, keep);
          }
          if (weights_pass) add_weights(v0, q, n);
        },
        [&] {
          if (draw_pass) draw.Step();
        });
  }
  float best_score = draw.best_score;
  int draw_id = draw.draw_id;
  if (!greedy) BlockBestScore(best_score, draw_id, sh);
  if (want_lp) weight_sum = BlockSum(weight_sum, sh);
  if constexpr (kScore) rank_count = BlockSum(rank_count, sh);
  if (threadIdx.x == 0) {
    sh.x_draw_score = best_score, sh.x_draw_id = draw_id, sh.x_weight_sum = weight_sum;
    if constexpr (kScore) sh.x_rank = rank_count;
  }
  cl.sync();
  if (rank == 0) {
    // Rank 0 combines the cluster's draws, weight sums and top logprob lists and writes the row.
    int token = kScore ? sp.score_token : best_id;
    u64 wsum = 0, rank_sum = 0;
    if (!greedy) {
      best_score = 0.0f, token = -1;
      for (int r = 0; r < parts; ++r) {
        const Smem* o = cl.map_shared_rank(&sh, r);
        if (ScoreBefore(o->x_draw_score, o->x_draw_id, best_score, token))
          best_score = o->x_draw_score, token = o->x_draw_id;
      }
    }
    if (threadIdx.x == 0) out[row] = token;
    if constexpr (kScore) {
      for (int r = 0; r < parts; ++r) rank_sum += cl.map_shared_rank(&sh, r)->x_rank;
    }
    if (want_lp) {
      for (int r = 0; r < parts; ++r) wsum += cl.map_shared_rank(&sh, r)->x_weight_sum;
      for (int i = threadIdx.x; i < parts * n_lp; i += kThreads) {
        const Smem* o = cl.map_shared_rank(&sh, i / n_lp);
        sh.lp_key[i] = o->top_key[i % n_lp], sh.lp_id[i] = o->top_id[i % n_lp];
      }
    }
    cl.sync();  // the other CTAs may exit now
    if (want_lp) {
      // Logprobs: lse from the exact weight sum; the cluster's candidates ranked give the top
      // n_lp (sentinels rank past them: n_lp <= vocab real keys precede them).
      const double lse = engine::LogSumExp(max_z, wsum);
      engine::RowLogprobs& o = lp_out[row];
      RankTop(sh.lp_key, sh.lp_id, parts * n_lp, n_lp, [&](int rk, int i) {
        o.top_ids[rk] = sh.lp_id[i];
        o.top[rk] = engine::LogprobOf(engine::KeyValue(sh.lp_key[i]), lse);
      });
      // Slots past n_lp are zero, as in the host rule's result: the row's bytes are defined (the
      // buffer's stale bytes would otherwise differ between two runs of the same row).
      for (int i = n_lp + static_cast<int>(threadIdx.x); i < engine::kMaxLogprobs; i += kThreads) {
        o.top_ids[i] = 0;
        o.top[i] = 0.0f;
      }
      if (threadIdx.x == 0) {
        o.num_top = n_lp;
        o.rank = static_cast<int32_t>(rank_sum);  // (0 but in score rows, as on the host)
        o.sampled = engine::LogprobOf(z[token], lse);
      }
    }
  } else {
    cl.sync();  // rank 0 has read this CTA's shared memory
  }
}

// Grid: rows * split CTAs in clusters of `split`; the cluster of row r is CTAs
// [r * split, (r + 1) * split). Each instance skips the other's rows: kScore runs the score rows
// (launched only for batches that have some), the other every other row.
template <bool kScore>
__global__ void __launch_bounds__(kThreads, 2)
    SampleKernel(const float* logits, int vocab, const SampleSpec* specs,
                 const int32_t* penalty_tokens, const int32_t* penalty_counts,
                 const float* penalty_bias, int32_t* out, engine::RowLogprobs* lp_out) {
  WaitForPriorGrids();
  extern __shared__ uint4 smem_raw[];
  Smem& sh = *reinterpret_cast<Smem*>(smem_raw);
  const SampleSpec sp = specs[blockIdx.x / cg::this_cluster().num_blocks()];
  if ((sp.score_token >= 0) != kScore) return;  // (the whole cluster: one row, one spec)
  if constexpr (kScore) {
    SampleRow<false, true>(logits, vocab, sp, specs, penalty_tokens, penalty_counts, penalty_bias,
                           out, lp_out, sh);
  } else if (engine::UsesPenalty(sp) && engine::UsesEntries(sp)) {
    SampleRow<true>(logits, vocab, sp, specs, penalty_tokens, penalty_counts, penalty_bias, out,
                    lp_out, sh);
  } else {
    SampleRow<false>(logits, vocab, sp, specs, penalty_tokens, penalty_counts, penalty_bias, out,
                     lp_out, sh);
  }
}

// One thread per uniform j: counts those whose noise exceeds kGumbelMax or GumbelUpper.
__global__ void GumbelBoundKernel(unsigned long long* violations) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  const float u = engine::UniformOf(j);
  const float g = engine::GumbelNoise(u);
  if (!(g <= kGumbelMax) || !(g <= GumbelUpper(u)) || !(g <= GumbelCoarse(j))) {
    atomicAdd(violations, 1ull);
  }
}

std::atomic<size_t> g_smem_set{0};
std::atomic<int> g_sms{0};
std::atomic<int> g_max_split{0};          // the largest cluster size that fits, 0: not known yet
std::atomic<bool> g_sample_twice{false};  // SetSampleTwiceForTiming

// CTAs per row: up to two CTAs per SM over all rows (this kernel's occupancy), at most the
// largest cluster that fits. The result does not depend on it.
int SplitFor(int n) {
  int split = g_max_split.load();
  while (split > 1 && n * split > 2 * g_sms.load()) split /= 2;
  return split;
}

cudaError_t EnsureSetUp(size_t smem) {
  if (smem <= g_smem_set.load() && g_max_split.load() > 0) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(
      SampleKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(SampleKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  int device = 0, sms = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return e;
  int split = kMaxSplit;
  for (; split > 1; split /= 2) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(split);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = split;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, SampleKernel<false>, &config) == cudaSuccess &&
        clusters > 0) {
      break;
    }
    cudaGetLastError();  // a size that does not fit is not an error of the launch
  }
  g_sms.store(sms);
  g_max_split.store(split);
  g_smem_set.store(smem);
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchGumbelBoundCheck(unsigned long long* violations, cudaStream_t stream) {
  if (cudaError_t e = cudaMemsetAsync(violations, 0, sizeof(*violations), stream); e != cudaSuccess)
    return e;
  GumbelBoundKernel<<<(1u << 24) / 256, 256, 0, stream>>>(violations);
  return cudaGetLastError();
}

void SetSampleTwiceForTiming(bool on) { g_sample_twice.store(on); }

size_t SampleRowsSmemBytes(int vocab) {
  const size_t words = static_cast<size_t>((vocab + 31) / 32);
  return sizeof(Smem) + words * 4 + (words + kRankWords - 1) / kRankWords * 4;
}

cudaError_t LaunchSampleRows(const float* logits, int n, int vocab, const SampleSpec* specs,
                             const int32_t* penalty_tokens, const int32_t* penalty_counts,
                             const float* penalty_bias, int32_t* out, engine::RowLogprobs* logprobs,
                             bool score_rows, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t smem = SampleRowsSmemBytes(vocab);
  if (cudaError_t e = EnsureSetUp(smem); e != cudaSuccess) return e;
  const int split = SplitFor(n);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(n * split);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = split;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  config.numAttrs = ProgrammaticLaunchEnabled() ? 2 : 1;
  auto launch = [&](auto kernel) {
    return cudaLaunchKernelEx(&config, kernel, logits, vocab, specs, penalty_tokens, penalty_counts,
                              penalty_bias, out, logprobs);
  };
  cudaError_t err = launch(SampleKernel<false>);
  if (err == cudaSuccess && g_sample_twice.load(std::memory_order_relaxed)) {
    err = launch(SampleKernel<false>);
  }
  if (err == cudaSuccess && score_rows) err = launch(SampleKernel<true>);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace cascade::cuda::internal
