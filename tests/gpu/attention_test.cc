// Paged attention (prefill with causal offset, split decode, cascade) against a float64 CPU
// reference, and the bitwise equalities the design relies on: cascade == non-cascade, cached
// prefill == cold prefill == decode for the same row, a row alone == the row in a batch.
// Tolerance vs the reference: outputs are bf16 (one rounding) of an fp32 computation over bf16
// inputs: |err| <= 2e-2 elementwise and relative L2 < 1e-2.
#include "gpu_worker/backend/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/launchers.h"
#include "gtest/gtest.h"
#include "tests/gpu/test_util.h"

namespace cascade::cuda {
namespace {

using testing::Download;
using testing::FromBf16;
using testing::Poisoned;
using testing::RandomNormal;
using testing::RelL2;
using testing::RoundToBf16;
using testing::Upload;

struct Seq {
  int q_len = 1;  // new tokens (rows), at positions ctx - q_len .. ctx - 1
  int ctx = 1;
  std::vector<int32_t> blocks;  // block table (filled by the harness if empty)
};

// A paged cache with random bf16 contents and the batch's host metadata.
struct Harness {
  int hq, hkv, D, bs, num_blocks;
  std::vector<float> k, v;  // [num_blocks, hkv, bs, D] (bf16-rounded)
  std::vector<uint16_t> k_bits, v_bits;
  DeviceBuffer d_k, d_v;
  int next_block = 0;
  std::vector<int32_t> free_blocks;

  Harness(int hq_, int hkv_, int D_, int bs_, int nb, std::mt19937* rng)
      : hq(hq_), hkv(hkv_), D(D_), bs(bs_), num_blocks(nb) {
    k = RandomNormal(static_cast<size_t>(nb) * hkv * bs * D, rng);
    v = RandomNormal(static_cast<size_t>(nb) * hkv * bs * D, rng);
    k_bits = RoundToBf16(&k);
    v_bits = RoundToBf16(&v);
    d_k = Upload(k_bits);
    d_v = Upload(v_bits);
    free_blocks.resize(nb);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), *rng);
  }
  // Appends fresh blocks to `s` until it covers s->ctx tokens.
  void Fill(Seq* s) {
    while (static_cast<int>(s->blocks.size()) * bs < s->ctx) {
      s->blocks.push_back(free_blocks.at(next_block++));
    }
  }
  KvCacheView View() { return {d_k.as<Bf16>(), d_v.as<Bf16>(), num_blocks, bs, hkv, D}; }
};

struct Batch {
  std::vector<int32_t> positions, query_start{0}, context_lens, table_start{0}, block_ids;
  int num_tokens() const { return static_cast<int>(positions.size()); }
};

Batch MakeBatch(const std::vector<Seq>& seqs) {
  Batch b;
  for (const Seq& s : seqs) {
    for (int p = s.ctx - s.q_len; p < s.ctx; ++p) b.positions.push_back(p);
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(s.ctx);
    b.block_ids.insert(b.block_ids.end(), s.blocks.begin(), s.blocks.end());
    b.table_start.push_back(static_cast<int32_t>(b.block_ids.size()));
  }
  return b;
}

// The persistent decode kernel's work counter, one for every run of this binary (as a backend's
// serves its every layer and step): each launch must hand it back at zero.
const DeviceBuffer& WsWork() {
  static const DeviceBuffer* counter = new DeviceBuffer(Upload(std::vector<int32_t>{0, 0}));
  return *counter;
}

// AttentionConfig::super_tiles of RunAttention: 0 the device's choice for the shape (SuperTilesFor:
// the two-level fold order on Hopper at head_dim 128), else this value. Tests that compare paths
// run under both orders (SuperOrders); each order has its own bits, so paths are compared within
// one order only.
int g_super_tiles = 0;
int SuperTiles(int head_dim, int block_size) {
  if (g_super_tiles > 0) return g_super_tiles;
  absl::StatusOr<int> st = SuperTilesFor(head_dim, block_size);
  EXPECT_TRUE(st.ok()) << st.status();
  return st.ok() ? *st : 1;
}
// The orders to test a shape under: the one-level order, and the device's choice where it differs
// (CASCADE_TEST_SUPER_TILES=G: G in its place, to prove the kernels at another super-tile size).
std::vector<int> SuperOrders(int head_dim, int block_size) {
  g_super_tiles = 0;
  int device = SuperTiles(head_dim, block_size);
  const char* env = std::getenv("CASCADE_TEST_SUPER_TILES");
  if (device > 1 && env != nullptr && std::atoi(env) > 1) device = std::atoi(env);
  return device > 1 ? std::vector<int>{1, device} : std::vector<int>{1};
}

// AttentionConfig::wide_rows of RunAttention: -1 the device's choice (WideCascadeRows: wide
// cascade items on the wgmma kernel on Hopper at head_dim 128), else this value (0: none).
int g_wide_rows = -1;
int WideRows(int head_dim, int group, int block_size) {
  if (g_wide_rows >= 0) return g_wide_rows;
  absl::StatusOr<int> w = WideCascadeRows(head_dim, group, block_size);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : 0;
}

// AttentionConfig::wide_all and ws_ctas of RunAttention (ws_ctas 0: no SM count, as before the
// backend passed one; WideFoldRun's long fold runs need it).
bool g_wide_all = false;
int g_ws_ctas = 0;
bool g_wide_pairs = true;   // AttentionConfig::wide_pairs of RunAttention
bool g_wide_chains = true;  // AttentionConfig::wide_chains of RunAttention

// Runs attention over `q` ([tokens, hq * D] bf16 bits) and returns [tokens, hq * D] bf16 bits.
std::vector<uint16_t> RunAttention(Harness& h, const Batch& b, const std::vector<uint16_t>& q,
                                   bool cascade, AttentionPlan* plan_out = nullptr,
                                   CascadeGrouping grouping = CascadeGrouping::kEveryTile,
                                   int tiles_per_item = 0,
                                   PrefillPath prefill_path = PrefillPath::kAuto,
                                   int lead_tiles = 0) {
  AttentionConfig cfg{h.hq, h.hkv, h.D, h.bs, cascade, grouping, tiles_per_item, lead_tiles};
  cfg.super_tiles = SuperTiles(h.D, h.bs);
  cfg.wide_rows = WideRows(h.D, h.hq / h.hkv, h.bs);
  cfg.wide_all = g_wide_all;
  cfg.ws_ctas = g_ws_ctas;
  cfg.wide_pairs = g_wide_pairs;
  cfg.wide_chains = g_wide_chains;
  AttentionBatch ab{b.positions.data(),
                    b.num_tokens(),
                    b.query_start.data(),
                    b.context_lens.data(),
                    b.table_start.data(),
                    b.block_ids.data(),
                    static_cast<int>(b.context_lens.size())};
  AttentionPlan plan;
  absl::Status st = PlanAttention(cfg, ab, &plan);
  EXPECT_TRUE(st.ok()) << st;
  DeviceBuffer d_q = Upload(q), d_pos = Upload(b.positions), d_blocks = Upload(b.block_ids);
  DeviceBuffer d_fi = Upload(plan.final_items), d_si = Upload(plan.split_items);
  DeviceBuffer d_rows = Upload(plan.item_rows), d_base = Upload(plan.partial_base);
  DeviceBuffer d_merge = Upload(plan.merge_list);
  const size_t out_elems = static_cast<size_t>(b.num_tokens()) * h.hq * h.D;
  DeviceBuffer d_out = Poisoned<Bf16>(out_elems);
  DeviceBuffer d_po = Poisoned<float>(static_cast<size_t>(plan.num_partials) * h.hq * h.D);
  DeviceBuffer d_pl = Poisoned<float>(static_cast<size_t>(plan.num_partials) * h.hq * 2);
  AttentionArgs args;
  args.q = d_q.as<Bf16>();
  args.q_row_stride = h.hq * h.D;
  args.cache = h.View();
  args.positions = d_pos.as<int32_t>();
  args.block_ids = d_blocks.as<int32_t>();
  args.out = d_out.as<Bf16>();
  args.partial_o = d_po.as<float>();
  args.partial_ml = d_pl.as<float>();
  args.scale = 1.f / std::sqrt(static_cast<float>(h.D));
  args.num_q_heads = h.hq;
  args.prefill_path = prefill_path;
  AttentionPlanView view{d_fi.as<int32_t>(),    plan.num_final(),     d_si.as<int32_t>(),
                         plan.num_split(),      d_rows.as<int32_t>(), d_base.as<int32_t>(),
                         d_merge.as<int32_t>(), plan.num_merge(),     plan.max_final_rows,
                         plan.max_split_rows};
  view.split_form = SplitForm(plan, h.D, h.hq / h.hkv);
  view.ws_work = WsWork().as<int32_t>();
  view.super_tiles = plan.super_tiles;
  view.num_wide = plan.num_wide;
  // The wide kernel's schedule where the planner made one (ws_ctas > 0), its CTAs the grid.
  DeviceBuffer d_sched;
  if (!plan.wide_sched.empty()) {
    d_sched = Upload(plan.wide_sched);
    view.wide_sched = d_sched.as<int32_t>();
    view.wide_ctas = static_cast<int>(plan.wide_sched.size()) - 1;
  }
  st = Attention(args, view, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (plan_out) *plan_out = plan;
  std::vector<uint16_t> out = Download<Bf16>(d_out, out_elems);
  EXPECT_EQ(Download<int32_t>(WsWork(), 2), (std::vector<int32_t>{0, 0}))
      << "the persistent decode kernel left its work counter set";
  return out;
}

std::vector<double> Reference(const Harness& h, const std::vector<Seq>& seqs, const Batch& b,
                              const std::vector<float>& q) {
  const int G = h.hq / h.hkv, D = h.D;
  std::vector<double> out(static_cast<size_t>(b.num_tokens()) * h.hq * D);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int r = b.query_start[s]; r < b.query_start[s + 1]; ++r) {
      const int p = b.positions[r];
      for (int qh = 0; qh < h.hq; ++qh) {
        const int kvh = qh / G;
        std::vector<double> sc(p + 1);
        double m = -INFINITY;
        for (int j = 0; j <= p; ++j) {
          const size_t base =
              ((static_cast<size_t>(seqs[s].blocks[j / h.bs]) * h.hkv + kvh) * h.bs + j % h.bs) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += static_cast<double>(q[(r * h.hq + qh) * D + d]) * h.k[base + d];
          sc[j] = dot / std::sqrt(static_cast<double>(D));
          m = std::max(m, sc[j]);
        }
        double l = 0;
        std::vector<double> o(D, 0.0);
        for (int j = 0; j <= p; ++j) {
          const double w = std::exp(sc[j] - m);
          l += w;
          const size_t base =
              ((static_cast<size_t>(seqs[s].blocks[j / h.bs]) * h.hkv + kvh) * h.bs + j % h.bs) * D;
          for (int d = 0; d < D; ++d) o[d] += w * h.v[base + d];
        }
        for (int d = 0; d < D; ++d) out[(r * h.hq + qh) * D + d] = o[d] / l;
      }
    }
  }
  return out;
}

void ExpectClose(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  std::vector<double> g(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    g[i] = FromBf16(got[i]);
    ASSERT_FALSE(std::isnan(g[i])) << "output element " << i << " not written";
    ASSERT_LE(std::fabs(g[i] - ref[i]), 2e-2) << "element " << i;
  }
  EXPECT_LT(RelL2(g, ref), 1e-2);
}

struct Shape {
  int hq, hkv, D, bs;
};

class AttentionShapes : public ::testing::TestWithParam<Shape> {};

// Prefill from position 0, prefill with an offset (a cached prefix), and decode rows at tile
// boundaries and far past them, all in one batch.
TEST_P(AttentionShapes, MixedBatchMatchesFloat64Reference) {
  CASCADE_REQUIRE_GPU();
  const Shape sh = GetParam();
  std::mt19937 rng(100 + sh.D + sh.hq);
  Harness h(sh.hq, sh.hkv, sh.D, sh.bs, 500, &rng);
  // {200, 520}: a prefill of several CTAs whose tiles are mostly unmasked, from a mid-tile offset.
  std::vector<Seq> seqs = {{70, 70, {}},  {37, 200, {}}, {1, 1, {}}, {1, 130, {}},  {1, 64, {}},
                           {1, 1000, {}}, {2, 65, {}},   {3, 3, {}}, {200, 520, {}}};
  for (Seq& s : seqs) h.Fill(&s);
  Batch b = MakeBatch(seqs);
  std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * sh.hq * sh.D, &rng);
  auto q_bits = RoundToBf16(&q);
  auto out = RunAttention(h, b, q_bits, /*cascade=*/true);
  ExpectClose(out, Reference(h, seqs, b, q));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(Shape{4, 2, 32, 16}, Shape{8, 8, 64, 16},
                                           Shape{16, 8, 128, 16}, Shape{8, 2, 128, 32},
                                           Shape{32, 1, 64, 64}, Shape{8, 4, 256, 16}));

// Wide cascade items (shared runs read by more rows than a split CTA holds, on the persistent
// wgmma kernel, 128 q-rows a CTA) against `flat` (cascade off): where the device runs them
// (`plan`, made with the device's choice, has some), with fold items of none / the planner's /
// whole runs, on 1, 3 and every CTA (each CTA walking many works); and with none (every item on
// the split kernel).
void ExpectWideCascadeBitwise(Harness& h, const Batch& b, const std::vector<uint16_t>& q_bits,
                              const std::vector<uint16_t>& flat, const AttentionPlan& plan) {
  const size_t bytes = flat.size() * sizeof(uint16_t);
  if (WideRows(h.D, h.hq / h.hkv, h.bs) == 0) {
    EXPECT_EQ(plan.num_wide, 0);
  } else {
    EXPECT_GT(plan.num_wide, 0) << "no wide cascade item in a plan of shared runs";
    // The small items after the wide ones on the persistent decode kernel (the default, split
    // form 6, which writes their partials; also on 3 CTAs, so its rings wrap) or on the
    // shared-memory split kernel (own = false), or every item on the wgmma kernel (wide_all).
    for (bool all : {true, false}) {
      g_wide_all = all;
      for (bool own : {true, false}) {
        if (all && !own) continue;
        SetOwnTilesOnPersistentDecode(own);
        for (int lead : {-1, 0, 1000}) {
          for (int ctas : {1, 3, 0, -3}) {  // -3: the persistent decode kernel on 3 CTAs
            if (ctas < 0 && (all || !own)) continue;
            internal::SetPrefillWsCtas(std::max(ctas, 0));
            internal::SetDecodeWsCtas(std::max(-ctas, 0));
            AttentionPlan p;
            auto wide = RunAttention(h, b, q_bits, true, &p, CascadeGrouping::kEveryTile, 0,
                                     PrefillPath::kAuto, lead);
            internal::SetPrefillWsCtas(0);
            internal::SetDecodeWsCtas(0);
            EXPECT_EQ(all, p.num_wide == p.num_split()) << "wide_all " << all;
            const int form = SplitForm(p, h.D, h.hq / h.hkv);  // 1: groups on the split kernel
            if (!all && form != 1 && p.num_split() > p.num_wide) {
              EXPECT_EQ(form, own ? 6 : 0);
            }
            EXPECT_EQ(0, std::memcmp(wide.data(), flat.data(), bytes))
                << "wide cascade items (" << p.num_wide << " of " << p.num_split() << ", wide_all "
                << all << ", own tiles on the persistent kernel " << own << ", fold items " << lead
                << ", " << ctas << " CTAs) != flat";
          }
        }
      }
      SetOwnTilesOnPersistentDecode(true);
    }
    g_wide_all = false;
    // With the SM count as the backend plans (PersistentDecodeCtas): the wide fold runs the
    // span model picks (WideFoldRun), whole rows for the persistent decode kernel, and the wide
    // kernel's schedule (AttentionPlan::wide_sched: one range of works a CTA); also planned for
    // 3 CTAs and 1 (many works a CTA, its ring wrapping) and for 1000 (ranges left empty).
    absl::StatusOr<int> sms = PersistentDecodeCtas(h.D, h.hq / h.hkv, h.bs);
    ASSERT_TRUE(sms.ok()) << sms.status();
    // Without wide chains (AttentionConfig::wide_chains, the default: a chunk of rows per run
    // they go on in, each folding from tile 0 through it): the system in chunks of wide_rows,
    // its fold run WideFoldRun's; both with pairs of one-tile items (kFoldPair, where a run's
    // rows fill at most half the kernel's q-rows: its two consumer warpgroups take a tile each)
    // and without. Then with chains.
    for (int chains : {0, 1}) {
      g_wide_chains = chains != 0;
      for (bool pairs : {true, false}) {
        if (chains && !pairs) continue;
        g_wide_pairs = pairs;
        for (int ctas : {*sms, 3, 1, 1000}) {
          g_ws_ctas = ctas;
          AttentionPlan p;
          auto planned = RunAttention(h, b, q_bits, true, &p);
          g_ws_ctas = 0;
          EXPECT_GT(p.num_wide, 0);
          EXPECT_EQ(p.wide_sched.size(), static_cast<size_t>(ctas) + 1);
          EXPECT_EQ(0, std::memcmp(planned.data(), flat.data(), bytes))
              << "wide cascade items planned with ws_ctas " << ctas << ", pairs " << pairs
              << ", chains " << chains << " != flat";
        }
      }
    }
    g_wide_pairs = true;
    g_wide_chains = true;
    // The persistent decode kernel's consumers in the decode-shaped form (SetDecodeWsN8): the
    // rows' own tiles (split form 6: partial slots, fold runs), planned as the backend plans.
    internal::SetDecodeWsN8(true);
    g_ws_ctas = *sms;
    auto n8 = RunAttention(h, b, q_bits, true);
    g_ws_ctas = 0;
    internal::SetDecodeWsN8(false);
    EXPECT_EQ(0, std::memcmp(n8.data(), flat.data(), bytes))
        << "wide cascade items, own tiles on the decode-shaped consumers != flat";
  }
  g_wide_rows = 0;
  AttentionPlan p;
  auto narrow = RunAttention(h, b, q_bits, true, &p);
  g_wide_rows = -1;
  EXPECT_EQ(p.num_wide, 0);
  EXPECT_EQ(0, std::memcmp(narrow.data(), flat.data(), bytes)) << "no wide items: != flat";
}

// Decode rows sharing a prefix (the same leading block ids) computed with cascade on and off:
// the outputs are bitwise equal, and the cascade plan really shared tiles.
TEST(Attention, CascadeEqualsNonCascadeBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(7);
  Harness h(16, 8, 128, 16, 2500, &rng);
  Seq prefix{1, 300, {}};
  h.Fill(&prefix);  // 19 blocks; the first 18 are full
  std::vector<int32_t> shared(prefix.blocks.begin(), prefix.blocks.begin() + 18);
  std::vector<Seq> seqs;
  for (int i = 0; i < 40; ++i) {
    Seq s{1, 290 + 17 * i, shared};
    h.Fill(&s);
    seqs.push_back(s);
  }
  Seq short_share{1, 150, std::vector<int32_t>(shared.begin(), shared.begin() + 5)};
  h.Fill(&short_share);  // shares one full tile (4 blocks) only
  seqs.push_back(short_share);
  Seq alone{1, 500, {}};
  h.Fill(&alone);
  seqs.push_back(alone);
  Batch b = MakeBatch(seqs);
  std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * 16 * 128, &rng);
  auto q_bits = RoundToBf16(&q);
  for (int order : SuperOrders(128, 16)) {
    g_super_tiles = order;
    SCOPED_TRACE("super_tiles " + std::to_string(order));
    AttentionPlan plan_on, plan_off;
    auto on = RunAttention(h, b, q_bits, true, &plan_on);
    auto off = RunAttention(h, b, q_bits, false, &plan_off);
    // One-level: tile 0 is read once for the 41 rows that share it, tiles 1..3 once for the 40
    // that share them: two groups, four shared tiles. Super-tiles of 4: the 40 rows share
    // super-tile 0 (tiles 0..3); the short row's one shared tile is part of a super-tile it does
    // not share.
    // (Super-tiles past 4 tiles, CASCADE_TEST_SUPER_TILES: no super-tile is shared; bits only.)
    if (order <= 4) {
      EXPECT_EQ(plan_on.cascade_groups, order == 1 ? 2 : 1);
      EXPECT_EQ(plan_on.cascade_shared_tiles, 4);
      EXPECT_LT(plan_on.split_tile_reads, plan_off.split_tile_reads);
    }
    EXPECT_EQ(plan_off.cascade_groups, 0);
    ASSERT_EQ(on.size(), off.size());
    EXPECT_EQ(0, std::memcmp(on.data(), off.data(), on.size() * sizeof(uint16_t)))
        << "cascade changed a result";
    ExpectClose(on, Reference(h, seqs, b, q));
    // Fold items (a row's first tiles folded in the CTA into one partial): none, short, whole rows.
    for (int lead : {-1, 2, 1000}) {
      for (bool cascade : {true, false}) {
        auto folded = RunAttention(h, b, q_bits, cascade, nullptr, CascadeGrouping::kEveryTile, 0,
                                   PrefillPath::kAuto, lead);
        EXPECT_EQ(0, std::memcmp(folded.data(), off.data(), off.size() * sizeof(uint16_t)))
            << "fold items of " << lead << " tiles (cascade " << cascade << ") changed a result";
      }
    }
    for (int variant : {1, 2, 3}) {  // shared-memory form with / without prefetch, register form
      for (int lead : {-1, 0, 1000}) {
        internal::SetSplitVariant(variant);
        auto other = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                                  PrefillPath::kAuto, lead);
        internal::SetSplitVariant(0);
        EXPECT_EQ(0, std::memcmp(other.data(), off.data(), off.size() * sizeof(uint16_t)))
            << "split kernel variant " << variant << " (fold items " << lead
            << ") changed a result";
      }
    }
    ExpectWideCascadeBitwise(h, b, q_bits, off, plan_on);
  }
  g_super_tiles = 0;
}

// The product's tree: a system chunk of 2048 tokens shared by 256 requests, 8 context chunks of
// 1024 tokens shared by 32 requests each, and each request's own query of 1..150 tokens (rows
// end mid-block, mid-tile and on boundaries), one decode row each. Every-tile cascade (the
// system and the contexts read once per group) with 1, 3 or the planner's choice of tiles per
// item, single-level grouping and cascade off all give the same bits, and match the float64
// reference.
TEST(Attention, ThreeLevelTreeCascadeEqualsFlatBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(21);
  Harness h(16, 8, 128, 16, 3300, &rng);
  Seq system{1, 2048, {}};
  h.Fill(&system);
  std::vector<Seq> seqs;
  for (int c = 0; c < 8; ++c) {
    Seq context{1, 2048 + 1024, system.blocks};
    h.Fill(&context);
    for (int i = 0; i < 32; ++i) {
      Seq s{1, context.ctx + 1 + (c * 32 + i) * 37 % 150, context.blocks};
      h.Fill(&s);
      seqs.push_back(s);
    }
  }
  Batch b = MakeBatch(seqs);
  std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * 16 * 128, &rng);
  auto q_bits = RoundToBf16(&q);
  for (int order : SuperOrders(128, 16)) {  // chunks are whole super-tiles: the same sharing
    g_super_tiles = order;
    SCOPED_TRACE("super_tiles " + std::to_string(order));
    AttentionPlan every, leading, off;
    auto out = RunAttention(h, b, q_bits, true, &every);
    EXPECT_EQ(every.cascade_groups, 9);
    EXPECT_EQ(every.cascade_shared_tiles, 32 + 8 * 16);
    auto single = RunAttention(h, b, q_bits, true, &leading, CascadeGrouping::kLeadingTiles);
    EXPECT_EQ(leading.cascade_shared_tiles, 32);
    auto one = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 1);
    auto merged = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 3);
    auto nofold = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                               PrefillPath::kAuto, -1);
    auto whole = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                              PrefillPath::kAuto, 1000);
    auto flat_whole = RunAttention(h, b, q_bits, false, nullptr, CascadeGrouping::kEveryTile, 0,
                                   PrefillPath::kAuto, 1000);
    auto flat = RunAttention(h, b, q_bits, false, &off);
    EXPECT_LT(every.split_tile_reads * 4, off.split_tile_reads);
    const size_t bytes = out.size() * sizeof(uint16_t);
    EXPECT_EQ(0, std::memcmp(out.data(), flat.data(), bytes)) << "every-tile cascade != flat";
    EXPECT_EQ(0, std::memcmp(single.data(), flat.data(), bytes)) << "single-level cascade != flat";
    EXPECT_EQ(0, std::memcmp(one.data(), flat.data(), bytes)) << "one tile per item != flat";
    EXPECT_EQ(0, std::memcmp(merged.data(), flat.data(), bytes)) << "3 tiles per item != flat";
    EXPECT_EQ(0, std::memcmp(nofold.data(), flat.data(), bytes)) << "no fold items != flat";
    EXPECT_EQ(0, std::memcmp(whole.data(), flat.data(), bytes)) << "system folded whole != flat";
    EXPECT_EQ(0, std::memcmp(flat_whole.data(), flat.data(), bytes)) << "rows folded whole != flat";
    ExpectWideCascadeBitwise(h, b, q_bits, flat, every);
    // The float64 reference on one row of each context (the rest are the same computation).
    std::vector<Seq> some;
    std::vector<float> q_some;
    std::vector<uint16_t> out_some;
    const size_t row = 16 * 128;
    for (int c = 0; c < 8; ++c) {
      const int r = c * 32 + (c * 5) % 32;
      some.push_back(seqs[r]);
      q_some.insert(q_some.end(), q.begin() + r * row, q.begin() + (r + 1) * row);
      out_some.insert(out_some.end(), out.begin() + r * row, out.begin() + (r + 1) * row);
    }
    ExpectClose(out_some, Reference(h, some, MakeBatch(some), q_some));
  }
  g_super_tiles = 0;
}

// The Hopper prefill kernels (wgmma: warp-specialized with TMA, with and without the ping-pong
// schedule, and the two-warpgroup form) and the mma.sync prefill kernel give the same bits for
// every row: prefills from position 0 over many items, from mid-tile and mid-block offsets (a
// cached prefix), short items, GQA groups 1, 2 and 4, blocks of 8, 16, 32 and 64 (8: no TMA
// pieces), sequence ends mid-piece, next to decode rows.
// With CachedPrefillEqualsColdPrefillBitwise (default path: wgmma on Hopper == the split kernel)
// this keeps prefill == decode for a row whichever kernel runs it.
TEST(Attention, PrefillKernelsAgreeBitwise) {
  CASCADE_REQUIRE_GPU();
  absl::StatusOr<bool> wgmma = WgmmaPrefillAvailable();
  ASSERT_TRUE(wgmma.ok()) << wgmma.status();
  if (!*wgmma) GTEST_SKIP() << "the wgmma prefill kernel needs a compute capability 9.0 GPU";
  bool checked_reference = false;
  for (const Shape sh : {Shape{16, 8, 128, 16}, Shape{32, 8, 128, 16}, Shape{8, 8, 128, 32},
                         Shape{16, 4, 128, 64}, Shape{16, 8, 128, 8}}) {
    std::mt19937 rng(300 + sh.hq + sh.bs);
    Harness h(sh.hq, sh.hkv, sh.D, sh.bs, 6000 / sh.bs, &rng);
    std::vector<Seq> seqs = {{1000, 1000, {}}, {45, 300, {}}, {3, 3, {}},     {130, 700, {}},
                             {1, 90, {}},      {64, 64, {}},  {200, 520, {}}, {17, 129, {}}};
    for (Seq& s : seqs) h.Fill(&s);
    Batch b = MakeBatch(seqs);
    std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * sh.hq * sh.D, &rng);
    auto q_bits = RoundToBf16(&q);
    for (int order : SuperOrders(sh.D, sh.bs)) {
      g_super_tiles = order;
      auto mma = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                              PrefillPath::kMmaSync);
      std::vector<uint16_t> wg;
      // The two-warpgroup kernel (one-level order only), then warp-specialized (TMA) with and
      // without ping-pong (0 last: the default form), the persistent kernel on 1 and 3 CTAs (each
      // walks many works: its stage and Q rings wrap, works of odd tile counts shift which load
      // warp copies a work's first tile) and on its default grid (last).
      for (int variant : {2, 1, 3, 0}) {
        if (variant == 2 && order > 1) continue;
        internal::SetWgmmaPrefillVariant(variant);
        for (int ctas : {1, 3, 0}) {
          if (variant == 2 && ctas != 0) continue;
          internal::SetPrefillWsCtas(ctas);
          wg = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                            PrefillPath::kWgmma);
          internal::SetPrefillWsCtas(0);
          ASSERT_EQ(mma.size(), wg.size());
          size_t differ = 0;
          for (size_t i = 0; i < mma.size(); ++i) differ += mma[i] != wg[i];
          EXPECT_EQ(differ, 0u) << "wgmma prefill (variant " << variant << ", " << ctas
                                << " CTAs) != mma.sync prefill, shape hq " << sh.hq << " hkv "
                                << sh.hkv << " block " << sh.bs << ", super_tiles " << order;
        }
      }
      if (!checked_reference || order > 1) {  // each order against the reference once
        ExpectClose(wg, Reference(h, seqs, b, q));
        checked_reference = true;
      }
    }
  }
  g_super_tiles = 0;
}

// TunePrefillForm times both warp-specialized forms where both can run and makes its pick the
// default; the default then gives the mma.sync kernel's bits under either form. A shape with one
// form (head_dim 64) times nothing.
TEST(Attention, TunedPrefillFormGivesTheSameBits) {
  CASCADE_REQUIRE_GPU();
  absl::StatusOr<bool> wgmma = WgmmaPrefillAvailable();
  ASSERT_TRUE(wgmma.ok()) << wgmma.status();
  absl::StatusOr<PrefillFormChoice> none = TunePrefillForm(HeadShape{16, 8, 64}, 16, 512, nullptr);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->tuned);
  if (!*wgmma) GTEST_SKIP() << "the wgmma prefill kernel needs a compute capability 9.0 GPU";
  absl::StatusOr<PrefillFormChoice> choice =
      TunePrefillForm(HeadShape{16, 8, 128}, 16, 1000, nullptr);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->tuned);
  EXPECT_TRUE(choice->form == 0 || choice->form == 1);
  EXPECT_GT(choice->us[0], 0.f);
  EXPECT_GT(choice->us[1], 0.f);
  EXPECT_EQ(internal::PrefillForm(), choice->form) << choice->Describe(1000);
  std::mt19937 rng(31);
  Harness h(16, 8, 128, 16, 200, &rng);
  std::vector<Seq> seqs = {{300, 300, {}}, {70, 500, {}}, {1, 40, {}}};
  for (Seq& s : seqs) h.Fill(&s);
  Batch b = MakeBatch(seqs);
  std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * 16 * 128, &rng);
  auto q_bits = RoundToBf16(&q);
  auto mma = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                          PrefillPath::kMmaSync);
  for (int form : {1 - choice->form, choice->form}) {
    internal::SetPrefillForm(form);
    auto wg = RunAttention(h, b, q_bits, true, nullptr, CascadeGrouping::kEveryTile, 0,
                           PrefillPath::kWgmma);
    EXPECT_TRUE(wg == mma) << "default prefill form " << form << " != mma.sync prefill";
  }
  internal::SetPrefillForm(0);
}

// The same query row computed by a cold prefill, by a prefill of the uncached tail (causal offset),
// by a one-token step (split decode), and next to unrelated sequences: bitwise equal.
TEST(Attention, CachedPrefillEqualsColdPrefillBitwise) {
  CASCADE_REQUIRE_GPU();
  std::mt19937 rng(8);
  const int hq = 16, hkv = 8, D = 128, N = 300;
  Harness h(hq, hkv, D, 16, 200, &rng);
  Seq cold{N, N, {}};
  h.Fill(&cold);
  std::vector<float> q = RandomNormal(static_cast<size_t>(N) * hq * D, &rng);
  auto q_bits = RoundToBf16(&q);
  for (int order : SuperOrders(D, 16)) {
    g_super_tiles = order;
    SCOPED_TRACE("super_tiles " + std::to_string(order));
    auto cold_out = RunAttention(h, MakeBatch({cold}), q_bits, true);
    const size_t row = static_cast<size_t>(hq) * D;
    for (int tail : {45, 1, 64}) {
      Seq cached{tail, N, cold.blocks};
      Seq other{3, 77, {}};
      h.Fill(&other);
      std::vector<Seq> seqs = {other, cached};
      Batch b = MakeBatch(seqs);
      std::vector<uint16_t> qb(other.q_len * row);
      for (auto& x : qb) x = testing::ToBf16(0.5f);
      qb.insert(qb.end(), q_bits.begin() + (N - tail) * row, q_bits.end());
      for (int lead : {0, -1, 1000}) {  // a one-token step: fold items of 1 tile, none, the row
        auto out = RunAttention(h, b, qb, true, nullptr, CascadeGrouping::kEveryTile, 0,
                                PrefillPath::kAuto, lead);
        EXPECT_EQ(0, std::memcmp(out.data() + other.q_len * row, cold_out.data() + (N - tail) * row,
                                 tail * row * sizeof(uint16_t)))
            << "tail " << tail << " (fold items " << lead << ") differs from the cold prefill";
      }
    }
  }
  g_super_tiles = 0;
}

// Split form 3 (whole decode rows of <= 8 q-rows: the persistent warp-specialized kernel on
// Hopper, no merge) against the shared-memory split form and the float64 reference: rows of 1 to
// 1100 keys (ends mid-block, mid-tile, on tile boundaries), GQA groups 1, 2, 4 and 8, blocks of
// 16, 32 and 64 (16-token TMA pieces and whole-tile ones), beside a prefill sequence; on the
// default grid and on 3 CTAs, where each consumer runs hundreds of items and its stage and Q
// rings wrap many times; with 16-token pieces both the half-stage ring (the default: a row's last
// tile of <= 32 keys in one half-stage) and whole stages. Works are taken from a counter at run
// time (longest first), so which consumer runs a row differs from run to run: the bits may not.
TEST(Attention, PersistentDecodeFormEqualsSplitFormsBitwise) {
  CASCADE_REQUIRE_GPU();
  bool hopper = false;
  ASSERT_EQ(internal::WgmmaAvailable(&hopper), cudaSuccess);
  bool checked_reference = false;
  for (const Shape sh : {Shape{16, 8, 128, 16}, Shape{32, 8, 128, 32}, Shape{8, 8, 128, 16},
                         Shape{64, 8, 128, 64}, Shape{16, 2, 128, 16}}) {
    std::mt19937 rng(500 + sh.hq + sh.hkv + sh.bs);
    Harness h(sh.hq, sh.hkv, sh.D, sh.bs, 36000 / sh.bs + 200, &rng);
    const std::vector<int> lens = {1,   2,   15,  16,  17,  31,  63,  64,  65,   100, 127,
                                   128, 129, 160, 191, 192, 193, 250, 500, 1000, 1100};
    std::vector<Seq> seqs = {{37, 200, {}}};  // a prefill item beside the decode rows
    for (int i = 0; i < 150; ++i) seqs.push_back(Seq{1, lens[i % lens.size()] + i / 50, {}});
    for (Seq& s : seqs) h.Fill(&s);
    Batch b = MakeBatch(seqs);
    std::vector<float> q = RandomNormal(static_cast<size_t>(b.num_tokens()) * sh.hq * sh.D, &rng);
    auto q_bits = RoundToBf16(&q);
    for (int order : SuperOrders(sh.D, sh.bs)) {
      g_super_tiles = order;
      AttentionPlan plan;
      auto run = [&] {
        return RunAttention(h, b, q_bits, false, &plan, CascadeGrouping::kEveryTile, 0,
                            PrefillPath::kAuto, 1000);
      };
      const int min_tiles = DecodeWsMinTiles();
      SetDecodeWsMinTiles(0);  // form 3 whatever the rows' length
      const auto ws = run();
      ASSERT_EQ(SplitForm(plan, sh.D, sh.hq / sh.hkv), 3) << "every split item a whole row";
      // The output on the default grid, then on 3 CTAs.
      auto run_both_grids = [&] {
        auto full_grid = run();
        internal::SetDecodeWsCtas(3);
        auto three = run();
        internal::SetDecodeWsCtas(0);
        return std::pair{std::move(full_grid), std::move(three)};
      };
      internal::SetDecodeWsCtas(3);
      const auto few = run();
      internal::SetDecodeWsCtas(0);
      // The consumers in the decode-shaped form (one-level order only; the default is the 64-row
      // form), also on 3 CTAs.
      internal::SetDecodeWsN8(true);
      const auto [n8, n8_few] = run_both_grids();
      internal::SetDecodeWsN8(false);
      // 16-token pieces: the consumers' rings as whole 64-key stages (the default is half-stages
      // of 32 keys, a row's last tile of <= 32 keys in one), also on 3 CTAs.
      internal::SetDecodeWsHalfRing(false);
      const auto [whole, whole_few] = run_both_grids();
      internal::SetDecodeWsHalfRing(true);
      // One-level: the same plan (form 3: no merge) on the shared-memory kernel. Super-tiles: only
      // the persistent kernel folds a row's super-tiles in one CTA, so the rows split into
      // super-tile items (no fold items) on the shared-memory kernel and the merge.
      std::vector<uint16_t> smem;
      if (order == 1) {
        internal::SetSplitVariant(2);
        smem = run();
        internal::SetSplitVariant(0);
      } else {
        smem = RunAttention(h, b, q_bits, false, nullptr, CascadeGrouping::kEveryTile, 0,
                            PrefillPath::kAuto, -1);
      }
      SetDecodeWsMinTiles(min_tiles);
      const size_t bytes = ws.size() * sizeof(uint16_t);
      const std::string shape = "hq " + std::to_string(sh.hq) + " hkv " + std::to_string(sh.hkv) +
                                " block " + std::to_string(sh.bs) + " super_tiles " +
                                std::to_string(order);
      EXPECT_EQ(0, std::memcmp(ws.data(), smem.data(), bytes))
          << "form 3 != shared-memory, " << shape;
      EXPECT_EQ(0, std::memcmp(few.data(), smem.data(), bytes)) << "form 3 on 3 CTAs, " << shape;
      EXPECT_EQ(0, std::memcmp(n8.data(), smem.data(), bytes))
          << "form 3, consumers in the decode-shaped form, " << shape;
      EXPECT_EQ(0, std::memcmp(n8_few.data(), smem.data(), bytes))
          << "form 3 on 3 CTAs, consumers in the decode-shaped form, " << shape;
      EXPECT_EQ(0, std::memcmp(whole.data(), smem.data(), bytes))
          << "form 3, whole-stage rings, " << shape;
      EXPECT_EQ(0, std::memcmp(whole_few.data(), smem.data(), bytes))
          << "form 3 on 3 CTAs, whole-stage rings, " << shape;
      if (!checked_reference || order > 1) {
        ExpectClose(ws, Reference(h, seqs, b, q));
        checked_reference = true;
      }
    }
  }
  g_super_tiles = 0;
  if (!hopper) GTEST_SKIP() << "no sm_90a device: form 3 ran on the shared-memory kernel";
}

// Argument checks run before any launch (no GPU needed): a plan whose prefill items hold more
// (row, head) pairs than the prefill CTA, a GQA group past the split kernel's 32 queries, a
// cache whose (block, head, slot) rows overflow the kernels' 32-bit row index, a persistent
// decode plan without its work counter, wide cascade items it cannot run, and the wgmma prefill
// kernel asked for where it cannot run.
TEST(Attention, RejectsPlansAndCachesTheKernelsCannotRun) {
  alignas(16) static uint16_t buf[64];
  int32_t dummy[4] = {0, 0, 0, 0};
  AttentionArgs args;
  args.q = buf;
  args.q_row_stride = 4 * 64;
  args.cache = {buf, buf, 16, 16, 2, 64};
  args.positions = dummy;
  args.block_ids = dummy;
  args.out = buf;
  args.scale = 0.125f;
  args.num_q_heads = 4;
  AttentionPlanView plan;
  plan.num_final = 1;
  plan.final_items = dummy;
  plan.item_rows = dummy;
  plan.max_final_rows = PrefillQueriesPerCta(64) / 2 + 1;  // group 2
  absl::Status st = Attention(args, plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  plan.max_final_rows = 1;
  args.num_q_heads = 2 * 33;  // group 33
  args.q_row_stride = 66 * 64;
  st = Attention(args, plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  args.num_q_heads = 4;
  args.q_row_stride = 4 * 64;
  args.cache.num_blocks = int64_t{1} << 27;  // x 2 heads x 16 slots = 2^32 rows
  st = Attention(args, plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("2^31"), std::string::npos) << st;
  // A plan for the persistent decode kernel (split form 3) without its work counter.
  args.cache.num_blocks = 16;
  AttentionPlanView ws_plan;
  ws_plan.num_split = 1;
  ws_plan.split_items = dummy;
  ws_plan.item_rows = dummy;
  ws_plan.partial_base = dummy;
  ws_plan.max_split_rows = 1;
  ws_plan.split_form = 3;
  float partials[4] = {};
  args.partial_o = partials;
  args.partial_ml = partials;
  st = Attention(args, ws_plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("work counter"), std::string::npos) << st;
  // The two-level fold order on a head_dim its kernels do not run (64 here), and no order at all.
  for (int super_tiles : {4, 0}) {
    AttentionPlanView super_plan = plan;
    super_plan.super_tiles = super_tiles;
    st = Attention(args, super_plan, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("super_tiles"), std::string::npos) << st;
  }
  // Wide cascade items: more than the split items (eager), none of their arrays in graph mode,
  // and (with valid counts) a head_dim their kernel does not serve (64 here).
  AttentionPlanView wide_plan = ws_plan;
  wide_plan.split_form = 1;
  wide_plan.num_wide = 2;
  st = Attention(args, wide_plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("num_wide"), std::string::npos) << st;
  wide_plan.num_wide = -1;
  st = Attention(args, wide_plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  wide_plan.num_wide = 1;
  wide_plan.split_count = dummy;  // graph mode without wide_items / wide_count
  st = Attention(args, wide_plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("graph-mode arrays"), std::string::npos) << st;
  wide_plan.split_count = nullptr;
  st = Attention(args, wide_plan, nullptr);  // InvalidArgument, or the device query's error
  EXPECT_FALSE(st.ok());
  if (st.code() == absl::StatusCode::kInvalidArgument) {
    EXPECT_NE(st.message().find("wide cascade items"), std::string::npos) << st;
  }
  // A wide schedule without its CTAs.
  wide_plan.wide_sched = dummy;
  wide_plan.wide_ctas = 0;
  st = Attention(args, wide_plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("wide_sched"), std::string::npos) << st;
  // The wgmma prefill kernel asked for on a head_dim it does not serve (64 here).
  args.prefill_path = PrefillPath::kWgmma;
  st = Attention(args, plan, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("head_dim 128"), std::string::npos) << st;
}

}  // namespace
}  // namespace cascade::cuda
