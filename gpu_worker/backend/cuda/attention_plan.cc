// Host planning of attention work items: prefill chunks, split decode tiles, cascade groups.
// Plain C++ (no CUDA), so it is unit-testable anywhere.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/attention.h"

namespace cascade::cuda {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }
int64_t CeilDiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Decode tiles of a step from which split items hold several tiles (AttentionConfig::
// tiles_per_item = 0).
constexpr int kAutoMultiTileFrom = 1024;

// Split CTAs per kv head in one wave when the config does not say (an H100's or H200's 132 SMs
// at 4 split CTAs each over 8 kv heads).
constexpr int kDefaultSplitCtas = 66;

void AddItem(std::vector<int32_t>* items, int table_offset, int tile_begin, int tile_end,
             int row_begin, int row_count, int kv_len, bool fold = false) {
  items->insert(items->end(), {table_offset, tile_begin, tile_end, row_begin, row_count, kv_len,
                               fold ? kFoldPartial : kFoldNone});
}

// Reorders items (kItemFields each) longest first (stable), so that a launch's last wave is its
// shortest items. The order changes no result: each CTA computes its own rows (and a split item
// writes its own partial slots).
void SortLongestFirst(std::vector<int32_t>* flat) {
  if (flat->empty()) return;  // (memcpy from an empty vector's null data() is undefined)
  std::vector<std::array<int32_t, kItemFields>> items(flat->size() / kItemFields);
  std::memcpy(items.data(), flat->data(), flat->size() * sizeof(int32_t));
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& x, const auto& y) { return x[2] - x[1] > y[2] - y[1]; });
  std::memcpy(flat->data(), items.data(), flat->size() * sizeof(int32_t));
}

// Reorders items already sorted longest first so that a fixed grid of `slots` CTAs taking them
// round-robin (CTA c runs items c, c + slots, ...: ForEachSplitItem in a decode graph) gets them
// as a snake: odd rounds reversed, so the CTA that took one round's longest item takes the next
// round's shortest. Balances rows of different lengths; the order changes no result.
void SnakeRounds(std::vector<int32_t>* flat, int slots) {
  const int n = static_cast<int>(flat->size()) / kItemFields;
  for (int begin = slots; begin < n; begin += 2 * slots) {
    const int end = std::min(n, begin + slots);
    for (int i = begin, j = end - 1; i < j; ++i, --j) {
      std::swap_ranges(flat->begin() + i * kItemFields, flat->begin() + (i + 1) * kItemFields,
                       flat->begin() + j * kItemFields);
    }
  }
}

// The most tiles one CTA reads when `slots` CTAs take the items round-robin.
int64_t RoundRobinSpan(const std::vector<int32_t>& flat, int slots) {
  std::vector<int64_t> load(slots, 0);
  for (size_t i = 0; i < flat.size() / kItemFields; ++i) {
    load[i % slots] += flat[i * kItemFields + 2] - flat[i * kItemFields + 1];
  }
  return *std::max_element(load.begin(), load.end());
}

// A work of the persistent wgmma kernel that writes a one-tile partial costs about this many times
// a tile folded in its CTA: its Q rows gathered, its pipeline filled and drained, the partial's
// q-rows of f32 state stored (and read back by the merge). Fitted to H200 measurements: the fold
// runs (bench/kernels/RESULTS.md), then the per-work timeline of session 29 (a one-tile context
// work every ~4.3 us of a CTA, a tile inside a fold run ~1.1 us: bench/kernels/NOTES.md).
constexpr int kWidePartialCost = 4;

// A wide work's cost in fold-tile units: its tiles, and the work's own fixed cost on top (so a
// one-tile work costs kWidePartialCost; a pair, kFoldPair, its two tiles side by side, as much).
int64_t WideWorkCost(int tiles) { return tiles + kWidePartialCost - 1; }

// Splits works of the given costs, in order, into `ranges` consecutive ranges (some possibly
// empty) whose costliest range costs the least possible: the smallest bound B for which filling
// ranges greedily (a range takes works while its cost stays <= B, and at least one) needs at
// most `ranges` of them, found by bisection. Returns the ranges' starts and the end,
// ranges + 1 entries.
std::vector<int32_t> PartitionWorks(const std::vector<int64_t>& cost, int ranges) {
  const int n = static_cast<int>(cost.size());
  int64_t total = 0, most = 0;
  for (int64_t c : cost) {
    total += c;
    most = std::max(most, c);
  }
  auto fill = [&](int64_t bound, std::vector<int32_t>* starts) {
    int used = n > 0 ? 1 : 0;
    int64_t load = 0;
    if (starts != nullptr) starts->assign(1, 0);
    for (int i = 0; i < n; ++i) {
      if (load > 0 && load + cost[i] > bound) {
        ++used;
        load = 0;
        if (starts != nullptr) starts->push_back(i);
      }
      load += cost[i];
    }
    return used;
  };
  // The least bound lies in [lo, lo + most]: with the even share plus the costliest work every
  // range a greedy fill closes holds at least the share (checked, else up to the total).
  int64_t lo = std::max(most, CeilDiv64(total, std::max(1, ranges))), hi = lo + most;
  if (fill(hi, nullptr) > ranges) hi = std::max(lo, total);
  while (lo < hi) {  // the least bound that fits
    const int64_t mid = lo + (hi - lo) / 2;
    if (fill(mid, nullptr) <= ranges) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<int32_t> starts;
  fill(lo, &starts);
  starts.resize(static_cast<size_t>(ranges) + 1, n);
  return starts;
}

// Orders the first `wide` items of `items` for the wide kernel's schedule and returns it
// (AttentionPlan::wide_sched): work w is item w % wide at kv head w / wide (one pass over the items
// per kv head), the works split into `ctas` consecutive ranges by cost (PartitionWorks). So that
// consecutive ranges can balance, the long items (a work costing more than half a CTA's even
// share) are spaced out within a pass, each followed by an equal part of the short ones, longest
// first: a tree's fold runs then each share a range with the one-tile works after them, where
// side by side they would leave every range but the last of them to one work alone.
std::vector<int32_t> WideSchedule(std::vector<int32_t>* items, int wide, int kv_heads, int ctas) {
  std::vector<std::array<int32_t, kItemFields>> sorted(wide);
  std::memcpy(sorted.data(), items->data(), sorted.size() * sizeof(sorted[0]));
  auto cost_of = [](const std::array<int32_t, kItemFields>& it) {
    return it[6] == kFoldPair ? int64_t{kWidePartialCost} : WideWorkCost(it[2] - it[1]);
  };
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](const auto& x, const auto& y) { return cost_of(x) > cost_of(y); });
  int64_t total = 0;
  for (const auto& it : sorted) total += cost_of(it);
  // Long: 2 * cost * ctas > total * kv_heads (more than half of an even share).
  int longs = 0;
  while (longs < wide && 2 * cost_of(sorted[longs]) * ctas > total * kv_heads) ++longs;
  std::vector<std::array<int32_t, kItemFields>> order;
  order.reserve(wide);
  const int shorts = wide - longs;
  for (int i = 0; i < longs; ++i) {
    order.push_back(sorted[i]);
    const int64_t from = longs + static_cast<int64_t>(shorts) * i / longs;
    const int64_t to = longs + static_cast<int64_t>(shorts) * (i + 1) / longs;
    order.insert(order.end(), sorted.begin() + from, sorted.begin() + to);
  }
  if (longs == 0) order = sorted;
  std::memcpy(items->data(), order.data(), order.size() * sizeof(order[0]));
  std::vector<int64_t> cost;
  cost.reserve(static_cast<size_t>(wide) * kv_heads);
  for (int h = 0; h < kv_heads; ++h) {
    for (const auto& it : order) cost.push_back(cost_of(it));
  }
  return PartitionWorks(cost, ctas);
}

// The wide runs of a plan: a wide item and the later ones that continue it (the same rows of the
// same table from the tile where it ends: the planner emits a run piece by piece, in tile order,
// its rows copied anew each time). Calls visit(i, run) with run the index of the run item i
// belongs to, in item order; a new run's index is its first item's.
template <class Visit>
void ForEachWideRun(const AttentionPlan& plan, int rows_per_cta, Visit visit) {
  // (table offset, first row, rows) -> the run's first item and its current end tile.
  std::map<std::array<int32_t, 3>, std::pair<int, int>> open;
  for (int i = 0; i < plan.num_split(); ++i) {
    const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
    if (it[4] <= rows_per_cta) continue;
    const std::array<int32_t, 3> key = {it[0], plan.item_rows[it[3]], it[4]};
    auto [at, fresh] = open.try_emplace(key, i, it[2]);
    // The same rows, in the same order (another group can have the same first row and size at
    // other tiles: a context whose rows are not the system chunk's).
    const int32_t* head = &plan.split_items[static_cast<size_t>(at->second.first) * kItemFields];
    const auto rows = plan.item_rows.begin();
    if (!fresh && at->second.second == it[1] &&
        std::equal(rows + it[3], rows + it[3] + it[4], rows + head[3])) {
      at->second.second = it[2];
    } else {
      at->second = {i, it[2]};
    }
    visit(i, at->second.first);
  }
}

// The fold run from tile 0 for the wide items of a one-level plan whose wide runs were cut into a
// fold item of `first` tiles and one-tile items: the length L minimizing the wide kernel's span
// in fold-tile units under the planner's schedule (AttentionPlan::wide_sched), estimated as the
// larger of its costliest work and the works' total cost over the SMs (WideWorkCost: each run
// from tile 0 folds min(L, its length) in one work per kv head, its tiles past L one-tile works);
// of equal spans the longer run (fewer partials). `first` where nothing longer wins.
int WideFoldRun(const AttentionPlan& plan, int rows_per_cta, int first, int kv_heads, int sms) {
  std::map<int, int> runs;  // run (first item) from tile 0 -> its end tile
  int64_t other = 0;        // one-tile wide works (per kv head) outside those runs
  ForEachWideRun(plan, rows_per_cta, [&](int i, int run) {
    const int32_t* it = &plan.split_items[static_cast<size_t>(i) * kItemFields];
    const int32_t* head = &plan.split_items[static_cast<size_t>(run) * kItemFields];
    if (head[1] == 0 && (head[6] == kFoldPartial || head[6] == kFoldFinish)) {
      runs[run] = it[2];
    } else {
      other += it[6] == kFoldPair ? 1 : it[2] - it[1];  // a pair: one work
    }
  });
  if (runs.empty() || sms <= 0) return first;
  int longest = 0;
  for (const auto& [run, end] : runs) longest = std::max(longest, end);
  auto span = [&](int len) {
    int64_t total = kWidePartialCost * other, costliest = 0;
    for (const auto& [run, end] : runs) {
      const int64_t fold = WideWorkCost(std::min(len, end));
      total += fold + kWidePartialCost * std::max(0, end - len);
      costliest = std::max(costliest, fold);
    }
    return std::max<int64_t>(costliest, CeilDiv64(total * kv_heads, sms));
  };
  int best = first;
  int64_t best_span = span(first);
  for (int len = first + 1; len <= longest; ++len) {
    const int64_t s = span(len);
    if (s <= best_span) {
      best = len;
      best_span = s;
    }
  }
  return best;
}

// Removes the split items marked in `drop`, keeping the others in order.
void DropSplitItems(AttentionPlan* plan, const std::vector<bool>& drop) {
  std::vector<int32_t>& items = plan->split_items;
  size_t out = 0;
  for (size_t i = 0; i < drop.size(); ++i) {
    if (drop[i]) continue;
    std::copy_n(&items[i * kItemFields], kItemFields, &items[out * kItemFields]);
    ++out;
  }
  items.resize(out * kItemFields);
}

// A wide chunk's key: (table offset, first row, rows), as ForEachWideRun tells its runs apart.
using ChunkKey = std::array<int32_t, 3>;

// Lengthens each wide run's fold item from tile 0 (made with `first` tiles, the rest one-tile
// items) to `len` tiles, dropping the one-tile items it covers: the plan DecodePlanner makes with
// wide_lead = len (but for the items' order), without planning again. Runs whose first chunk is
// in `whole` (wide chains) fold to their end.
void ExtendWideFolds(AttentionPlan* plan, int rows_per_cta, int len,
                     const std::set<ChunkKey>* whole = nullptr) {
  std::vector<bool> drop(plan->num_split(), false);
  ForEachWideRun(*plan, rows_per_cta, [&](int i, int run) {
    int32_t* head = &plan->split_items[static_cast<size_t>(run) * kItemFields];
    const int32_t* it = &plan->split_items[static_cast<size_t>(i) * kItemFields];
    const bool all =
        whole != nullptr && whole->count({head[0], plan->item_rows[head[3]], head[4]}) > 0;
    if (i == run || head[1] != 0 || head[6] == kFoldNone || head[6] == kFoldPair ||
        (!all && it[2] > len)) {
      return;
    }
    head[2] = it[2];
    head[5] = it[5];
    drop[i] = true;
  });
  DropSplitItems(plan, drop);
}

// Pairs each wide run's consecutive one-tile items (kFoldPair) where its rows fill at most half
// the wgmma kernel's q-rows (2 x rows <= wide_rows): one work then runs both tiles, a consumer
// warpgroup each, where a one-tile work leaves one of them idle. The same partials: each tile is
// still written from the empty state at its own slot. One-level order only (the caller's).
void PairWideItems(AttentionPlan* plan, int rows_per_cta, int wide_rows) {
  std::vector<bool> drop(plan->num_split(), false);
  std::map<int, int> waiting;  // run -> its one-tile item waiting for the next (-1: none)
  ForEachWideRun(*plan, rows_per_cta, [&](int i, int run) {
    int32_t* it = &plan->split_items[static_cast<size_t>(i) * kItemFields];
    int& w = waiting.try_emplace(run, -1).first->second;
    if (it[6] != kFoldNone || it[2] - it[1] != 1 || 2 * it[4] > wide_rows) {
      w = -1;
      return;
    }
    if (w >= 0) {
      int32_t* first = &plan->split_items[static_cast<size_t>(w) * kItemFields];
      if (first[2] == it[1]) {
        first[2] = it[2];
        first[5] = it[5];
        first[6] = kFoldPair;
        drop[i] = true;
        w = -1;
        return;
      }
    }
    w = i;
  });
  DropSplitItems(plan, drop);
}

struct DecodeRow {
  int row, pos, table_offset;
  int tiles() const { return CeilDiv(pos + 1, kTileTokens); }
};

// Groups decode rows by the block ids of one tile: an open-addressing table keyed by the tile's
// ids, probed once per row. Stamps mark the live slots of the current tile, so the table is
// allocated once per plan and never cleared.
class TileGrouper {
 public:
  TileGrouper(const int32_t* block_ids, int blocks_per_tile, int max_rows)
      : block_ids_(block_ids), blocks_per_tile_(blocks_per_tile) {
    int cap = 16;
    while (cap < 2 * max_rows) cap *= 2;
    stamp_.assign(cap, 0);
    slot_group_.resize(cap);
    lead_key_.reserve(max_rows);
  }
  // Starts a new tile: forgets every group.
  void Reset() {
    ++generation_;
    lead_key_.clear();
  }
  // The group (numbered 0, 1, .. in first-seen order since Reset) of the tile whose block ids
  // start at block_ids[key_offset].
  int GroupOf(int key_offset) {
    const int32_t* key = block_ids_ + key_offset;
    uint32_t h = 0;
    for (int b = 0; b < blocks_per_tile_; ++b) {
      h = (h ^ static_cast<uint32_t>(key[b])) * 0x9E3779B1u;
    }
    const uint32_t mask = static_cast<uint32_t>(stamp_.size()) - 1;
    for (uint32_t s = (h ^ (h >> 15)) & mask;; s = (s + 1) & mask) {
      if (stamp_[s] != generation_) {
        stamp_[s] = generation_;
        slot_group_[s] = static_cast<int>(lead_key_.size());
        lead_key_.push_back(key_offset);
        return slot_group_[s];
      }
      const int32_t* lead = block_ids_ + lead_key_[slot_group_[s]];
      if (std::equal(key, key + blocks_per_tile_, lead)) return slot_group_[s];
    }
  }
  // A new group for a tile known to be read by no other row at this tile: GroupOf's answer for
  // it, without the probe (later GroupOf calls do not look for it).
  int NewGroup(int key_offset) {
    lead_key_.push_back(key_offset);
    return static_cast<int>(lead_key_.size()) - 1;
  }

 private:
  const int32_t* block_ids_;
  int blocks_per_tile_;
  std::vector<int> stamp_, slot_group_;
  std::vector<int> lead_key_;  // [group] offset of the group's first key in block_ids
  int generation_ = 0;
};

// How many of a step's (row, tile) pairs start with each block id, up to 2: a tile whose first
// block starts no other pair is read by its row alone (rows that read the same tile start it
// with the same block), so the every-tile planner gives it its own group without a probe. One
// hash of one id a pair, where a probe hashes and compares a tile's blocks: distinct prompts
// (most rows' tiles unshared) plan ~2x faster.
class FirstBlockCounts {
 public:
  explicit FirstBlockCounts(int keys) {
    size_t cap = 16;
    while (cap < 2 * static_cast<size_t>(keys)) cap *= 2, ++shift_down_;
    id_.resize(cap);
    count_.assign(cap, 0);
  }
  // Counts block `id` and returns its slot.
  int Add(int32_t id) {
    const uint32_t mask = static_cast<uint32_t>(count_.size()) - 1;
    uint32_t s = (static_cast<uint32_t>(id) * 0x9E3779B1u) >> (32 - shift_down_);  // top bits
    while (count_[s] != 0 && id_[s] != id) s = (s + 1) & mask;
    id_[s] = id;
    if (count_[s] < 2) ++count_[s];
    return static_cast<int>(s);
  }
  bool Shared(int slot) const { return count_[slot] >= 2; }

 private:
  std::vector<int32_t> id_;
  std::vector<uint8_t> count_;  // 0: empty slot
  int shift_down_ = 4;          // log2 of the capacity
};

// Emits the split items of decode rows into a plan.
class DecodePlanner {
 public:
  // lead_tiles: the length of a fold item (a row's first item, from tile 0, folded in the CTA);
  // < 0: no fold items. unit: tiles per super-tile (AttentionConfig::super_tiles): rows share
  // whole super-tiles only, and tiles_per_item and lead_tiles are multiples of it (the caller's).
  // wide_rows: AttentionConfig::wide_rows (0: none); wide_lead: the fold run of a wide item from
  // tile 0 where longer than lead_tiles (0: lead_tiles).
  // chains: AttentionConfig::wide_chains (a wide node's rows chunked by the runs they go on in),
  // the chunks that go on in a run of their own added to *chained (their runs fold whole).
  DecodePlanner(const AttentionBatch& batch, int rows_per_cta, int blocks_per_tile,
                int tiles_per_item, int lead_tiles, int unit, int wide_rows, int wide_lead,
                std::set<ChunkKey>* chained, AttentionPlan* plan)
      : batch_(batch),
        chained_(unit == 1 ? chained : nullptr),
        chains_(chained_ != nullptr),
        rows_per_cta_(rows_per_cta),
        wide_rows_(wide_rows),
        blocks_per_tile_(blocks_per_tile),
        per_item_(std::max(1, tiles_per_item)),
        lead_(lead_tiles < 0 ? -1 : std::max(lead_tiles, unit > 1 ? unit : per_item_)),
        wide_lead_(lead_ < 0 ? -1 : std::max(lead_, wide_lead)),
        unit_(unit),
        plan_(plan) {}

  // Tiles in an item that starts at tile t.
  int ItemTiles(int t) const { return t == 0 && lead_ > 0 ? lead_ : per_item_; }
  // Whether a run shared by `count` rows becomes wide items, and the tiles of its item at tile t:
  // a fold run of wide_lead_ from tile 0, else one super-tile (one partial each).
  bool Wide(int count) const { return wide_rows_ > rows_per_cta_ && count > rows_per_cta_; }
  int SharedItemTiles(int t, int count) const {
    return !Wide(count) ? ItemTiles(t) : t == 0 && lead_ > 0 ? wide_lead_ : unit_;
  }
  // Super-tiles whose every key row d sees (the units rows may share).
  int FullUnits(const DecodeRow& d) const { return (d.pos + 1) / (kTileTokens * unit_); }

  // Tiles [tile_begin, tile_end) of `d`, read for it alone: items of up to per_item_ tiles (a
  // fold item of up to lead_ from tile 0).
  void AddOwn(const DecodeRow& d, int tile_begin, int tile_end) {
    if (tile_begin >= tile_end) return;
    const int row_begin = static_cast<int>(plan_->item_rows.size());
    plan_->item_rows.push_back(d.row);
    for (int t = tile_begin; t < tile_end;) {
      const int t_end = std::min(tile_end, t + ItemTiles(t));
      AddItem(&plan_->split_items, d.table_offset, t, t_end, row_begin, 1, d.pos + 1,
              t == 0 && lead_ > 0);
      plan_->split_tile_reads += t_end - t;
      t = t_end;
    }
    plan_->max_split_rows = std::max(plan_->max_split_rows, 1);
  }

  // Tiles [tile_begin, tile_end), all full for every row of `members` (indices into rows) and
  // the same blocks for all: one item per chunk of rows_per_cta rows and per_item_ tiles (a fold
  // item of up to lead_ from tile 0). With wide items (more rows than rows_per_cta), chunks of
  // wide_rows_ rows, each item its fold run from tile 0 or one super-tile (one partial each).
  // child (wide chains): per member, the node it reads next; a chunk then holds one child's rows
  // (the members grouped by child, the caller's) and reads through its first row's table.
  void AddShared(const std::vector<DecodeRow>& rows, const int* members, int count, int tile_begin,
                 int tile_end, const int* child = nullptr) {
    if (tile_begin >= tile_end) return;
    const int chunk = Wide(count) ? wide_rows_ : rows_per_cta_;
    for (int c = 0, n = 0; c < count; c += n) {
      n = std::min(chunk, count - c);
      if (child != nullptr) {
        for (int k = 1; k < n; ++k) {
          if (child[c + k] != child[c]) n = k;
        }
      }
      const bool chained = child != nullptr && child[c] >= 0;
      const DecodeRow& lead = rows[members[chained ? c : 0]];
      if (chained) chained_->insert({lead.table_offset, rows[members[c]].row, n});
      const int row_begin = static_cast<int>(plan_->item_rows.size());
      for (int k = c; k < c + n; ++k) plan_->item_rows.push_back(rows[members[k]].row);
      for (int t = tile_begin; t < tile_end;) {
        const int t_end = std::min(tile_end, t + SharedItemTiles(t, count));
        AddItem(&plan_->split_items, lead.table_offset, t, t_end, row_begin, n, t_end * kTileTokens,
                t == 0 && lead_ > 0);
        plan_->split_tile_reads += t_end - t;
        t = t_end;
      }
      plan_->max_split_rows = std::max(plan_->max_split_rows, n);
    }
    plan_->cascade_shared_tiles += tile_end - tile_begin;
  }

  // Single level: rows grouped by their first super-tile's blocks share the leading super-tiles
  // common to the whole group; the rest of each row is its own.
  void PlanLeadingTiles(const std::vector<DecodeRow>& rows) {
    const int n = static_cast<int>(rows.size());
    const int blocks_per_unit = blocks_per_tile_ * unit_;
    TileGrouper grouper(batch_.block_ids, blocks_per_unit, n);
    grouper.Reset();
    std::vector<int> group_of(n, -1), size;
    for (int i = 0; i < n; ++i) {
      if (FullUnits(rows[i]) == 0) continue;  // no full super-tile to share
      group_of[i] = grouper.GroupOf(rows[i].table_offset);
      if (group_of[i] == static_cast<int>(size.size())) size.push_back(0);
      ++size[group_of[i]];
    }
    std::vector<std::vector<int>> members(size.size());
    for (int i = 0; i < n; ++i) {
      if (group_of[i] >= 0 && size[group_of[i]] >= 2) members[group_of[i]].push_back(i);
    }
    for (int i = 0; i < n; ++i) {
      if (group_of[i] < 0 || size[group_of[i]] < 2) AddOwn(rows[i], 0, rows[i].tiles());
    }
    for (const std::vector<int>& g : members) {
      if (g.empty()) continue;
      const int32_t* lead = batch_.block_ids + rows[g[0]].table_offset;
      int shared = FullUnits(rows[g[0]]);
      for (int i : g) {
        shared = std::min(shared, FullUnits(rows[i]));
        const int32_t* ids = batch_.block_ids + rows[i].table_offset;
        const int len = shared * blocks_per_unit;
        shared = static_cast<int>(std::mismatch(ids, ids + len, lead).first - ids) /
                 blocks_per_unit;  // >= 1: the group key is super-tile 0
      }
      ++plan_->cascade_groups;
      AddShared(rows, g.data(), static_cast<int>(g.size()), 0, shared * unit_);
      for (int i : g) AddOwn(rows[i], shared * unit_, rows[i].tiles());
    }
  }

  // Every level: for each tile index (super-tile index with unit_ > 1: t below counts super-tiles),
  // the rows whose full tile t names the same blocks read it once. Rows are visited longest first,
  // so the rows with a full tile t are a prefix of that order. A group whose rows are exactly the
  // rows of a group of tile t - 1 continues it (a node of the prefix tree): its tiles become
  // multi-tile items, emitted when the node ends, and its rows are checked against the node's key
  // first (one compare, no hash probe). A row's tiles that no other row shares are emitted as runs
  // when the run ends.
  void PlanEveryTile(const std::vector<DecodeRow>& rows) {
    const int n = static_cast<int>(rows.size());
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return FullUnits(rows[a]) > FullUnits(rows[b]); });
    const int blocks_per_unit = blocks_per_tile_ * unit_;
    TileGrouper grouper(batch_.block_ids, blocks_per_unit, n);
    // Row i's (row, tile) pairs sit at [pair_start[i], + FullUnits), each with its first block's
    // slot in `counts`.
    const bool fast = PlannerSkipsUnsharedTiles();
    std::vector<int> pair_start(n + 1, 0);
    for (int i = 0; i < n; ++i) pair_start[i + 1] = pair_start[i] + FullUnits(rows[i]);
    FirstBlockCounts counts(fast ? pair_start[n] : 0);
    std::vector<int> pair_slot(fast ? pair_start[n] : 0);
    for (int i = 0; fast && i < n; ++i) {
      for (int t = 0; t < pair_start[i + 1] - pair_start[i]; ++t) {
        pair_slot[pair_start[i] + t] =
            counts.Add(batch_.block_ids[rows[i].table_offset + t * blocks_per_unit]);
      }
    }
    // cand_end[i]: 1 + row i's last tile some other row may share (0: none). From there on the
    // row reads its tiles alone: it leaves the loop below, and its own run from its last shared
    // tile (or earlier) to its end is emitted with the others at the end, as if it had gone on.
    std::vector<int> cand_end(n, 0);
    int max_full = 0;
    for (int i = 0; i < n; ++i) {
      if (!fast) cand_end[i] = FullUnits(rows[i]);
      for (int t = pair_start[i + 1] - pair_start[i]; fast && t > 0; --t) {
        if (counts.Shared(pair_slot[pair_start[i] + t - 1])) {
          cand_end[i] = t;
          break;
        }
      }
      max_full = std::max(max_full, cand_end[i]);
    }
    // own_begin[i]: first tile of row i's current run of unshared tiles, -1 after a shared tile.
    // node[i]: the node whose tile t - 1 row i read (-1: none).
    std::vector<int> own_begin(n, 0), node(n, -1);
    // Per node: rows, first tile not yet emitted, last tile read, where its rows sit in the
    // members buffer of that tile; and (stamped with the tile) its group and key at tile t.
    std::vector<int> node_size, node_begin, node_last, node_at, node_stamp, node_group, node_key;
    std::vector<int> group_of(n), size(n), start(n + 1), members(n), prev_members(n);
    std::vector<int> open, prev_open;  // nodes read at tile t, at tile t - 1
    int active = n;
    for (int t = 0; t < max_full; ++t) {
      while (FullUnits(rows[order[active - 1]]) <= t) --active;
      grouper.Reset();
      int groups = 0;
      for (int k = 0; k < active; ++k) {
        const int i = order[k], p = node[i];
        if (t >= cand_end[i]) {  // past its last tile that may be shared
          group_of[k] = -1;
          continue;
        }
        const int key = rows[i].table_offset + t * blocks_per_unit;
        int g = -1;
        if (p >= 0 && node_stamp[p] == t &&
            std::equal(batch_.block_ids + key, batch_.block_ids + key + blocks_per_unit,
                       batch_.block_ids + node_key[p])) {
          g = node_group[p];
        } else {
          g = !fast || counts.Shared(pair_slot[pair_start[i] + t]) ? grouper.GroupOf(key)
                                                                   : grouper.NewGroup(key);
          if (g == groups) size[groups++] = 0;
          if (p >= 0 && node_stamp[p] != t) {
            node_stamp[p] = t;
            node_group[p] = g;
            node_key[p] = key;
          }
        }
        group_of[k] = g;
        ++size[g];
      }
      // Members of each group of >= 2 rows, contiguous, in visiting order.
      start[0] = 0;
      for (int g = 0; g < groups; ++g) start[g + 1] = start[g] + (size[g] >= 2 ? size[g] : 0);
      for (int g = 0; g < groups; ++g) size[g] = size[g] >= 2 ? 0 : -1;  // fill cursor
      for (int k = 0; k < active; ++k) {
        const int i = order[k], g = group_of[k];
        if (g < 0) continue;  // left the loop (cand_end)
        if (size[g] < 0) {    // read by row i alone
          if (own_begin[i] < 0) own_begin[i] = t;
          node[i] = -1;
        } else {
          members[start[g] + size[g]++] = i;
        }
      }
      for (int g = 0; g < groups; ++g) {
        if (size[g] < 0) continue;
        const int* m = members.data() + start[g];
        const int count = size[g];
        const int p = node[m[0]];
        bool same = p >= 0 && node_last[p] == t - 1 && node_size[p] == count;
        for (int k = 1; same && k < count; ++k) same = node[m[k]] == p;
        int id = p;
        if (!same) {
          id = static_cast<int>(node_size.size());
          for (auto* v : {&node_size, &node_begin, &node_last, &node_at, &node_stamp, &node_group,
                          &node_key}) {
            v->push_back(-1);
          }
          node_size[id] = count;
          node_begin[id] = t;
          ++plan_->cascade_groups;
        }
        node_last[id] = t;
        node_at[id] = start[g];
        open.push_back(id);
        for (int k = 0; k < count; ++k) {
          const int i = m[k];
          if (own_begin[i] >= 0) AddOwn(rows[i], own_begin[i] * unit_, t * unit_);
          own_begin[i] = -1;
          node[i] = id;
        }
        // (Wide chains: a wide node's items wait for its end, where the runs its rows go on in
        // are known.)
        if ((t + 1 - node_begin[id]) * unit_ == SharedItemTiles(node_begin[id] * unit_, count) &&
            !(chains_ && Wide(count))) {  // full item
          AddShared(rows, m, count, node_begin[id] * unit_, (t + 1) * unit_);
          node_begin[id] = t + 1;
        }
      }
      for (int p : prev_open) {  // nodes that ended at tile t - 1
        if (node_last[p] != t - 1) continue;
        int* m = prev_members.data() + node_at[p];
        const int count = node_size[p];
        if (chains_ && Wide(count)) {  // its rows grouped by the wide node each reads next
          std::vector<int> next(count);
          for (int k = 0; k < count; ++k) {
            const int c = node[m[k]];
            // (A run of its own: wide, and filling at least half a chunk, so that the system
            // tiles are not read by many small chunks.)
            next[k] =
                c != p && c >= 0 && Wide(node_size[c]) && 2 * node_size[c] >= wide_rows_ ? c : -1;
          }
          std::vector<int> idx(count);
          std::iota(idx.begin(), idx.end(), 0);
          std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return next[x] < next[y]; });
          std::vector<int> sorted(count), child(count);
          for (int k = 0; k < count; ++k) {
            sorted[k] = m[idx[k]];
            child[k] = next[idx[k]];
          }
          AddShared(rows, sorted.data(), count, node_begin[p] * unit_, t * unit_, child.data());
        } else {
          AddShared(rows, m, count, node_begin[p] * unit_, t * unit_);
        }
      }
      std::swap(members, prev_members);
      std::swap(open, prev_open);
      open.clear();
    }
    for (int p : prev_open) {
      AddShared(rows, prev_members.data() + node_at[p], node_size[p], node_begin[p] * unit_,
                (node_last[p] + 1) * unit_);
    }
    for (int i = 0; i < n; ++i) {
      AddOwn(rows[i], (own_begin[i] >= 0 ? own_begin[i] : cand_end[i]) * unit_, rows[i].tiles());
    }
  }

 private:
  const AttentionBatch& batch_;
  std::set<ChunkKey>* const chained_;
  const bool chains_;
  const int rows_per_cta_, wide_rows_, blocks_per_tile_, per_item_, lead_, wide_lead_, unit_;
  AttentionPlan* plan_;
};

}  // namespace

namespace {
std::atomic<int> g_decode_ws_min_tiles{kDefaultDecodeWsMinTiles};
std::atomic<bool> g_own_tiles_ws{true};
std::atomic<bool> g_decode_ws_few_works{false};  // within noise (engine NOTES, run 21)
std::atomic<bool> g_skip_unshared_tiles{true};
}  // namespace

bool PlannerSkipsUnsharedTiles() { return g_skip_unshared_tiles.load(std::memory_order_relaxed); }
void SetPlannerSkipsUnsharedTiles(bool on) {
  g_skip_unshared_tiles.store(on, std::memory_order_relaxed);
}

bool DecodeWsFewWorks() { return g_decode_ws_few_works.load(std::memory_order_relaxed); }
void SetDecodeWsFewWorks(bool on) { g_decode_ws_few_works.store(on, std::memory_order_relaxed); }

int DecodeWsMinTiles() { return g_decode_ws_min_tiles.load(std::memory_order_relaxed); }
void SetDecodeWsMinTiles(int tiles) {
  g_decode_ws_min_tiles.store(tiles, std::memory_order_relaxed);
}
bool OwnTilesOnPersistentDecode() { return g_own_tiles_ws.load(std::memory_order_relaxed); }
void SetOwnTilesOnPersistentDecode(bool on) { g_own_tiles_ws.store(on, std::memory_order_relaxed); }

absl::Status PlanAttention(const AttentionConfig& config, const AttentionBatch& batch,
                           AttentionPlan* plan) {
  const int hq = config.num_q_heads, hkv = config.num_kv_heads, bs = config.block_size;
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: bad head counts q=", hq, " kv=", hkv));
  }
  if (bs <= 0 || kTileTokens % bs != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: block_size ", bs, " must divide the tile size ", kTileTokens));
  }
  const int unit = config.super_tiles;
  if (unit < 1 || unit > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: super_tiles ", unit, " outside [1, 64]"));
  }
  const int group = hq / hkv;
  const int rows_per_cta = std::max(1, kMaxQueriesPerCta / group);  // split items
  const int prefill_rows = std::max(1, PrefillQueriesPerCta(config.head_dim) / group);
  const int blocks_per_tile = kTileTokens / bs;

  *plan = AttentionPlan();
  plan->super_tiles = unit;
  plan->partial_base.assign(batch.num_tokens, -1);
  if (batch.query_start[0] != 0 || batch.query_start[batch.num_seqs] != batch.num_tokens) {
    return absl::InvalidArgumentError("attention: query_start does not cover the tokens");
  }

  std::vector<DecodeRow> decode_rows;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q0 = batch.query_start[s], q1 = batch.query_start[s + 1];
    const int ctx = batch.context_lens[s];
    const int table = batch.block_table_start[s];
    const int table_blocks = batch.block_table_start[s + 1] - table;
    if (q1 < q0 || ctx <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("attention: sequence ", s, " is malformed"));
    }
    if (static_cast<int64_t>(table_blocks) * bs < ctx) {
      return absl::InvalidArgumentError(absl::StrCat("attention: sequence ", s, " has ",
                                                     table_blocks, " blocks for ", ctx, " keys"));
    }
    for (int r = q0; r < q1; ++r) {
      if (batch.positions[r] < 0 || batch.positions[r] >= ctx) {
        return absl::InvalidArgumentError(absl::StrCat("attention: position ", batch.positions[r],
                                                       " outside [0, ", ctx, ") in sequence ", s));
      }
    }
    if (q1 - q0 == 1) {
      decode_rows.push_back({q0, batch.positions[q0], table});
      continue;
    }
    // Prefill: chunks of consecutive rows, each CTA folding every tile its rows can see.
    for (int c = q0; c < q1; c += prefill_rows) {
      const int n = std::min(prefill_rows, q1 - c);
      int kv_len = 0;
      for (int r = c; r < c + n; ++r) kv_len = std::max(kv_len, batch.positions[r] + 1);
      const int row_begin = static_cast<int>(plan->item_rows.size());
      for (int r = c; r < c + n; ++r) plan->item_rows.push_back(r);
      AddItem(&plan->final_items, table, 0, CeilDiv(kv_len, kTileTokens), row_begin, n, kv_len);
      plan->max_final_rows = std::max(plan->max_final_rows, n);
    }
  }

  SortLongestFirst(&plan->final_items);

  for (const DecodeRow& d : decode_rows) plan->decode_row_tiles += d.tiles();
  // Items of several tiles (one Q load, one CTA for a run of tiles) pay off once a step has
  // enough tiles to fill the GPU several times over: measured on an H100 (bench/kernels/
  // RESULTS.md), 4 tiles per item from 1024 decode tiles on.
  int tiles_per_item = config.tiles_per_item;
  if (tiles_per_item <= 0) tiles_per_item = plan->decode_row_tiles >= kAutoMultiTileFrom ? 4 : 1;
  tiles_per_item = CeilDiv(tiles_per_item, unit) * unit;  // whole super-tiles
  const size_t final_rows = plan->item_rows.size();
  int wide_lead = 0;           // DecodePlanner's wide_lead
  std::set<ChunkKey> chained;  // DecodePlanner's wide chains
  auto plan_decode = [&](int lead_tiles) {
    plan->split_items.clear();
    plan->item_rows.resize(final_rows);
    plan->max_split_rows = plan->cascade_groups = plan->cascade_shared_tiles = 0;
    plan->split_tile_reads = 0;
    chained.clear();
    DecodePlanner planner(batch, rows_per_cta, blocks_per_tile, tiles_per_item, lead_tiles, unit,
                          config.wide_rows, wide_lead, config.wide_chains ? &chained : nullptr,
                          plan);
    if (!config.cascade || rows_per_cta < 2) {  // a tile read per row either way
      for (const DecodeRow& d : decode_rows) planner.AddOwn(d, 0, d.tiles());
    } else if (config.grouping == CascadeGrouping::kLeadingTiles) {
      planner.PlanLeadingTiles(decode_rows);
    } else {
      planner.PlanEveryTile(decode_rows);
    }
    // (Wide chains: a chained run's later items come from the node its rows go on in, which
    // emits one-tile items; a plan made again folds them as the first did.)
    if (!chained.empty() && wide_lead > 0) {
      ExtendWideFolds(plan, rows_per_cta, wide_lead, &chained);
    }
  };
  plan->split_items.reserve(static_cast<size_t>(plan->decode_row_tiles) * kItemFields);
  plan->item_rows.reserve(plan->item_rows.size() + 2 * plan->decode_row_tiles);
  // Fold items: a row's first item folds its tiles in the CTA (one partial instead of one per
  // tile: the same bits, less partial traffic). The first item always folds. Whole runs from
  // tile 0 (a row's every tile, a group's shared run) fold when the CTAs, taking the items
  // longest first in snake rounds (SnakeRounds), end within about the step's tile reads per CTA;
  // else a long fold item would run on after the other CTAs are done (measured on an H100,
  // bench/kernels/RESULTS.md: runs shorter than whole rows lost to no folding at all, whole rows
  // won from batch 64 on). That takes a second plan, kept or dropped once its span is known.
  // With super-tiles (unit > 1) a fold item spans one super-tile (the split kernels keep one
  // state, the super-tile's), except whole rows of one q-row set, head_dim 128 and a GQA group
  // <= 8: the persistent decode kernel's items (split form 3), which fold super-tiles in order.
  std::vector<int> tiles_of(batch.num_tokens, 0);
  for (const DecodeRow& d : decode_rows) tiles_of[d.row] = d.tiles();
  auto runnable = [&] {
    if (unit == 1) return true;
    // (A plan with shared tiles runs on the register form: SplitForm 1.)
    const bool ws_shape = config.head_dim == 128 && group <= 8 && config.finish_rows &&
                          plan->cascade_shared_tiles == 0;
    for (int i = 0; i < plan->num_split(); ++i) {
      const int32_t* it = &plan->split_items[static_cast<size_t>(i) * kItemFields];
      if (it[6] == kFoldNone || it[2] - it[1] <= unit) continue;
      if (!ws_shape || it[4] != 1 || tiles_of[plan->item_rows[it[3]]] != it[2]) return false;
    }
    return true;
  };
  int lead = config.lead_tiles;
  const int slots = config.split_ctas > 0 ? config.split_ctas : kDefaultSplitCtas;
  plan_decode(lead < 0 ? lead : lead > 0 ? lead : unit > 1 ? unit : tiles_per_item);
  if (!runnable()) {
    lead = unit;
    plan_decode(unit);
  }
  // Wide items (one-level order, the planner's lead): a work of the wgmma kernel pays its Q rows
  // and its pipeline's fill and drain whatever its tiles, and a one-tile work writes a partial
  // the merge reads back, so a shared run from tile 0 folds in one longer run where that shortens
  // the wide kernel's span (WideFoldRun), where tiles_per_item would cut it into many one-tile
  // works. Measured on an H200 (bench/kernels/RESULTS.md): the three-level tree 1.10x-1.24x with
  // runs of 16-32 tiles. The runs are lengthened in place (ExtendWideFolds), not planned again.
  if (lead == 0 && unit == 1 && config.wide_rows > rows_per_cta && config.ws_ctas > 0) {
    // Wide chains fold whole (their rows' partials then only their own tiles'; measured on an
    // H200: the tree 71 vs 93 us, bench/kernels/RESULTS.md).
    const int len =
        WideFoldRun(*plan, rows_per_cta, tiles_per_item, config.num_kv_heads, config.ws_ctas);
    if (len > tiles_per_item || !chained.empty()) {
      wide_lead = std::max(len, tiles_per_item);
      ExtendWideFolds(plan, rows_per_cta, wide_lead, &chained);
    }
  }
  if (lead == 0) {
    int longest = 0;
    for (const DecodeRow& d : decode_rows) longest = std::max(longest, d.tiles());
    const int64_t share = CeilDiv(plan->split_tile_reads, slots);  // tiles per CTA, evenly
    // Whole rows for the persistent decode kernel (split form 3): plain rows (no shared tile) of
    // >= DecodeWsMinTiles() tiles on average, at least 7/8 of a (row, kv head) work per SM, and
    // balanced: none longer than 1.5x the mean, or none longer than a consumer's share of the
    // step's works (it hands them out longest first as consumers come free, so a mix of lengths
    // ends together then). Its consumers keep copies in flight with one row each, so it needs
    // no wave of CTAs to fill (batch 16, ctx 1k-4k: 1.17-1.21x over split rows).
    const int64_t rows = static_cast<int64_t>(decode_rows.size());
    const int64_t tiles = plan->decode_row_tiles;
    // Shorter rows too where every work has a consumer of its own (one round: nothing to
    // balance, no consumer takes a second work). Measured on an H200, decode steps of 3-tile rows
    // (qwen3-0.6b, prompt 128): 1.01-1.07x at batch 16-32 (1.10x at 32 in an earlier call),
    // where at batch 64 (two rounds) the kernel lost 5%. DecodeWsMinTiles() at INT_MAX turns the
    // kernel off altogether.
    const int min_tiles = DecodeWsMinTiles();
    const bool one_round = min_tiles != std::numeric_limits<int>::max() &&
                           rows * config.num_kv_heads <= 2 * static_cast<int64_t>(config.ws_ctas);
    const bool balanced =
        2 * static_cast<int64_t>(longest) * rows <= 3 * tiles ||
        2 * static_cast<int64_t>(longest) * config.ws_ctas <= tiles * config.num_kv_heads;
    const bool persistent =
        config.ws_ctas > 0 && config.finish_rows && config.head_dim == 128 &&
        config.num_q_heads <= 8 * config.num_kv_heads && plan->cascade_shared_tiles == 0 &&
        (8 * rows * config.num_kv_heads >= 7 * static_cast<int64_t>(config.ws_ctas) ||
         (one_round && DecodeWsFewWorks() && longest <= kDecodeWsFewWorksMaxTiles)) &&
        (one_round || tiles >= static_cast<int64_t>(min_tiles) * rows) && balanced;
    // A row longer than 1.1x the share would keep its CTA running after the others if folded
    // whole: no second plan then (it would be dropped, and planning twice costs host time).
    if (longest > tiles_per_item &&
        (persistent || (unit == 1 && 10 * static_cast<int64_t>(longest) <= 11 * share))) {
      const int64_t reads = plan->split_tile_reads;
      std::vector<int32_t> items = plan->split_items, rows = plan->item_rows;
      const int max_rows = plan->max_split_rows, groups = plan->cascade_groups;
      const int shared = plan->cascade_shared_tiles;
      plan_decode(longest);
      plan->one_round = persistent && one_round;
      SortLongestFirst(&plan->split_items);
      SnakeRounds(&plan->split_items, slots);
      // span <= 1.1 * reads / slots, in integers.
      if (persistent || 10 * RoundRobinSpan(plan->split_items, slots) <= 11 * share) {
        lead = longest;
      } else {  // back to the first plan
        plan->one_round = false;
        plan->split_items = std::move(items);
        plan->item_rows = std::move(rows);
        plan->max_split_rows = max_rows;
        plan->cascade_groups = groups;
        plan->cascade_shared_tiles = shared;
        plan->split_tile_reads = static_cast<int>(reads);
      }
    }
  } else if (lead > tiles_per_item) {  // the fold items lead
    SortLongestFirst(&plan->split_items);
    SnakeRounds(&plan->split_items, slots);
  }

  // Partial slots: one per super-tile (per tile with unit 1), but a fold item's super-tiles [0, f)
  // share one, super-tile f - 1's (slot of tile t = partial_base + t / unit, so slot f - 1 is the
  // row's first); then the merge of the row's slots in order. A fold item whose every row ends at
  // its last tile holds those rows' final states: it writes their outputs itself (kFoldFinish, the
  // merge's o * rcp(l) of a lone state: the same bits), and their merge entries have no slot (the
  // merge skips them). Only in plans of the shared-memory split form: the register form's kernel is
  // at its register cap.
  std::vector<int> folded(batch.num_tokens, 0);
  const bool finish =
      config.finish_rows &&
      SplitForm(*plan, config.head_dim, config.num_q_heads / std::max(1, config.num_kv_heads)) != 1;
  for (int i = 0; i < plan->num_split(); ++i) {
    int32_t* it = &plan->split_items[static_cast<size_t>(i) * kItemFields];
    if (it[6] == kFoldNone || it[6] == kFoldPair) continue;
    bool whole = finish;
    for (int k = it[3]; k < it[3] + it[4]; ++k) {
      folded[plan->item_rows[k]] = it[2];
      whole = whole && tiles_of[plan->item_rows[k]] == it[2];
    }
    if (whole) {
      it[6] = kFoldFinish;
      for (int k = it[3]; k < it[3] + it[4]; ++k) folded[plan->item_rows[k]] = -1;
    }
  }
  for (const DecodeRow& d : decode_rows) {
    if (folded[d.row] < 0) {  // finished by its fold item
      plan->partial_base[d.row] = -1;
      plan->merge_list.insert(plan->merge_list.end(), {d.row, plan->num_partials, 0});
      continue;
    }
    // Super-tiles without a slot of their own.
    const int skipped = std::max(CeilDiv(folded[d.row], unit), 1) - 1;
    const int slots = CeilDiv(d.tiles(), unit) - skipped;
    plan->partial_base[d.row] = plan->num_partials - skipped;
    plan->merge_list.insert(plan->merge_list.end(), {d.row, plan->num_partials, slots});
    plan->num_partials += slots;
  }
  // Wide items (more rows than a split CTA holds) first, in their order: the wgmma kernel runs
  // them, the split kernel the rest (AttentionPlanView::num_wide). With wide_all, where there are
  // wide items, every item is one: an item of several super-tiles without a fold (a row's own
  // tiles, a small group's run) becomes one item a super-tile, the partials it wrote.
  // Pairs of one-tile wide items (kFoldPair; the one-level order).
  if (config.wide_rows > rows_per_cta && unit == 1 && config.wide_pairs) {
    PairWideItems(plan, rows_per_cta, config.wide_rows);
  }
  if (config.wide_rows > rows_per_cta) {
    bool all = false;  // wide_all and some item is wide
    for (int i = 0; i < plan->num_split() && config.wide_all && !all; ++i) {
      all = plan->split_items[static_cast<size_t>(i) * kItemFields + 4] > rows_per_cta;
    }
    std::vector<int32_t> wide, rest;
    int max_rows = 0;
    for (int i = 0; i < plan->num_split(); ++i) {
      const int32_t* it = &plan->split_items[static_cast<size_t>(i) * kItemFields];
      const bool w = all || it[4] > rows_per_cta;
      if (w && it[6] == kFoldNone && it[2] - it[1] > unit) {
        for (int t = it[1]; t < it[2]; t += unit) {
          wide.insert(wide.end(),
                      {it[0], t, std::min(t + unit, it[2]), it[3], it[4], it[5], kFoldNone});
        }
      } else {
        (w ? wide : rest).insert((w ? wide : rest).end(), it, it + kItemFields);
      }
      if (w) {
        plan->max_wide_rows = std::max(plan->max_wide_rows, static_cast<int>(it[4]));
      } else {
        max_rows = std::max(max_rows, static_cast<int>(it[4]));
      }
    }
    plan->num_wide = static_cast<int>(wide.size()) / kItemFields;
    if (plan->num_wide > 0) {
      plan->max_split_rows = max_rows;
      plan->split_items = std::move(wide);
      plan->split_items.insert(plan->split_items.end(), rest.begin(), rest.end());
    }
  }
  // The persistent decode kernel (form 3) takes its works from a counter in plan order: strictly
  // longest first is then the greedy longest-processing-time schedule, which the snake rounds
  // made for fixed grids above would only disturb. (Items are independent: any order gives the
  // same bits.)
  if (config.ws_ctas > 0 && SplitForm(*plan, config.head_dim,
                                      config.num_q_heads / std::max(1, config.num_kv_heads)) == 3) {
    SortLongestFirst(&plan->split_items);
  }
  // The wide kernel's schedule (AttentionPlan::wide_sched). The kernel's own snake gave the SMs
  // that took a tree's fold runs of 32 tiles their share of the one-tile works on top: on an H200
  // its busiest CTA ran 77.8 us where the median ran 41.6 (session 29's timeline).
  const int wide_ctas = config.wide_ctas > 0 ? config.wide_ctas : config.ws_ctas;
  if (plan->num_wide > 0 && wide_ctas > 0) {
    plan->wide_sched = WideSchedule(&plan->split_items, plan->num_wide,
                                    std::max(1, config.num_kv_heads), wide_ctas);
  }
  return absl::OkStatus();
}

}  // namespace cascade::cuda
