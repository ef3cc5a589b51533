// Engine-level throughput, no gRPC: decode tokens/s by batch size, prefill tokens/s for long
// prompts, and the shared-prefix workload (one long cached system chunk, N concurrent queries)
// with cascade attention on and off in the same run. Prints markdown tables; numbers go to
// bench/engine/RESULTS.md.
//
//   engine_bench [--backend=cuda|cpu|null] [--preset=tiny|qwen3-0.6b|...] [--model_dir=DIR]
//                [--batches=1,8,32,64,128,256] [--prompt_len=128] [--decode_len=64]
//                [--prefill_lens=512,2048,8192] [--prefill_tokens=8192]
//                [--shared_len=2048] [--queries=16,64,256] [--query_len=32] [--shared_gen=64]
//                [--sections=decode,prefill,shared,tree,nanovllm,score] [--num_blocks=N] [--seed=0]
//                [--score_logprobs=5]
//                [--tree_contexts=8] [--tree_context_len=1024] [--tree_queries=32]
//                [--variants=default,eager,heuristic] [--temperature=T]
//                [--samplers=greedy,temperature,topk,topp,minp,penalty,freqpres,logprobs,all,bias]
//                [--nano_seqs=256] [--nano_min_len=100] [--nano_max_len=1024] [--tune_log=1]
//                [--rounds=1] [--decode_warm=full|bucket]
//
// Decode variants (CUDA backend), run one after another in the same process so they compare
// on the same device state: "default" (deterministic: pinned GEMM algorithms, decode CUDA
// graphs captured at load, verified small-m and decode GEMMs), "eager" (no decode graphs),
// "lazygraphs" (each decode graph captured by the first step that needs it, as before session 47),
// "spec" / "specN" (the overlapped schedule, from N rows, with speculated launches: the next
// decode step enqueued behind the one in flight, CudaBackendOptions::speculative_launch, on by
// default since session 48, so the same as "overlapN"), "nospec" (without them: overlapN+nospec),
// "nodefer" (eager steps run whole inside the launch: CudaBackendOptions::defer_eager_steps off),
// "cublas" (no small-m or decode GEMMs: the pinned cuBLASLt algorithm at every m), "nodecodegemm"
// (no DecodeGemm: SmallGemm and cuBLASLt as before it; the same bits), "coldchoice" (that choice
// timed one launch at a time on flushed L2 for every bucket, as before session 36), "smallchoice"
// (SmallGemm among that choice's candidates, as before session 42; the same bits), "nodgemmhead"
// (the LM head out of that choice at 17-64 rows, the pinned kernel as before session 55:
// CudaBackendOptions::decode_gemm_lm_head off; "dgemmhead" on; the same bits), "nopdl" (kernels
// launched without programmatic dependent launch), "heuristic" (cuBLAS heuristics per m, no
// pinning, graphs on: the cost of determinism is default vs heuristic), "overlap" (default with the
// engine's overlapped schedule: step n+1 scheduled and built while step n runs), "overlapN"
// (overlapped after steps of N rows or more: EngineOptions::overlap_min_rows, the worker's default
// 32), "splitk" (the batch-invariant split-K rule of gemm.h: o_proj / down_proj of narrow models in
// k slices; the default since session 42), "nosplit" (no split-K: the default from run 8 to session
// 41), "split2" / "split4" / "split8" (that many k slices for every GEMM whose k allows it, the LM
// head excepted), "colsN" (the rule with S n <= N output columns instead of 4096:
// CudaBackendOptions::split_columns; other bits), "resminN" (o_proj / down_proj in at least N
// slices under the rule instead of 2: CudaBackendOptions::split_residual_min; resmin1 is the rule
// before session 45, which left qwen3-8b's unsplit; other bits), "refN" (the pinned GEMM algorithms
// picked by cuBLASLt's heuristic at m = N instead of 256, e.g. ref1024), "block32" / "block64" (KV
// blocks of 32 / 64 tokens instead of 16: coarser prefix sharing, fewer and larger copies for the
// Hopper prefill kernel), "nofold" (no attention fold items: every split item writes one partial
// per tile, as before fold items; the same bits), "nofinish" (fold items never write a row's output
// themselves: every decode row goes through the merge; the same bits), "untuned" (the pinned GEMM
// algorithms at every decode graph bucket, no tuning: the default below hidden 2048), "tuned" /
// "tuneN" (GEMMs tuned at the decode buckets up to m = 64 / N, gemm.h; the same bits), "earlyN"
// (DecodeGemm CTAs copy N chunks of weights before waiting for the previous kernel instead of 2;
// early0: none; the same bits), "nofusesilu" (SiluMul as its own kernel after gate_up's DecodeGemm;
// the same bits), "splitprefetch" / "splitsmem" / "splitreg" (every plan's split attention items on
// that form of the split kernel, launchers.h SetSplitVariant, instead of the plan's choice; the
// same bits), "ws" / "nows" (plans of whole decode rows on the persistent decode kernel at any row
// length / never: attention.h SetDecodeWsMinTiles; the same bits), "single" (cascade groups only
// the leading tiles common to a whole group: CudaBackendOptions::attention_single_level; the same
// bits), "noprefillgemm" (prefill-sized GEMMs on the pinned algorithm instead of the one chosen at
// load, CudaBackendOptions::gemm_prefill_min_m = 0; the same bits), "prefillgemmN" (that choice
// from N rows up instead of 1024; the same bits), "super" (the two-level fold order where the
// device runs it, CudaBackendOptions::attention_super_tiles = 0: other bits than the default),
// "noprefetch" (no L2 prefetch of the weights: CudaBackendOptions::prefetch_weights_max_rows = 0;
// the same bits), "prefetchall" (prefetched at every decode batch, not only up to 16 rows),
// "prefetchrowsN" (steps of up to N rows prefetch: CudaBackendOptions::prefetch_weights_max_rows),
// "prefetchearly" (a layer's o_proj / gate_up / down_proj weights prefetched during its attention
// instead of after it), "prefetchctasN" (N CTAs issue each prefetch instead of 16), "ownsmem" (a
// wide cascade step's own tiles on the shared-memory split kernel instead of the persistent decode
// kernel: attention.h SetOwnTilesOnPersistentDecode(false); the same bits), "dwn8" (the persistent
// decode kernel's consumers in the decode-shaped form: launchers.h SetDecodeWsN8; the same bits),
// "stages" (that kernel's rings in whole 64-key stages instead of half-stages of 32 keys:
// launchers.h SetDecodeWsHalfRing(false); the same bits), "halfcascade" (the half-stage ring on
// cascade steps' own tiles too: SetDecodeWsHalfRingOnCascade; the same bits), "sampletwice" (the
// device sampler launched twice on the same logits, for a timeline of its second launch:
// SetSampleTwiceForTiming; the same tokens, a longer step),
// "wsfew" (steps of fewer works than 7/8 of the SMs, all rows short, on the persistent decode
// kernel instead of the split kernel and the merge: attention.h SetDecodeWsFewWorks(true); the same
// bits), "hostscore" (every logits row back whole, the engine sampling and scoring prompt rows on
// the host: EngineOptions::debug_capture_logits; how prompt rows were scored before session 46),
// "scorerowsN" (N prompt-logprob rows a step at most instead of
// EngineOptions::max_prompt_logprob_rows' default). Variants compose with "+":
// "splitk+noprefetch" applies splitk, then noprefetch.
//
// tree: issue 11's three-level prefix tree through the engine: a system chunk of shared_len
// tokens, tree_contexts context chunks of tree_context_len tokens below it, tree_queries
// queries of query_len tokens below each context, shared_gen tokens generated by each (the
// system and context chunks cached first). One engine each for cascade off, single-level
// grouping and every shared tile read once (the default); decode tok/s and ms per step, each
// step's bytes floor with every shared tile counted once, and whether every request got the same
// tokens in all three (it must: the same bits). --tree_super=1 (CUDA): a fourth engine, every tile
// in the two-level fold order (CudaBackendOptions::attention_super_tiles = 0: other bits, so its
// tokens are not compared). --tree_ownsmem=1 (CUDA): an engine with the rows' own tiles on the
// shared-memory split kernel (variant "ownsmem") instead of the persistent decode kernel (split
// form 6; the same bits, so its tokens are compared). --variants other than "default" alone: one
// "every tile" engine a listed variant, in order (e.g. default,halfcascade,default,halfcascade),
// every one's tokens compared.
//
// Decode samplers (every request of a run alike; all but greedy seeded, temperature 0.8, drawn
// on the device): "greedy" (temperature --temperature), "temperature", "topk" (top_k 50), "topp"
// (top_p 0.9), "minp" (min_p 0.05), "penalty" (repetition_penalty 1.2), "freqpres"
// (frequency_penalty 0.5, presence_penalty 0.5), "logprobs" (5), "all" (every one of those at
// once), "bias" (a logit_bias of 64 ids below 4096: -100, 5, -2 or 0.5; not in "all").
// Each variant's engine runs them one after another. --rounds=R (> 1): instead, at each batch,
// the samplers run R times each in rounds, the order rotated a round (round r starts with the
// r-th), so a drift in the device's or the process's state over the run reaches every sampler
// alike; a sampler's ms/step is the median of its rounds, and the ratios compare medians.
//
// nanovllm: nano-vllm's bench.py workload: nano_seqs requests at once, input and output lengths
// uniform in [nano_min_len, nano_max_len] (std::mt19937 seeded with --seed, so not Python's
// exact draws), input tokens uniform in [0, 10000), temperature 0.6 (seeded), ignore_eos;
// prints total output tokens / wall time from the first AddRequest to the last token.
//
// Timing: host steady clock around Engine::Step() calls (a step returns after the backend has
// copied the logits to the host, so it includes all device work). "fwd %" is the share of the
// step time spent inside Backend::Forward (device work + logits copy); the rest is the engine's
// host work (scheduling, sampling, output). "idle gap us" is, per decode step, the time from a
// step's results reaching the host to the next step's launch returning, where that step was not
// already enqueued behind the previous one (the device has nothing of the engine's to run for
// about that long; a speculated launch, Backend::PrepareSampled, counts 0: the device ran the step
// meanwhile), "launch us" the time inside the backend's LaunchSampled (planning, staging, copies,
// graph launch; for an adopted speculated step, only the adoption). On CUDA, "bytes floor ms" is a
// decode step's bytes (every weight once, LM head included, plus each row's K and V over its mean
// context) at the device's measured copy rate, and "floor / step" that floor over the measured
// step; the nano-vllm section prints its decode steps' floor likewise (K/V token reads from the
// requests' own lengths), the output tok/s no run of that workload can pass on this device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gpu_worker/backend/cuda/cuda_defaults.h"
#include "gpu_worker/engine/engine.h"
#include "gpu_worker/engine/sample_noise.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#ifdef CASCADE_HAVE_CUDA
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/cuda_backend.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/launchers.h"
#endif

namespace cascade::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Flags {
  std::string backend = "cuda";
  std::string preset = "tiny";
  std::string model_dir;
  std::vector<int> batches = {1, 8, 32, 64, 128, 256};
  int prompt_len = 128;
  int decode_len = 64;
  std::vector<int> prefill_lens = {512, 2048, 8192};
  int prefill_tokens = 8192;
  int score_logprobs = 5;  // the score section's prompt_logprobs
  int shared_len = 2048;
  std::vector<int> queries = {16, 64, 256};
  int query_len = 32;
  int shared_gen = 64;
  int tree_contexts = 8;
  int tree_context_len = 1024;
  int tree_queries = 32;  // per context
  bool tree_super = false;
  bool tree_ownsmem = false;
  std::vector<std::string> sections = {"decode", "prefill", "shared"};
  int64_t num_blocks = 0;
  uint64_t seed = 0;
  double temperature = 0.0;  // 0: greedy; > 0: seeded temperature sampling
  std::vector<std::string> variants = {"default"};
  std::vector<std::string> samplers = {"greedy"};
  int nano_seqs = 256;
  int nano_min_len = 100;
  int nano_max_len = 1024;
  bool tune_log = false;  // print each GEMM tuning and decode-sized kernel choice (gemm.h)
  // Decode's warm-up before each batch: "full" runs the batch as measured once first (prompt and
  // decode lengths), so every graph bucket and attention form its steps meet (the tail's, where
  // rows that started in earlier prefill steps finish first) is captured before the timing, as a
  // server that has run a while has them; "bucket" (before session 47) ran 3 tokens a request,
  // which left the tail's captures inside the timed steps.
  std::string decode_warm = "full";
  int rounds = 1;  // decode: each batch's samplers timed this many times, interleaved
};

// Sets the sampling options of --samplers name `n` on p (p null: only checks the name).
bool ApplySampler(const std::string& n, engine::SamplingParams* p) {
  engine::SamplingParams q;
  if (p != nullptr) q = *p;
  if (n != "greedy") q.temperature = 0.8f;
  if (n == "topk" || n == "all") q.top_k = 50;
  if (n == "topp" || n == "all") q.top_p = 0.9f;
  if (n == "minp" || n == "all") q.min_p = 0.05f;
  if (n == "penalty" || n == "all") q.repetition_penalty = 1.2f;
  if (n == "freqpres" || n == "all") q.frequency_penalty = 0.5f, q.presence_penalty = 0.5f;
  if (n == "logprobs" || n == "all") q.logprobs = 5;
  if (n == "bias") {
    const float values[] = {-100.0f, 5.0f, -2.0f, 0.5f};
    q.logit_bias.clear();
    for (int32_t i = 0; i < 64; ++i) q.logit_bias.emplace_back(i * 61, values[i % 4]);
  }
  if (p != nullptr) *p = q;
  return n == "greedy" || n == "temperature" || n == "topk" || n == "topp" || n == "minp" ||
         n == "penalty" || n == "freqpres" || n == "logprobs" || n == "all" || n == "bias";
}

// Backend options a decode variant changes (see the header comment).
struct Variant {
  bool graphs = true;
  bool graphs_at_load = true;  // CudaBackendOptions::capture_graphs_at_load
  bool speculative = true;     // CudaBackendOptions::speculative_launch
  bool defer_eager = true;     // CudaBackendOptions::defer_eager_steps
  bool batch_invariant = true;
  bool small_m_gemm = true;
  int decode_gemm_max_m = cuda::kDefaultDecodeGemmMaxM;
  bool pdl = true;
  bool overlap = false;                // EngineOptions::overlap_schedule
  int overlap_min_rows = 0;            // EngineOptions::overlap_min_rows
  int split_k = cuda::kDefaultSplitK;  // CudaBackendOptions::split_k (0: the rule, 1: off)
  int split_columns = cuda::kDefaultSplitColumns;           // CudaBackendOptions::split_columns
  int split_residual_min = cuda::kDefaultSplitResidualMin;  // ::split_residual_min
  int reference_m = 256;                                    // CudaBackendOptions::gemm_reference_m
  int block_size = 16;                                      // CudaBackendOptions::block_size
  int lead_tiles = 0;       // CudaBackendOptions::attention_lead_tiles
  bool finish_rows = true;  // CudaBackendOptions::attention_finish_rows
  bool gemm_tune = false;   // CudaBackendOptions::gemm_tune
  // CudaBackendOptions::gemm_tune_min_hidden
  int tune_min_hidden = cuda::kDefaultGemmTuneMinHidden;
  int tune_max_m = 64;      // CudaBackendOptions::gemm_tune_max_m
  int early_chunks = 2;     // CudaBackendOptions::decode_gemm_early_chunks
  bool choice_warm = true;  // CudaBackendOptions::decode_gemm_choice_warm
  bool choose_small = cuda::kDefaultDecodeGemmChooseSmall;  // ...::decode_gemm_choose_small
  bool lm_head_decode = cuda::kDefaultDecodeGemmLmHead;     // ...::decode_gemm_lm_head
  bool fuse_silu = true;                                    // CudaBackendOptions::fuse_silu
  int split_variant = 0;  // internal::SetSplitVariant (process-wide, set when the backend loads)
  // CudaBackendOptions::persistent_decode_min_tiles (the backend sets it process-wide at load);
  // -1 here: its default.
  int ws_min_tiles = -1;
  bool single_level = false;  // CudaBackendOptions::attention_single_level
  int prefill_min_m = 1024;   // CudaBackendOptions::gemm_prefill_min_m
  int super_tiles = 1;        // CudaBackendOptions::attention_super_tiles
  int prefetch_max_rows = cuda::kDefaultPrefetchWeightsMaxRows;  // ::prefetch_weights_max_rows
  int prefetch_ctas = 16;        // CudaBackendOptions::prefetch_weights_ctas
  bool prefetch_early = false;   // CudaBackendOptions::prefetch_weights_early
  bool own_tiles_ws = true;      // attention.h SetOwnTilesOnPersistentDecode (process-wide)
  bool dw_n8 = false;            // internal::SetDecodeWsN8 (process-wide, set at load)
  bool dw_stages = false;        // internal::SetDecodeWsHalfRing(false) (process-wide, at load)
  bool sample_twice = false;     // internal::SetSampleTwiceForTiming (process-wide, at load)
  bool dw_half_cascade = false;  // internal::SetDecodeWsHalfRingOnCascade (process-wide, at load)
  bool ws_few_works = false;     // attention.h SetDecodeWsFewWorks (process-wide, set at load)
  bool host_score = false;       // EngineOptions::debug_capture_logits: rows come back whole
  int prompt_logprob_rows = 0;   // EngineOptions::max_prompt_logprob_rows (0: its default)
};
// One part of a variant's name: its settings over what *v holds.
bool ParseVariantPart(const std::string& name, Variant* v) {
  if (name == "default") return true;
  if (name == "eager") return v->graphs = false, true;
  if (name == "lazygraphs") return v->graphs_at_load = false, true;
  if (absl::StartsWith(name, "spec")) {  // specN: overlapped from N rows, speculated launches
    v->speculative = v->overlap = true;
    return name.size() == 4 ||
           (absl::SimpleAtoi(name.substr(4), &v->overlap_min_rows) && v->overlap_min_rows > 0);
  }
  if (name == "heuristic") return v->batch_invariant = false, true;
  if (name == "cublas") return v->small_m_gemm = false, v->decode_gemm_max_m = 0, true;
  if (name == "nodecodegemm") return v->decode_gemm_max_m = 0, true;
  if (name == "nofusesilu") return v->fuse_silu = false, true;
  // The split attention kernel's form for every plan (launchers.h SetSplitVariant): shared-memory
  // form with tile t + 1 copied during tile t, shared-memory form, register form.
  if (name == "splitprefetch") return v->split_variant = 1, true;
  if (name == "splitsmem") return v->split_variant = 2, true;
  if (name == "splitreg") return v->split_variant = 3, true;
  // Whole-row decode plans on the persistent decode kernel (split form 3) whatever the rows'
  // length, or never (form 2: the shared-memory kernel without the merge).
  if (name == "ws") return v->ws_min_tiles = 0, true;
  if (name == "super") return v->super_tiles = 0, true;
  if (name == "ownsmem") return v->own_tiles_ws = false, true;
  if (name == "dwn8") return v->dw_n8 = true, true;
  if (name == "stages") return v->dw_stages = true, true;
  if (name == "sampletwice") return v->sample_twice = true, true;
  if (name == "halfcascade") return v->dw_half_cascade = true, true;
  if (name == "wsfew") return v->ws_few_works = true, true;
  if (name == "coldchoice") return v->choice_warm = false, true;
  if (name == "smallchoice") return v->choose_small = true, true;
  if (name == "dgemmhead") return v->lm_head_decode = true, true;
  if (name == "nodgemmhead") return v->lm_head_decode = false, true;
  if (name == "noprefetch") return v->prefetch_max_rows = 0, true;
  if (name == "nospec") return v->speculative = false, true;           // e.g. overlap32+nospec
  if (name == "nodefer") return v->defer_eager = false, true;          // e.g. spec1+nodefer
  if (name == "prefetchall") return v->prefetch_max_rows = 256, true;  // every decode bucket
  if (absl::StartsWith(name, "prefetchrows")) {  // prefetchrowsN: steps of up to N rows prefetch
    return absl::SimpleAtoi(name.substr(12), &v->prefetch_max_rows) && v->prefetch_max_rows >= 0;
  }
  if (name == "prefetchearly") return v->prefetch_early = true, true;
  if (absl::StartsWith(name, "prefetchctas")) {
    return absl::SimpleAtoi(name.substr(12), &v->prefetch_ctas) && v->prefetch_ctas >= 1 &&
           v->prefetch_ctas <= 1024;
  }
  if (name == "nows") return v->ws_min_tiles = std::numeric_limits<int>::max(), true;  // never
  if (name == "single") return v->single_level = true, true;
  if (name == "noprefillgemm") return v->prefill_min_m = 0, true;
  if (absl::StartsWith(name, "prefillgemm")) {  // prefillgemmN: gemm_prefill_min_m = N
    return absl::SimpleAtoi(name.substr(11), &v->prefill_min_m) && v->prefill_min_m >= 0;
  }
  if (absl::StartsWith(name, "early")) {  // earlyN: DecodeGemm copies N weight chunks early
    return absl::SimpleAtoi(name.substr(5), &v->early_chunks) && v->early_chunks >= 0;
  }
  if (name == "nopdl") return v->pdl = false, true;
  if (name == "hostscore") return v->host_score = true, true;
  if (absl::StartsWith(name, "scorerows")) {  // scorerowsN: max_prompt_logprob_rows = N
    return absl::SimpleAtoi(name.substr(9), &v->prompt_logprob_rows) && v->prompt_logprob_rows > 0;
  }
  if (name == "overlap") return v->overlap = true, true;
  if (name == "nosplit") return v->split_k = 1, true;
  if (name == "splitk") return v->split_k = 0, true;
  if (name == "split2") return v->split_k = 2, true;
  if (name == "split4") return v->split_k = 4, true;
  if (name == "split8") return v->split_k = 8, true;
  if (absl::StartsWith(name, "resmin")) {  // resminN: CudaBackendOptions::split_residual_min
    return absl::SimpleAtoi(name.substr(6), &v->split_residual_min) && v->split_residual_min >= 1;
  }
  if (absl::StartsWith(name, "cols")) {  // colsN: the rule with S n <= N (split_columns)
    return absl::SimpleAtoi(name.substr(4), &v->split_columns) && v->split_columns >= 8;
  }
  if (name == "block32") return v->block_size = 32, true;  // KV blocks of 32 / 64 tokens
  if (name == "block64") return v->block_size = 64, true;
  if (name == "nofold") return v->lead_tiles = -1, true;
  if (name == "nofinish") return v->finish_rows = false, true;
  if (name == "untuned") return v->gemm_tune = false, v->tune_min_hidden = 0, true;
  if (name == "tuned") return v->gemm_tune = true, true;
  if (absl::StartsWith(name, "tune")) {  // tuneN: GEMMs tuned at buckets up to m = N
    v->gemm_tune = true;
    return absl::SimpleAtoi(name.substr(4), &v->tune_max_m) && v->tune_max_m > 0;
  }
  if (absl::StartsWith(name, "overlap") && name.size() > 7) {  // overlapN: from N rows
    v->overlap = true;
    return absl::SimpleAtoi(name.substr(7), &v->overlap_min_rows) && v->overlap_min_rows > 0;
  }
  if (absl::StartsWith(name, "ref")) {  // refN: pinned GEMM algorithms chosen at m = N
    return absl::SimpleAtoi(name.substr(3), &v->reference_m) && v->reference_m > 0 &&
           v->reference_m <= 65536;
  }
  return false;
}
// A variant's settings from the defaults: "a+b" is variant a's, then b's over them (e.g.
// spec1+nodefer).
bool ParseVariant(const std::string& name, Variant* v) {
  *v = Variant{};
  size_t begin = 0;
  while (true) {
    const size_t plus = name.find('+', begin);
    const std::string part = name.substr(begin, plus == std::string::npos ? plus : plus - begin);
    if (part.empty() || !ParseVariantPart(part, v)) return false;
    if (plus == std::string::npos) return true;
    begin = plus + 1;
  }
}

bool ParseInts(const std::string& v, std::vector<int>* out) {
  out->clear();
  for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    int x;
    if (!absl::SimpleAtoi(p, &x) || x <= 0) return false;
    out->push_back(x);
  }
  return !out->empty();
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", a.c_str());
      return false;
    }
    const std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    bool ok = true;
    auto int_flag = [&](int* x) { ok = absl::SimpleAtoi(v, x) && *x > 0; };
    if (k == "backend")
      f->backend = v;
    else if (k == "preset")
      f->preset = v;
    else if (k == "model_dir")
      f->model_dir = v;
    else if (k == "batches")
      ok = ParseInts(v, &f->batches);
    else if (k == "prompt_len")
      int_flag(&f->prompt_len);
    else if (k == "decode_len")
      int_flag(&f->decode_len);
    else if (k == "prefill_lens")
      ok = ParseInts(v, &f->prefill_lens);
    else if (k == "prefill_tokens")
      int_flag(&f->prefill_tokens);
    else if (k == "score_logprobs")
      ok = absl::SimpleAtoi(v, &f->score_logprobs) && f->score_logprobs >= 0 &&
           f->score_logprobs <= 20;
    else if (k == "shared_len")
      int_flag(&f->shared_len);
    else if (k == "queries")
      ok = ParseInts(v, &f->queries);
    else if (k == "query_len")
      int_flag(&f->query_len);
    else if (k == "shared_gen")
      int_flag(&f->shared_gen);
    else if (k == "tree_contexts")
      int_flag(&f->tree_contexts);
    else if (k == "tree_context_len")
      int_flag(&f->tree_context_len);
    else if (k == "tree_queries")
      int_flag(&f->tree_queries);
    else if (k == "tree_super")
      f->tree_super = v == "1" || v == "true";
    else if (k == "tree_ownsmem")
      f->tree_ownsmem = v == "1" || v == "true";
    else if (k == "sections")
      f->sections = absl::StrSplit(v, ',', absl::SkipEmpty());
    else if (k == "num_blocks")
      ok = absl::SimpleAtoi(v, &f->num_blocks) && f->num_blocks >= 0;
    else if (k == "seed")
      ok = absl::SimpleAtoi(v, &f->seed);
    else if (k == "temperature")
      ok = absl::SimpleAtod(v, &f->temperature) && f->temperature >= 0;
    else if (k == "samplers") {
      f->samplers = absl::StrSplit(v, ',', absl::SkipEmpty());
      for (const std::string& n : f->samplers) ok = ok && ApplySampler(n, nullptr);
    } else if (k == "variants") {
      f->variants = absl::StrSplit(v, ',', absl::SkipEmpty());
      Variant var;
      for (const std::string& n : f->variants) ok = ok && ParseVariant(n, &var);
    } else if (k == "rounds") {
      ok = absl::SimpleAtoi(v, &f->rounds) && f->rounds >= 1 && f->rounds <= 50;
    } else if (k == "nano_seqs")
      int_flag(&f->nano_seqs);
    else if (k == "nano_min_len")
      int_flag(&f->nano_min_len);
    else if (k == "nano_max_len")
      int_flag(&f->nano_max_len);
    else if (k == "decode_warm")
      f->decode_warm = v, ok = v == "full" || v == "bucket";
    else if (k == "tune_log")
      f->tune_log = v == "1" || v == "true";
    else {
      std::fprintf(stderr, "unknown flag --%s\n", k.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad value for --%s: %s\n", k.c_str(), v.c_str());
      return false;
    }
  }
  if (f->backend != "cuda" && f->backend != "cpu" && f->backend != "null") {
    std::fprintf(stderr, "--backend must be cuda, cpu or null\n");
    return false;
  }
  return true;
}

// Host time around a step's launch (TimedBackend), for the decode table's "idle gap" and
// "launch" columns: gap_s sums, over the launches that follow a collected step and were not
// started beforehand (PrepareSampled), the time from that step's results reaching the host
// (FinishSampled returned) to the next launch returning: the device has nothing of the engine's
// to run for about that long (the wait, the engine's collect, its scheduling where not
// overlapped, and the launch). spec_gap_s sums the same host time for the launches that adopt a
// started step (the device busy with it meanwhile). launch_s sums the time inside LaunchSampled
// (the backend's planning, staging, copies and graph launch).
struct LaunchTimes {
  double gap_s = 0;
  double spec_gap_s = 0;
  double launch_s = 0;
  bool ready = false;    // a step's results reached the host and no launch followed yet
  bool started = false;  // PrepareSampled started the next step (no launch since)
  Clock::time_point ready_at;
};

// Times Backend::Forward and ForwardSampled (host clock; they return with results on the host).
class TimedBackend : public engine::Backend {
 public:
  TimedBackend(std::unique_ptr<engine::Backend> inner, double* forward_s, LaunchTimes* launches)
      : inner_(std::move(inner)), forward_s_(forward_s), launches_(launches) {}
  std::string Name() const override { return inner_->Name(); }
  std::string KvNumerics() const override { return inner_->KvNumerics(); }
  int64_t NumBlocks() const override { return inner_->NumBlocks(); }
  int BlockSize() const override { return inner_->BlockSize(); }
  int VocabSize() const override { return inner_->VocabSize(); }
  absl::Status Forward(const engine::ForwardBatch& b, std::vector<float>* logits) override {
    const auto t0 = Clock::now();
    absl::Status st = inner_->Forward(b, logits);
    *forward_s_ += Seconds(t0, Clock::now());
    return st;
  }
  // The engine samples through this: rows come back as ids (and logprobs), not whole rows.
  absl::Status ForwardSampled(const engine::ForwardBatch& b, std::vector<float>* logits,
                              std::vector<int32_t>* argmax,
                              std::vector<engine::RowLogprobs>* logprobs) override {
    const auto t0 = Clock::now();
    absl::Status st = inner_->ForwardSampled(b, logits, argmax, logprobs);
    *forward_s_ += Seconds(t0, Clock::now());
    return st;
  }
  // Overlapped schedule: the launch and the wait count as forward time.
  absl::Status LaunchSampled(const engine::ForwardBatch& b) override {
    const auto t0 = Clock::now();
    absl::Status st = inner_->LaunchSampled(b);
    const auto t1 = Clock::now();
    *forward_s_ += Seconds(t0, t1);
    launches_->launch_s += Seconds(t0, t1);
    if (launches_->ready) {
      (launches_->started ? launches_->spec_gap_s : launches_->gap_s) +=
          Seconds(launches_->ready_at, t1);
    }
    launches_->ready = launches_->started = false;
    return st;
  }
  // Speculated launches (CudaBackendOptions::speculative_launch): offered while the step in
  // flight runs (host time inside the overlap window, not counted as forward time).
  bool PrepareSampled(const engine::ForwardBatch& next, std::span<const int32_t> feed) override {
    const bool started = inner_->PrepareSampled(next, feed);
    launches_->started |= started;
    return started;
  }
  absl::Status FinishSampled(std::vector<float>* logits, std::vector<int32_t>* argmax,
                             std::vector<engine::RowLogprobs>* logprobs) override {
    const auto t0 = Clock::now();
    absl::Status st = inner_->FinishSampled(logits, argmax, logprobs);
    launches_->ready_at = Clock::now();
    launches_->ready = true;
    *forward_s_ += Seconds(t0, launches_->ready_at);
    return st;
  }

 private:
  std::unique_ptr<engine::Backend> inner_;
  double* forward_s_;
  LaunchTimes* launches_;
};

// --backend=null: no model work. Each batch is checked as every backend checks it, and every row
// comes back at once as a token (a hash of the row's seed and position) with empty logprob lists,
// so engine_bench times the engine's own host work per step: scheduling, building batches and
// penalty lists, collecting and emitting outputs. The rows must be sampled in the backend (they
// are unless logits are captured).
class NullBackend final : public engine::Backend {
 public:
  NullBackend(int64_t num_blocks, int block_size, int vocab, int64_t max_num_tokens)
      : num_blocks_(num_blocks),
        block_size_(block_size),
        vocab_(vocab),
        max_tokens_(max_num_tokens) {}
  std::string Name() const override { return "null"; }
  int64_t NumBlocks() const override { return num_blocks_; }
  int BlockSize() const override { return block_size_; }
  int VocabSize() const override { return vocab_; }
  absl::Status Forward(const engine::ForwardBatch&, std::vector<float>*) override {
    return absl::UnimplementedError("the null backend only samples (ForwardSampled)");
  }
  absl::Status ForwardSampled(const engine::ForwardBatch& b, std::vector<float>* logits,
                              std::vector<int32_t>* tokens,
                              std::vector<engine::RowLogprobs>* logprobs) override {
    if (absl::Status st = engine::ValidateForwardBatch(b, {.vocab_size = vocab_,
                                                           .num_blocks = num_blocks_,
                                                           .block_size = block_size_,
                                                           .max_num_tokens = max_tokens_});
        !st.ok()) {
      return st;
    }
    const size_t rows = b.logits_rows.size();
    logits->clear();
    tokens->assign(rows, 0);
    if (logprobs != nullptr) logprobs->assign(rows, engine::RowLogprobs{});
    for (size_t r = 0; r < rows; ++r) {
      const engine::SampleSpec& s = b.row_samples[r].spec;
      (*tokens)[r] = s.score_token >= 0
                         ? s.score_token
                         : static_cast<int32_t>(
                               engine::SplitMix64(s.seed ^ static_cast<uint64_t>(s.position)) %
                               static_cast<uint64_t>(vocab_));
      if (logprobs != nullptr) (*logprobs)[r].num_top = s.logprobs;
    }
    return absl::OkStatus();
  }

 private:
  int64_t num_blocks_;
  int block_size_, vocab_;
  int64_t max_tokens_;
};

#ifdef CASCADE_HAVE_CUDA
// The device's copy rate, bytes read + written per second: 1 GiB copied device to device, the
// best of 5 after a warm-up (the attention benchmark's floor uses the same measure).
absl::StatusOr<double> CopyRate() {
  const size_t bytes = size_t{1} << 30;
  absl::StatusOr<cuda::DeviceBuffer> src = cuda::DeviceBuffer::Allocate(bytes);
  if (!src.ok()) return src.status();
  absl::StatusOr<cuda::DeviceBuffer> dst = cuda::DeviceBuffer::Allocate(bytes);
  if (!dst.ok()) return dst.status();
  if (absl::Status st = cuda::FillBytes(src->data(), 1, bytes); !st.ok()) return st;
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status st = cuda::CopyAsync(dst->data(), src->data(), bytes, nullptr); !st.ok()) {
      return st;
    }
    if (absl::Status st = cuda::Synchronize(nullptr); !st.ok()) return st;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i > 0) best = std::max(best, 2.0 * bytes / s);
  }
  return best;
}
#endif

struct Bench {
  const Flags& flags;
  const model::Model& model;
  int max_seqs = 256;
  int max_batched_tokens = 8192;
  int64_t max_context = 16384;
  double forward_s = 0;                      // accumulated by the current engine's TimedBackend
  LaunchTimes launches;                      // likewise
  const engine::Backend* backend = nullptr;  // the current engine's backend (owned by it)
  double copy_bytes_per_s = 0;  // device-to-device copy rate (read + written), CUDA only

  // Tokens a request of decode's warm-up batch generates (Flags::decode_warm).
  int WarmTokens() const { return flags.decode_warm == "full" ? flags.decode_len : 3; }

  // A decode step's bytes floor in ms at batch `batch`: every weight read once (the layers'
  // projections and the LM head; norms and the batch's embedding rows are negligible) plus each
  // row's K and V over its context (prompt + half the generated tokens on average over the run's
  // steps), at the copy rate; 0 where no rate was measured.
  double DecodeFloorMs(int batch) const {
    if (copy_bytes_per_s <= 0) return 0;
    const double ctx = flags.prompt_len + flags.decode_len / 2.0;
    return 1e3 * (WeightBytes() + batch * ctx * KvBytesPerToken()) / copy_bytes_per_s;
  }
  // Bytes of the weights a decode step reads (bf16).
  double WeightBytes() const {
    const model::ModelConfig& c = model.config();
    const double layer = static_cast<double>(c.hidden_size) * (c.q_size() + 2 * c.kv_size()) +
                         static_cast<double>(c.q_size()) * c.hidden_size +
                         3.0 * c.hidden_size * c.intermediate_size;
    return 2.0 * (layer * c.num_hidden_layers + static_cast<double>(c.vocab_size) * c.hidden_size);
  }
  // K and V bytes of one token over all layers (bf16).
  double KvBytesPerToken() const {
    const model::ModelConfig& c = model.config();
    return 2.0 * 2.0 * c.kv_size() * c.num_hidden_layers;
  }

  // One line of the CUDA backend's decode-path counters.
  // The current engine's decode graph captures so far and the host time of its first-use costs
  // (CudaGraphStats: bucket's eager first steps, captures); zero off CUDA.
  struct FirstUse {
    int64_t captures = 0;
    double ms = 0;
  };
  FirstUse FirstUseCosts() const {
#ifdef CASCADE_HAVE_CUDA
    if (backend == nullptr) return {};
    const cuda::CudaGraphStats st = cuda::GetCudaGraphStats(*backend);
    return {st.captures, 1e-6 * static_cast<double>(st.first_steps_ns + st.captures_ns)};
#else
    return {};
#endif
  }

  void PrintCounters() const {
#ifdef CASCADE_HAVE_CUDA
    if (backend == nullptr) return;
    const cuda::CudaGraphStats st = cuda::GetCudaGraphStats(*backend);
    std::printf(
        "\n(decode graphs: %lld captured, %lld replays; small-m GEMM shapes: %d verified "
        "bitwise, %d rejected; split-K slices o_proj %d, down_proj %d)\n",
        static_cast<long long>(st.captures), static_cast<long long>(st.replays),
        st.small_gemm_verified, st.small_gemm_rejected, st.o_proj_splits, st.down_proj_splits);
    if (st.speculated_adopted + st.speculated_dropped > 0) {
      std::printf("(speculated decode steps: %lld adopted, %lld dropped)\n",
                  static_cast<long long>(st.speculated_adopted),
                  static_cast<long long>(st.speculated_dropped));
    }
    std::string refused;
    for (int i = 0; i < 10; ++i) {
      if (st.speculate_refused[i] > 0)
        absl::StrAppend(&refused, " ", i, ":", st.speculate_refused[i]);
    }
    if (!refused.empty()) {
      std::printf("(speculation refused, by reason (CudaGraphStats::speculate_refused):%s)\n",
                  refused.c_str());
    }
    if (st.captured_at_load > 0) {
      std::printf("(decode graphs captured at load: %lld in %.0f ms)\n",
                  static_cast<long long>(st.captured_at_load), st.load_capture_ms);
    }
    if (!st.load_capture_log.empty()) std::printf("(%s)\n", st.load_capture_log.c_str());
    if (st.replays > 0) {
      const cuda::CudaGraphStats::ReplayHost& h = st.replay_host;
      const double per = 1e-3 / static_cast<double>(st.replays);
      std::printf(
          "(host us a replay: check %.1f, pad + plan %.1f, stage %.1f, uploads %.1f, graph launch "
          "%.1f, results %.1f)\n",
          h.check_ns * per, h.plan_ns * per, h.stage_ns * per, h.upload_ns * per, h.launch_ns * per,
          h.results_ns * per);
    }
    if (st.captures > 0) {
      std::printf("(first-use host ms: eager first steps of buckets %.1f, captures %.1f)\n",
                  st.first_steps_ns * 1e-6, st.captures_ns * 1e-6);
    }
    if (st.gemm_tuned > 0) {
      std::printf(
          "(GEMMs tuned at the decode buckets: %d, %d replaced by a faster bitwise-equal "
          "algorithm; decode graphs with them kept %d, dropped for the pinned %d)\n",
          st.gemm_tuned, st.gemm_replaced, st.graphs_tuned_kept, st.graphs_tuned_dropped);
      if (flags.tune_log) {
        for (const std::string& line : st.gemm_tune_log) std::printf("  tune %s\n", line.c_str());
      }
    }
    if (flags.tune_log) {
      for (const std::string& line : st.gemm_decode_log) std::printf("  decode %s\n", line.c_str());
    }
#endif
  }

  std::unique_ptr<engine::Engine> MakeEngine(bool cascade, Variant variant = {},
                                             int64_t blocks_override = -1) {
    std::unique_ptr<engine::Backend> backend;
    const int64_t blocks = blocks_override >= 0 ? blocks_override : flags.num_blocks;
    if (flags.backend == "cpu") {
      cpu::CpuBackendOptions o;
      o.num_blocks = blocks > 0 ? blocks : 4096;
      backend = cpu::NewCpuBackend(model, o);
    } else if (flags.backend == "null") {
      backend = std::make_unique<NullBackend>(blocks > 0 ? blocks : 8192, 16,
                                              static_cast<int>(model.config().vocab_size),
                                              max_batched_tokens);
    } else {
#ifdef CASCADE_HAVE_CUDA
      cuda::CudaBackendOptions o;
      // 131k tokens: room for every workload here (the largest, 256 x 192, is 49k), without
      // sizing a huge block table for small models.
      o.num_blocks = blocks > 0 ? blocks : blocks_override == 0 ? 0 : 8192;  // 0: auto
      o.max_num_tokens = max_batched_tokens;
      o.max_logits_rows = max_seqs;
      o.cascade = cascade;
      o.cuda_graphs = variant.graphs;
      o.capture_graphs_at_load = variant.graphs_at_load;
      o.speculative_launch = variant.speculative;
      o.defer_eager_steps = variant.defer_eager;
      o.batch_invariant = variant.batch_invariant;
      o.small_m_gemm = variant.small_m_gemm;
      o.decode_gemm_max_m = variant.decode_gemm_max_m;
      o.decode_gemm_early_chunks = variant.early_chunks;
      o.decode_gemm_choice_warm = variant.choice_warm;
      o.decode_gemm_choose_small = variant.choose_small;
      o.decode_gemm_lm_head = variant.lm_head_decode;
      o.fuse_silu = variant.fuse_silu;
      o.split_k = variant.split_k;
      o.split_columns = variant.split_columns;
      o.split_residual_min = variant.split_residual_min;
      o.gemm_reference_m = variant.reference_m;
      o.block_size = variant.block_size;
      o.attention_lead_tiles = variant.lead_tiles;
      o.attention_finish_rows = variant.finish_rows;
      o.attention_single_level = variant.single_level;
      o.attention_super_tiles = variant.super_tiles;
      o.prefetch_weights_max_rows = variant.prefetch_max_rows;
      o.prefetch_weights_ctas = variant.prefetch_ctas;
      o.prefetch_weights_early = variant.prefetch_early;
      o.gemm_prefill_min_m = variant.prefill_min_m;
      o.gemm_tune = variant.gemm_tune;
      o.gemm_tune_min_hidden = variant.tune_min_hidden;
      o.gemm_tune_max_m = variant.tune_max_m;
      o.programmatic_launch = variant.pdl;
      cuda::internal::SetSplitVariant(variant.split_variant);
      cuda::SetOwnTilesOnPersistentDecode(variant.own_tiles_ws);
      cuda::internal::SetDecodeWsN8(variant.dw_n8);
      cuda::internal::SetDecodeWsHalfRing(!variant.dw_stages);
      cuda::internal::SetSampleTwiceForTiming(variant.sample_twice);
      cuda::internal::SetDecodeWsHalfRingOnCascade(variant.dw_half_cascade);
      cuda::SetDecodeWsFewWorks(variant.ws_few_works);
      o.persistent_decode_min_tiles =
          variant.ws_min_tiles >= 0 ? variant.ws_min_tiles : cuda::kDefaultDecodeWsMinTiles;
      const Clock::time_point load_start = Clock::now();
      auto b = cuda::NewCudaBackend(model, o);
      if (!b.ok()) {
        std::fprintf(stderr, "cuda backend: %s\n", b.status().ToString().c_str());
        std::exit(1);
      }
      // Load includes the load-time GEMM choices and tunings (gemm.h PrepareDecode, PrepareTune).
      const cuda::CudaGraphStats st = cuda::GetCudaGraphStats(**b);
      std::printf(
          "(cuda backend loaded in %.2f s, %d GEMMs tuned at load, prefill GEMMs: %d of %d shapes "
          "on a faster bitwise-equal algorithm)\n",
          Seconds(load_start, Clock::now()), st.gemm_tuned, st.gemm_prefill_replaced,
          st.gemm_prefill_shapes);
      if (!st.prefill_attention_log.empty()) {
        std::printf("(%s)\n", st.prefill_attention_log.c_str());
      }
      if (flags.tune_log) {
        for (const std::string& line : st.gemm_prefill_log)
          std::printf("  prefill %s\n", line.c_str());
      }
      backend = std::move(*b);
      this->backend = backend.get();
#else
      std::fprintf(stderr, "built without CUDA; use --backend=cpu\n");
      std::exit(1);
#endif
    }
    if (!backend) {
      std::fprintf(stderr, "could not create the backend\n");
      std::exit(1);
    }
    forward_s = 0;
    launches = LaunchTimes{};
    engine::EngineOptions eo;
    eo.model_name = model.name();
    eo.max_num_seqs = max_seqs;
    eo.max_num_batched_tokens = max_batched_tokens;
    eo.max_context = max_context;
    eo.max_tokens_limit = 4096;
    eo.max_waiting = 100000;
    eo.overlap_schedule = variant.overlap;
    eo.overlap_min_rows = variant.overlap_min_rows;
    eo.debug_capture_logits = variant.host_score;
    if (variant.prompt_logprob_rows > 0) eo.max_prompt_logprob_rows = variant.prompt_logprob_rows;
    return engine::NewEngine(
        eo, std::make_unique<TimedBackend>(std::move(backend), &forward_s, &launches));
  }

  std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
    std::vector<int32_t> t(n);
    const int vocab = static_cast<int>(model.config().vocab_size);
    for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
    return t;
  }
};

double g_temperature = 0.0;        // --temperature, applied to every request
std::string g_sampler = "greedy";  // one of --samplers, applied to every request

engine::Request MakeRequest(std::vector<engine::ChunkInput> chunks, int max_tokens) {
  static uint64_t next_seed = 1;
  engine::Request r;
  r.chunks = std::move(chunks);
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;  // fixed lengths
  r.sampling.temperature = static_cast<float>(g_temperature);
  r.sampling.seed = next_seed++;
  ApplySampler(g_sampler, &r.sampling);
  return r;
}

// What one batch of requests cost, split at the step after which every request had its first
// token (from then on every step is a pure decode step over the whole batch).
struct PhaseResult {
  double first_tokens_s = 0;  // add -> every request has its first token (prefill phase)
  double decode_s = 0;        // the remaining steps
  int64_t decode_tokens = 0;  // tokens produced in those steps
  int decode_steps = 0;
  double decode_forward_s = 0;
  double decode_gap_s = 0;     // LaunchTimes::gap_s over the decode steps
  double decode_launch_s = 0;  // LaunchTimes::launch_s over the decode steps
  double total_s = 0;
  int64_t prompt_tokens_computed = 0;
};

// tokens (optional): each request's generated tokens, in the order of reqs.
PhaseResult RunBatch(Bench& b, engine::Engine& e, const std::vector<engine::Request>& reqs,
                     std::vector<std::vector<int32_t>>* tokens = nullptr) {
  PhaseResult r;
  const int64_t computed0 = e.Stats().prompt_tokens_computed;
  const auto t0 = Clock::now();
  std::map<uint64_t, size_t> index;  // sequence id -> position in reqs
  for (const engine::Request& q : reqs) {
    auto id = e.AddRequest(q);
    if (!id.ok()) {
      std::fprintf(stderr, "AddRequest: %s\n", id.status().ToString().c_str());
      std::exit(1);
    }
    const size_t position = index.size();
    index[*id] = position;
  }
  if (tokens != nullptr) tokens->assign(reqs.size(), {});
  std::map<uint64_t, bool> got_first;
  size_t firsts = 0, finished = 0;
  bool decoding = false;
  Clock::time_point t_decode;
  double fwd_at_decode = 0, gap_at_decode = 0, launch_at_decode = 0;
  while (finished < reqs.size()) {
    auto outs = e.Step();
    if (!outs.ok()) {
      std::fprintf(stderr, "Step: %s\n", outs.status().ToString().c_str());
      std::exit(1);
    }
    for (const engine::SequenceOutput& o : *outs) {
      if (!o.status.ok()) {
        std::fprintf(stderr, "sequence error: %s\n", o.status.ToString().c_str());
        std::exit(1);
      }
      if (decoding) r.decode_tokens += static_cast<int64_t>(o.new_tokens.size());
      if (tokens != nullptr) {
        std::vector<int32_t>& t = (*tokens)[index.at(o.seq_id)];
        t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
      }
      if (!o.new_tokens.empty() && !got_first[o.seq_id]) {
        got_first[o.seq_id] = true;
        ++firsts;
      }
      finished += o.finished;
    }
    if (decoding) ++r.decode_steps;
    if (!decoding && firsts == reqs.size()) {
      decoding = true;
      t_decode = Clock::now();
      fwd_at_decode = b.forward_s;
      gap_at_decode = b.launches.gap_s;
      launch_at_decode = b.launches.launch_s;
      r.first_tokens_s = Seconds(t0, t_decode);
    }
  }
  const auto t1 = Clock::now();
  r.total_s = Seconds(t0, t1);
  r.decode_s = Seconds(t_decode, t1);
  r.decode_forward_s = b.forward_s - fwd_at_decode;
  r.decode_gap_s = b.launches.gap_s - gap_at_decode;
  r.decode_launch_s = b.launches.launch_s - launch_at_decode;
  const engine::EngineStats es = e.Stats();
  r.prompt_tokens_computed = es.prompt_tokens_computed - computed0;
  if (es.speculated_steps + es.speculation_declined[0] + es.speculation_declined[1] +
          es.speculation_declined[2] >
      0) {
    std::fprintf(stderr, "(engine: %lld speculated steps, declined %lld / %lld / %lld)\n",
                 static_cast<long long>(es.speculated_steps),
                 static_cast<long long>(es.speculation_declined[0]),
                 static_cast<long long>(es.speculation_declined[1]),
                 static_cast<long long>(es.speculation_declined[2]));
  }
  return r;
}

// "variant" or "variant/sampler" -> batch -> ms/step
using DecodeMs = std::map<std::string, std::map<int, double>>;

// `name`, or name#2, name#3, ... where it is in `taken` already (a variant listed twice).
std::string NumberedLabel(const std::string& name, const std::vector<std::string>& taken) {
  std::string u = name;
  for (int k = 2; std::find(taken.begin(), taken.end(), u) != taken.end(); ++k) {
    u = absl::StrCat(name, "#", k);
  }
  return u;
}

// The column of a variant's sampler: "variant/sampler" (or the variant alone with one sampler),
// numbered where the name is in `columns` already (a sampler listed twice).
std::string DecodeColumn(const Bench& b, const std::string& variant, const std::string& sampler,
                         const std::vector<std::string>& columns) {
  return NumberedLabel(b.flags.samplers.size() > 1 ? variant + "/" + sampler : variant, columns);
}

// --rounds=R > 1: one variant's samplers at each batch, R interleaved rounds (see the header).
void DecodeRounds(Bench& b, engine::Engine& e, const std::string& name, DecodeMs* ms,
                  std::vector<std::string>* columns) {
  const std::vector<std::string>& samplers = b.flags.samplers;
  const int ns = static_cast<int>(samplers.size()), rounds = b.flags.rounds;
  std::vector<std::string> cols;
  for (const std::string& s : samplers) {
    cols.push_back(DecodeColumn(b, name, s, *columns));
    columns->push_back(cols.back());
  }
  std::printf(
      "\n## Decode, variant %s, %d rounds (prompt %d tokens, %d generated, ignore_eos; ms/step "
      "of each run, the samplers' order rotated a round)\n\n| batch | round |",
      name.c_str(), rounds, b.flags.prompt_len, b.flags.decode_len);
  for (const std::string& s : samplers) std::printf(" %s |", s.c_str());
  std::printf("\n|---:|---|");
  for (int i = 0; i < ns; ++i) std::printf("---:|");
  std::printf("\n");
  std::mt19937 rng(b.flags.seed + 1);
  auto requests = [&](int n, int max_tokens) {
    std::vector<engine::Request> reqs;
    for (int i = 0; i < n; ++i) {
      reqs.push_back(MakeRequest({{1, b.RandomTokens(rng, b.flags.prompt_len), ""}}, max_tokens));
    }
    return reqs;
  };
  for (const std::string& s : samplers) {  // first-use costs (GEMM choice, allocations)
    g_sampler = s;
    RunBatch(b, e, requests(2, 4));
  }
  for (int batch : b.flags.batches) {
    for (const std::string& s : samplers) {  // the buckets' captures, each sampler's buffers
      g_sampler = s;
      RunBatch(b, e, requests(batch, b.WarmTokens()));
    }
    std::vector<std::vector<double>> runs(ns);
    for (int r = 0; r < rounds; ++r) {
      for (int j = 0; j < ns; ++j) {
        const int i = (r + j) % ns;
        g_sampler = samplers[i];
        const PhaseResult res = RunBatch(b, e, requests(batch, b.flags.decode_len));
        runs[i].push_back(1e3 * res.decode_s / std::max(1, res.decode_steps));
      }
      std::printf("| %d | %d |", batch, r + 1);
      for (int i = 0; i < ns; ++i) std::printf(" %.3f |", runs[i].back());
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("| %d | median |", batch);
    for (int i = 0; i < ns; ++i) {
      std::vector<double> v = runs[i];
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      (*ms)[cols[i]][batch] = v[v.size() / 2];
      std::printf(" **%.3f** |", v[v.size() / 2]);
    }
    std::printf("\n| %d | max / min |", batch);
    for (int i = 0; i < ns; ++i) {
      const auto [lo, hi] = std::minmax_element(runs[i].begin(), runs[i].end());
      std::printf(" %.3f |", *hi / *lo);
    }
    std::printf("\n");
  }
  b.PrintCounters();
  g_sampler = "greedy";
}

void DecodeSection(Bench& b) {
  DecodeMs ms;
  std::vector<std::string> columns;
  for (const std::string& name : b.flags.variants) {
    Variant variant;
    ParseVariant(name, &variant);
    auto e = b.MakeEngine(true, variant);
    if (b.flags.rounds > 1) {
      DecodeRounds(b, *e, name, &ms, &columns);
      continue;
    }
    for (const std::string& sampler : b.flags.samplers) {
      g_sampler = sampler;
      const std::string column = DecodeColumn(b, name, sampler, columns);
      columns.push_back(column);
      std::printf(
          "\n## Decode, variant %s, sampler %s (prompt %d tokens, %d generated, "
          "ignore_eos, %s)\n\n",
          name.c_str(), sampler.c_str(), b.flags.prompt_len, b.flags.decode_len,
          sampler == "greedy" && b.flags.temperature == 0 ? "greedy" : "seeded sampling");
      std::printf(
          "| batch | decode tok/s | ms/step | fwd %% | prefill s | bytes floor ms | floor / step "
          "| idle gap us | launch us |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
      std::mt19937 rng(b.flags.seed + 1);
      {  // warm-up: first-use costs (GEMM algorithm choice, allocations) stay out of the numbers
        std::vector<engine::Request> w;
        for (int i = 0; i < 2; ++i)
          w.push_back(MakeRequest({{1, b.RandomTokens(rng, b.flags.prompt_len), ""}}, 4));
        RunBatch(b, *e, w);
      }
      std::vector<std::string> notes;  // printed after the table
      for (int batch : b.flags.batches) {
        std::vector<engine::Request> reqs, warm;
        for (int i = 0; i < batch; ++i) {
          reqs.push_back(
              MakeRequest({{1, b.RandomTokens(rng, b.flags.prompt_len), ""}}, b.flags.decode_len));
          warm.push_back(
              MakeRequest({{1, b.RandomTokens(rng, b.flags.prompt_len), ""}}, b.WarmTokens()));
        }
        // The batch's graph buckets once first (captures and GEMM tuning are first-use costs).
        RunBatch(b, *e, warm);
        const Bench::FirstUse before = b.FirstUseCosts();
        PhaseResult r = RunBatch(b, *e, reqs);
        const Bench::FirstUse after = b.FirstUseCosts();
        if (after.captures > before.captures) {
          notes.push_back(absl::StrFormat(
              "(batch %d: %lld decode graph captures in the timed run, %.1f host ms)", batch,
              static_cast<long long>(after.captures - before.captures), after.ms - before.ms));
        }
        const double step_ms = 1e3 * r.decode_s / std::max(1, r.decode_steps);
        ms[column][batch] = step_ms;
        const double floor_ms = b.DecodeFloorMs(batch);
        const int steps = std::max(1, r.decode_steps);
        std::printf(
            "| %d | %.0f | %.3f | %.0f | %.3f | %s | %s | %.1f | %.1f |\n", batch,
            r.decode_tokens / r.decode_s, step_ms, 100.0 * r.decode_forward_s / r.decode_s,
            r.first_tokens_s, floor_ms > 0 ? absl::StrFormat("%.3f", floor_ms).c_str() : "-",
            floor_ms > 0 ? absl::StrFormat("%.0f%%", 100.0 * floor_ms / step_ms).c_str() : "-",
            1e6 * r.decode_gap_s / steps, 1e6 * r.decode_launch_s / steps);
        std::fflush(stdout);
      }
      b.PrintCounters();
      for (const std::string& line : notes) std::printf("%s\n", line.c_str());
    }
    g_sampler = "greedy";
  }
  if (columns.size() < 2) return;
  // The ratios' base: the first column, or the mean of its runs where it was repeated (e.g.
  // --samplers=greedy,topp,greedy: the first variant of a process can run a few percent slow).
  const std::string& base = columns[0];
  std::vector<std::string> base_runs;
  for (const std::string& c : columns) {
    if (c == base || absl::StartsWith(c, base + "#")) base_runs.push_back(c);
  }
  auto base_ms = [&](int batch) {
    double sum = 0;
    for (const std::string& c : base_runs) sum += ms[c][batch];
    return sum / static_cast<double>(base_runs.size());
  };
  const std::string how =
      b.flags.rounds > 1 ? absl::StrCat(", the median of ", b.flags.rounds, " rounds") : "";
  std::printf("\n## Decode ms/step by variant (same process%s; ratio = column / %s%s)\n\n| batch |",
              how.c_str(), base.c_str(), base_runs.size() > 1 ? ", the mean of its runs" : "");
  for (const std::string& v : columns) std::printf(" %s |", v.c_str());
  for (size_t i = 1; i < columns.size(); ++i) {
    std::printf(" %s / %s |", columns[i].c_str(), base.c_str());
  }
  std::printf("\n|---:|");
  for (size_t i = 0; i < 2 * columns.size() - 1; ++i) std::printf("---:|");
  std::printf("\n");
  for (int batch : b.flags.batches) {
    std::printf("| %d |", batch);
    for (const std::string& v : columns) std::printf(" %.3f |", ms[v][batch]);
    for (size_t i = 1; i < columns.size(); ++i) {
      std::printf(" %.3f |", ms[columns[i]][batch] / base_ms(batch));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// nano-vllm's benchmark workload (see the header comment), once per variant.
void NanoVllmSection(Bench& b) {
  const Flags& f = b.flags;
  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  std::uniform_int_distribution<int> len(f.nano_min_len, f.nano_max_len), tok(0, 9999);
  std::vector<engine::Request> reqs;
  int64_t input_tokens = 0, output_tokens = 0, max_output = 0;
  double kv_reads = 0;  // token reads of the decode steps: each row its whole context, each step
  for (int i = 0; i < f.nano_seqs; ++i) {
    std::vector<int32_t> prompt(len(rng));
    for (auto& t : prompt) t = tok(rng) % static_cast<int>(b.model.config().vocab_size);
    engine::Request r = MakeRequest({{1, prompt, ""}}, len(rng));
    r.sampling.temperature = 0.6f;
    r.sampling.seed = 1000 + i;
    const int64_t p = static_cast<int64_t>(prompt.size()), o = r.sampling.max_tokens;
    input_tokens += p;
    output_tokens += o;
    max_output = std::max(max_output, o);
    // Decode steps 1 .. o - 1 (the first token comes with the prefill) read contexts p + 1 ..
    kv_reads += static_cast<double>(o - 1) * p + static_cast<double>(o - 1) * o / 2.0;
    reqs.push_back(std::move(r));
  }
  std::printf(
      "\n## nano-vllm workload: %d sequences, input and output lengths uniform in "
      "[%d, %d] (%lld input, %lld output tokens), temperature 0.6, ignore_eos\n\n",
      f.nano_seqs, f.nano_min_len, f.nano_max_len, static_cast<long long>(input_tokens),
      static_cast<long long>(output_tokens));
  if (b.copy_bytes_per_s > 0) {  // the decode steps' bytes floor: K/V reads + weights per step
    const double kv = kv_reads * b.KvBytesPerToken();
    const double weights = static_cast<double>(max_output - 1) * b.WeightBytes();
    const double s = (kv + weights) / b.copy_bytes_per_s;
    std::printf(
        "(bytes floor of its decode steps: K/V %.1f TB + weights %.2f TB over >= %lld steps = "
        "%.2f s at the copy rate, so at most %.0f output tok/s before any prefill)\n\n",
        kv / 1e12, weights / 1e12, static_cast<long long>(max_output - 1), s, output_tokens / s);
  }
  std::printf(
      "| variant | output tok/s | total s | prefill phase s | steps "
      "|\n|---|---:|---:|---:|---:|\n");
  for (const std::string& name : f.variants) {
    Variant variant;
    ParseVariant(name, &variant);
    auto e = b.MakeEngine(true, variant, /*blocks_override=*/0);  // KV: most of the free memory
    // Warm-up: a batch that shrinks one sequence per step from nano_seqs to 1 meets every
    // decode-graph bucket, so captures stay out of the timed run (as a server captures at start).
    std::mt19937 wrng(f.seed + 7);
    std::vector<engine::Request> warm;
    for (int i = 0; i < f.nano_seqs; ++i) {
      warm.push_back(MakeRequest({{1, b.RandomTokens(wrng, 32), ""}}, 2 + i));
    }
    RunBatch(b, *e, warm);
    const Bench::FirstUse before = b.FirstUseCosts();
    PhaseResult r = RunBatch(b, *e, reqs);
    const Bench::FirstUse after = b.FirstUseCosts();
    std::printf("| %s | %.0f | %.3f | %.3f | %d |\n", name.c_str(), output_tokens / r.total_s,
                r.total_s, r.first_tokens_s, r.decode_steps);
    b.PrintCounters();
    std::printf("(in the timed run: %lld decode graph captures, %.1f host ms of first-use costs)\n",
                static_cast<long long>(after.captures - before.captures), after.ms - before.ms);
    std::fflush(stdout);
  }
}

void PrefillSection(Bench& b) {
  std::printf("\n## Prefill (cold prompts, 1 generated token, %d tokens per measurement)\n\n",
              b.flags.prefill_tokens);
  std::printf("| variant | prompt len | seqs | prefill tok/s | s |\n|---|---:|---:|---:|---:|\n");
  for (const std::string& name : b.flags.variants) {  // same prompts for every variant
    Variant variant;
    ParseVariant(name, &variant);
    auto e = b.MakeEngine(true, variant);
    std::mt19937 rng(b.flags.seed + 2);
    RunBatch(b, *e, {MakeRequest({{1, b.RandomTokens(rng, 256), ""}}, 1)});  // warm-up
    for (int len : b.flags.prefill_lens) {
      if (len + 1 > b.max_context) continue;
      const int seqs = std::max(1, b.flags.prefill_tokens / len);
      std::vector<engine::Request> reqs;
      for (int i = 0; i < seqs; ++i)
        reqs.push_back(MakeRequest({{1, b.RandomTokens(rng, len), ""}}, 1));
      PhaseResult r = RunBatch(b, *e, reqs);
      std::printf("| %s | %d | %d | %.0f | %.3f |\n", name.c_str(), len, seqs,
                  r.prompt_tokens_computed / r.total_s, r.total_s);
      std::fflush(stdout);
    }
  }
}

// Prompt scoring (lm-eval's loglikelihood; vLLM's prompt_logprobs): cold prompts of each
// prefill length, 1 generated token, with prompt_logprobs = --score_logprobs beside the same
// number of prompts without, per variant (hostscore: every row back whole, the engine scoring on
// the host, as before session 46; scorerowsN: N prompt rows a step at most).
void ScoreSection(Bench& b) {
  std::printf(
      "\n## Prompt scoring (cold prompts, prompt_logprobs = %d, 1 generated token, %d tokens per "
      "measurement)\n\n",
      b.flags.score_logprobs, b.flags.prefill_tokens);
  std::printf(
      "| variant | prompt len | seqs | plain tok/s | scored tok/s | scored / plain | scored s "
      "|\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const std::string& name : b.flags.variants) {
    Variant variant;
    ParseVariant(name, &variant);
    auto e = b.MakeEngine(true, variant);
    std::mt19937 rng(b.flags.seed + 5);
    engine::Request warm = MakeRequest({{1, b.RandomTokens(rng, 256), ""}}, 1);
    RunBatch(b, *e, {warm});
    warm.sampling.prompt_logprobs = b.flags.score_logprobs;
    RunBatch(b, *e, {warm});
    for (int len : b.flags.prefill_lens) {
      if (len + 1 > b.max_context) continue;
      const int seqs = std::max(1, b.flags.prefill_tokens / len);
      std::vector<engine::Request> plain, scored;
      for (int i = 0; i < seqs; ++i) {
        plain.push_back(MakeRequest({{1, b.RandomTokens(rng, len), ""}}, 1));
        scored.push_back(MakeRequest({{1, b.RandomTokens(rng, len), ""}}, 1));
        scored.back().sampling.prompt_logprobs = b.flags.score_logprobs;
      }
      const PhaseResult p = RunBatch(b, *e, plain);
      const PhaseResult q = RunBatch(b, *e, scored);
      const double pt = p.prompt_tokens_computed / p.total_s;
      const double qt = q.prompt_tokens_computed / q.total_s;
      std::printf("| %s | %d | %d | %.0f | %.0f | %.3f | %.3f |\n", name.c_str(), len, seqs, pt, qt,
                  qt / pt, q.total_s);
      std::fflush(stdout);
    }
  }
}

void SharedSection(Bench& b) {
  const bool cuda = b.flags.backend == "cuda";
  std::printf(
      "\n## Shared prefix (system chunk %d tokens cached, N queries of %d tokens, %d "
      "generated each)%s\n\n",
      b.flags.shared_len, b.flags.query_len, b.flags.shared_gen,
      cuda ? "" : " [cpu backend: no cascade option, both columns are the same backend]");
  std::mt19937 rng(b.flags.seed + 3);
  const std::vector<int32_t> system = b.RandomTokens(rng, b.flags.shared_len);
  std::map<int, std::vector<engine::Request>> workloads;
  for (int n : b.flags.queries) {
    for (int i = 0; i < n; ++i) {
      workloads[n].push_back(MakeRequest(
          {{1, system, ""}, {3, b.RandomTokens(rng, b.flags.query_len), ""}}, b.flags.shared_gen));
    }
  }
  std::map<int, PhaseResult> res[2];
  for (int c = 0; c < 2; ++c) {  // c = 0: cascade off, 1: on; one engine each, same requests
    auto e = b.MakeEngine(c == 1);
    RunBatch(b, *e, {MakeRequest({{1, system, ""}}, 1)});  // the system chunk is cached
    for (int n : b.flags.queries) {
      res[c][n] = RunBatch(b, *e, workloads[n]);
      // Drop the queries' own blocks from the cache? Not needed: every workload's queries differ.
    }
  }
  std::printf(
      "| N | decode tok/s off | decode tok/s on | decode on/off | total s off | total s on "
      "| total off/on |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int n : b.flags.queries) {
    const PhaseResult& off = res[0][n];
    const PhaseResult& on = res[1][n];
    const double d_off = off.decode_tokens / off.decode_s, d_on = on.decode_tokens / on.decode_s;
    std::printf("| %d | %.0f | %.0f | %.2fx | %.3f | %.3f | %.2fx |\n", n, d_off, d_on,
                d_on / d_off, off.total_s, on.total_s, off.total_s / on.total_s);
  }
  std::fflush(stdout);
}

// Returns false when some request's tokens differ between the runs.
bool TreeSection(Bench& b) {
  const Flags& f = b.flags;
  const int rows = f.tree_contexts * f.tree_queries;
  std::printf(
      "\n## Three-level prefix tree (system %d tokens, %d contexts of %d, %d queries of %d tokens "
      "each: %d requests, %d generated each)%s\n\n",
      f.shared_len, f.tree_contexts, f.tree_context_len, f.tree_queries, f.query_len, rows,
      f.shared_gen,
      f.backend == "cuda" ? "" : " [cpu backend: no cascade option, every run the same backend]");
  std::mt19937 rng(f.seed + 5);
  const std::vector<int32_t> system = b.RandomTokens(rng, f.shared_len);
  std::vector<engine::Request> warm, reqs;
  for (int c = 0; c < f.tree_contexts; ++c) {
    const std::vector<int32_t> context = b.RandomTokens(rng, f.tree_context_len);
    warm.push_back(MakeRequest({{1, system, ""}, {2, context, ""}}, 1));
    for (int q = 0; q < f.tree_queries; ++q) {
      reqs.push_back(MakeRequest(
          {{1, system, ""}, {2, context, ""}, {3, b.RandomTokens(rng, f.query_len), ""}},
          f.shared_gen));
    }
  }
  struct TreeRun {
    std::string name;
    bool cascade;
    bool single_level;
    bool super = false;     // the two-level fold order: other bits, tokens not compared
    bool own_smem = false;  // the rows' own tiles on the shared-memory split kernel (ownsmem)
    PhaseResult result = {};
    std::vector<std::vector<int32_t>> tokens = {};
    std::string variant = "default";  // --variants: one "every tile" run a variant, in order
  };
  std::vector<TreeRun> runs = {{"cascade off", false, false}, {"single-level", true, true}};
  const bool only_default = f.variants.size() == 1 && f.variants[0] == "default";
  std::vector<std::string> labels;
  for (const std::string& v : f.variants) {
    TreeRun run{"every tile", true, false};
    if (!only_default) {
      run.variant = v;
      labels.push_back(NumberedLabel(v, labels));
      run.name += absl::StrCat(" [", labels.back(), "]");
    }
    runs.push_back(std::move(run));
  }
  if (f.tree_ownsmem) {
    runs.push_back({"every tile, own tiles on the split kernel", true, false, false, true});
  }
  if (f.tree_super) runs.push_back({"every tile, super-tiles", true, false, true});
  for (TreeRun& run : runs) {
    Variant variant;
    ParseVariant(run.variant, &variant);  // checked with the flags
    variant.single_level = run.single_level;
    variant.own_tiles_ws = !run.own_smem;
    if (run.super) variant.super_tiles = 0;
    auto e = b.MakeEngine(run.cascade, variant);
    RunBatch(b, *e, warm);  // the system and context chunks are cached
    run.result = RunBatch(b, *e, reqs, &run.tokens);
  }
  // A decode step's bytes with every shared tile once: the weights, the system and context
  // chunks, and each request's own query and tokens so far (half of shared_gen on average).
  const double kv_tokens = f.shared_len +
                           static_cast<double>(f.tree_contexts) * f.tree_context_len +
                           rows * (f.query_len + f.shared_gen / 2.0);
  const double floor_ms =
      b.copy_bytes_per_s > 0
          ? 1e3 * (b.WeightBytes() + kv_tokens * b.KvBytesPerToken()) / b.copy_bytes_per_s
          : 0;
  std::printf(
      "| run | decode tok/s | ms/step | bytes floor ms | step / floor | vs cascade off |\n"
      "|---|---:|---:|---:|---:|---:|\n");
  auto step_ms = [](const PhaseResult& r) {
    return 1e3 * r.decode_s / std::max(1, r.decode_steps);
  };
  bool same = true;
  for (const TreeRun& run : runs) {
    const PhaseResult& r = run.result;
    same = same && (run.super || run.tokens == runs[0].tokens);
    std::printf("| %s | %.0f | %.3f | %s | %s | %.2fx |\n", run.name.c_str(),
                r.decode_tokens / r.decode_s, step_ms(r),
                floor_ms > 0 ? absl::StrFormat("%.3f", floor_ms).c_str() : "-",
                floor_ms > 0 ? absl::StrFormat("%.2fx", step_ms(r) / floor_ms).c_str() : "-",
                step_ms(runs[0].result) / step_ms(r));
  }
  std::printf("(every request's tokens equal in the runs of the default order: %s)\n",
              same ? "yes" : "NO");
  std::fflush(stdout);
  return same;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  g_temperature = flags.temperature;
  std::string dir = flags.model_dir;
  if (dir.empty()) {
    auto config = model::FindPresetConfig(flags.preset);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 2;
    }
    dir = (std::filesystem::temp_directory_path() / ("cascade_bench_" + flags.preset)).string();
    if (!std::filesystem::exists(dir + "/config.json")) {
      const auto t0 = Clock::now();
      absl::Status st = model::WriteRandomModel(dir, *config, flags.seed, "");
      if (!st.ok()) {
        std::fprintf(stderr, "mkmodel: %s\n", st.ToString().c_str());
        return 1;
      }
      std::fprintf(stderr, "generated %s in %.1f s\n", dir.c_str(), Seconds(t0, Clock::now()));
    }
  }
  auto model = model::LoadModel(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  std::string device = "cpu";
#ifdef CASCADE_HAVE_CUDA
  if (flags.backend == "cuda") {
    auto name = cuda::DeviceName(0);
    device = name.ok() ? *name : name.status().ToString();
  }
#endif
  const model::ModelConfig& c = (*model)->config();
  std::printf("# engine_bench: backend %s (%s), model %s (%lld layers, hidden %lld, vocab %lld)\n",
              flags.backend.c_str(), device.c_str(), dir.c_str(),
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size));
  Bench b{flags, **model};
#ifdef CASCADE_HAVE_CUDA
  if (flags.backend == "cuda") {
    absl::StatusOr<double> rate = CopyRate();
    if (rate.ok()) {
      b.copy_bytes_per_s = *rate;
      std::printf("(device-to-device copy: %.0f GB/s, read + written; the bytes floors use it)\n",
                  *rate / 1e9);
    } else {
      std::printf("(no copy rate: %s; no bytes floors)\n", rate.status().ToString().c_str());
    }
  }
#endif
  b.max_seqs = 256;
  for (int x : flags.batches) b.max_seqs = std::max(b.max_seqs, x);
  for (int x : flags.queries) b.max_seqs = std::max(b.max_seqs, x);
  b.max_seqs = std::max(b.max_seqs, flags.tree_contexts * flags.tree_queries);
  bool exact = true;  // cascade on and off gave every request the same tokens (tree)
  for (const std::string& s : flags.sections) {
    if (s == "decode")
      DecodeSection(b);
    else if (s == "prefill")
      PrefillSection(b);
    else if (s == "shared")
      SharedSection(b);
    else if (s == "tree")
      exact = TreeSection(b) && exact;
    else if (s == "nanovllm")
      NanoVllmSection(b);
    else if (s == "score")
      ScoreSection(b);
    else
      std::fprintf(stderr, "unknown section %s\n", s.c_str());
  }
  return exact ? 0 : 1;
}

}  // namespace
}  // namespace cascade::bench

int main(int argc, char** argv) { return cascade::bench::Main(argc, argv); }
