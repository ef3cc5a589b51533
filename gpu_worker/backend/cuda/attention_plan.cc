// Host planning of attention work items: prefill chunks, split decode tiles, cascade groups.
// Plain C++ (no CUDA), so it is unit-testable anywhere.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/attention.h"

namespace cascade::cuda {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

void AddItem(std::vector<int32_t>* items, int table_offset, int tile_begin, int tile_end,
             int row_begin, int row_count, int kv_len) {
  items->insert(items->end(), {table_offset, tile_begin, tile_end, row_begin, row_count, kv_len});
}

}  // namespace

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
  const int group = hq / hkv;
  const int rows_per_cta = std::max(1, kMaxQueriesPerCta / group);  // split items
  const int prefill_rows = std::max(1, PrefillQueriesPerCta(config.head_dim) / group);
  const int blocks_per_tile = kTileTokens / bs;

  *plan = AttentionPlan();
  plan->partial_base.assign(batch.num_tokens, -1);
  if (batch.query_start[0] != 0 || batch.query_start[batch.num_seqs] != batch.num_tokens) {
    return absl::InvalidArgumentError("attention: query_start does not cover the tokens");
  }

  struct DecodeRow {
    int row, pos, table_offset;
  };
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

  // Longest prefill items first, so that a launch's last wave is its shortest items (the order of
  // items changes no result: each CTA computes its own rows).
  {
    std::vector<std::array<int32_t, kItemFields>> items(plan->num_final());
    std::memcpy(items.data(), plan->final_items.data(), plan->final_items.size() * sizeof(int32_t));
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& x, const auto& y) { return x[2] - x[1] > y[2] - y[1]; });
    std::memcpy(plan->final_items.data(), items.data(), plan->final_items.size() * sizeof(int32_t));
  }

  // Decode rows: one partial slot per tile, then a merge. Cascade: rows whose first full tiles
  // have the same block ids (the same memory) read those tiles once per group.
  for (const DecodeRow& d : decode_rows) {
    const int tiles = CeilDiv(d.pos + 1, kTileTokens);
    plan->partial_base[d.row] = plan->num_partials;
    plan->merge_list.insert(plan->merge_list.end(), {d.row, plan->num_partials, tiles});
    plan->num_partials += tiles;
  }
  auto tile_ids = [&](const DecodeRow& d, int t) {
    const int32_t* b = batch.block_ids + d.table_offset + t * blocks_per_tile;
    return std::vector<int32_t>(b, b + blocks_per_tile);
  };
  std::vector<std::vector<int>> groups;  // indices into decode_rows, first-seen order
  if (config.cascade) {
    std::map<std::vector<int32_t>, int> group_of;
    std::vector<int> singles;
    for (int i = 0; i < static_cast<int>(decode_rows.size()); ++i) {
      if ((decode_rows[i].pos + 1) / kTileTokens == 0) {  // no full tile to share
        groups.push_back({i});
        continue;
      }
      auto [it, inserted] = group_of.emplace(tile_ids(decode_rows[i], 0), groups.size());
      if (inserted) groups.emplace_back();
      groups[it->second].push_back(i);
    }
  } else {
    for (int i = 0; i < static_cast<int>(decode_rows.size()); ++i) groups.push_back({i});
  }

  for (const std::vector<int>& g : groups) {
    int shared = 0;
    if (g.size() >= 2) {
      const DecodeRow& lead = decode_rows[g[0]];
      shared = (lead.pos + 1) / kTileTokens;
      for (int i : g) shared = std::min(shared, (decode_rows[i].pos + 1) / kTileTokens);
      for (size_t k = 1; k < g.size(); ++k) {
        int t = 0;
        while (t < shared && tile_ids(decode_rows[g[k]], t) == tile_ids(lead, t)) ++t;
        shared = t;  // >= 1: the group key is tile 0
      }
      ++plan->cascade_groups;
      plan->cascade_shared_tiles += shared;
      for (int t = 0; t < shared; ++t) {
        for (size_t c = 0; c < g.size(); c += rows_per_cta) {
          const int n = static_cast<int>(std::min<size_t>(rows_per_cta, g.size() - c));
          const int row_begin = static_cast<int>(plan->item_rows.size());
          for (size_t k = c; k < c + n; ++k) plan->item_rows.push_back(decode_rows[g[k]].row);
          AddItem(&plan->split_items, lead.table_offset, t, t + 1, row_begin, n,
                  shared * kTileTokens);
          plan->max_split_rows = std::max(plan->max_split_rows, n);
        }
      }
    }
    for (int i : g) {
      const DecodeRow& d = decode_rows[i];
      const int tiles = CeilDiv(d.pos + 1, kTileTokens);
      const int row_begin = static_cast<int>(plan->item_rows.size());
      if (shared < tiles) plan->item_rows.push_back(d.row);
      for (int t = shared; t < tiles; ++t) {
        AddItem(&plan->split_items, d.table_offset, t, t + 1, row_begin, 1, d.pos + 1);
        plan->max_split_rows = std::max(plan->max_split_rows, 1);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace cascade::cuda
