// The attention planner (plain C++, no GPU): every decode row's tiles are computed exactly once,
// each by an item that loads exactly the keys the row's own flat item would load from the same
// blocks (so cascade == flat holds whatever the grouping), and cascade shares every tile that
// several rows name with the same blocks: one item per (shared tile, row chunk), at every level
// of a prefix tree, checked against a brute-force grouping.
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_worker/backend/cuda/attention.h"
#include "gtest/gtest.h"

namespace cascade::cuda {
namespace {

struct Seq {
  int q_len = 1;  // rows at positions ctx - q_len .. ctx - 1
  int ctx = 1;
  std::vector<int32_t> blocks;  // block table, >= ceil(ctx / block_size) entries
};

struct Batch {
  std::vector<int32_t> positions, query_start{0}, context_lens, table_start{0}, block_ids;
  std::vector<Seq> seqs;
  AttentionBatch View() const {
    return {positions.data(),
            static_cast<int>(positions.size()),
            query_start.data(),
            context_lens.data(),
            table_start.data(),
            block_ids.data(),
            static_cast<int>(seqs.size())};
  }
};

Batch MakeBatch(const std::vector<Seq>& seqs) {
  Batch b;
  b.seqs = seqs;
  for (const Seq& s : seqs) {
    for (int p = s.ctx - s.q_len; p < s.ctx; ++p) b.positions.push_back(p);
    b.query_start.push_back(static_cast<int32_t>(b.positions.size()));
    b.context_lens.push_back(s.ctx);
    b.block_ids.insert(b.block_ids.end(), s.blocks.begin(), s.blocks.end());
    b.table_start.push_back(static_cast<int32_t>(b.block_ids.size()));
  }
  return b;
}

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// A random prefix forest over a pool of paths: each sequence copies a random earlier sequence's
// first k blocks (k random; unless one in `fresh_one_in`), then takes fresh blocks; one in
// `meet_one_in` then takes `meet_run` blocks of a random earlier sequence at a random place
// (tables that meet again after diverging); one in `prefill_one_in` is a prefill row.
struct Forest {
  int max_seqs = 90, max_ctx = 1200, block_size = 16;
  int prefill_one_in = 8, fresh_one_in = 4, meet_one_in = 5, meet_run = 1;
};
std::vector<Seq> RandomForest(std::mt19937& rng, const Forest& f) {
  const int bs = f.block_size;
  std::vector<Seq> seqs;
  int next = 0;
  const int n = 1 + static_cast<int>(rng() % f.max_seqs);
  for (int i = 0; i < n; ++i) {
    Seq s;
    const bool prefill = rng() % f.prefill_one_in == 0;
    s.ctx = 1 + static_cast<int>(rng() % f.max_ctx);
    s.q_len = prefill ? 1 + static_cast<int>(rng() % s.ctx) : 1;
    const int nb = CeilDiv(s.ctx, bs);
    if (!seqs.empty() && rng() % f.fresh_one_in != 0) {
      const Seq& p = seqs[rng() % seqs.size()];
      const int k = std::min<int>(rng() % (p.blocks.size() + 1), (s.ctx - 1) / bs);
      s.blocks.assign(p.blocks.begin(), p.blocks.begin() + k);
    }
    while (static_cast<int>(s.blocks.size()) < nb) s.blocks.push_back(next++);
    if (!seqs.empty() && rng() % f.meet_one_in == 0 && (s.ctx - 1) / bs > 0) {
      const Seq& p = seqs[rng() % seqs.size()];
      const int j = static_cast<int>(rng() % std::min<size_t>(p.blocks.size(), (s.ctx - 1) / bs));
      const int end = std::min(
          {j + f.meet_run, static_cast<int>(p.blocks.size()), static_cast<int>(s.blocks.size())});
      for (int k = j; k < end; ++k) s.blocks[k] = p.blocks[k];
    }
    seqs.push_back(s);
  }
  return seqs;
}

// A shared tile as the plan reads it: (tile, the sorted rows that read it in one group).
using SharedRead = std::pair<int, std::vector<int>>;

// A fold item (from tile 0, its tiles folded into one state); not a pair (kFoldPair).
bool IsFold(const int32_t* it) { return it[6] == kFoldPartial || it[6] == kFoldFinish; }

// The cost of each range of the wide kernel's schedule (AttentionPlan::wide_sched): its works'
// tiles + 3 each (WideWorkCost; 4 a pair), work w being item w % num_wide.
std::vector<int64_t> RangeCosts(const AttentionPlan& plan) {
  std::vector<int64_t> out;
  for (size_t c = 0; c + 1 < plan.wide_sched.size(); ++c) {
    int64_t cost = 0;
    for (int w = plan.wide_sched[c]; w < plan.wide_sched[c + 1]; ++w) {
      const int32_t* it = &plan.split_items[static_cast<size_t>(w % plan.num_wide) * kItemFields];
      cost += it[6] == kFoldPair ? 4 : it[2] - it[1] + 3;  // a pair: its two tiles side by side
    }
    out.push_back(cost);
  }
  return out;
}

// Checks the structural invariants of `plan` for `b` and returns the shared reads (split items
// of >= 2 rows, chunks of one group joined back by (tile, table offset)).
std::set<SharedRead> CheckPlan(const AttentionConfig& cfg, const Batch& b,
                               const AttentionPlan& plan) {
  const int group = cfg.num_q_heads / cfg.num_kv_heads;
  const int rows_per_cta = std::max(1, kMaxQueriesPerCta / group);
  const int bs = cfg.block_size;
  // Decode rows: the only row of a one-token sequence.
  std::map<int, int> decode_seq;  // row -> sequence
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    if (b.query_start[s + 1] - b.query_start[s] == 1) decode_seq[b.query_start[s]] = s;
  }
  // Fold items: from tile 0, and the tiles they fold (per row). A finishing one (kFoldFinish)
  // holds every tile of each of its rows, and a fold item that does is a finishing one (unless
  // the config turns that off).
  std::map<int, int> folded;  // row -> tiles of its fold item
  std::set<int> finished;     // rows whose fold item writes their output
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[i * kItemFields];
    EXPECT_TRUE(it[6] == kFoldNone || it[6] == kFoldPartial || it[6] == kFoldFinish ||
                (it[6] == kFoldPair && i < plan.num_wide))
        << "fold flag " << it[6] << " of item " << i;
    if (it[6] == kFoldNone || it[6] == kFoldPair) continue;
    EXPECT_EQ(it[1], 0) << "a fold item starts at tile 0";
    bool whole = true;
    for (int k = it[3]; k < it[3] + it[4]; ++k) {
      const int row = plan.item_rows[k];
      EXPECT_FALSE(folded.count(row)) << "two fold items for one row";
      folded[row] = it[2];
      whole = whole && CeilDiv(b.positions[row] + 1, kTileTokens) == it[2];
      if (it[6] == kFoldFinish) finished.insert(row);
    }
    EXPECT_EQ(it[6] == kFoldFinish,
              whole && cfg.finish_rows && !(cfg.head_dim <= 128 && plan.cascade_shared_tiles > 0))
        << "item " << i;
  }
  for (int i = 0; i < plan.num_final(); ++i) EXPECT_EQ(plan.final_items[i * kItemFields + 6], 0);
  // Merge list: one entry per decode row, a slot per tile past its fold item and one for the
  // fold item (at the slot of its last tile), disjoint slot ranges.
  EXPECT_EQ(plan.num_merge(), static_cast<int>(decode_seq.size()));
  std::vector<bool> slot_used(plan.num_partials, false);
  int row_tiles = 0;
  for (int e = 0; e < plan.num_merge(); ++e) {
    const int row = plan.merge_list[3 * e], base = plan.merge_list[3 * e + 1];
    const int slots = plan.merge_list[3 * e + 2];
    EXPECT_TRUE(decode_seq.count(row)) << "merge of a non-decode row " << row;
    row_tiles += CeilDiv(b.positions[row] + 1, kTileTokens);
    if (finished.count(row)) {  // no slot: its output is written by its fold item
      EXPECT_EQ(slots, 0) << "row " << row;
      EXPECT_EQ(plan.partial_base[row], -1) << "row " << row;
      continue;
    }
    const int skipped = folded.count(row) ? folded[row] - 1 : 0;
    EXPECT_EQ(base, plan.partial_base[row] + skipped);
    const int tiles = CeilDiv(b.positions[row] + 1, kTileTokens);
    EXPECT_EQ(slots, tiles - skipped) << "row " << row;
    for (int t = 0; t < slots; ++t) {
      EXPECT_FALSE(slot_used.at(base + t)) << "partial slot used twice";
      slot_used[base + t] = true;
    }
  }
  EXPECT_EQ(plan.decode_row_tiles, row_tiles);
  // Split items: every (row, tile) exactly once, loading exactly the keys and blocks its own
  // flat item would.
  std::map<std::pair<int, int>, int> covered;              // (row, tile) -> times
  std::map<std::pair<int, int>, std::vector<int>> shared;  // (tile, table) -> rows
  int tile_reads = 0, max_rows = 0, max_wide = 0;
  // Wide items (AttentionConfig::wide_rows): the first num_wide, each more rows than a split CTA
  // holds (with wide_all: every item of a plan with such items) and at most wide_rows, a fold run
  // from tile 0 or one super-tile.
  EXPECT_TRUE(plan.num_wide == 0 || cfg.wide_rows > rows_per_cta);
  if (cfg.wide_all && plan.num_wide > 0) EXPECT_EQ(plan.num_wide, plan.num_split());
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[i * kItemFields];
    const int table = it[0], t0 = it[1], t1 = it[2], row_begin = it[3], n = it[4], kv_len = it[5];
    EXPECT_LT(t0, t1);
    EXPECT_GE(n, 1);
    const bool wide = i < plan.num_wide;
    if (wide) {
      if (!cfg.wide_all) EXPECT_GT(n, rows_per_cta) << "wide item " << i << " fits a split CTA";
      EXPECT_LE(n, cfg.wide_rows) << "wide item " << i << " past wide_rows";
      if (it[6] == kFoldNone) EXPECT_EQ(t1 - t0, cfg.super_tiles) << "wide item " << i;
      // A pair: two tiles of at most half the wgmma kernel's rows, in the one-level order.
      if (it[6] == kFoldPair) {
        EXPECT_EQ(t1 - t0, 2) << "wide item " << i;
        EXPECT_LE(2 * n, cfg.wide_rows) << "wide item " << i;
        EXPECT_EQ(cfg.super_tiles, 1) << "wide item " << i;
      }
      if (n > rows_per_cta || !cfg.wide_all) max_wide = std::max(max_wide, n);
      tile_reads += t1 - t0;
    } else {
      EXPECT_LE(n, rows_per_cta) << "item past the CTA's rows";
      max_rows = std::max(max_rows, n);
    }
    const int per_item = cfg.tiles_per_item > 0 ? cfg.tiles_per_item : 4;
    if (wide) {
    } else if (it[6] == kFoldNone || cfg.lead_tiles < 0) {
      EXPECT_LE(t1 - t0, per_item) << "an item holds at most tiles_per_item tiles";
    } else if (cfg.lead_tiles > 0) {
      EXPECT_LE(t1 - t0, std::max(per_item, cfg.lead_tiles)) << "a fold item past lead_tiles";
    }
    if (!wide) tile_reads += t1 - t0;
    for (int k = row_begin; k < row_begin + n; ++k) {
      const int row = plan.item_rows.at(k);
      EXPECT_TRUE(decode_seq.count(row)) << "split item of a non-decode row";
      const int s = decode_seq[row], pos = b.positions[row];
      const int own_table = b.table_start[s];
      for (int t = t0; t < t1; ++t) {
        ++covered[{row, t}];
        const int ts = t * kTileTokens;
        const int own_keys = std::min(kTileTokens, pos + 1 - ts);
        EXPECT_GT(own_keys, 0) << "row " << row << " given tile " << t << " past its keys";
        if (own_keys <= 0) continue;
        EXPECT_EQ(std::min(kTileTokens, kv_len - ts), own_keys)
            << "item loads other keys than row " << row << "'s own item at tile " << t;
        for (int j = ts; j < ts + own_keys; j += bs) {
          EXPECT_EQ(b.block_ids[table + j / bs], b.block_ids[own_table + j / bs])
              << "row " << row << " tile " << t << " read from another block";
        }
      }
      // A tile read once for several rows: items naming one table at that tile (a group's
      // chunks name the lead's table; a row's own item never shares a tile with its group).
      for (int t = t0; t < t1; ++t) shared[{t, table}].push_back(row);
    }
  }
  EXPECT_EQ(plan.split_tile_reads, tile_reads);
  EXPECT_EQ(plan.max_split_rows, max_rows);
  EXPECT_EQ(plan.max_wide_rows, max_wide);
  for (const auto& [row, s] : decode_seq) {
    const int tiles = CeilDiv(b.positions[row] + 1, kTileTokens);
    for (int t = 0; t < tiles; ++t) {
      EXPECT_EQ((covered[{row, t}]), 1) << "row " << row << " tile " << t;
    }
  }
  EXPECT_EQ(covered.size(), static_cast<size_t>(row_tiles)) << "a tile past some row's keys";
  std::set<SharedRead> reads;
  for (auto& [key, rows] : shared) {
    std::sort(rows.begin(), rows.end());
    if (rows.size() >= 2) reads.insert({key.first, rows});
  }
  // The wide kernel's schedule: one consecutive range of (item, kv head) works per CTA over
  // every work, the busiest never below the even share nor a work above it.
  const int sched_ctas = cfg.wide_ctas > 0 ? cfg.wide_ctas : cfg.ws_ctas;
  if (plan.num_wide == 0 || sched_ctas == 0) {
    EXPECT_TRUE(plan.wide_sched.empty());
  } else if (plan.wide_sched.size() != static_cast<size_t>(sched_ctas) + 1) {
    ADD_FAILURE() << "wide_sched of " << plan.wide_sched.size() << " for " << sched_ctas << " CTAs";
  } else {
    EXPECT_EQ(plan.wide_sched.front(), 0);
    EXPECT_EQ(plan.wide_sched.back(), plan.num_wide * cfg.num_kv_heads);
    EXPECT_TRUE(std::is_sorted(plan.wide_sched.begin(), plan.wide_sched.end()));
    const std::vector<int64_t> costs = RangeCosts(plan);
    const int64_t total = std::accumulate(costs.begin(), costs.end(), int64_t{0});
    const int64_t busiest = *std::max_element(costs.begin(), costs.end());
    int64_t costliest = 0;
    for (int i = 0; i < plan.num_wide; ++i) {
      const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
      costliest = std::max<int64_t>(costliest, it[6] == kFoldPair ? 4 : it[2] - it[1] + 3);
    }
    const int64_t share = (total + sched_ctas - 1) / sched_ctas;
    EXPECT_GE(busiest, std::max(costliest, share));
    EXPECT_LT(busiest, share + costliest);
  }
  return reads;
}

// What every-tile cascade must share, by brute force: per tile index, the decode rows whose tile
// is full, grouped by the tile's block ids; groups of >= 2 (none where a split CTA holds one row).
std::set<SharedRead> BruteForceShared(const AttentionConfig& cfg, const Batch& b) {
  const int bpt = kTileTokens / cfg.block_size;
  if (kMaxQueriesPerCta / (cfg.num_q_heads / cfg.num_kv_heads) < 2) return {};
  std::map<std::pair<int, std::vector<int32_t>>, std::vector<int>> groups;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const int row = b.query_start[s];
    if (b.query_start[s + 1] - row != 1) continue;
    const int full = (b.positions[row] + 1) / kTileTokens;
    for (int t = 0; t < full; ++t) {
      const int32_t* ids = b.block_ids.data() + b.table_start[s] + t * bpt;
      groups[{t, std::vector<int32_t>(ids, ids + bpt)}].push_back(row);
    }
  }
  std::set<SharedRead> out;
  for (auto& [key, rows] : groups) {
    if (rows.size() >= 2) out.insert({key.first, rows});
  }
  return out;
}

AttentionPlan Plan(const AttentionConfig& cfg, const Batch& b) {
  AttentionPlan plan;
  const absl::Status st = PlanAttention(cfg, b.View(), &plan);
  EXPECT_TRUE(st.ok()) << st;
  return plan;
}

// A prefix-cache tree: one system chunk, `contexts` context chunks under it, `queries` requests
// under each, every request decoding its last query token. Blocks are shared exactly where a
// prefix cache shares them: a full block whose tokens all lie in a common prefix.
std::vector<Seq> Tree(int system, int context, int contexts, int queries, int bs,
                      const std::vector<int>& query_lens) {
  int next = 1000;
  const int sys_blocks = system / bs;  // full blocks of the system chunk alone
  std::vector<int32_t> sys_ids(sys_blocks);
  std::iota(sys_ids.begin(), sys_ids.end(), next);
  next += sys_blocks;
  std::vector<Seq> seqs;
  for (int c = 0; c < contexts; ++c) {
    std::vector<int32_t> ctx_ids = sys_ids;
    while (static_cast<int>(ctx_ids.size()) < (system + context) / bs) ctx_ids.push_back(next++);
    for (int q = 0; q < queries; ++q) {
      Seq s;
      s.ctx = system + context + query_lens[(c * queries + q) % query_lens.size()];
      s.blocks = ctx_ids;
      while (static_cast<int>(s.blocks.size()) * bs < s.ctx) s.blocks.push_back(next++);
      seqs.push_back(s);
    }
  }
  return seqs;
}

// The kernel benchmark's shared-prefix case: 64 requests over one 4096-token prefix (blocks of
// 16), each with 128 tokens of its own.
std::vector<Seq> SharedPrefix() {
  std::vector<Seq> prefix(64);
  for (Seq& q : prefix) {
    q.ctx = 4096 + 128;
    for (int b = 0; b < 4096 / 16; ++b) q.blocks.push_back(b);
  }
  int next = 4096 / 16;
  for (Seq& q : prefix) {
    while (static_cast<int>(q.blocks.size()) * 16 < q.ctx) q.blocks.push_back(next++);
  }
  return prefix;
}

// Query lengths 1..150: rows end mid-block, mid-tile, on block and tile boundaries.
std::vector<int> QueryLens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> lens = {1, 16, 63, 64, 65, 128, 150};
  while (static_cast<int>(lens.size()) < n) lens.push_back(1 + static_cast<int>(rng() % 150));
  return lens;
}

constexpr AttentionConfig kQwen3{16, 8, 128, 16};  // group 2: 16 rows per split CTA

TEST(AttentionPlanTest, ThreeLevelTreeGivesOneItemPerSharedTileAndRowChunk) {
  // System 2048 tokens (tiles 0..31) for all 256 rows, 8 contexts of 1024 (tiles 32..47) for 32
  // rows each, then each row's own query.
  const Batch b = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  AttentionConfig one = kQwen3;
  one.tiles_per_item = 1;
  one.lead_tiles = -1;  // no fold items: one item per tile and row chunk
  const AttentionPlan plan = Plan(one, b);
  const auto reads = CheckPlan(one, b, plan);
  EXPECT_EQ(reads, BruteForceShared(kQwen3, b));
  EXPECT_EQ(plan.cascade_groups, 9);  // the system and 8 contexts
  EXPECT_EQ(plan.cascade_shared_tiles, 32 + 8 * 16);
  int system_items = 0, context_items = 0;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int t = plan.split_items[i * kItemFields + 1], n = plan.split_items[i * kItemFields + 4];
    if (n > 1) {
      EXPECT_EQ(n, 16) << "groups of 256 and 32 rows split into full chunks";
      (t < 32 ? system_items : context_items)++;
    }
  }
  EXPECT_EQ(system_items, 32 * 256 / 16);
  EXPECT_EQ(context_items, 8 * 16 * 32 / 16);
  // Own tiles: each row's tiles from 48 on, once.
  int own = 0;
  for (size_t s = 0; s < b.seqs.size(); ++s) own += CeilDiv(b.seqs[s].ctx, kTileTokens) - 48;
  EXPECT_EQ(plan.split_tile_reads, 32 * 256 / 16 + 8 * 16 * 32 / 16 + own);
  EXPECT_EQ(plan.decode_row_tiles, 256 * 48 + own);
  // The planner's tiles per item (this many tiles: 4 per item), no fold items: the same tiles in
  // runs of 4 per row chunk.
  AttentionConfig four = kQwen3;
  four.lead_tiles = -1;
  const AttentionPlan runs = Plan(four, b);
  EXPECT_EQ(CheckPlan(four, b, runs), reads);
  EXPECT_EQ(runs.split_tile_reads, plan.split_tile_reads);
  EXPECT_EQ(runs.cascade_groups, 9);
  EXPECT_EQ(runs.cascade_shared_tiles, 32 + 8 * 16);
  int shared_items = 0;
  for (int i = 0; i < runs.num_split(); ++i) {
    const int32_t* it = &runs.split_items[i * kItemFields];
    if (it[4] > 1) {
      EXPECT_EQ(it[2] - it[1], 4) << "system and context runs are multiples of 4 tiles";
      ++shared_items;
    }
  }
  EXPECT_EQ(shared_items, (system_items + context_items) / 4);
}

TEST(AttentionPlanTest, SingleLevelGroupingSharesOnlyTheCommonLeadingTiles) {
  const Batch b = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  AttentionConfig cfg = kQwen3;
  cfg.grouping = CascadeGrouping::kLeadingTiles;
  const AttentionPlan plan = Plan(cfg, b);
  const auto reads = CheckPlan(cfg, b, plan);
  EXPECT_EQ(plan.cascade_groups, 1);
  EXPECT_EQ(plan.cascade_shared_tiles, 32);  // the contexts are read once per row
  for (const auto& [tile, rows] : reads) {
    EXPECT_LT(tile, 32);
    EXPECT_EQ(rows.size(), 256u);
  }
  cfg.cascade = false;
  const AttentionPlan off = Plan(cfg, b);
  EXPECT_TRUE(CheckPlan(cfg, b, off).empty());
  EXPECT_EQ(off.cascade_groups, 0);
  EXPECT_EQ(off.split_tile_reads, off.decode_row_tiles);
}

TEST(AttentionPlanTest, ChunkBoundariesMidTileAndMidBlockShareExactlyTheCommonFullTiles) {
  // System 2008 tokens: tiles 0..30 are all system; tile 31's last three blocks hold the context
  // (block 125 holds the system's tail and the context's head: a context block). Contexts of
  // 1010 end mid-block at 3018: tiles 31..46 are the context's, tile 47 holds a query block.
  for (int bs : {16, 32, 64}) {
    AttentionConfig cfg = kQwen3;
    cfg.block_size = bs;
    const Batch b = MakeBatch(Tree(2008, 1010, 8, 32, bs, QueryLens(256, 2)));
    const AttentionPlan plan = Plan(cfg, b);
    EXPECT_EQ(CheckPlan(cfg, b, plan), BruteForceShared(cfg, b)) << "block size " << bs;
    EXPECT_EQ(plan.cascade_groups, 9) << "block size " << bs;
    const int system_tiles = 2008 / bs * bs / kTileTokens;
    const int context_tiles = 3018 / bs * bs / kTileTokens - system_tiles;
    EXPECT_EQ(plan.cascade_shared_tiles, system_tiles + 8 * context_tiles) << "block size " << bs;
  }
}

TEST(AttentionPlanTest, RowsThatDivergeThenNameTheSameBlocksAgainShareThoseTilesOnly) {
  // 4 blocks per tile. Rows 0 and 1: the same tile 0, different tile 1, the same tile 2 again.
  // Row 2: tile 1 the same as row 0's, tile 0 not. Row 3: tile 2's first block the same as row
  // 0's, the rest not (a partly equal tile is not shared).
  auto ids = [](std::initializer_list<int> tiles) {
    std::vector<int32_t> v;
    for (int t : tiles) {
      for (int k = 0; k < 4; ++k) v.push_back(t * 4 + k);
    }
    return v;
  };
  std::vector<Seq> seqs = {{1, 200, ids({0, 1, 2, 3})},
                           {1, 230, ids({0, 5, 2, 6})},
                           {1, 192, ids({7, 1, 8})},
                           {1, 250, ids({9, 10, 11, 12})}};
  seqs[3].blocks[8] = 8;  // row 3's tile 2: {8, 45, 46, 47}; row 0's: {8, 9, 10, 11}
  const Batch b = MakeBatch(seqs);
  const AttentionPlan plan = Plan(kQwen3, b);
  const auto reads = CheckPlan(kQwen3, b, plan);
  const std::set<SharedRead> want = {{0, {0, 1}}, {1, {0, 2}}, {2, {0, 1}}};
  EXPECT_EQ(reads, want);
  EXPECT_EQ(reads, BruteForceShared(kQwen3, b));
  EXPECT_EQ(plan.cascade_groups, 3) << "{0,1}, {0,2}, and {0,1} again: three groups";
  EXPECT_EQ(plan.cascade_shared_tiles, 3);
  // Rows 0 and 1 read tile 1 alone and row 2 tile 0 (runs cut by shared tiles).
  EXPECT_EQ(plan.split_tile_reads, 3 + (plan.decode_row_tiles - 6));
}

TEST(AttentionPlanTest, RandomForestsMatchBruteForceUnderEveryShape) {
  std::mt19937 rng(11);
  const std::vector<AttentionConfig> shapes = {
      {16, 8, 128, 16}, {4, 2, 64, 16}, {8, 8, 64, 32}, {32, 1, 64, 64}, {8, 4, 256, 16}};
  for (int trial = 0; trial < 60; ++trial) {
    AttentionConfig cfg = shapes[trial % shapes.size()];
    Forest f;
    f.block_size = cfg.block_size;
    const Batch b = MakeBatch(RandomForest(rng, f));
    SCOPED_TRACE("trial " + std::to_string(trial));
    cfg.tiles_per_item = 1;
    const AttentionPlan every = Plan(cfg, b);
    const auto reads = CheckPlan(cfg, b, every);
    EXPECT_EQ(reads, BruteForceShared(cfg, b));
    EXPECT_EQ(every.cascade_shared_tiles, static_cast<int>(reads.size()));
    cfg.tiles_per_item = 1 + trial % 5;
    const AttentionPlan merged = Plan(cfg, b);
    EXPECT_EQ(CheckPlan(cfg, b, merged), reads);
    EXPECT_EQ(merged.split_tile_reads, every.split_tile_reads);
    EXPECT_LE(merged.num_split(), every.num_split());
    for (int lead : {-1, 1 + trial % 7, 1000}) {
      cfg.lead_tiles = lead;
      const AttentionPlan folded = Plan(cfg, b);
      EXPECT_EQ(CheckPlan(cfg, b, folded), reads) << "lead " << lead;
      EXPECT_EQ(folded.split_tile_reads, every.split_tile_reads) << "lead " << lead;
    }
    cfg.lead_tiles = 0;
    cfg.wide_rows = 128 / (cfg.num_q_heads / cfg.num_kv_heads);  // wide cascade items
    const AttentionPlan wide = Plan(cfg, b);
    EXPECT_EQ(CheckPlan(cfg, b, wide), reads) << "wide items";
    cfg.ws_ctas = 1 + static_cast<int>(rng() % 200);  // and their schedule (CheckPlan)
    const AttentionPlan scheduled = Plan(cfg, b);
    EXPECT_EQ(CheckPlan(cfg, b, scheduled), reads) << "wide items on " << cfg.ws_ctas << " SMs";
    // Wide chains: every (row, tile) still once from its own blocks (CheckPlan), each tile a row
    // shares with others still read with some of them (a chunk may split a group's reads).
    cfg.wide_chains = true;
    std::set<std::pair<int, int>> shared_before, shared_chains;  // (tile, row)
    for (const auto& [t, rows] : reads) {
      for (int r : rows) shared_before.insert({t, r});
    }
    for (const auto& [t, rows] : CheckPlan(cfg, b, Plan(cfg, b))) {
      for (int r : rows) shared_chains.insert({t, r});
    }
    EXPECT_EQ(shared_chains, shared_before) << "wide chains";
    cfg.wide_chains = false;
    cfg.ws_ctas = 0;
    cfg.wide_rows = 0;
    cfg.grouping = CascadeGrouping::kLeadingTiles;
    const AttentionPlan leading = Plan(cfg, b);
    CheckPlan(cfg, b, leading);
    EXPECT_LE(leading.cascade_shared_tiles, every.cascade_shared_tiles);
    EXPECT_GE(leading.split_tile_reads, every.split_tile_reads);
    cfg.cascade = false;
    const AttentionPlan off = Plan(cfg, b);
    EXPECT_TRUE(CheckPlan(cfg, b, off).empty());
    EXPECT_EQ(off.split_tile_reads, off.decode_row_tiles);
    EXPECT_EQ(off.final_items, every.final_items) << "prefill items do not depend on cascade";
  }
}

// The every-tile planner's fast path for unshared tiles (no probe; a row leaves the tile loop
// after its last tile another may share) gives exactly the plan without it: random forests
// (shared prefixes, tables that meet again after diverging, prefill rows), one level,
// super-tiles and wide items.
TEST(AttentionPlanTest, SkippingUnsharedTilesGivesTheSamePlan) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 120; ++trial) {
    const Batch b = MakeBatch(RandomForest(rng, {.max_seqs = 200,
                                                 .max_ctx = 1500,
                                                 .prefill_one_in = 9,
                                                 .fresh_one_in = 3,
                                                 .meet_one_in = 4,
                                                 .meet_run = 8}));
    AttentionConfig cfg{16, 8, 128, 16};
    if (trial % 3 == 1) cfg.super_tiles = 4;
    if (trial % 3 == 2) cfg.wide_rows = 64, cfg.wide_ctas = 132;
    SCOPED_TRACE("trial " + std::to_string(trial));
    SetPlannerSkipsUnsharedTiles(false);
    const AttentionPlan slow = Plan(cfg, b);
    SetPlannerSkipsUnsharedTiles(true);
    const AttentionPlan fast = Plan(cfg, b);
    EXPECT_EQ(fast.final_items, slow.final_items);
    EXPECT_EQ(fast.split_items, slow.split_items);
    EXPECT_EQ(fast.item_rows, slow.item_rows);
    EXPECT_EQ(fast.partial_base, slow.partial_base);
    EXPECT_EQ(fast.merge_list, slow.merge_list);
    EXPECT_EQ(fast.wide_sched, slow.wide_sched);
    EXPECT_EQ(fast.num_wide, slow.num_wide);
    EXPECT_EQ(fast.num_partials, slow.num_partials);
    EXPECT_EQ(fast.cascade_groups, slow.cascade_groups);
  }
}

TEST(AttentionPlanTest, OwnTilesMergeIntoFewerItemsOfTheSameTiles) {
  std::vector<Seq> seqs = {{1, 1000, {}}, {1, 64, {}}, {1, 65, {}}};
  int next = 0;
  for (Seq& s : seqs) {
    while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next++);
  }
  const Batch filled = MakeBatch(seqs);
  AttentionConfig cfg = kQwen3;
  cfg.tiles_per_item = 4;
  const AttentionPlan plan = Plan(cfg, filled);
  CheckPlan(cfg, filled, plan);
  EXPECT_EQ(plan.num_split(), 4 + 1 + 1);  // 16 tiles in items of 4; 1 tile; 2 tiles in one
  EXPECT_EQ(plan.split_tile_reads, 16 + 1 + 2);
}

// Fold items: a decode row's first item folds its tiles into one partial. With enough rows of
// long context to fill the CTAs the planner folds whole rows (one item, one partial each, no
// merge traffic); with fewer, only the first item (a whole row would run on alone); at batch 1
// the first tile. An explicit lead_tiles folds that many.
TEST(AttentionPlanTest, FoldItemsGrowWithTheStepsWork) {
  std::vector<Seq> seqs(256, Seq{1, 4096, {}});
  int next = 0;
  for (Seq& s : seqs) {
    while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next++);
  }
  const Batch b = MakeBatch(seqs);
  AttentionConfig cfg = kQwen3;
  cfg.split_ctas = 64;  // 256 fold items in 4 waves of 64 CTAs: 4 * 64 tiles <= 16384 / 64
  const AttentionPlan whole = Plan(cfg, b);
  CheckPlan(cfg, b, whole);
  EXPECT_EQ(whole.num_split(), 256);
  // Each fold item is a whole row: it writes the row's output, no partial, nothing to merge.
  EXPECT_EQ(whole.num_partials, 0);
  for (int e = 0; e < whole.num_merge(); ++e) EXPECT_EQ(whole.merge_list[3 * e + 2], 0);
  for (int i = 0; i < whole.num_split(); ++i) {
    EXPECT_EQ(whole.split_items[i * kItemFields + 6], kFoldFinish);
  }
  // Every item a whole row: no merge (forms 2 and 3). Rows of up to 8 q-rows at head_dim 128 and
  // of DecodeWsMinTiles() tiles or more: the persistent decode kernel (3); else the
  // shared-memory kernel (2).
  EXPECT_EQ(SplitForm(whole, 128, 2), 3);
  EXPECT_EQ(SplitForm(whole, 128, 8), 3);
  EXPECT_EQ(SplitForm(whole, 128, 16), 2);
  EXPECT_EQ(SplitForm(whole, 64, 2), 2);
  const int min_tiles = DecodeWsMinTiles();
  SetDecodeWsMinTiles(65);  // rows of 64 tiles are too short then
  EXPECT_EQ(SplitForm(whole, 128, 2), 2);
  SetDecodeWsMinTiles(min_tiles);
  AttentionConfig through_merge = cfg;
  through_merge.finish_rows = false;  // one partial per row, merged
  const AttentionPlan merged = Plan(through_merge, b);
  CheckPlan(through_merge, b, merged);
  EXPECT_EQ(merged.num_partials, 256);
  for (int e = 0; e < merged.num_merge(); ++e) EXPECT_EQ(merged.merge_list[3 * e + 2], 1);
  EXPECT_EQ(SplitForm(merged, 128, 2), 0) << "rows left to the merge";
  cfg.split_ctas = 1000;  // one wave of 64 tiles > 16384 / 1000: only the first 4 tiles fold
  const AttentionPlan first = Plan(cfg, b);
  CheckPlan(cfg, b, first);
  EXPECT_EQ(first.num_split(), 256 * 16);
  EXPECT_EQ(first.num_partials, 256 * (1 + 60));
  EXPECT_EQ(SplitForm(first, 128, 2), 0) << "rows of several items";
  cfg.lead_tiles = 16;  // explicit: 16 tiles folded, then items of 4, longest first
  const AttentionPlan runs = Plan(cfg, b);
  CheckPlan(cfg, b, runs);
  EXPECT_EQ(runs.num_split(), 256 * (1 + 48 / 4));
  EXPECT_EQ(runs.num_partials, 256 * (1 + 48));
  for (int i = 0; i < runs.num_split(); ++i) {
    const int32_t* it = &runs.split_items[i * kItemFields];
    EXPECT_EQ(it[2] - it[1], i < 256 ? 16 : 4) << "item " << i;
    EXPECT_EQ(it[6], i < 256 ? kFoldPartial : kFoldNone) << "item " << i;
  }
  cfg.lead_tiles = -1;
  const AttentionPlan none = Plan(cfg, b);
  CheckPlan(cfg, b, none);
  EXPECT_EQ(none.num_partials, 256 * 64);
  EXPECT_EQ(none.split_tile_reads, whole.split_tile_reads);
  // Batch 1: one tile per item, the first one a (one-tile) fold item.
  const Batch one = MakeBatch({seqs[0]});
  const AttentionPlan single = Plan(kQwen3, one);
  CheckPlan(kQwen3, one, single);
  EXPECT_EQ(single.num_split(), 64);
  EXPECT_EQ(single.num_partials, 64);
  EXPECT_EQ(single.split_items[6], kFoldPartial);
}

// Where the persistent decode kernel can run (AttentionConfig::ws_ctas: its SMs), plain rows fold
// whole from about one (row, kv head) work per SM (or fewer, when every row is short), when they
// average DecodeWsMinTiles() tiles (or have a consumer each) and none is longer than 1.5x the mean
// or than a consumer's share of the works; without it, or short, ragged, too few or unfinished
// rows keep the shared-memory kernel's rule (split rows at batch 16).
TEST(AttentionPlanTest, PersistentKernelTakesWholeRowsFromOneWorkPerSm) {
  auto batch = [](const std::vector<int>& ctx) {
    std::vector<Seq> seqs;
    int next = 0;
    for (int c : ctx) {
      Seq s{1, c, {}};
      while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next++);
      seqs.push_back(s);
    }
    return MakeBatch(seqs);
  };
  AttentionConfig cfg = kQwen3;
  cfg.split_ctas = 66;
  cfg.ws_ctas = 132;
  auto whole_rows = [&](const AttentionConfig& c, const Batch& b) {
    const AttentionPlan plan = Plan(c, b);
    CheckPlan(c, b, plan);
    for (int i = 0; i < plan.num_split(); ++i) {
      if (plan.split_items[i * kItemFields + 6] != kFoldFinish) return false;
    }
    EXPECT_EQ(SplitForm(plan, c.head_dim, c.num_q_heads / c.num_kv_heads), 3);
    return true;
  };
  const Batch sixteen = batch(std::vector<int>(16, 4096));  // 128 works >= 7/8 of 132 SMs
  EXPECT_TRUE(whole_rows(cfg, sixteen));
  EXPECT_TRUE(whole_rows(cfg, batch(std::vector<int>(16, 384))));  // 6 tiles: enough
  AttentionConfig none = cfg;
  none.ws_ctas = 0;
  EXPECT_FALSE(whole_rows(none, sixteen)) << "no persistent kernel: split rows at batch 16";
  AttentionConfig through_merge = cfg;
  through_merge.finish_rows = false;
  EXPECT_FALSE(whole_rows(through_merge, sixteen)) << "rows the merge finishes";
  EXPECT_FALSE(whole_rows(cfg, batch(std::vector<int>(8, 4096)))) << "64 works for 132 SMs";
  // With DecodeWsFewWorks (off by default), fewer works than that fold whole when every row is
  // short (one round, no merge); rows past kDecodeWsFewWorksMaxTiles tiles keep the split.
  ASSERT_FALSE(DecodeWsFewWorks());
  EXPECT_FALSE(whole_rows(cfg, batch({150}))) << "DecodeWsFewWorks off: batch 1 splits";
  SetDecodeWsFewWorks(true);
  EXPECT_TRUE(whole_rows(cfg, batch({150}))) << "batch 1, 3 tiles: 8 works";
  EXPECT_TRUE(whole_rows(cfg, batch(std::vector<int>(8, 4 * kTileTokens)))) << "4 tiles";
  EXPECT_FALSE(whole_rows(cfg, batch(std::vector<int>(8, 4 * kTileTokens + 1)))) << "5 tiles";
  EXPECT_FALSE(whole_rows(cfg, batch({150, 1000}))) << "one row of 16 tiles";
  SetDecodeWsFewWorks(false);
  ASSERT_EQ(DecodeWsMinTiles(), 2);
  EXPECT_TRUE(whole_rows(cfg, batch(std::vector<int>(40, 300)))) << "5 tiles a row, 320 works";
  EXPECT_TRUE(whole_rows(cfg, batch(std::vector<int>(64, 150)))) << "3 tiles a row, 512 works";
  // Rows shorter than that (one tile, each already one item) stay on the shared-memory kernel,
  // one round or two.
  for (int rows : {32, 64}) {
    const AttentionPlan one_tile = Plan(cfg, batch(std::vector<int>(rows, 60)));
    EXPECT_EQ(SplitForm(one_tile, cfg.head_dim, cfg.num_q_heads / cfg.num_kv_heads), 2) << rows;
  }
  std::vector<int> ragged(15, 1000);
  ragged.push_back(4096);  // 64 tiles against a mean of 19
  EXPECT_FALSE(whole_rows(cfg, batch(ragged))) << "one row far longer than the rest";
  const int min_tiles = DecodeWsMinTiles();
  SetDecodeWsMinTiles(std::numeric_limits<int>::max());  // the persistent kernel turned off
  EXPECT_FALSE(whole_rows(cfg, sixteen));
  SetDecodeWsMinTiles(min_tiles);
}

// Rows of different lengths (the nano-vllm workload's shape): whole rows fold when the CTAs,
// taking the items longest first in snake rounds, stay within 1.1x of the even share of the
// tile reads; one row much longer than the step's share keeps it from folding whole.
TEST(AttentionPlanTest, RaggedRowsFoldWholeWhenSnakeRoundsBalanceThem) {
  auto make = [](const std::vector<int>& tiles) {
    std::vector<Seq> seqs;
    int next = 0;
    for (int t : tiles) {
      Seq s{1, t * kTileTokens - 5, {}};
      while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next++);
      seqs.push_back(s);
    }
    return seqs;
  };
  std::vector<int> ragged;
  for (int i = 0; i < 256; ++i) ragged.push_back(7 + (i * 7) % 26);  // 7..32 tiles
  const Batch b = MakeBatch(make(ragged));
  AttentionConfig cfg = kQwen3;
  cfg.split_ctas = 66;
  const AttentionPlan plan = Plan(cfg, b);
  CheckPlan(cfg, b, plan);
  EXPECT_EQ(plan.num_split(), 256) << "one whole-row item per row";
  EXPECT_EQ(plan.num_partials, 0) << "every row finished by its fold item";
  // The CTAs' loads: within 1.1x of the even share (round-robin over the planned order).
  std::vector<int> load(66, 0);
  int total = 0;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[i * kItemFields];
    load[i % 66] += it[2] - it[1];
    total += it[2] - it[1];
  }
  EXPECT_LE(10 * *std::max_element(load.begin(), load.end()), 11 * CeilDiv(total, 66));
  // One row of 400 tiles beside 255 short ones: folding it whole would leave its CTA running
  // long after the others, so only first items fold.
  std::vector<int> skewed(255, 4);
  skewed.push_back(400);
  const Batch b2 = MakeBatch(make(skewed));
  const AttentionPlan plan2 = Plan(cfg, b2);
  CheckPlan(cfg, b2, plan2);
  EXPECT_GT(plan2.num_split(), 256);
  int longest = 0;
  for (int i = 0; i < plan2.num_split(); ++i) {
    longest = std::max(
        longest, plan2.split_items[i * kItemFields + 2] - plan2.split_items[i * kItemFields + 1]);
  }
  EXPECT_LE(longest, 4) << "a fold item longer than tiles_per_item";
}

// The persistent kernel hands its works out from a counter in plan order, so for it the planner
// keeps whole rows strictly longest first (the greedy longest-processing-time schedule; snake
// rounds are for the fixed grids of the other forms), and takes rows of mixed lengths whenever
// the longest is no more than a consumer's share of the works, though it is far above 1.5x the
// mean (here 1.85x): the kernel's schedule of these works then ends within 3% of the even share.
TEST(AttentionPlanTest, PersistentKernelTakesMixedRowsLongestFirst) {
  std::vector<Seq> seqs;
  int next_block = 0;
  for (int i = 0; i < 256; ++i) {
    Seq s{1, 100 + (i * 677) % 1949, {}};  // contexts 100..2048, in no order
    while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next_block++);
    seqs.push_back(s);
  }
  const Batch b = MakeBatch(seqs);
  AttentionConfig cfg = kQwen3;
  cfg.split_ctas = 66;
  cfg.ws_ctas = 132;
  const AttentionPlan plan = Plan(cfg, b);
  CheckPlan(cfg, b, plan);
  ASSERT_EQ(plan.num_split(), 256) << "one whole-row item per row";
  EXPECT_EQ(SplitForm(plan, cfg.head_dim, cfg.num_q_heads / cfg.num_kv_heads), 3);
  int longest = 0;
  int64_t total = 0;
  std::vector<int> tiles;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[i * kItemFields];
    EXPECT_EQ(it[6], kFoldFinish) << "item " << i;
    tiles.push_back(it[2] - it[1]);
    if (i > 0) {
      EXPECT_LE(tiles[i], tiles[i - 1]) << "item " << i << " out of longest-first order";
    }
    longest = std::max(longest, tiles[i]);
    total += tiles[i];
  }
  EXPECT_GT(2 * longest * plan.num_split(), 3 * total) << "the 1.5x-the-mean rule alone refuses";
  // The kernel's schedule (DecodeWsKernel), works (item, kv head) in plan order: the first three
  // rounds dealt out (consumer c gets works c, 2n - 1 - c and 2n + c of n consumers), the rest
  // from a counter, consumer c taking its work j once it has finished work j - 2, or j - 3 after
  // a work of at most kDwShortTiles (8) tiles while more than two rounds of works are left
  // after it. Longest first ends within 2% of the even share here (136 tiles against 134; 140
  // taking short works two ahead to the end, 137 with the counter from the second work, session
  // 19's kernel); the batch's own order would take ~151, and the old static assignment (work w
  // to consumer w mod 264, longest first) 149.
  const int consumers = 2 * cfg.ws_ctas;
  constexpr int kShortTiles = 8;
  std::vector<int> works;  // tiles per work
  for (int t : tiles) works.insert(works.end(), cfg.num_kv_heads, t);
  const int num_works = static_cast<int>(works.size());
  // Per consumer, its works' tiles and when each ends (works run back to back).
  std::vector<std::vector<int>> dur(consumers);
  std::vector<std::vector<int64_t>> end(consumers);
  std::vector<int> last(consumers, 0);  // the index of consumer c's last work
  auto add = [&](int c, int w) {
    last[c] = w;
    dur[c].push_back(works[w]);
    end[c].push_back((end[c].empty() ? 0 : end[c].back()) + works[w]);
  };
  for (int c = 0; c < consumers; ++c) {
    for (int w : {c, 2 * consumers - 1 - c, 2 * consumers + c}) {
      if (w >= num_works) break;
      add(c, w);
    }
  }
  using Take = std::tuple<int64_t, int, int>;  // (when consumer c takes its work j, c, j)
  std::priority_queue<Take, std::vector<Take>, std::greater<Take>> takes;
  auto take_next = [&](int c) {
    const int j = static_cast<int>(dur[c].size());
    const bool one_ahead = dur[c][j - 1] > kShortTiles || num_works - last[c] <= 2 * consumers;
    const int f = one_ahead ? j - 2 : j - 3;  // the work it waits to finish
    takes.push({f >= 0 ? end[c][f] : 0, c, j});
  };
  for (int c = 0; c < consumers; ++c) {
    if (dur[c].size() == 3) take_next(c);
  }
  int next = 3 * consumers;
  while (!takes.empty() && next < num_works) {
    const int c = std::get<1>(takes.top());
    takes.pop();
    add(c, next++);
    take_next(c);
  }
  int64_t makespan = 0;
  for (int c = 0; c < consumers; ++c) {
    if (!end[c].empty()) makespan = std::max(makespan, end[c].back());
  }
  const int64_t share = CeilDiv(total * cfg.num_kv_heads, consumers);
  EXPECT_LE(100 * makespan, 102 * share) << "makespan " << makespan << " tiles, share " << share;
}

// Super-tiles (AttentionConfig::super_tiles = 4): every split item starts on a super-tile and ends
// on one or at its rows' last tile, every (row, tile) is computed once, a fold item spans one
// super-tile unless it is a whole one-q-row row for the persistent kernel, partial slots are one
// per super-tile (disjoint, base + t / 4), and cascade shares exactly the super-tiles whose 16
// blocks several rows name (brute force), at every level of the tree, also where chunks end
// mid-super-tile.
void CheckSuperPlan(const AttentionConfig& cfg, const Batch& b, const AttentionPlan& plan,
                    std::set<SharedRead>* shared_out) {
  const int u = cfg.super_tiles;
  EXPECT_EQ(plan.super_tiles, u);
  std::map<int, int> tiles_of;  // decode row -> tiles
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    if (b.query_start[s + 1] - b.query_start[s] == 1) {
      tiles_of[b.query_start[s]] = CeilDiv(b.positions[b.query_start[s]] + 1, kTileTokens);
    }
  }
  std::map<std::pair<int, int>, int> covered;
  std::map<std::pair<int, int>, std::vector<int>> shared;  // (super-tile, table) -> rows
  std::map<int, int> folded;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[i * kItemFields];
    EXPECT_EQ(it[1] % u, 0) << "item " << i << " starts mid-super-tile";
    for (int k = it[3]; k < it[3] + it[4]; ++k) {
      const int row = plan.item_rows[k];
      EXPECT_TRUE(it[2] % u == 0 || it[2] == tiles_of.at(row)) << "item " << i << " ends mid";
      for (int t = it[1]; t < it[2]; ++t) ++covered[{row, t}];
      for (int t = it[1]; t < it[2]; t += u) shared[{t / u, it[0]}].push_back(row);
      if (it[6] != kFoldNone) folded[row] = it[2];
    }
    if (it[6] != kFoldNone && it[2] - it[1] > u) {
      EXPECT_EQ(it[6], kFoldFinish) << "a fold item of several super-tiles finishes its row";
      EXPECT_EQ(it[4], 1);
      EXPECT_EQ(it[2], tiles_of.at(plan.item_rows[it[3]])) << "... and holds all of it";
      EXPECT_EQ(SplitForm(plan, cfg.head_dim, cfg.num_q_heads / cfg.num_kv_heads), 3);
    }
  }
  for (const auto& [row, tiles] : tiles_of) {
    for (int t = 0; t < tiles; ++t) EXPECT_EQ((covered[{row, t}]), 1) << row << " " << t;
  }
  std::vector<bool> used(plan.num_partials, false);
  for (int e = 0; e < plan.num_merge(); ++e) {
    const int row = plan.merge_list[3 * e], base = plan.merge_list[3 * e + 1];
    const int slots = plan.merge_list[3 * e + 2];
    if (slots == 0) continue;  // finished by its fold item
    const int skipped = folded.count(row) ? CeilDiv(folded[row], u) - 1 : 0;
    EXPECT_EQ(slots, CeilDiv(tiles_of.at(row), u) - skipped) << "row " << row;
    EXPECT_EQ(base, plan.partial_base[row] + skipped);
    for (int k = base; k < base + slots; ++k) {
      EXPECT_FALSE(used.at(k)) << "slot " << k << " used twice";
      used[k] = true;
    }
  }
  shared_out->clear();
  for (auto& [key, rows] : shared) {
    std::sort(rows.begin(), rows.end());
    if (rows.size() >= 2) shared_out->insert({key.first, rows});
  }
}

std::set<SharedRead> BruteForceSharedSupers(const AttentionConfig& cfg, const Batch& b) {
  const int per = kTileTokens * cfg.super_tiles, bps = per / cfg.block_size;
  std::map<std::pair<int, std::vector<int32_t>>, std::vector<int>> groups;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const int row = b.query_start[s];
    if (b.query_start[s + 1] - row != 1) continue;
    for (int u = 0; u < (b.positions[row] + 1) / per; ++u) {
      const int32_t* ids = b.block_ids.data() + b.table_start[s] + u * bps;
      groups[{u, std::vector<int32_t>(ids, ids + bps)}].push_back(row);
    }
  }
  std::set<SharedRead> out;
  for (auto& [key, rows] : groups) {
    if (rows.size() >= 2) out.insert({key.first, rows});
  }
  return out;
}

TEST(AttentionPlanTest, SuperTilesAlignItemsSlotsAndSharing) {
  AttentionConfig cfg = kQwen3;
  cfg.super_tiles = 4;
  std::set<SharedRead> reads;
  // The product's tree, chunks of whole super-tiles: the same groups and shared tiles as tiles.
  const Batch tree = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  for (int lead : {0, -1, 1000}) {
    cfg.lead_tiles = lead;
    const AttentionPlan plan = Plan(cfg, tree);
    CheckSuperPlan(cfg, tree, plan, &reads);
    EXPECT_EQ(reads, BruteForceSharedSupers(cfg, tree)) << "lead " << lead;
    EXPECT_EQ(plan.cascade_groups, 9);
    EXPECT_EQ(plan.cascade_shared_tiles, 32 + 8 * 16);
  }
  // Chunks that end mid-super-tile: the system's last partial super-tile holds context tokens,
  // so it is shared per context (7 super-tiles for all, 4 per context).
  const Batch mid = MakeBatch(Tree(2000, 1000, 8, 32, 16, QueryLens(256, 2)));
  cfg.lead_tiles = 0;
  const AttentionPlan plan = Plan(cfg, mid);
  CheckSuperPlan(cfg, mid, plan, &reads);
  EXPECT_EQ(reads, BruteForceSharedSupers(cfg, mid));
  EXPECT_EQ(plan.cascade_groups, 9);
  EXPECT_EQ(plan.cascade_shared_tiles, 4 * 7 + 8 * 4 * 4);
  // Plain rows: whole rows of several super-tiles only for the persistent kernel; otherwise fold
  // items of one super-tile and a slot per super-tile.
  std::vector<Seq> rows;
  int next = 0;
  for (int i = 0; i < 40; ++i) {
    Seq s{1, 2000 + 7 * i, {}};  // 32-36 tiles: balanced, ending anywhere in a super-tile
    while (static_cast<int>(s.blocks.size()) * 16 < s.ctx) s.blocks.push_back(next++);
    rows.push_back(s);
  }
  const Batch plain = MakeBatch(rows);
  for (int ws : {0, 132}) {
    for (int lead : {0, -1, 1000}) {
      cfg.ws_ctas = ws;
      cfg.lead_tiles = lead;
      const AttentionPlan p = Plan(cfg, plain);
      CheckSuperPlan(cfg, plain, p, &reads);
      bool multi = false;
      for (int i = 0; i < p.num_split(); ++i) {
        const int32_t* it = &p.split_items[i * kItemFields];
        multi = multi || (it[6] != kFoldNone && it[2] - it[1] > 4);
      }
      // Whole rows come from the persistent kernel's rule (ws) or an explicit lead (1000).
      EXPECT_EQ(multi, lead == 1000 || (ws > 0 && lead == 0)) << "ws " << ws << " lead " << lead;
    }
  }
  // One-level plans are unchanged by the field's default.
  EXPECT_EQ(kQwen3.super_tiles, 1);
  AttentionConfig bad = kQwen3;
  bad.super_tiles = 0;
  AttentionPlan p;
  EXPECT_EQ(PlanAttention(bad, plain.View(), &p).code(), absl::StatusCode::kInvalidArgument);
}

// Wide cascade items (AttentionConfig::wide_rows, the wgmma kernel's 128 q-rows): a shared run
// read by more rows than a split CTA holds is cut into chunks of up to wide_rows rows, placed
// first, each item a fold run from tile 0 or one super-tile; the tiles, slots and sharing stay
// what they are without them (CheckPlan, brute force), and fewer items read the shared tiles.
TEST(AttentionPlanTest, WideCascadeItemsTakeLargeGroupsFirst) {
  const Batch tree = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  for (int unit : {1, 4}) {
    for (int lead : {-1, 0, 1000}) {
      SCOPED_TRACE("super_tiles " + std::to_string(unit) + " lead " + std::to_string(lead));
      AttentionConfig cfg = kQwen3;
      cfg.super_tiles = unit;
      cfg.lead_tiles = lead;
      cfg.wide_chains = false;  // (the chunks of chains: WideChainsFoldSystemAndContextInOneWork)
      const AttentionPlan narrow = Plan(cfg, tree);
      cfg.wide_rows = 64;  // 128 q-rows at group 2
      const AttentionPlan wide = Plan(cfg, tree);
      EXPECT_EQ(narrow.num_wide, 0);
      ASSERT_GT(wide.num_wide, 0);
      EXPECT_EQ(wide.max_wide_rows, 64);  // the system's 256 rows in chunks of 64
      EXPECT_LE(wide.max_split_rows, 16);
      EXPECT_EQ(wide.cascade_groups, narrow.cascade_groups);
      EXPECT_EQ(wide.cascade_shared_tiles, narrow.cascade_shared_tiles);
      EXPECT_EQ(wide.num_partials, narrow.num_partials);
      EXPECT_EQ(wide.merge_list, narrow.merge_list);
      if (unit == 1) {
        EXPECT_EQ(CheckPlan(cfg, tree, wide), BruteForceShared(kQwen3, tree));
      } else {
        std::set<SharedRead> reads;
        CheckSuperPlan(cfg, tree, wide, &reads);
        EXPECT_EQ(reads, BruteForceSharedSupers(cfg, tree));
      }
      // The system (256 rows) and each context (32 rows) are wide; every row's own tiles not.
      int wide_rows = 0;
      for (int i = 0; i < wide.num_wide; ++i) wide_rows += wide.split_items[i * kItemFields + 4];
      EXPECT_GT(wide_rows, 0);
      for (int i = wide.num_wide; i < wide.num_split(); ++i) {
        EXPECT_LE(wide.split_items[i * kItemFields + 4], 16);
      }
    }
  }
  // The planner's lead with the SM count (ws_ctas): a wide run from tile 0 folds as long as that
  // shortens the wide kernel's span (WideFoldRun). The tree: the system's 32 tiles in 4 chunks
  // (32 fold works over 8 kv heads, 35 tiles' time each), each context's 16 tiles as one-tile
  // works (1024 at 4 a work: ~40 over 132 SMs with the folds): the system folds whole. The
  // shared prefix (one chunk of 64 rows over 64 tiles: 8 fold works, the rest one-tile works):
  // runs of 11 (span 14: 10 and 11 tie, 12 is a 15 fold work).
  AttentionConfig ws = kQwen3;
  ws.wide_rows = 64;
  ws.ws_ctas = 132;
  ws.wide_chains = false;  // (chained: WideChainsFoldSystemAndContextInOneWork)
  const AttentionPlan led = Plan(ws, tree);
  EXPECT_EQ(CheckPlan(ws, tree, led), BruteForceShared(kQwen3, tree));
  int long_folds = 0;
  for (int i = 0; i < led.num_wide; ++i) {
    const int32_t* it = &led.split_items[i * kItemFields];
    if (IsFold(it)) {
      EXPECT_EQ(it[1], 0);
      EXPECT_EQ(it[2], 32) << "the system's run folded whole";
      ++long_folds;
    }
  }
  EXPECT_EQ(long_folds, 4) << "one per system chunk";
  const Batch shared = MakeBatch(SharedPrefix());
  const AttentionPlan runs = Plan(ws, shared);
  EXPECT_EQ(CheckPlan(ws, shared, runs), BruteForceShared(kQwen3, shared));
  ASSERT_GT(runs.num_wide, 0);
  int folds = 0;
  for (int i = 0; i < runs.num_wide; ++i) {
    const int32_t* it = &runs.split_items[i * kItemFields];
    if (IsFold(it)) {
      EXPECT_EQ(it[2], 11) << "the shared prefix's fold run";
      ++folds;
    } else {
      EXPECT_EQ(it[2] - it[1], 1) << "one-tile works after it";
    }
  }
  EXPECT_EQ(folds, 1);
  // A context whose rows are not a system chunk's but start with the same row and number as one
  // (even rows share context A, odd rows context B, 2048 tokens and 64 rows each; a system of 512
  // tokens for all 128 rows, in chunks of 64): the system chunk's fold run (the span model wants
  // ~13 tiles here) must not run on into context A's tiles.
  std::vector<Seq> interleaved(128);
  int next_block = 512 / 16;
  std::vector<int32_t> ctx_blocks[2];
  for (int c = 0; c < 2; ++c) {
    for (int b = 0; b < 2048 / 16; ++b) ctx_blocks[c].push_back(next_block++);
  }
  for (int r = 0; r < 128; ++r) {
    Seq& q = interleaved[r];
    q.ctx = 512 + 2048 + 1 + r % 50;
    for (int b = 0; b < 512 / 16; ++b) q.blocks.push_back(b);
    q.blocks.insert(q.blocks.end(), ctx_blocks[r % 2].begin(), ctx_blocks[r % 2].end());
    while (static_cast<int>(q.blocks.size()) * 16 < q.ctx) q.blocks.push_back(next_block++);
  }
  const Batch odd_even = MakeBatch(interleaved);
  const AttentionPlan oe = Plan(ws, odd_even);
  EXPECT_EQ(CheckPlan(ws, odd_even, oe), BruteForceShared(kQwen3, odd_even));
  for (int i = 0; i < oe.num_wide; ++i) {
    const int32_t* it = &oe.split_items[i * kItemFields];
    if (IsFold(it)) EXPECT_LE(it[2], 8) << "a fold run past the system chunk";
  }
  ws.ws_ctas = 0;  // no SM count: the runs of tiles_per_item
  const AttentionPlan short_runs = Plan(ws, tree);
  for (int i = 0; i < short_runs.num_wide; ++i) {
    const int32_t* it = &short_runs.split_items[i * kItemFields];
    if (IsFold(it)) EXPECT_EQ(it[2], 4);
  }
  // Groups no larger than a split CTA's rows stay on it; no wide_rows above it: none.
  const Batch small = MakeBatch(Tree(2048, 1024, 8, 2, 16, QueryLens(16, 3)));
  AttentionConfig cfg = kQwen3;
  cfg.wide_rows = 64;
  const AttentionPlan p = Plan(cfg, small);
  EXPECT_EQ(p.num_wide, 0) << "the system's 16 rows fit one split CTA";
  // The split kernel's form: the register form while it reads shared tiles (no wide items, or
  // groups that fit a split CTA beside wide ones), the persistent decode kernel where wide items
  // took every shared tile and it runs the rows' own tiles alone (at head_dim 128, <= 8 q-rows a
  // row; else, or with OwnTilesOnPersistentDecode off, the shared-memory form).
  EXPECT_EQ(SplitForm(p, 128, 2), 1) << "shared tiles on the split kernel";
  EXPECT_EQ(SplitForm(Plan(kQwen3, tree), 128, 2), 1) << "no wide items";
  const Batch mixed_batch = MakeBatch(Tree(2048, 1024, 4, 8, 16, QueryLens(32, 2)));
  ws.wide_all = false;
  const AttentionPlan mixed = Plan(ws, mixed_batch);
  ASSERT_GT(mixed.num_wide, 0) << "the system's 32 rows";
  EXPECT_EQ(SplitForm(mixed, 128, 2), 1) << "contexts of 8 rows on the split kernel";
  const AttentionPlan own = Plan(ws, tree);
  EXPECT_EQ(SplitForm(own, 128, 2), 6) << "every shared tile on wide items";
  EXPECT_EQ(SplitForm(own, 128, 16), 0) << "rows of 16 q-rows";
  EXPECT_EQ(SplitForm(own, 64, 2), 0) << "head_dim 64";
  SetOwnTilesOnPersistentDecode(false);
  EXPECT_EQ(SplitForm(own, 128, 2), 0) << "own tiles on the shared-memory form";
  SetOwnTilesOnPersistentDecode(true);
  // With wide_all the wgmma kernel runs the contexts and the own tiles too, one
  // (super-)tile an item but for the fold runs; the plan reads and merges the same partials.
  ws.wide_all = true;
  const AttentionPlan all = Plan(ws, mixed_batch);
  EXPECT_EQ(CheckPlan(ws, mixed_batch, all), BruteForceShared(kQwen3, mixed_batch));
  EXPECT_EQ(all.num_wide, all.num_split());
  EXPECT_EQ(all.max_wide_rows, mixed.max_wide_rows);
  EXPECT_EQ(all.merge_list, mixed.merge_list);
  EXPECT_EQ(all.num_partials, mixed.num_partials);
  EXPECT_EQ(all.split_tile_reads, mixed.split_tile_reads);
  for (int i = 0; i < all.num_split(); ++i) {
    const int32_t* it = &all.split_items[i * kItemFields];
    if (it[6] == kFoldNone) EXPECT_EQ(it[2] - it[1], 1) << "item " << i;
  }
  cfg.wide_rows = 16;
  EXPECT_EQ(Plan(cfg, tree).num_wide, 0) << "wide_rows not above a split CTA's rows";
}

// The wide kernel's schedule (AttentionPlan::wide_sched): ws_ctas + 1 consecutive ranges over
// every (item, kv head) work, work w being item w % num_wide at kv head w / num_wide. A work costs
// its tiles + 3 (a one-tile work 4 tiles' time: session 29's timeline on an H200). On the tree
// (32 fold works of 32 tiles, 1024 one-tile works) no range costs more than 43 against a lower
// bound of 40 (5216 over 132 SMs), where the kernel's own snake over the same works gave the SMs
// with a fold run ~7 one-tile works on top (63); the shared prefix's busiest range costs 16.
TEST(AttentionPlanTest, WideScheduleSplitsTheWorksIntoBalancedRanges) {
  const Batch tree = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  AttentionConfig ws = kQwen3;
  ws.wide_rows = 64;
  ws.wide_chains = false;  // (the works of chains: WideChainsFoldSystemAndContextInOneWork)
  for (int ctas : {132, 7, 1, 2000}) {
    SCOPED_TRACE("ws_ctas " + std::to_string(ctas));
    ws.ws_ctas = ctas;
    const AttentionPlan plan = Plan(ws, tree);
    EXPECT_EQ(CheckPlan(ws, tree, plan), BruteForceShared(kQwen3, tree));
    ASSERT_GT(plan.num_wide, 0);
    ASSERT_EQ(plan.wide_sched.size(), static_cast<size_t>(ctas) + 1);  // (and CheckPlan's checks)
    const std::vector<int64_t> costs = RangeCosts(plan);
    const int64_t total = std::accumulate(costs.begin(), costs.end(), int64_t{0});
    const int64_t busiest = *std::max_element(costs.begin(), costs.end());
    if (ctas == 132) {  // (with other SM counts the fold runs differ: WideFoldRun)
      // The contexts' 16 tiles as 8 pairs (kFoldPair: 32 rows, half the wgmma kernel's q-rows).
      EXPECT_EQ(total, 8 * (4 * 35 + 64 * 4));
      EXPECT_EQ(busiest, 35);
      // The snake the kernel deals without a schedule: works longest first, kv head fastest, CTA
      // c taking j * P + c in even rounds and j * P + P - 1 - c in odd ones.
      std::vector<int64_t> works;
      for (int i = 0; i < plan.num_wide; ++i) {
        const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
        works.insert(works.end(), ws.num_kv_heads, it[6] == kFoldPair ? 4 : it[2] - it[1] + 3);
      }
      std::stable_sort(works.begin(), works.end(), std::greater<>());
      std::vector<int64_t> snake(ctas, 0);
      for (size_t w = 0; w < works.size(); ++w) {
        const size_t j = w / ctas, c = w % ctas;
        snake[j % 2 ? ctas - 1 - c : c] += works[w];
      }
      EXPECT_GE(*std::max_element(snake.begin(), snake.end()), 47);
    }
  }
  // Without pairs: the contexts' 1024 one-tile works (per kv head).
  ws.ws_ctas = 132;
  ws.wide_pairs = false;
  {
    const AttentionPlan plan = Plan(ws, tree);
    EXPECT_EQ(CheckPlan(ws, tree, plan), BruteForceShared(kQwen3, tree));
    const std::vector<int64_t> costs = RangeCosts(plan);
    EXPECT_EQ(std::accumulate(costs.begin(), costs.end(), int64_t{0}), 8 * (4 * 35 + 128 * 4));
    EXPECT_LE(*std::max_element(costs.begin(), costs.end()), 43);
  }
  ws.wide_pairs = true;
  const Batch shared = MakeBatch(SharedPrefix());
  ws.ws_ctas = 132;
  const AttentionPlan plan = Plan(ws, shared);
  EXPECT_EQ(CheckPlan(ws, shared, plan), BruteForceShared(kQwen3, shared));
  const std::vector<int64_t> costs = RangeCosts(plan);
  EXPECT_EQ(*std::max_element(costs.begin(), costs.end()), 16);
  // No SM count, no schedule (the kernel's snake); wide_ctas alone (the persistent decode kernel
  // off: ws_ctas 0) schedules.
  ws.ws_ctas = 0;
  EXPECT_TRUE(Plan(ws, tree).wide_sched.empty());
  ws.wide_ctas = 132;
  EXPECT_EQ(Plan(ws, tree).wide_sched.size(), 133u);
  EXPECT_TRUE(Plan(kQwen3, tree).wide_sched.empty()) << "no wide items";
}

// Wide chains (AttentionConfig::wide_chains): the tree's system node is cut into one chunk per
// context (its 32 rows, in the context node's order, read through the chunk's first row's table),
// so each context's rows fold system and context tiles in one work from tile 0 (48 tiles, one
// partial at tile 47's slot): 8 wide items (64 works over 8 kv heads) and no context partials;
// the merge then reads a fold partial and the own tiles' per row. Every (row, tile) is still
// covered once from its own blocks (CheckPlan); the system tiles are read once per chunk.
TEST(AttentionPlanTest, WideChainsFoldSystemAndContextInOneWork) {
  const Batch tree = MakeBatch(Tree(2048, 1024, 8, 32, 16, QueryLens(256, 1)));
  AttentionConfig ws = kQwen3;
  ws.wide_rows = 64;
  ws.ws_ctas = 132;
  ws.wide_chains = true;
  const AttentionPlan plan = Plan(ws, tree);
  const std::set<SharedRead> reads = CheckPlan(ws, tree, plan);
  ASSERT_EQ(plan.num_wide, 8);
  std::set<int> rows_seen;
  for (int i = 0; i < plan.num_wide; ++i) {
    const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
    EXPECT_EQ(it[1], 0) << "wide item " << i;
    EXPECT_EQ(it[2], 48) << "wide item " << i;
    EXPECT_EQ(it[4], 32) << "wide item " << i;
    EXPECT_EQ(it[6], kFoldPartial) << "wide item " << i;
    // One context's rows: the 32 queries of one context are consecutive sequences here.
    std::set<int> ctx;
    for (int k = it[3]; k < it[3] + it[4]; ++k) {
      ctx.insert(plan.item_rows[k] / 32);
      rows_seen.insert(plan.item_rows[k]);
    }
    EXPECT_EQ(ctx.size(), 1u) << "wide item " << i << " mixes contexts";
  }
  EXPECT_EQ(rows_seen.size(), 256u);
  // Each context's 48 shared tiles are read once for its rows: per tile, 8 reads of 32 rows.
  for (int t = 0; t < 48; ++t) {
    int n = 0;
    for (const SharedRead& r : reads) n += r.first == t ? 1 : 0;
    EXPECT_EQ(n, 8) << "tile " << t;
  }
  // The merge: the fold partial and the own tiles' (those past tile 47), per row.
  for (int e = 0; e < plan.num_merge(); ++e) {
    const int row = plan.merge_list[3 * e];
    EXPECT_EQ(plan.merge_list[3 * e + 2], CeilDiv(tree.positions[row] + 1, kTileTokens) - 47)
        << "row " << row;
  }
  // Off: the system node in chunks of 64 rows, the contexts' tiles in pairs.
  ws.wide_chains = false;
  const AttentionPlan off = Plan(ws, tree);
  EXPECT_EQ(CheckPlan(ws, tree, off), BruteForceShared(kQwen3, tree));
  EXPECT_EQ(off.num_wide, 4 + 8 * 8);
  // A shared prefix whose rows go on alone (no run of their own after it): the same plan.
  const Batch shared = MakeBatch(SharedPrefix());
  const AttentionPlan plain = Plan(ws, shared);
  ws.wide_chains = true;
  const AttentionPlan chained = Plan(ws, shared);
  EXPECT_EQ(CheckPlan(ws, shared, chained), BruteForceShared(kQwen3, shared));
  EXPECT_EQ(chained.num_wide, plain.num_wide);
  EXPECT_EQ(chained.merge_list, plain.merge_list);
  EXPECT_EQ(chained.wide_sched, plain.wide_sched);
  // Contexts of 4 rows (less than half a chunk: tiny chunks would read the system tiles many
  // times over): not chained, the system in chunks of 64 rows.
  const Batch small = MakeBatch(Tree(2048, 1024, 64, 4, 16, QueryLens(256, 1)));
  const AttentionPlan unchained = Plan(ws, small);
  EXPECT_EQ(CheckPlan(ws, small, unchained), BruteForceShared(kQwen3, small));
  EXPECT_EQ(unchained.max_wide_rows, 64);
}

TEST(AttentionPlanTest, RejectsPositionsOutsideContextAndBadShapes) {
  std::vector<int32_t> pos = {5}, qs = {0, 1}, ctx = {5}, ts = {0, 1}, blocks = {0};
  AttentionBatch b{pos.data(), 1, qs.data(), ctx.data(), ts.data(), blocks.data(), 1};
  AttentionPlan plan;
  EXPECT_EQ(PlanAttention({4, 2, 64, 16}, b, &plan).code(), absl::StatusCode::kInvalidArgument);
  pos[0] = 4;
  EXPECT_TRUE(PlanAttention({4, 2, 64, 16}, b, &plan).ok());
  ctx[0] = 17;  // one block cannot hold 17 keys
  pos[0] = 16;
  EXPECT_EQ(PlanAttention({4, 2, 64, 16}, b, &plan).code(), absl::StatusCode::kInvalidArgument);
  ctx[0] = 5;
  pos[0] = 4;
  EXPECT_EQ(PlanAttention({4, 2, 64, 48}, b, &plan).code(),
            absl::StatusCode::kInvalidArgument);  // block size must divide the tile
  EXPECT_EQ(PlanAttention({4, 3, 64, 16}, b, &plan).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cascade::cuda
