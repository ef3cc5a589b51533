// Paged attention for prefill, decode and cascade (shared-prefix) decode, with a host-side plan.
//
// One function for every query: query row r (global position p) of a sequence attends to the
// keys at positions [0, p] of that sequence (causal mask with offset). Keys are cut into TILES
// of kTileTokens tokens aligned at position 0; a tile's partial state (unnormalized P.V, max
// score, sum of p) is a fixed function of the query and the tile's keys, and the final state is
// the left fold, in tile order, of the partials of the tiles that hold at least one visible key
// (attention.cu: RowSoftmax, Fold). Whether the prefill kernel folds all tiles of a row in
// registers (final items), or tiles are computed by separate CTAs and folded by a merge kernel
// (split decode), or a shared-prefix tile is computed once for a whole group of requests
// (cascade), the same partials are folded in the same order with the same arithmetic, so all
// three give bitwise equal results. This is what makes cascade == non-cascade and cached == cold
// bitwise.
//
// Two levels (AttentionConfig::super_tiles = G > 1): tiles group into SUPER-TILES of G tiles, also
// aligned at position 0. Inside a super-tile a row's state is accumulated in place from the empty
// state, tile by tile in order (FA3's order: m' = max(m, tile max), o and l scaled by 2^(m - m'),
// P = 2^(s - m') rounded to bf16, o += P V on the tensor cores; attention.cu: RowSoftmaxInPlace);
// the row's final state is the left fold (Fold), in order, of its super-tiles' states. G = 1 is
// exactly the one-level order above (a tile accumulated from the empty state is its partial).
// Everything else holds as before with "super-tile" for "tile": split items start at super-tile
// boundaries and write one partial per super-tile, a cascade group shares whole super-tiles.
// The gain: no per-tile partial and fold inside a super-tile (prefill, bench/kernels/NOTES.md)
// and G times fewer partials to write and merge (split decode, cascade).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/backend/cuda/cuda_defaults.h"
#include "gpu_worker/backend/cuda/kernel_types.h"
#include "gpu_worker/backend/cuda/ops.h"

namespace cascade::cuda {

// How cascade groups decode rows (every grouping gives the same bits; only the work differs).
enum class CascadeGrouping {
  // Per KV tile index, the rows whose block tables name the same physical blocks for that full
  // tile read it once: system, context and any deeper level of a prefix tree, and rows whose
  // tables diverge and meet again.
  kEveryTile,
  // The single-level grouping kept for comparison (bench): rows grouped by the blocks of their
  // first tile share only the leading tiles common to the whole group.
  kLeadingTiles,
};

struct AttentionConfig {
  int num_q_heads = 0;
  int num_kv_heads = 0;  // divides num_q_heads; query head h reads kv head h / group
  int head_dim = 0;      // 32, 64, 128 or 256
  int block_size = 0;    // divides kTileTokens
  bool cascade = true;   // decode rows that share KV tiles read them once per step
  CascadeGrouping grouping = CascadeGrouping::kEveryTile;
  // Most consecutive tiles of one split item (one CTA loops over them for the same rows, one
  // partial per tile as with one tile per item, so results do not change); 0: chosen by the
  // planner from the step's number of decode tiles.
  int tiles_per_item = 0;
  // Tiles of a decode row's first split item, which folds them inside its CTA and writes one
  // partial (the same bits as one partial per tile folded by the merge; less partial traffic):
  // 0: chosen by the planner (whole runs from tile 0 when the fold items' waves end within about
  // the step's tile reads per CTA, else tiles_per_item); > 0: this many (at least
  // tiles_per_item); < 0: no fold items.
  int lead_tiles = 0;
  // Split CTAs per kv head in one wave on the device (SplitCtasPerWave), which sizes fold items;
  // 0: 66 (an H100's or H200's 132 SMs at 4 split CTAs each over 8 kv heads).
  int split_ctas = 0;
  // SMs where the persistent decode kernel (split form 3) can run: Hopper, head_dim 128, group
  // <= 8, blocks of a multiple of 16 tokens (the backend's PersistentDecodeCtas); 0: it cannot.
  // With it the planner also folds whole rows at smaller batches (one (row, kv head) work per SM
  // is enough there: measured 1.17-1.21x at batch 16, ctx 1k-4k, bench/kernels/RESULTS.md).
  int ws_ctas = 0;
  // A fold item that holds every tile of its rows writes their outputs (kFoldFinish) instead of
  // a partial for the merge (the same bits; one pass less over a row's state), in plans of the
  // shared-memory split form (SplitForm 0); false: always a partial (benchmarks).
  bool finish_rows = true;
  // Tiles per super-tile of the fold order (see the top of this file): 1, today's per-tile
  // partials, on every device and head_dim; > 1 only where every kernel that may run the model's
  // attention implements it (SuperTilesFor: Hopper, head_dim 128). Every path of one model must
  // use the same value: it defines the bits.
  int super_tiles = 1;
  // Rows of a wide cascade item (WideCascadeRows: 128 / group on Hopper at head_dim 128 with
  // blocks of a multiple of 16 tokens, else 0). A shared run read by more rows than one split CTA
  // holds (kMaxQueriesPerCta / group) is cut into chunks of up to this many rows, each item its
  // leading fold run or one super-tile (one tile in the one-level order), which the persistent
  // wgmma kernel runs 128 q-rows a CTA, writing the partial the split kernel would (the same
  // bits). 0: every split item on the split kernel.
  int wide_rows = 0;
  // In a plan with wide items, the other split items too (the rows' own tiles, groups that fit a
  // split CTA) run on the persistent wgmma kernel, cut into one-super-tile items (a fold run from
  // tile 0 stays whole): one launch for the step instead of the wide kernel and then the split
  // kernel. The same partials, the same bits. Off by default: measured on an H200
  // (bench/kernels/RESULTS.md) the one-level order lost (tree 160.8 vs 133.6 us, engine tree
  // decode 6.17 vs 5.45 ms a step: a one-row, one-tile work fills 2 of the kernel's 128 q-rows),
  // while the two-level order's four-tile works gained (shared prefix 43.8 vs 49.6 us).
  bool wide_all = false;
  // CTAs of the wide kernel's schedule (AttentionPlan::wide_sched): the SM count where wide_rows
  // is set (the backend passes it whether or not the persistent decode kernel runs); 0: ws_ctas;
  // both 0: no schedule (the kernel's own snake).
  int wide_ctas = 0;
  // Wide runs of rows that fill at most half the wgmma kernel's q-rows take two tiles a work,
  // one a consumer warpgroup (kFoldPair; the one-level order). The same partials, the same bits.
  bool wide_pairs = true;
  // Wide chains (one-level order): a wide run whose rows go on in wide runs of their own (a system
  // chunk's rows in their contexts) is cut into one chunk per such run, each the same rows in the
  // same order, so that one fold run from tile 0 goes on through the continuing run (a work per
  // context and kv head folding system and context tiles in its CTA: no context partials, fewer
  // works, the merge only the rows' own tiles). The same bits: a fold run from tile 0 is the
  // merge's left fold. The system tiles are read once per chunk.
  bool wide_chains = true;
};

// Host views of the batch's attention metadata (see engine::ForwardBatch for the meaning).
struct AttentionBatch {
  const int32_t* positions = nullptr;  // [num_tokens]
  int num_tokens = 0;
  const int32_t* query_start = nullptr;        // [num_seqs + 1]
  const int32_t* context_lens = nullptr;       // [num_seqs]
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1]
  const int32_t* block_ids = nullptr;          // [block_table_start[num_seqs]]
  int num_seqs = 0;
};

// Work partition of one batch, made on the host once per step and shared by all layers.
// A work item is one CTA per kv head: {table_offset (into block_ids, of the sequence whose block
// table is read), tile_begin, tile_end, row_begin (into item_rows), row_count, kv_len (keys
// [0, kv_len) may be read), fold (split items only, kernel_types.h: kFoldPartial when tile_begin
// is 0 and the item folds its tiles into one partial, written at its last tile's slot;
// kFoldFinish when that fold is every tile of its rows, whose outputs it writes)}.
struct AttentionPlan {
  // Items whose rows fold all their tiles inside the CTA and write the output (prefill chunks).
  std::vector<int32_t> final_items;  // [num_final * kItemFields]
  // Items that write one partial state per (row, tile) for the merge kernel (decode rows), or
  // one per row for a fold item's tiles.
  std::vector<int32_t> split_items;  // [num_split * kItemFields]
  std::vector<int32_t> item_rows;    // token rows of the items, concatenated
  // [num_tokens] for a split row, the slot of its tile t is base + t (t past its fold item, whose
  // state sits at the slot of the fold item's last tile); -1 for other rows and for rows a
  // kFoldFinish item completes.
  std::vector<int32_t> partial_base;
  // [num_merge * 3] {row, first slot, slots} for each split row: its slots are consecutive; no
  // slot for a row its kFoldFinish item completes (the merge leaves its output alone).
  std::vector<int32_t> merge_list;
  int num_partials = 0;    // partial slots; each holds [num_q_heads, head_dim] f32 + lse
  int max_final_rows = 0;  // most rows in one final item (sizes shared memory)
  int max_split_rows = 0;  // most rows in one split item
  // Statistics. A cascade group is a maximal run of consecutive tiles that the same set of >= 2
  // decode rows reads once (a node of the prefix tree: a system chunk, a context chunk); a group
  // that sits one level below another, or that rows join again after diverging, is a new group.
  int cascade_groups = 0;
  // (tile, group) pairs read once for a group of >= 2 rows: each shared tile counted once per
  // group that reads it in this step.
  int cascade_shared_tiles = 0;
  // Tiles read by split items, over all items (a shared tile once per row chunk of its group),
  // and the tiles the decode rows fold (one per (row, tile)): the work cascade saves.
  int split_tile_reads = 0;
  int decode_row_tiles = 0;
  // Set by PlanAttention where the decode rows' (row, kv head) works are at most one per consumer
  // of the persistent decode kernel (two per AttentionConfig::ws_ctas): whole rows run on it
  // whatever their length (SplitForm 3).
  bool one_round = false;
  // AttentionConfig::super_tiles. Split items start at a multiple of it and end at one or at
  // their rows' last tile, and partial slots are per super-tile (slot of tile t = base + t /
  // super_tiles). With super_tiles > 1 a split item's fold spans one super-tile at most, except
  // whole rows on the persistent decode kernel (split form 3), which fold super-tiles in order.
  int super_tiles = 1;
  // The first num_wide split items are wide cascade items (AttentionConfig::wide_rows; more rows
  // than a split CTA holds); max_split_rows counts only the others, max_wide_rows these.
  int num_wide = 0;
  int max_wide_rows = 0;
  // With wide items and AttentionConfig::wide_ctas or ws_ctas > 0: the persistent wgmma kernel's
  // schedule, one entry per CTA (wide_ctas, else ws_ctas) and one more. CTA c runs the
  // wide works [wide_sched[c], wide_sched[c + 1]) in order, work w being item w % num_wide at kv
  // head w / num_wide (a pass over the items per kv head). The planner orders the wide items so
  // that consecutive ranges can balance (the long ones, a fold run of many tiles, spaced out
  // within a pass, each followed by its share of the one-tile ones) and picks the ranges whose
  // costliest CTA costs the least (WideWorkCost: a work's tiles plus its fixed cost). Empty
  // without wide items (the kernel then deals the works out in a snake, as for prefill). The
  // schedule changes no result: every work writes its own partials or rows.
  std::vector<int32_t> wide_sched;

  int num_final() const { return static_cast<int>(final_items.size()) / kItemFields; }
  int num_split() const { return static_cast<int>(split_items.size()) / kItemFields; }
  int num_merge() const { return static_cast<int>(merge_list.size()) / 3; }
};

// Plans `batch`. Rows of a sequence with one new token are decode rows (split + merge, cascade
// candidates); rows of longer sequences are prefill rows (final items of up to
// PrefillQueriesPerCta(head_dim) / group rows, longest first). A shared tile becomes one split
// item per chunk of up to kMaxQueriesPerCta / group rows of its group. Host cost: one hash of a
// block id per (decode row, full tile), a probe of the tile's blocks only where another row's
// tile starts with the same block, nothing past a row's last such tile; no allocation per tile.
// Errors: InvalidArgument for inconsistent metadata (positions outside [0, context_len), block
// tables too short for context_len, bad config).
absl::Status PlanAttention(const AttentionConfig& config, const AttentionBatch& batch,
                           AttentionPlan* plan);

// CTAs per kv head that fill one wave of the split kernel on the current device: the grid of a
// graph-captured split launch (AttentionPlanView::split_count).
absl::StatusOr<int> SplitCtasPerWave(int head_dim, int num_kv_heads, int split_form = 0);

inline constexpr int kDefaultDecodeWsMinTiles = kDefaultPersistentDecodeMinTiles;
// Split form 3 (the persistent decode kernel) needs whole-row items of at least this many tiles
// on average; shorter rows take form 2 (measured: bench/kernels/RESULTS.md). Process-wide;
// benchmarks compare settings (SetDecodeWsMinTiles; 0: form 3 for every whole-row plan, INT_MAX:
// never).
int DecodeWsMinTiles();
void SetDecodeWsMinTiles(int tiles);
// Plans of fewer (row, kv head) works than 7/8 of the SMs (batch 1-14 at 8 kv heads) whose rows
// are all short (<= kDecodeWsFewWorksMaxTiles tiles) on the persistent decode kernel too: its
// consumers fold each row whole, with no merge launch after them, where the split kernel spreads
// a row's few tiles over CTAs and then merges them. Longer rows keep the split kernel: there the
// spread is the parallelism. Off by default: measured within noise on an H200 (qwen3-0.6b,
// prompt 128: batch 1 1.133 / 1.189 vs 1.160 / 1.154 ms a step, batch 8 1.197 / 1.230 vs 1.254 /
// 1.244; the merge's boundary is already hidden by programmatic launch). Process-wide.
inline constexpr int kDecodeWsFewWorksMaxTiles = 4;
bool DecodeWsFewWorks();
void SetDecodeWsFewWorks(bool on);

// The every-tile planner's fast path (default on): a tile whose first block no other (row, tile)
// starts with gets its row's own group without a probe, and a row leaves the tile loop after
// its last tile another row may share. The same plans either way; off only in the planner's
// test that compares the two.
bool PlannerSkipsUnsharedTiles();
void SetPlannerSkipsUnsharedTiles(bool on);
// Split form 6 (the rows' own tiles of a wide cascade step on the persistent decode kernel): on by
// default; benchmarks compare it with the shared-memory form (false: form 0). Process-wide.
bool OwnTilesOnPersistentDecode();
void SetOwnTilesOnPersistentDecode(bool on);

// The split kernel form for a plan (AttentionPlanView::split_form):
//  1: the register form, where a split item reads a tile once for several rows (measured faster
//     on cascade steps: its one barrier per tile and register-resident tiles make a shared tile's
//     serial chain short); not where wide cascade items took every shared tile and the split
//     kernel runs rows' own tiles alone (there the shared-memory form measured 1.25x faster:
//     bench/kernels/RESULTS.md);
//  2: every split item is a whole decode row (kFoldFinish from tile 0), so each writes its rows'
//     outputs: the shared-memory form, and no merge launch;
//  3: as 2, with rows of at most 8 q-rows (one row an item, `group` = query heads per kv head
//     <= 8) at head_dim 128, DecodeWsMinTiles() tiles or more on average or a one-round plan
//     (AttentionPlan::one_round): the persistent warp-specialized decode kernel on Hopper (the
//     shared-memory form elsewhere), no merge;
//  6: wide cascade items took every shared tile and each split item after them is one row's (its
//     own tiles, or a row that shares nothing), at head_dim 128 with at most 8 q-rows a row: the
//     persistent decode kernel runs them (the shared-memory form elsewhere), writing the split
//     kernel's partials (one per tile, or super-tile) where an item does not finish its rows,
//     then the merge (OwnTilesOnPersistentDecode; measured faster than the shared-memory form's
//     CTA per item: bench/kernels/RESULTS.md);
//  0: else, the shared-memory form (faster on distinct rows: more warps and loads in flight).
inline int SplitForm(const AttentionPlan& plan, int head_dim, int group) {
  if (head_dim <= 128 && plan.cascade_shared_tiles > 0) {
    for (int i = plan.num_wide; i < plan.num_split(); ++i) {
      if (plan.split_items[static_cast<size_t>(i) * kItemFields + 4] > 1) return 1;
    }
    if (plan.num_wide == 0) return 1;
    if (head_dim == 128 && group <= 8 && OwnTilesOnPersistentDecode()) return 6;
  }
  if (plan.num_split() == 0) return 0;
  bool single_rows = true, multi_super = false;
  int64_t tiles = 0;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
    if (it[6] != kFoldFinish || it[1] != 0) return 0;
    single_rows = single_rows && it[4] == 1;
    multi_super = multi_super || (plan.super_tiles > 1 && it[2] > plan.super_tiles);
    tiles += it[2];
  }
  // Rows of several super-tiles folded whole run only on the persistent kernel (the planner makes
  // them only in its shape).
  const bool ws = head_dim == 128 && group <= 8 && single_rows &&
                  (multi_super || plan.one_round ||
                   tiles >= static_cast<int64_t>(DecodeWsMinTiles()) * plan.num_split());
  return ws ? 3 : 2;
}

// Runs the plan: final items, split items, then the merge (three launches, no host sync, no
// allocation: graph-capturable). Rows not covered by the plan are left untouched.
absl::Status Attention(const AttentionArgs& args, const AttentionPlanView& plan, Stream stream);

// Whether prefill items of head_dim 128 can run on the Hopper wgmma kernel on the current device
// (compute capability 9.0); PrefillPath::kAuto picks it then. FailedPrecondition from Attention
// when kWgmma is asked for where it cannot run.
absl::StatusOr<bool> WgmmaPrefillAvailable();

// AttentionConfig::ws_ctas for a model on the current device: its SM count where the persistent
// decode kernel can run (compute capability 9.0, head_dim 128, group <= 8, block_size a multiple
// of 16), else 0.
absl::StatusOr<int> PersistentDecodeCtas(int head_dim, int group, int block_size);

// AttentionConfig::super_tiles for a model on the current device: kSuperTiles where every kernel
// that may run its attention implements the two-level order (Hopper, head_dim 128, blocks of a
// multiple of 16 tokens: prefill on the warp-specialized kernel, decode on the split kernels and
// the persistent one; the two-warpgroup prefill kernel v7, which takes blocks of 8, does not),
// else 1. (kSuperTiles, the two-level order's super-tile, is in cuda_defaults.h.)
absl::StatusOr<int> SuperTilesFor(int head_dim, int block_size);

// Prefill attention on Hopper runs the warp-specialized kernel in one of two forms that give the
// same bits: one consumer schedule over whole-tile TMA copies (form 0, the default), or two
// consumer warpgroups in ping-pong over 16-token pieces (form 1). Which is faster differs between
// devices and even between H200 machines (bench/kernels/RESULTS.md: either by up to ~7%), so
// TunePrefillForm times both on a cold prompt of `tokens` tokens of the model's head shape and
// makes the faster the process-wide default (ping-pong only if >= 1% faster). It allocates its own
// buffers (~4 x tokens x heads x head_dim x 2 bytes) and synchronizes `stream`; not during graph
// capture. Where only one form can run (no sm_90a code, head_dim != 128, blocks not a multiple of
// 16 tokens) it times nothing (tuned false).
struct PrefillFormChoice {
  int form = 0;          // 0 warp-specialized, 1 ping-pong
  bool tuned = false;    // both forms were timed
  float us[2] = {0, 0};  // median time of one prefill call per form
  std::string Describe(int tokens) const;
};
absl::StatusOr<PrefillFormChoice> TunePrefillForm(const HeadShape& shape, int block_size,
                                                  int tokens, Stream stream);

// AttentionConfig::wide_rows for a model on the current device: 128 / group where the wgmma
// kernels run its attention (compute capability 9.0, head_dim 128, group <= 8, blocks of a
// multiple of 16 tokens), else 0.
absl::StatusOr<int> WideCascadeRows(int head_dim, int group, int block_size);

}  // namespace cascade::cuda
