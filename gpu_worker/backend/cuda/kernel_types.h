// Plain structs and constants shared by the op wrappers and the kernels. CUDA-free and
// absl-free, so that both g++ and nvcc translation units include it cheaply.
#pragma once

#include <cstdint>

#include "gpu_worker/engine/sample_rule.h"

struct CUstream_st;

namespace cascade::cuda {

using Stream = CUstream_st*;  // == cudaStream_t
using Bf16 = uint16_t;        // raw bfloat16 bits

// Split-KV tile size in tokens. Tile boundaries are multiples of this from position 0, for every
// plan; block_size must divide it.
inline constexpr int kTileTokens = 64;
// At most this many (row, query head) pairs share one split CTA (one K/V tile load).
inline constexpr int kMaxQueriesPerCta = 32;
// (row, query head) pairs of one prefill CTA (16 per warp; head_dim 256 keeps half the rows so
// that its registers and K/V stages fit).
constexpr int PrefillQueriesPerCta(int head_dim) { return head_dim > 128 ? 64 : 128; }
// Fields of one work item in AttentionPlan::*_items (see AttentionPlan).
inline constexpr int kItemFields = 7;
// Item field 6 (split items): kFoldNone, one partial per (row, tile); kFoldPartial, the item's
// tiles (a row's first) folded in the CTA into one partial; kFoldFinish, as kFoldPartial for rows
// that have no tile past the item, whose outputs the CTA writes itself (the merge skips them).
inline constexpr int kFoldNone = 0;
inline constexpr int kFoldPartial = 1;
inline constexpr int kFoldFinish = 2;
// kFoldPair (wide items only, the one-level order): two tiles of rows that fill at most half the
// wgmma kernel's q-rows, one a consumer warpgroup, each written as its own partial from the empty
// state (as two kFoldNone items would be): the rows read once, two tiles' math at once.
inline constexpr int kFoldPair = 3;

struct HeadShape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Paged KV cache of one layer: k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim]
// bf16. Slot s is block s / block_size, offset s % block_size.
struct KvCacheView {
  Bf16* k = nullptr;
  Bf16* v = nullptr;
  int64_t num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Device views of a plan (same layout as AttentionPlan, uploaded by the caller).
struct AttentionPlanView {
  const int32_t* final_items = nullptr;
  int num_final = 0;
  const int32_t* split_items = nullptr;
  int num_split = 0;  // split items, or with split_count: the CTAs (per kv head) that run them
  const int32_t* item_rows = nullptr;
  const int32_t* partial_base = nullptr;
  const int32_t* merge_list = nullptr;
  int num_merge = 0;
  int max_final_rows = 0;
  int max_split_rows = 0;
  // Graph mode: [1] device count of split items; a fixed grid of num_split CTAs loops over them,
  // so one captured launch serves every step whatever its number of items. nullptr: eager.
  const int32_t* split_count = nullptr;
  // The split kernel's form (SplitForm of the plan; the same bits either way): 0 the shared-memory
  // form, 1 the register form (head_dim <= 128), 2 the shared-memory form with every row finished
  // by its item (no merge launch), 3 as 2 on the persistent decode kernel, 6 the rows' own tiles
  // after wide cascade items on the persistent decode kernel, then the merge (SplitForm).
  int split_form = 0;
  // Forms on the persistent decode kernel (3, 6), and forms the merge follows (0, 1, 6).
  static constexpr bool OnPersistentDecode(int form) { return form == 3 || form == 6; }
  static constexpr bool Merges(int form) { return form < 2 || form == 6; }
  // [2] device ints, zero before the first launch (cudaMemset once): the work counter of the
  // persistent decode kernel (forms 3 and 6), which hands its (item, kv head) works out in plan
  // order and sets the counter back to zero as it ends. Required for form 3 (Attention fails with
  // InvalidArgument without it); launches that share it run one after another (one stream).
  int32_t* ws_work = nullptr;
  // AttentionPlan::super_tiles: tiles per super-tile of the fold order (attention.h).
  int super_tiles = 1;
  // Wide cascade items (AttentionPlan::num_wide), run by the Hopper wgmma kernel before the split
  // kernel. Eager: the first num_wide of split_items (num_split counts them). Graph mode
  // (split_count set): they sit apart at wide_items, their number on the device at wide_count,
  // split_items / split_count hold only the others, and num_wide > 0 says the launch is captured.
  int num_wide = 0;
  const int32_t* wide_items = nullptr;
  const int32_t* wide_count = nullptr;
  // AttentionPlan::wide_sched on the device (wide_ctas + 1 entries) and its CTAs, the wide
  // kernel's grid; nullptr: the kernel deals the works out itself (a snake over min(SMs, works)).
  const int32_t* wide_sched = nullptr;
  int wide_ctas = 0;
};

// The kernel that runs prefill items of head_dim 128 (every choice gives the same bits).
// kAuto: wgmma on a GPU with sm_90a machine code (Hopper), else mma.sync.
enum class PrefillPath : int32_t { kAuto = 0, kMmaSync = 1, kWgmma = 2 };

struct AttentionArgs {
  const Bf16* q = nullptr;  // [num_tokens, q_row_stride] bf16, query head h at column h*head_dim
  int q_row_stride = 0;
  KvCacheView cache;                   // this layer's paged cache (already holds the new K/V)
  const int32_t* positions = nullptr;  // [num_tokens] device
  const int32_t* block_ids = nullptr;  // device copy of AttentionBatch::block_ids
  Bf16* out = nullptr;                 // [num_tokens, num_q_heads * head_dim] bf16
  // Workspace for split rows, one partial per (tile, query head): partial_o [num_partials,
  // num_q_heads, head_dim] f32, the tile's unnormalized P.V, and partial_ml [num_partials,
  // num_q_heads, 2] f32, the tile's (max score in log2 units, sum of p); see attention.cu's Fold.
  float* partial_o = nullptr;
  float* partial_ml = nullptr;
  float scale = 0;  // softmax scale, usually 1/sqrt(head_dim)
  int num_q_heads = 0;
  PrefillPath prefill_path = PrefillPath::kAuto;
};

// Block ids of one KvBlockCopy launch, passed by value (a kernel parameter), so a copy enqueued
// on a stream needs no host buffer that outlives the call.
inline constexpr int kMaxKvBlocksPerCopy = 128;
struct KvBlockList {
  int32_t ids[kMaxKvBlocksPerCopy];
};

// Read-only regions (device pointer, bytes) one PrefetchL2 launch hints into the L2 cache, passed
// by value as a kernel parameter.
inline constexpr int kMaxL2Regions = 4;
struct L2Regions {
  const void* data[kMaxL2Regions] = {};
  uint64_t bytes[kMaxL2Regions] = {};
  int count = 0;
};

// Per-row sampling parameters on the device (engine::RowSample without the flag).
using RowSampleParams = engine::SampleSpec;

}  // namespace cascade::cuda
