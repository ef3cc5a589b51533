// The worker's KV cache sizing from its flags: --kv_blocks wins, --kv_cache_bytes is honoured by
// both backends (f32 K/V on the CPU, bf16 on CUDA), and without either the CPU takes 256 MiB
// while CUDA is left to size itself from --kv_cache_fraction (0 blocks); negative sizes are
// refused at start, not read as the default.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "gpu_worker/engine/engine.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/service/worker_server.h"
#include "tests/backend_cpu/test_util.h"

namespace cascade::worker {
namespace {

// The WorkerConfig one flag ("--name=value") parses into; nullopt where the parser refuses it.
std::optional<WorkerConfig> ParseOneFlag(const char* flag) {
  WorkerConfig parsed;
  common::FlagSet flags("cascade-worker", "test");
  RegisterWorkerFlags(&flags, &parsed);
  const char* argv[] = {"cascade-worker", flag};
  if (common::ParseFlags(flags, 2, argv).has_value()) return std::nullopt;
  return parsed;
}

model::ModelConfig Qwen3Small() {
  model::ModelConfig m;
  m.num_hidden_layers = 28;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  return m;
}

// The tiny model with a small vocabulary: what the CPU backend loads quickly for flag checks.
std::unique_ptr<model::Model> SmallTiny() {
  return cpu::testing_util::MakeModel(cpu::testing_util::SmallVocab("tiny"), 3);
}

// A string flag with a fixed set of values: each of `bad` in `field` makes the CPU backend's
// MakeBackend refuse with INVALID_ARGUMENT saying "--<flag>='<bad>': must be <choices>".
void ExpectValuesRefused(const model::Model& model, WorkerConfig c,
                         std::string WorkerConfig::*field, const std::string& flag,
                         std::initializer_list<const char*> bad, const std::string& choices) {
  for (const char* v : bad) {
    c.*field = v;
    absl::StatusOr<std::unique_ptr<engine::Backend>> b = MakeBackend("cpu", model, c);
    ASSERT_FALSE(b.ok()) << v;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("--" + flag + "='" + v + "': must be " + choices),
              std::string::npos)
        << b.status();
  }
}

// A numeric engine flag with a range: CheckEngineFlags accepts each of `good` in `field` and
// refuses each of `bad` with INVALID_ARGUMENT saying "--<flag>=<bad>: <must>".
template <class T>
void ExpectRangeChecked(T WorkerConfig::*field, const std::string& flag,
                        std::initializer_list<T> good, std::initializer_list<T> bad,
                        const std::string& must) {
  WorkerConfig c;
  for (T v : good) {
    c.*field = v;
    EXPECT_TRUE(CheckEngineFlags(c).ok()) << flag << "=" << v;
  }
  for (T v : bad) {
    c.*field = v;
    const absl::Status s = CheckEngineFlags(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag << "=" << v;
    EXPECT_NE(s.message().find("--" + flag + "=" + std::to_string(v) + ": " + must),
              std::string::npos)
        << s;
  }
}

// The CUDA backend's L2 weight prefetch is used where a layer's prefetched weights fit the L2:
// qwen3-0.6b (23 MB a layer) on a 50 MB L2 (H100 / H200), not llama-3.2-1b (109 MB) nor
// qwen3-8b (335 MB), and not qwen3-0.6b on a 16 MB L2.
TEST(WorkerConfigTest, L2PrefetchOnlyWhereALayerFitsTheL2) {
  auto fits = [](const char* preset, int64_t l2) {
    const model::ModelConfig c = model::PresetConfig(preset);
    return cuda::PrefetchFitsL2(c.hidden_size, c.num_attention_heads * c.head_dim,
                                c.num_key_value_heads * c.head_dim, c.intermediate_size, l2);
  };
  constexpr int64_t kHopperL2 = int64_t{50} << 20;
  EXPECT_TRUE(fits("qwen3-0.6b", kHopperL2));
  EXPECT_TRUE(fits("tiny", kHopperL2));
  EXPECT_FALSE(fits("llama-3.2-1b", kHopperL2));
  EXPECT_FALSE(fits("qwen3-8b", kHopperL2));
  EXPECT_FALSE(fits("qwen3-0.6b", int64_t{16} << 20));
  // Exactly at the boundary: qwen3-0.6b's 2 x 1024 x (2048 + 3 x 3072) bytes.
  EXPECT_TRUE(fits("qwen3-0.6b", int64_t{2} * 1024 * (2048 + 3 * 3072)));
  EXPECT_FALSE(fits("qwen3-0.6b", int64_t{2} * 1024 * (2048 + 3 * 3072) - 1));
}

// The split rule's slices per projection (o_proj / down_proj / qkv / gate_up / LM head): the
// residual-width shapes in at least two, the narrow ones further while S n <= 4096.
TEST(WorkerConfigTest, SplitRuleCutsTheResidualProjections) {
  struct Slices {
    int o, down, qkv, gate_up, head;
  };
  auto slices = [](const char* preset, int residual_min) {
    const model::ModelConfig c = model::PresetConfig(preset);
    const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
    const int64_t kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
    auto rule = [&](int64_t n, int64_t k) {
      return cuda::SplitRuleSlices(n, k, cuda::kDefaultSplitColumns, h, residual_min);
    };
    return Slices{rule(h, q), rule(h, inter), rule(q + 2 * kv, h), rule(2 * inter, h),
                  rule(c.vocab_size, h)};
  };
  auto expect = [&](const char* preset, int residual_min, Slices want) {
    SCOPED_TRACE(absl::StrCat(preset, " residual_min ", residual_min));
    const Slices got = slices(preset, residual_min);
    EXPECT_EQ(got.o, want.o);
    EXPECT_EQ(got.down, want.down);
    EXPECT_EQ(got.qkv, want.qkv);
    EXPECT_EQ(got.gate_up, want.gate_up);
    EXPECT_EQ(got.head, want.head);
  };
  const int d = cuda::kDefaultSplitResidualMin;
  expect("qwen3-0.6b", d, {4, 4, 1, 1, 1});
  expect("llama-3.2-1b", d, {2, 2, 1, 1, 1});
  expect("qwen3-8b", d, {2, 2, 1, 1, 1});
  expect("qwen3-8b", 1, {1, 1, 1, 1, 1});  // the rule before session 45
  expect("qwen3-8b", 4, {4, 4, 1, 1, 1});
  expect("qwen3-0.6b", 1, {4, 4, 1, 1, 1});
  // A k that one more slice would leave off a multiple of 64 stops the doubling.
  EXPECT_EQ(cuda::SplitRuleSlices(4096, 384, 4096, 4096, 8), 2);
  EXPECT_EQ(cuda::SplitRuleSlices(512, 4096, 4096, 0, 2), 8);  // narrow: by columns
}

TEST(WorkerConfigTest, KvBlocksFlagWinsOnEveryBackend) {
  WorkerConfig c;
  c.kv_blocks = 123;
  c.kv_cache_bytes = int64_t{1} << 40;
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cpu"), 123);
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cuda"), 123);
}

TEST(WorkerConfigTest, KvCacheBytesIsHonouredByCuda) {
  // 28 layers x 8 kv heads x 128 dims x (K, V) = 57344 elements per token; bf16 on CUDA:
  // 114688 bytes per token, 1835008 per 16-token block.
  WorkerConfig c;
  c.block_size = 16;
  c.kv_cache_bytes = int64_t{40} << 30;
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cuda"), (int64_t{40} << 30) / 1835008);
  // The CPU keeps f32: half the blocks for the same budget.
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cpu"), (int64_t{40} << 30) / (2 * 1835008));
  c.block_size = 64;
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cuda"), (int64_t{40} << 30) / (4 * 1835008));
  // A budget below one block still gives one block.
  c.kv_cache_bytes = 1;
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cuda"), 1);
}

TEST(WorkerConfigTest, DefaultsCpu256MiBAndCudaSizesItself) {
  WorkerConfig c;
  ASSERT_EQ(c.kv_cache_bytes, 0);
  ASSERT_EQ(c.kv_blocks, 0);
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cpu"), (int64_t{256} << 20) / (2 * 1835008));
  EXPECT_EQ(*KvCacheBlocks(c, Qwen3Small(), "cuda"), 0);
}

TEST(WorkerConfigTest, NegativeSizesAreRefusedWithWhatToDo) {
  WorkerConfig c;
  c.kv_cache_bytes = -1;
  for (const char* kind : {"cpu", "cuda"}) {
    absl::StatusOr<int64_t> blocks = KvCacheBlocks(c, Qwen3Small(), kind);
    EXPECT_EQ(blocks.status().code(), absl::StatusCode::kInvalidArgument) << kind;
    EXPECT_NE(blocks.status().message().find("must be >= 0"), std::string::npos) << blocks.status();
  }
  c.kv_cache_bytes = 0;
  c.kv_blocks = -5;  // not silently "the default"
  EXPECT_EQ(KvCacheBlocks(c, Qwen3Small(), "cpu").status().code(),
            absl::StatusCode::kInvalidArgument);
  c.kv_blocks = -5;
  c.kv_cache_bytes = int64_t{1} << 30;  // a valid budget does not excuse a bad block count
  EXPECT_EQ(KvCacheBlocks(c, Qwen3Small(), "cuda").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkerConfigTest, KvCacheBytesFlagParses) {
  WorkerConfig c;
  common::FlagSet flags("cascade-worker", "test");
  RegisterWorkerFlags(&flags, &c);
  const char* argv[] = {"cascade-worker", "--kv_cache_bytes=4096", "--kv_blocks=0"};
  ASSERT_FALSE(common::ParseFlags(flags, 3, argv).has_value());
  EXPECT_EQ(c.kv_cache_bytes, 4096);
}

// --decode_gemm_max_m outside [0, 64] (and --gemm_tune_min_hidden or --gemm_prefill_min_m below
// 0, --persistent_decode_min_tiles below -1) is refused with the
// flag, the value and the range, on every backend (it is a CUDA setting, but a bad value is a
// mistake wherever it is given); the bounds themselves load.
TEST(WorkerConfigTest, CudaGemmSettingsOutsideTheirRangeAreRefused) {
  std::unique_ptr<model::Model> model = SmallTiny();
  ASSERT_NE(model, nullptr);
  WorkerConfig c;
  c.kv_blocks = 16;
  // c is refused INVALID_ARGUMENT with a message holding `why`.
  auto expect_refused = [&](const std::string& why) {
    auto b = MakeBackend("cpu", *model, c);
    ASSERT_FALSE(b.ok()) << why;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find(why), std::string::npos) << b.status();
  };
  for (int bad : {-1, 65, 1 << 30}) {
    c.decode_gemm_max_m = bad;
    expect_refused("--decode_gemm_max_m=" + std::to_string(bad) + ": must be in [0, 64]");
  }
  for (int good : {0, 64}) {
    c.decode_gemm_max_m = good;
    EXPECT_TRUE(MakeBackend("cpu", *model, c).ok()) << good;
  }
  // --persistent_decode_min_tiles below -1 the same way; -1 (never) and 0 (any length) load.
  c.persistent_decode_min_tiles = -2;
  expect_refused("--persistent_decode_min_tiles=-2: must be >= -1");
  for (int good : {-1, 0}) {
    c.persistent_decode_min_tiles = good;
    EXPECT_TRUE(MakeBackend("cpu", *model, c).ok()) << good;
  }
  c.persistent_decode_min_tiles = cuda::kDefaultPersistentDecodeMinTiles;
  // --gemm_tune_min_hidden below 0 the same way; 0 (never tuned by default) loads.
  c.gemm_tune_min_hidden = -1;
  expect_refused("--gemm_tune_min_hidden=-1: must be >= 0");
  c.gemm_tune_min_hidden = 0;
  EXPECT_TRUE(MakeBackend("cpu", *model, c).ok());
  // --gemm_prefill_min_m below 0 the same way; 0 (off) loads.
  c.gemm_prefill_min_m = -5;
  expect_refused("--gemm_prefill_min_m=-5: must be >= 0");
  c.gemm_prefill_min_m = 0;
  EXPECT_TRUE(MakeBackend("cpu", *model, c).ok());
}

// --attention_fold_order: one_level or two_level, anything else refused on every backend; the
// CPU backend, which folds in one level only, refuses two_level rather than serving other bits
// than the deployment asked for; the flag parses into the config.
TEST(WorkerConfigTest, AttentionFoldOrderIsOneOfTwoAndTwoLevelIsRefusedOnTheCpu) {
  std::unique_ptr<model::Model> model = SmallTiny();
  ASSERT_NE(model, nullptr);
  WorkerConfig c;
  c.kv_blocks = 16;
  EXPECT_EQ(c.attention_fold_order, "one_level");
  EXPECT_TRUE(MakeBackend("cpu", *model, c).ok());
  ExpectValuesRefused(*model, c, &WorkerConfig::attention_fold_order, "attention_fold_order",
                      {"", "two-level", "super", "ONE_LEVEL"}, "one_level or two_level");
  c.attention_fold_order = "two_level";
  absl::StatusOr<std::unique_ptr<engine::Backend>> cpu = MakeBackend("cpu", *model, c);
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.status().message().find("the CPU backend folds attention in one level only"),
            std::string::npos)
      << cpu.status();

  const std::optional<WorkerConfig> parsed = ParseOneFlag("--attention_fold_order=two_level");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->attention_fold_order, "two_level");
}

// --gemm_k_split: rule (the default) or off, anything else refused on every backend (the CPU
// backend accepts both: its arithmetic is its own); the flag parses into the config.
TEST(WorkerConfigTest, GemmKSplitIsRuleOrOff) {
  std::unique_ptr<model::Model> model = SmallTiny();
  ASSERT_NE(model, nullptr);
  WorkerConfig c;
  c.kv_blocks = 16;
  EXPECT_EQ(c.gemm_k_split, "rule");
  EXPECT_TRUE(MakeBackend("cpu", *model, c).ok());
  c.gemm_k_split = "off";
  EXPECT_TRUE(MakeBackend("cpu", *model, c).ok());
  ExpectValuesRefused(*model, c, &WorkerConfig::gemm_k_split, "gemm_k_split",
                      {"", "on", "RULE", "4"}, "rule or off");
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--gemm_k_split=off");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->gemm_k_split, "off");
}

// --max_pinned_kv_fraction: [0, 1] (0 no pins, 1 no cap), anything else (NaN too) refused with
// the flag, the value and the range; the default caps pins at half the cache; the flag parses.
TEST(WorkerConfigTest, PinnedKvFractionOutsideZeroToOneIsRefused) {
  WorkerConfig c;
  EXPECT_EQ(c.max_pinned_kv_fraction, 0.5);
  EXPECT_TRUE(CheckEngineFlags(c).ok());
  for (double good : {0.0, 1.0}) {
    c.max_pinned_kv_fraction = good;
    EXPECT_TRUE(CheckEngineFlags(c).ok()) << good;
  }
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    c.max_pinned_kv_fraction = bad;
    const absl::Status s = CheckEngineFlags(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--max_pinned_kv_fraction="), std::string::npos) << s;
    EXPECT_NE(s.message().find("must be in [0, 1]"), std::string::npos) << s;
  }
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--max_pinned_kv_fraction=0.25");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->max_pinned_kv_fraction, 0.25);
}

// --max_chunks_per_block: [1, 1024], default 8 (the engine's), refused outside with the flag and
// the range; the flag parses.
TEST(WorkerConfigTest, ChunksPerBlockOutsideOneTo1024IsRefused) {
  WorkerConfig c;
  EXPECT_EQ(c.max_chunks_per_block, engine::EngineOptions{}.max_chunks_per_block);
  for (int good : {1, 8, 1024}) {
    c.max_chunks_per_block = good;
    EXPECT_TRUE(CheckEngineFlags(c).ok()) << good;
  }
  for (int bad : {0, -3, 1025}) {
    c.max_chunks_per_block = bad;
    const absl::Status s = CheckEngineFlags(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--max_chunks_per_block="), std::string::npos) << s;
    EXPECT_NE(s.message().find("[1, 1024]"), std::string::npos) << s;
  }
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--max_chunks_per_block=3");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->max_chunks_per_block, 3);
}

// --overlap_min_rows: >= 0 (0: every step overlapped) or -1 (auto, the default), refused below
// with the flag and the value; the flag parses.
TEST(WorkerConfigTest, OverlapMinRowsBelowMinusOneIsRefused) {
  WorkerConfig c;
  EXPECT_EQ(c.overlap_min_rows, -1);
  for (int good : {-1, 0, 32, 1 << 20}) {
    c.overlap_min_rows = good;
    EXPECT_TRUE(CheckEngineFlags(c).ok()) << good;
  }
  for (int bad : {-2, -1000}) {
    c.overlap_min_rows = bad;
    const absl::Status s = CheckEngineFlags(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--overlap_min_rows=" + std::to_string(bad) + ": must be >= 0"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("-1 (auto"), std::string::npos) << s;
  }
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--overlap_min_rows=0");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->overlap_min_rows, 0);
}

// -1 (auto) overlaps every step where the CUDA backend speculates its launches (the next step
// enqueued behind the one in flight: H200, session 49, 1-5% faster at 1-16 rows) and from 32 rows
// otherwise (the overlap alone lost below that: session 36); a value given is kept on either.
TEST(WorkerConfigTest, OverlapMinRowsAutoOverlapsEveryStepWhereLaunchesAreSpeculated) {
  WorkerConfig c;
  EXPECT_EQ(EffectiveOverlapMinRows(c, "cuda"), 0);
  EXPECT_EQ(EffectiveOverlapMinRows(c, "cpu"), 32);
  c.speculative_launch = false;
  EXPECT_EQ(EffectiveOverlapMinRows(c, "cuda"), 32);
  for (bool spec : {false, true}) {
    c.speculative_launch = spec;
    for (int given : {0, 8, 32}) {
      c.overlap_min_rows = given;
      EXPECT_EQ(EffectiveOverlapMinRows(c, "cuda"), given);
      EXPECT_EQ(EffectiveOverlapMinRows(c, "cpu"), given);
    }
  }
}

// --max_prompt_logprob_rows: in [0, 16384] (0: the backend's default), refused outside with the
// flag, the value and the range; the flag parses.
TEST(WorkerConfigTest, MaxPromptLogprobRowsOutsideItsRangeIsRefused) {
  EXPECT_EQ(WorkerConfig{}.max_prompt_logprob_rows, 0);
  ExpectRangeChecked(&WorkerConfig::max_prompt_logprob_rows, "max_prompt_logprob_rows",
                     {0, 1, 256, 16384}, {-1, 16385, 1 << 20}, "must be in [0, 16384]");
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--max_prompt_logprob_rows=64");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->max_prompt_logprob_rows, 64);
}

// --host_kv_offload_ahead: -1 (auto, the default), 0 (off) or a block count; below -1 refused
// with the flag, the value and what it takes; the flag parses.
TEST(WorkerConfigTest, HostKvOffloadAheadBelowMinusOneIsRefused) {
  EXPECT_EQ(WorkerConfig{}.host_kv_offload_ahead, -1);
  ExpectRangeChecked<int64_t>(&WorkerConfig::host_kv_offload_ahead, "host_kv_offload_ahead",
                              {-1, 0, 1, int64_t{1} << 40}, {-2, int64_t{-1} << 40},
                              "must be >= 0 blocks (0: off), or -1 (auto)");
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--host_kv_offload_ahead=512");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host_kv_offload_ahead, 512);
}

// --host_kv_offload_min_uses: 0 (every block, the default) up to 1000000; outside refused with
// the flag, the value and the range; the flag parses.
TEST(WorkerConfigTest, HostKvOffloadMinUsesOutsideItsRangeIsRefused) {
  EXPECT_EQ(WorkerConfig{}.host_kv_offload_min_uses, 0);
  ExpectRangeChecked<int64_t>(&WorkerConfig::host_kv_offload_min_uses, "host_kv_offload_min_uses",
                              {0, 1, 1000000}, {-1, 1000001, int64_t{1} << 40},
                              "must be in [0, 1000000]");
  const std::optional<WorkerConfig> parsed = ParseOneFlag("--host_kv_offload_min_uses=1");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->host_kv_offload_min_uses, 1);
}

// The worker's decode schedule by default: overlapped (from a row count picked by backend),
// speculated launches and decode graphs captured at load on (CUDA); each turns off by its flag,
// and a flag of the others leaves them as they are.
TEST(WorkerConfigTest, ScheduleDefaultsAreOnAndEachTurnsOffByItsFlag) {
  const WorkerConfig defaults;
  EXPECT_TRUE(defaults.overlap_schedule);
  EXPECT_EQ(defaults.overlap_min_rows, -1);
  EXPECT_TRUE(defaults.speculative_launch);
  EXPECT_TRUE(defaults.capture_graphs_at_load);
  EXPECT_TRUE(defaults.defer_eager_steps);
  const std::optional<WorkerConfig> no_defer = ParseOneFlag("--defer_eager_steps=false");
  ASSERT_TRUE(no_defer.has_value());
  EXPECT_FALSE(no_defer->defer_eager_steps);
  EXPECT_TRUE(no_defer->speculative_launch);
  const std::optional<WorkerConfig> no_spec = ParseOneFlag("--speculative_launch=false");
  ASSERT_TRUE(no_spec.has_value());
  EXPECT_FALSE(no_spec->speculative_launch);
  EXPECT_TRUE(no_spec->overlap_schedule);
  EXPECT_TRUE(no_spec->defer_eager_steps);
  const std::optional<WorkerConfig> no_overlap = ParseOneFlag("--overlap_schedule=false");
  ASSERT_TRUE(no_overlap.has_value());
  EXPECT_FALSE(no_overlap->overlap_schedule);
  EXPECT_TRUE(no_overlap->speculative_launch);
  const std::optional<WorkerConfig> lazy = ParseOneFlag("--capture_graphs_at_load=false");
  ASSERT_TRUE(lazy.has_value());
  EXPECT_FALSE(lazy->capture_graphs_at_load);
}

}  // namespace
}  // namespace cascade::worker
