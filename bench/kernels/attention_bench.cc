// Kernel benchmark: decode and cascade attention against the bytes floor (K/V bytes that must be
// read / measured device copy bandwidth), shared-prefix decode with cascade on vs off, a
// three-level prefix tree (flat vs single-level grouping vs every-tile cascade), and prefill
// attention in TFLOP/s. Prints one table; see bench/kernels/RESULTS.md.
//   cuda_attention_bench [--quick | --cascade-only | --prefill-only] [--block=16 (tokens per KV
//   block)] [--decode=B,CTX (only the decode rows of that shape, any CTX in [1, 8192], 0: the
//   mixed rows; for a profiler)]
//   [--shared=B (only the shared-prefix rows of batch B, 16 or 64)]
//   [--prefill=N (only the prefill rows of N tokens: 512, 2048, 4096, 8192; for a profiler)]
//   [--super=G (the " super" rows' super-tile size, where the device runs super-tiles; default
//   SuperTilesFor's)] [--wide-ctas=N (the cascade rows' wide kernel on N CTAs: the planner's
//   schedule over N; default one per SM)]
//   [--dw-n8=0|1 (the persistent decode kernel's consumers in the 64-row form, the default, or
//   in the decode-shaped form)] [--dw-half=0|1|2 (that kernel's rings in half-stages of 32 keys,
//   on plain decode steps, the default; 2: on cascade steps' own tiles too; 0: whole 64-key stages;
//   the decode rows tagged " stages" use whole ones)]
//   [--dw-ctas=N (that kernel on N CTAs instead of one per SM: how
//   its rate scales with its consumers)]
//   [--tree=NAME (only the three-level tree's every-tile row of that configuration: default,
//   nopairs, nochains, nofold, ownsmem, lead32, super, ...; for a profiler)]
//   [--shared-row=NAME (only the shared-prefix row at B=64 of that configuration, as --tree)]
//   [--trace=FILE (with --tree, --shared-row or --decode=B,CTX: the wide kernel's per-work
//   timeline of that row's last launch into FILE, the persistent decode kernel's into FILE.dw, for
//   bench/kernels/ws_trace.py (--dw); needs a build configured with -DCASCADE_WS_TRACE=ON)]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernels/check_ok.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/launchers.h"

namespace cascade::cuda {
namespace {

template <typename T>
DeviceBuffer Up(const std::vector<T>& v) {
  auto b = DeviceBuffer::Allocate(std::max<size_t>(1, v.size()) * sizeof(T));
  CHECK_OK(b.status());
  CHECK_OK(CopyToDevice(b->data(), v.data(), v.size() * sizeof(T)));
  return std::move(*b);
}

// Median of `reps` timed runs of fn(rep) (after 3 warm-ups), in milliseconds.
template <typename F>
double TimeMs(F fn, int reps = 20, int calls = 1) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    for (int c = 0; c < calls; ++c) fn(i * calls + c);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

constexpr int kHq = 16, kHkv = 8, kD = 128;  // Qwen3-0.6B attention shape
int g_block = 16;                            // tokens per KV block (--block)

// n bf16 values uniform in [-2, 2) (random data: tensor-core timings on constants run fast).
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    const float f = static_cast<float>(static_cast<int32_t>(rng() >> 8) - (1 << 23)) / (1 << 22);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return v;
}

int g_wide_ctas = 0;  // --wide-ctas=N: the wide cascade kernel's CTAs (0: one per SM)

struct Setup {
  AttentionPlan plan;
  DeviceBuffer q, pos, blocks, fi, si, rows, base, merge, sched, out, po, pl;
  DeviceBuffer ws_work;  // the persistent decode kernel's work counter, [2] zeros
  AttentionArgs args;
  AttentionPlanView view;
};

// Sequences: q_len[i] new tokens at the end of ctx[i] keys, block table tables[i] (block ids
// before `offset` and modulo num_blocks: repeated runs can touch different memory).
void Build(Setup* s, const std::vector<int>& q_len, const std::vector<int>& ctx,
           const std::vector<std::vector<int32_t>>& tables, int64_t block_offset,
           int64_t num_blocks, const KvCacheView& cache, const AttentionConfig& config) {
  std::vector<int32_t> positions, qs{0}, cl, ts{0}, ids;
  for (size_t i = 0; i < ctx.size(); ++i) {
    for (int p = ctx[i] - q_len[i]; p < ctx[i]; ++p) positions.push_back(p);
    qs.push_back(static_cast<int32_t>(positions.size()));
    cl.push_back(ctx[i]);
    for (int32_t b : tables[i])
      ids.push_back(static_cast<int32_t>((block_offset + b) % num_blocks));
    ts.push_back(static_cast<int32_t>(ids.size()));
  }
  AttentionBatch ab{
      positions.data(), static_cast<int>(positions.size()), qs.data(), cl.data(), ts.data(),
      ids.data(),       static_cast<int>(cl.size())};
  CHECK_OK(PlanAttention(config, ab, &s->plan));
  const size_t n = positions.size();
  s->q = Up(RandomBf16(n * kHq * kD, 1234));
  s->pos = Up(positions);
  s->blocks = Up(ids);
  s->fi = Up(s->plan.final_items);
  s->si = Up(s->plan.split_items);
  s->rows = Up(s->plan.item_rows);
  s->base = Up(s->plan.partial_base);
  s->merge = Up(s->plan.merge_list);
  auto out = DeviceBuffer::Allocate(n * kHq * kD * 2);
  auto po = DeviceBuffer::Allocate(std::max(1, s->plan.num_partials) * size_t{kHq} * kD * 4);
  auto pl = DeviceBuffer::Allocate(std::max(1, s->plan.num_partials) * size_t{kHq} * 8);
  CHECK_OK(out.status());
  CHECK_OK(po.status());
  CHECK_OK(pl.status());
  s->out = std::move(*out);
  s->po = std::move(*po);
  s->pl = std::move(*pl);
  s->args = AttentionArgs{s->q.as<Bf16>(),
                          kHq * kD,
                          cache,
                          s->pos.as<int32_t>(),
                          s->blocks.as<int32_t>(),
                          s->out.as<Bf16>(),
                          s->po.as<float>(),
                          s->pl.as<float>(),
                          1.f / std::sqrt(float{kD}),
                          kHq};
  s->view = AttentionPlanView{s->fi.as<int32_t>(),    s->plan.num_final(),   s->si.as<int32_t>(),
                              s->plan.num_split(),    s->rows.as<int32_t>(), s->base.as<int32_t>(),
                              s->merge.as<int32_t>(), s->plan.num_merge(),   s->plan.max_final_rows,
                              s->plan.max_split_rows};
  s->view.split_form = SplitForm(s->plan, kD, kHq / kHkv);
  s->view.super_tiles = s->plan.super_tiles;
  s->view.num_wide = s->plan.num_wide;
  // The planner's wide schedule (AttentionPlan::wide_sched).
  if (!s->plan.wide_sched.empty()) {
    s->sched = Up(s->plan.wide_sched);
    s->view.wide_sched = s->sched.as<int32_t>();
    s->view.wide_ctas = static_cast<int>(s->plan.wide_sched.size()) - 1;
  }
  s->ws_work = Up(std::vector<int32_t>{0, 0});
  s->view.ws_work = s->ws_work.as<int32_t>();
}

// Block tables: the first `shared_blocks` blocks of every sequence are the same blocks (a shared
// prefix), the rest fresh. Returns the tables and the blocks they name.
std::vector<std::vector<int32_t>> PrefixTables(const std::vector<int>& ctx, int shared_blocks,
                                               int64_t* blocks) {
  std::vector<std::vector<int32_t>> tables(ctx.size());
  int32_t next = shared_blocks;
  for (size_t i = 0; i < ctx.size(); ++i) {
    for (int b = 0; b < (ctx[i] + g_block - 1) / g_block; ++b)
      tables[i].push_back(b < shared_blocks ? b : next++);
  }
  *blocks = next;
  return tables;
}

// The per-work timelines (--trace; launchers.h SetWsTrace, SetDwTrace): for the wide kernel and
// for the persistent decode kernel, each room for kTraceWorks works of kTraceSlots stamps, then 4
// stamps a CTA (clock64 and globaltimer at its start and end).
constexpr int kTraceWorks = 1 << 16, kTraceSlots = internal::kTraceSlotsPerWork, kTraceCtas = 1024;
class WsTrace {
 public:
  // Exits with status 2 where the library stamps nothing; stamps nothing until Arm().
  WsTrace() {
    for (DeviceBuffer* buf : {&ws_, &dw_}) {
      auto b = DeviceBuffer::Allocate(kWords * sizeof(uint64_t));
      CHECK_OK(b.status());
      *buf = std::move(*b);
    }
    if (!Set(true) || !Set(false)) {
      std::fprintf(stderr,
                   "--trace: this build stamps no timeline; configure it with "
                   "-DCASCADE_WS_TRACE=ON (bench/kernels/device_ws_trace.sh does)\n");
      std::exit(2);
    }
  }
  // Clears the stamps and starts them, for one launch: a CTA's clock64 pairs are only comparable
  // within one launch (the next may put the CTA on another SM, whose clock differs).
  void Arm() {
    for (DeviceBuffer* buf : {&ws_, &dw_}) {
      CHECK_OK(FillBytes(buf->data(), 0, kWords * sizeof(uint64_t)));
    }
    if (!Set(true)) std::exit(2);
  }
  // Stops the stamps and writes what the armed launch left: the wide kernel's to `path`, the
  // persistent decode kernel's to `path`.dw (where it ran), each as "cta,c0,t0,c1,t1" lines
  // (clock64 and globaltimer ns at the CTA's start and end), then "work,meta,s0..s17"
  // (ws_trace.py reads them; --dw for the second).
  void Write(const std::string& path) {
    if (!Set(false)) std::exit(2);
    WriteOne(ws_, path);
    WriteOne(dw_, path + ".dw");
  }

 private:
  bool Set(bool on) {
    return internal::SetWsTrace(on ? static_cast<uint64_t*>(ws_.data()) : nullptr,
                                on ? kTraceWorks : 0) == cudaSuccess &&
           internal::SetDwTrace(on ? static_cast<uint64_t*>(dw_.data()) : nullptr,
                                on ? kTraceWorks : 0) == cudaSuccess;
  }
  static void WriteOne(const DeviceBuffer& buf, const std::string& path) {
    std::vector<uint64_t> h(kWords);
    CHECK_OK(CopyToHost(h.data(), buf.data(), kWords * sizeof(uint64_t)));
    int ctas = 0, works = 0;
    std::string out;
    char line[256];
    const uint64_t* cta = h.data() + static_cast<size_t>(kTraceWorks) * kTraceSlots;
    for (int c = 0; c < kTraceCtas; ++c, cta += 4) {
      if (cta[0] == 0) continue;
      std::snprintf(
          line, sizeof(line), "cta,%d,%llu,%llu,%llu,%llu\n", c,
          static_cast<unsigned long long>(cta[0]), static_cast<unsigned long long>(cta[1]),
          static_cast<unsigned long long>(cta[2]), static_cast<unsigned long long>(cta[3]));
      out += line;
      ++ctas;
    }
    for (int w = 0; w < kTraceWorks; ++w) {
      const uint64_t* s = h.data() + static_cast<size_t>(w) * kTraceSlots;
      if (s[kTraceSlots - 1] == 0 && s[0] == 0) continue;
      out += "work," + std::to_string(w) + "," + std::to_string(s[kTraceSlots - 1]);  // meta
      for (int i = 0; i < kTraceSlots - 1; ++i) out += "," + std::to_string(s[i]);
      out += "\n";
      ++works;
    }
    if (ctas == 0 && works == 0) return;  // (the kernel did not run)
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "--trace=%s: cannot write it\n", path.c_str());
      std::exit(2);
    }
    std::fputs(out.c_str(), f);
    std::fclose(f);
    std::printf("    trace: %d works on %d CTAs in %s\n", works, ctas, path.c_str());
  }
  static constexpr size_t kWords =
      static_cast<size_t>(kTraceWorks) * kTraceSlots + static_cast<size_t>(kTraceCtas) * 4;
  DeviceBuffer ws_, dw_;
};
WsTrace* g_trace = nullptr;  // where set, TimeAttention traces one launch after its timed ones

// Times the attention of the given batch, rotating over `rot` disjoint block sets.
constexpr int kBackToBack = 10;
double TimeAttention(const std::vector<int>& q_len, const std::vector<int>& ctx,
                     const std::vector<std::vector<int32_t>>& tables, int64_t blocks_per_set,
                     int rot, int64_t num_blocks, const KvCacheView& cache,
                     const AttentionConfig& config, AttentionPlan* plan,
                     PrefillPath prefill_path = PrefillPath::kAuto,
                     double* back_to_back_ms = nullptr) {
  std::vector<Setup> sets(rot);
  for (int r = 0; r < rot; ++r) {
    Build(&sets[r], q_len, ctx, tables, r * blocks_per_set, num_blocks, cache, config);
    sets[r].args.prefill_path = prefill_path;
  }
  *plan = sets[0].plan;
  auto call = [&](int i) { CHECK_OK(Attention(sets[i % rot].args, sets[i % rot].view, nullptr)); };
  // Also per call of kBackToBack issued back to back (rotating the sets): the host's launch work
  // overlaps the previous call's kernels, as in a replayed decode graph.
  if (back_to_back_ms != nullptr) *back_to_back_ms = TimeMs(call, 20, kBackToBack);
  const double ms = TimeMs(call);
  if (g_trace != nullptr) {  // one launch more, the one traced (its stamps copied in Write)
    g_trace->Arm();
    call(0);
  }
  return ms;
}

// Host time of PlanAttention for the batch (median of 51 plans), in microseconds.
double PlanUs(const std::vector<int>& ctx, const std::vector<std::vector<int32_t>>& tables,
              const AttentionConfig& config) {
  std::vector<int32_t> positions, qs{0}, ts{0}, ids;
  for (size_t i = 0; i < ctx.size(); ++i) {
    positions.push_back(ctx[i] - 1);
    qs.push_back(static_cast<int32_t>(i + 1));
    ids.insert(ids.end(), tables[i].begin(), tables[i].end());
    ts.push_back(static_cast<int32_t>(ids.size()));
  }
  AttentionBatch ab{
      positions.data(), static_cast<int>(positions.size()), qs.data(), ctx.data(), ts.data(),
      ids.data(),       static_cast<int>(ctx.size())};
  std::vector<double> us;
  AttentionPlan plan;
  for (int i = 0; i < 51; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(PlanAttention(config, ab, &plan));
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int g_only_batch = 0, g_only_ctx = 0;  // --decode=B,CTX
bool g_dw_half = true;                 // --dw-half
int g_prefill_n = 0;                   // --prefill=N: only the prefill rows of N tokens
constexpr int kPrefillNs[] = {512, 2048, 4096, 8192};  // the prefill rows' lengths
int g_shared_batch = 0;                                // --shared=B
int g_super = 0;  // --super=G: the " super" rows' super-tile size (0: SuperTilesFor's)
// --tree=NAME: only the tree row of that configuration ("every tile" + NAME's suffix: "default",
// "nofold", "ownsmem", ...; for a profiler), nothing else.
std::string g_tree_only;
// --shared-row=NAME: only the shared-prefix row (B=64) of that configuration, as --tree=NAME.
std::string g_shared_only;
std::string g_trace_path;  // --trace=FILE

// --trace for one row: while it lives (and `on`, with --trace given) TimeAttention traces its last
// launch; at its end the timelines go to g_trace_path.
class TraceRow {
 public:
  explicit TraceRow(bool on) {
    if (on && !g_trace_path.empty()) g_trace = &trace_.emplace();
  }
  ~TraceRow() {
    g_trace = nullptr;
    if (trace_) trace_->Write(g_trace_path);
  }
  TraceRow(const TraceRow&) = delete;
  TraceRow& operator=(const TraceRow&) = delete;

 private:
  std::optional<WsTrace> trace_;
};

int Main(bool quick, bool cascade_only, bool prefill_only) {
  auto name = DeviceName(0);
  CHECK_OK(name.status());
  // Copy bandwidth: 1 GiB device-to-device, bytes read + written.
  const size_t copy_bytes = size_t{1} << 30;
  auto src = DeviceBuffer::Allocate(copy_bytes), dst = DeviceBuffer::Allocate(copy_bytes);
  CHECK_OK(src.status());
  CHECK_OK(dst.status());
  CHECK_OK(FillBytes(src->data(), 1, copy_bytes));
  const double copy_ms = TimeMs([&](int) {
    cudaMemcpyAsync(dst->data(), src->data(), copy_bytes, cudaMemcpyDeviceToDevice, nullptr);
  });
  const double bw = 2.0 * copy_bytes / (copy_ms * 1e-3);  // bytes/s
  // KV cache: 4 GiB each for K and V (full run); constant non-zero bf16 except the first 8192
  // tokens' blocks (random, below; decode time hardly depends on the values).
  const int64_t num_blocks = quick ? 16384 : 131072;
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kHkv * g_block * kD;
  auto k = DeviceBuffer::Allocate(cache_elems * 2), v = DeviceBuffer::Allocate(cache_elems * 2);
  CHECK_OK(k.status());
  CHECK_OK(v.status());
  CHECK_OK(FillBytes(k->data(), 0x3c, cache_elems * 2));  // bf16 0x3c3c ~ 0.0115
  CHECK_OK(FillBytes(v->data(), 0x3d, cache_elems * 2));
  // The blocks the prefill cases read (from block 0) hold random values.
  const size_t random_elems = static_cast<size_t>(8192 / g_block) * kHkv * g_block * kD;
  CHECK_OK(CopyToDevice(k->data(), RandomBf16(random_elems, 1).data(), random_elems * 2));
  CHECK_OK(CopyToDevice(v->data(), RandomBf16(random_elems, 2).data(), random_elems * 2));
  KvCacheView cache{k->as<Bf16>(), v->as<Bf16>(), num_blocks, g_block, kHkv, kD};
  const double token_bytes = 2.0 * kHkv * kD * 2;  // K + V bytes per token

  std::printf("device: %s\ncopy bandwidth (read+write): %.0f GB/s\n", name->c_str(), bw / 1e9);
  std::printf("shape: %d q heads, %d kv heads, head_dim %d, block %d, tile %d\n\n", kHq, kHkv, kD,
              g_block, kTileTokens);
  // time_us: one call between two events (its host launch work included); decode rows also
  // b2b_us: per call of kBackToBack issued back to back (the kernels' time, as in a decode graph).
  std::printf("%-34s %9s %10s %9s %8s %9s %9s\n", "case", "time_us", "KV_MB", "GB/s", "%floor",
              "b2b_us", "b2b%floor");
  auto row = [&](const std::string& c, double ms, double bytes, double b2b_ms = 0) {
    std::printf("%-34s %9.1f %10.1f %9.0f %7.0f%%", c.c_str(), ms * 1e3, bytes / 1e6,
                bytes / (ms * 1e-3) / 1e9, 100.0 * (bytes / bw) / (ms * 1e-3));
    if (b2b_ms > 0) {
      std::printf(" %9.1f %8.0f%%", b2b_ms * 1e3, 100.0 * (bytes / bw) / (b2b_ms * 1e-3));
    }
    std::printf("\n");
  };
  AttentionPlan plan;
  AttentionConfig every{kHq, kHkv, kD, g_block, true};
  auto ctas = SplitCtasPerWave(kD, kHkv);
  CHECK_OK(ctas.status());
  every.split_ctas = *ctas;
  auto ws_ctas = PersistentDecodeCtas(kD, kHq / kHkv, g_block);  // as the backend sets it
  CHECK_OK(ws_ctas.status());
  every.ws_ctas = *ws_ctas;
  auto wide_rows = WideCascadeRows(kD, kHq / kHkv, g_block);  // as the backend sets it (eager)
  CHECK_OK(wide_rows.status());
  every.wide_rows = *wide_rows;
  every.wide_ctas = g_wide_ctas;  // the wide schedule's CTAs (0: one per SM)
  // The two-level fold order where the device runs it (rows tagged " super": other bits than
  // the default's one-level order, attention.h).
  auto super_tiles = SuperTilesFor(kD, g_block);
  CHECK_OK(super_tiles.status());
  AttentionConfig supercfg = every;
  supercfg.super_tiles = *super_tiles > 1 && g_super > 0 ? g_super : *super_tiles;
  const bool super = supercfg.super_tiles > 1;
  if (super) std::printf("rows tagged super: super-tiles of %d tiles\n\n", supercfg.super_tiles);
  AttentionConfig nofold = every, whole = every, single = every, flat = every;
  AttentionConfig narrow = every;  // every cascade item on the split kernel (no wide items)
  narrow.wide_rows = 0;
  AttentionConfig ownsplit = every;  // the items that are not wide on the split kernel after them
  ownsplit.wide_all = false;
  // The default, with the split kernel waiting for the wide kernel before it runs its items
  // (internal::SetSplitOverlapsWide(false)), as before they overlapped.
  AttentionConfig serial = every;
  // The rows' own tiles (after the wide items) on the shared-memory split kernel, a CTA an item
  // (SetOwnTilesOnPersistentDecode(false)), as before split form 6; in both orders.
  AttentionConfig ownsmem = every;
  AttentionConfig superownsmem = supercfg;
  // The default without pairs of one-tile wide items (AttentionConfig::wide_pairs).
  AttentionConfig nopairs = every;
  nopairs.wide_pairs = false;
  AttentionConfig nochains = every;  // the system in chunks of wide_rows, contexts' tiles in pairs
  nochains.wide_chains = false;
  nofold.lead_tiles = -1;      // every split item writes a partial per tile (before fold items)
  whole.lead_tiles = 1 << 20;  // a decode row's every tile in one fold item
  // Cascade: fold items of 8 / 16 / 32 tiles from tile 0 (a group's leading run of the shared
  // prefix or system chunk), whatever the planner would pick.
  AttentionConfig lead8 = every, lead16 = every, lead32 = every;
  AttentionConfig smem = every;  // timed on the shared-memory split kernel (variant 2)
  // (the default picks the register form for the cascade cases: SplitForm)
  lead8.lead_tiles = 8;
  lead16.lead_tiles = 16;
  lead32.lead_tiles = 32;
  single.grouping = CascadeGrouping::kLeadingTiles;
  flat.cascade = false;
  auto suffix = [&](const AttentionConfig* c) -> std::string {
    return c == &nofold         ? " nofold"
           : c == &whole        ? " whole"
           : c == &lead8        ? " lead8"
           : c == &lead16       ? " lead16"
           : c == &lead32       ? " lead32"
           : c == &smem         ? " smem"
           : c == &supercfg     ? " super"
           : c == &narrow       ? " narrow"
           : c == &ownsplit     ? " ownsplit"
           : c == &serial       ? " serial"
           : c == &ownsmem      ? " ownsmem"
           : c == &superownsmem ? " super ownsmem"
           : c == &nopairs      ? " nopairs"
           : c == &nochains     ? " nochains"
                                : "";
  };
  // Decode, distinct sequences: without fold items; the default (the plan's split form: where
  // every item is a whole row of DecodeWsMinTiles() tiles or more on average, form 3, the
  // persistent warp-specialized kernel, tagged [ws]; whole rows of fewer, form 2, the
  // shared-memory kernel without the merge, tagged [f2]; else the shared-memory kernel, no tile
  // being shared); the shared-memory kernel forced (split variant 2); whole rows folded on the
  // persistent kernel whatever their length and on the shared-memory kernel. Same bits.
  struct Decode {
    const char* name;
    const AttentionConfig* config;
    int split_variant;          // internal::SetSplitVariant
    int ws_min_tiles;           // SetDecodeWsMinTiles for the row (-1: the default)
    bool whole_stages = false;  // internal::SetDecodeWsHalfRing(false) for the row
  };
  // With super-tiles also the default split form in the two-level order.
  // " stages": the default with the persistent decode kernel's rings in whole 64-key stages
  // (SetDecodeWsHalfRing(false); --dw-half=0 sets it for every row).
  // (Last, after the rows device_short_rows.sh's profiles count launches through.)
  std::vector<Decode> decodes = {{" nofold", &nofold, 0, -1},    {"", &every, 0, -1},
                                 {" smem", &every, 2, -1},       {" whole ws", &whole, 0, 0},
                                 {" whole smem", &whole, 2, -1}, {" stages", &every, 0, -1, true}};
  if (super) decodes.push_back({" super", &supercfg, 0, -1});
  // ctx 145 / 160: the engine benchmark's decode rows (prompt 128, up to 64 generated), items of 3
  // tiles (145: the last one ends mid-block, as most rows' do); 129 / 192: its first and last
  // steps' (3 tiles holding 2 tiles and 1 token / 3 whole tiles: what a partial tile costs);
  // 384: 6 tiles (the persistent decode kernel's default threshold, DecodeWsMinTiles);
  // 0 ("mixed"): contexts uniform in [100, 2048] (std::mt19937(7)), a continuous batch's mix of
  // lengths (the nano-vllm workload's rows span 100-2048 tokens). --decode=B,CTX runs that one
  // row, at any CTX (e.g. 128: two whole tiles, against 129's two and one token).
  std::vector<int> decode_ctxs = {145, 160, 129, 192, 384, 1024, 4096, 0};
  if (g_only_batch > 0) decode_ctxs = {g_only_ctx};
  for (int ctx : decode_ctxs) {
    if (cascade_only || prefill_only || g_shared_batch > 0) break;
    for (int batch : {1, 16, 64, 256}) {
      if (quick && batch > 64) continue;
      if (ctx == 0 && batch < 64) continue;
      if (g_only_batch > 0 && (batch != g_only_batch || ctx != g_only_ctx)) continue;
      std::vector<int> ctxs(batch, ctx);
      if (ctx == 0) {
        std::mt19937 rng(7);
        for (int& c : ctxs) c = 100 + static_cast<int>(rng() % 1949);
      }
      double kv_tokens = 0;
      for (int c : ctxs) kv_tokens += c;
      int64_t blocks = 0;
      const auto tables = PrefixTables(ctxs, 0, &blocks);
      if (blocks * 2 > num_blocks) continue;
      const int rot = std::max<int64_t>(1, std::min<int64_t>(8, num_blocks / blocks));
      for (const Decode& d : decodes) {
        internal::SetSplitVariant(d.split_variant);
        if (d.whole_stages) internal::SetDecodeWsHalfRing(false);
        const int min_tiles = DecodeWsMinTiles();
        if (d.ws_min_tiles >= 0) SetDecodeWsMinTiles(d.ws_min_tiles);
        double b2b = 0;
        double ms = 0;
        {
          const TraceRow trace(d.name[0] == '\0');  // --trace: the default configuration's row
          ms = TimeAttention(std::vector<int>(batch, 1), ctxs, tables, blocks, rot, num_blocks,
                             cache, *d.config, &plan, PrefillPath::kAuto, &b2b);
        }
        const int form = SplitForm(plan, kD, kHq / kHkv);
        SetDecodeWsMinTiles(min_tiles);
        internal::SetSplitVariant(0);
        if (d.whole_stages) internal::SetDecodeWsHalfRing(g_dw_half);
        const char* tag = d.split_variant != 0 ? ""
                          : form == 3          ? " [ws]"
                          : form == 2          ? " [f2]"
                                               : "";
        row("decode B=" + std::to_string(batch) +
                (ctx == 0 ? " ctx=mixed" : " ctx=" + std::to_string(ctx)) + d.name + tag,
            ms, token_bytes * kv_tokens, b2b);
      }
    }
  }
  if (g_only_batch > 0) return 0;
  // Shared prefix: B requests, prefix P shared, own suffix S. Floor counts the prefix once.
  std::printf("\n");
  for (int batch : {16, 64}) {
    if ((cascade_only && batch != 64) || prefill_only || !g_tree_only.empty()) continue;
    if (g_shared_batch > 0 && batch != g_shared_batch) continue;
    const int P = 4096, S = 128;
    const std::vector<int> ctx(batch, P + S);
    int64_t blocks = 0;
    const auto tables = PrefixTables(ctx, P / g_block, &blocks);
    const int rot = std::max<int64_t>(1, std::min<int64_t>(8, num_blocks / blocks));
    int timed = 0;  // configurations timed (--shared-row: one, or none for an unknown name)
    for (const AttentionConfig* c : {&flat, &nofold, &narrow, &ownsplit, &serial, &ownsmem, &every,
                                     &lead8, &lead16, &smem, &supercfg, &superownsmem}) {
      if ((c == &supercfg || c == &superownsmem) && !super) continue;
      if ((c == &narrow || c == &ownsplit || c == &serial || c == &ownsmem || c == &superownsmem) &&
          every.wide_rows == 0) {
        continue;
      }
      if (!g_shared_only.empty() &&
          (c == &flat || suffix(c) != (g_shared_only == "default" ? "" : " " + g_shared_only))) {
        continue;
      }
      ++timed;
      internal::SetSplitVariant(c == &smem ? 2 : 0);
      internal::SetSplitOverlapsWide(c != &serial);
      SetOwnTilesOnPersistentDecode(c != &ownsmem && c != &superownsmem);
      double b2b = 0;
      double ms = 0;
      {
        const TraceRow trace(true);
        ms = TimeAttention(std::vector<int>(batch, 1), ctx, tables, blocks, rot, num_blocks, cache,
                           *c, &plan, PrefillPath::kAuto, &b2b);
      }
      internal::SetSplitOverlapsWide(true);
      SetOwnTilesOnPersistentDecode(true);
      internal::SetSplitVariant(0);
      row("shared P=4096 S=128 B=" + std::to_string(batch) + (c == &flat ? " flat" : " cascade") +
              suffix(c),
          ms, token_bytes * (P + static_cast<double>(batch) * S), b2b);
    }
    if (!g_shared_only.empty() && timed == 0) {
      std::fprintf(
          stderr,
          "--shared-row=%s: no such configuration on this device (default, nofold, "
          "narrow, ownsplit, serial, ownsmem, lead8, lead16, smem, super, super ownsmem)\n",
          g_shared_only.c_str());
      return 2;
    }
  }
  if (g_shared_batch > 0) return 0;
  // Three-level tree: a system chunk of 2048 tokens for all 256 rows, 8 contexts of 1024 for 32
  // rows each, each row's own query of 1..128 tokens (mid-block and mid-tile ends). Floor: every
  // token's K/V once (the system and each context once, each query once).
  if (!prefill_only) {
    constexpr int kSystem = 2048, kContext = 1024, kContexts = 8, kQueries = 32;
    std::vector<int> ctx;
    std::vector<std::vector<int32_t>> tables;
    int32_t next = kSystem / g_block;
    double tokens = kSystem + kContexts * kContext;
    for (int c = 0; c < kContexts; ++c) {
      std::vector<int32_t> context(kSystem / g_block);
      std::iota(context.begin(), context.end(), 0);
      while (static_cast<int>(context.size()) * g_block < kSystem + kContext)
        context.push_back(next++);
      for (int i = 0; i < kQueries; ++i) {
        const int own = 1 + (c * kQueries + i) * 37 % 128;
        ctx.push_back(kSystem + kContext + own);
        tokens += own;
        tables.push_back(context);
        while (static_cast<int>(tables.back().size()) * g_block < ctx.back()) {
          tables.back().push_back(next++);
        }
      }
    }
    const int rot = std::max<int64_t>(1, std::min<int64_t>(8, num_blocks / next));
    std::printf("\n");
    double every_ms = 0, single_ms = 0, super_ms = 0, every_b2b = 0, single_b2b = 0;
    int timed = 0;  // configurations timed (--tree: one, or none for an unknown name)
    for (const AttentionConfig* c :
         {&flat, &single, &nofold, &narrow, &ownsplit, &serial, &ownsmem, &every, &nopairs,
          &nochains, &lead8, &lead16, &lead32, &smem, &supercfg, &superownsmem}) {
      if ((c == &supercfg || c == &superownsmem) && !super) continue;
      if ((c == &narrow || c == &ownsplit || c == &serial || c == &ownsmem || c == &superownsmem ||
           c == &nopairs || c == &nochains) &&
          every.wide_rows == 0) {
        continue;
      }
      if (!g_tree_only.empty() &&
          (c == &flat || c == &single ||
           suffix(c) != (g_tree_only == "default" ? "" : " " + g_tree_only))) {
        continue;
      }
      ++timed;
      internal::SetSplitVariant(c == &smem ? 2 : 0);
      internal::SetSplitOverlapsWide(c != &serial);
      SetOwnTilesOnPersistentDecode(c != &ownsmem && c != &superownsmem);
      double b2b = 0;
      double ms = 0;
      {
        const TraceRow trace(true);
        ms = TimeAttention(std::vector<int>(ctx.size(), 1), ctx, tables, next, rot, num_blocks,
                           cache, *c, &plan, PrefillPath::kAuto, &b2b);
      }
      internal::SetSplitOverlapsWide(true);
      SetOwnTilesOnPersistentDecode(true);
      internal::SetSplitVariant(0);
      const std::string name = c == &flat     ? "flat"
                               : c == &single ? "single-level"
                                              : "every tile" + suffix(c);
      row(std::string("tree 2048+8x1024+q B=256 ") + name, ms, token_bytes * tokens, b2b);
      std::printf(
          "    plan: %d split items (%d wide), %d tile reads, %d shared tiles in %d groups, %.1f "
          "us on the host\n",
          plan.num_split(), plan.num_wide, plan.split_tile_reads, plan.cascade_shared_tiles,
          plan.cascade_groups, PlanUs(ctx, tables, *c));
      if (c == &every) {
        every_ms = ms;
        every_b2b = b2b;
      }
      if (c == &single) {
        single_ms = ms;
        single_b2b = b2b;
      }
      if (c == &supercfg) super_ms = ms;
    }
    if (!g_tree_only.empty()) {
      if (timed > 0) return 0;
      std::fprintf(
          stderr,
          "--tree=%s: no such configuration on this device (default, nopairs, nochains, nofold, "
          "narrow, "
          "ownsplit, serial, ownsmem, lead8, lead16, lead32, smem, super, super ownsmem)\n",
          g_tree_only.c_str());
      return 2;
    }
    std::printf(
        "tree: every tile %.2fx faster than single-level, %.2fx its floor (back to back: %.2fx, "
        "%.2fx)\n",
        single_ms / every_ms, every_ms * 1e-3 / (token_bytes * tokens / bw), single_b2b / every_b2b,
        every_b2b * 1e-3 / (token_bytes * tokens / bw));
    if (super) {
      std::printf("tree: super-tiles %.2fx faster than single-level, %.2fx its floor\n",
                  single_ms / super_ms, super_ms * 1e-3 / (token_bytes * tokens / bw));
    }
  }
  // Prefill: one sequence of N tokens from position 0 (causal), TFLOP/s, on the mma.sync kernel
  // and (Hopper) the wgmma kernels; all give the same bits (cuda_attention_test).
  if (cascade_only) return 0;
  absl::StatusOr<bool> wgmma = WgmmaPrefillAvailable();
  CHECK_OK(wgmma.status());
  std::printf("\nprefill (causal, 1 seq): time_us (TFLOP/s); x = speedup over mma.sync\n");
  // Variants (internal::SetWgmmaPrefillVariant): 2 two warpgroups (v7, one-level order only);
  // warp-specialized with TMA (v8): 3 without, 1 with the ping-pong schedule, 0 the default form
  // TunePrefillForm chose at the top of this table (as a backend does at load); with super-tiles
  // also both v8 forms in the two-level order.
  struct Variant {
    int variant;
    const AttentionConfig* config;
    const char* name;
  };
  std::vector<Variant> variants = {{2, &every, "v7 2wg"},
                                   {3, &every, "v8 ws"},
                                   {1, &every, "v8 ws+pingpong"},
                                   {0, &every, "tuned default"}};
  if (super) {
    variants.push_back({3, &supercfg, "v8 ws super"});
    variants.push_back({1, &supercfg, "v8 pingpong super"});
  }
  if (*wgmma) {
    absl::StatusOr<PrefillFormChoice> form =
        TunePrefillForm(HeadShape{kHq, kHkv, kD}, g_block, 4096, nullptr);
    CHECK_OK(form.status());
    std::printf("%s\n", form->Describe(4096).c_str());
  }
  std::printf("%-16s %18s", "case", "mma.sync");
  for (const Variant& v : variants) std::printf(" %24s", v.name);
  std::printf("\n");
  for (int n : kPrefillNs) {
    if (g_prefill_n > 0 && n != g_prefill_n) continue;
    int64_t blocks = 0;
    const auto tables = PrefixTables({n}, 0, &blocks);
    const double flops = 4.0 * kD * kHq * (static_cast<double>(n) * (n + 1) / 2);
    const double ms = TimeAttention({n}, {n}, tables, blocks, 1, num_blocks, cache, every, &plan,
                                    PrefillPath::kMmaSync);
    std::printf("%-16s %9.1f (%6.1f)", ("prefill N=" + std::to_string(n)).c_str(), ms * 1e3,
                flops / (ms * 1e-3) / 1e12);
    for (const Variant& v : variants) {
      if (!*wgmma) break;
      internal::SetWgmmaPrefillVariant(v.variant);
      const double wg = TimeAttention({n}, {n}, tables, blocks, 1, num_blocks, cache, *v.config,
                                      &plan, PrefillPath::kWgmma);
      std::printf(" %9.1f (%6.1f) %5.2fx", wg * 1e3, flops / (wg * 1e-3) / 1e12, ms / wg);
    }
    internal::SetWgmmaPrefillVariant(0);
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace cascade::cuda

int main(int argc, char** argv) {
  if (cascade::cuda::DeviceCount() == 0) {
    std::printf("no CUDA device; nothing to benchmark\n");
    return 0;
  }
  std::string flag;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--block=", 0) == 0) {
      cascade::cuda::g_block = std::atoi(arg.c_str() + 8);
      if (cascade::cuda::g_block <= 0 || 64 % cascade::cuda::g_block != 0) {
        std::fprintf(stderr, "--block must divide 64 (got %s)\n", arg.c_str() + 8);
        return 2;
      }
    } else if (arg.rfind("--shared=", 0) == 0) {
      cascade::cuda::g_shared_batch = std::atoi(arg.c_str() + 9);
      if (cascade::cuda::g_shared_batch != 16 && cascade::cuda::g_shared_batch != 64) {
        std::fprintf(stderr, "--shared=B: B is 16 or 64\n");
        return 2;
      }
    } else if (arg.rfind("--super=", 0) == 0) {
      cascade::cuda::g_super = std::atoi(arg.c_str() + 8);
      if (cascade::cuda::g_super < 2 || cascade::cuda::g_super > 64) {
        std::fprintf(stderr, "--super=G: G in [2, 64]\n");
        return 2;
      }
    } else if (arg.rfind("--wide-ctas=", 0) == 0) {
      cascade::cuda::g_wide_ctas = std::atoi(arg.c_str() + 12);
      if (cascade::cuda::g_wide_ctas < 1) {
        std::fprintf(stderr, "--wide-ctas=N: N >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--dw-ctas=", 0) == 0) {
      const int ctas = std::atoi(arg.c_str() + 10);
      if (ctas < 1) {
        std::fprintf(stderr, "--dw-ctas=N: N >= 1\n");
        return 2;
      }
      cascade::cuda::internal::SetDecodeWsCtas(ctas);
    } else if (arg.rfind("--dw-n8=", 0) == 0) {
      const std::string v = arg.substr(8);
      if (v != "0" && v != "1") {
        std::fprintf(stderr,
                     "--dw-n8=0|1: 0 the 64-row consumers (default), 1 the decode-shaped\n");
        return 2;
      }
      cascade::cuda::internal::SetDecodeWsN8(v == "1");
    } else if (arg.rfind("--dw-half=", 0) == 0) {
      const std::string v = arg.substr(10);
      if (v != "0" && v != "1" && v != "2") {
        std::fprintf(stderr,
                     "--dw-half=0|1|2: the persistent decode kernel's rings in half-stages of 32 "
                     "keys on plain decode steps (1, default), on cascade steps too (2), or whole "
                     "64-key stages (0)\n");
        return 2;
      }
      cascade::cuda::g_dw_half = v != "0";
      cascade::cuda::internal::SetDecodeWsHalfRing(cascade::cuda::g_dw_half);
      cascade::cuda::internal::SetDecodeWsHalfRingOnCascade(v == "2");
    } else if (arg.rfind("--trace=", 0) == 0) {
      cascade::cuda::g_trace_path = arg.substr(8);
    } else if (arg.rfind("--shared-row=", 0) == 0) {
      cascade::cuda::g_shared_only = arg.substr(13);
      cascade::cuda::g_shared_batch = 64;
    } else if (arg.rfind("--tree=", 0) == 0) {
      cascade::cuda::g_tree_only = arg.substr(7);
      flag = "--cascade-only";
    } else if (arg.rfind("--prefill=", 0) == 0) {
      cascade::cuda::g_prefill_n = std::atoi(arg.c_str() + 10);
      if (std::find(std::begin(cascade::cuda::kPrefillNs), std::end(cascade::cuda::kPrefillNs),
                    cascade::cuda::g_prefill_n) == std::end(cascade::cuda::kPrefillNs)) {
        std::fprintf(stderr, "--prefill=N: N is 512, 2048, 4096 or 8192\n");
        return 2;
      }
      flag = "--prefill-only";
    } else if (arg.rfind("--decode=", 0) == 0) {
      if (std::sscanf(arg.c_str() + 9, "%d,%d", &cascade::cuda::g_only_batch,
                      &cascade::cuda::g_only_ctx) != 2 ||
          (cascade::cuda::g_only_batch != 1 && cascade::cuda::g_only_batch != 16 &&
           cascade::cuda::g_only_batch != 64 && cascade::cuda::g_only_batch != 256) ||
          cascade::cuda::g_only_ctx < 0 || cascade::cuda::g_only_ctx > 8192 ||
          (cascade::cuda::g_only_ctx == 0 && cascade::cuda::g_only_batch < 64)) {
        std::fprintf(stderr,
                     "--decode=B,CTX: B in 1, 16, 64, 256; CTX a context length in [1, 8192] "
                     "(the default rows: 129, 145, 160, 192, 384, 1024, 4096) or 0 (mixed "
                     "lengths: B >= 64)\n");
        return 2;
      }
    } else {
      flag = arg;
    }
  }
  if (!cascade::cuda::g_trace_path.empty() && cascade::cuda::g_tree_only.empty() &&
      cascade::cuda::g_shared_only.empty() && cascade::cuda::g_only_batch == 0) {
    std::fprintf(stderr,
                 "--trace=FILE traces one tree, shared-prefix or decode row: give --tree=NAME, "
                 "--shared-row=NAME or --decode=B,CTX too\n");
    return 2;
  }
  return cascade::cuda::Main(flag == "--quick", flag == "--cascade-only", flag == "--prefill-only");
}
