// The CUDA backend: bf16 weights and paged KV cache on one GPU, cuBLASLt GEMMs, the kernels of
// ops.h and attention.h. CUDA-free header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_worker/backend/cuda/cuda_defaults.h"
#include "gpu_worker/engine/backend.h"
#include "gpu_worker/model/model.h"

namespace cascade::cuda {

struct CudaBackendOptions {
  int device = 0;
  int block_size = 16;  // must divide kTileTokens (64)
  // KV cache capacity in blocks; 0: use kv_cache_fraction of the memory free after the weights
  // and activation buffers are allocated.
  int64_t num_blocks = 0;
  double kv_cache_fraction = 0.8;
  int max_num_tokens = 8192;  // most tokens in one Forward (sizes activation buffers)
  int max_logits_rows = 256;  // LM head rows computed per pass (more are done in passes)
  bool cascade = true;        // shared-prefix (cascade) decode attention
  // Deterministic mode: GEMM algorithms pinned per shape with split-K off (see gemm.h), so a
  // row's logits are bitwise the same whatever else is in the batch (cached == cold).
  bool batch_invariant = true;
  // Pure decode steps (every sequence one new token, logits for each) of up to max_graph_batch
  // rows replay a CUDA graph captured per batch-size bucket (the batch padded with inert rows);
  // other steps run eagerly. Replay computes exactly what eager does (same kernels, same
  // pinned GEMM algorithms, same attention items), so it changes no bits.
  bool cuda_graphs = true;
  // With cuda_graphs: every bucket's decode graph captured at load (NewCudaBackend), for rows of
  // 1, 129, 513 and 2049 tokens of context (so the attention forms of short rows, whole rows on the
  // persistent kernel and rows split over CTAs), as vLLM and SGLang capture theirs at start; false:
  // each (bucket, form) captured by the first step that needs it, whose host then spends ~5-10 ms
  // on the eager step and the capture (23 captures inside nano-vllm's timed run on an H200,
  // session 47). Steps with cascade items still capture their forms on first use. Same bits.
  bool capture_graphs_at_load = true;
  // With the overlapped engine: its next decode step enqueued behind the graph step in flight,
  // the inputs that step samples fed on the device (engine::Backend::PrepareSampled), so the GPU
  // does not wait for the host between steps; rows of sequences that ended meanwhile run and are
  // dropped. Same tokens. Measured on an H200 (session 48, qwen3-0.6b, overlapped from 32 rows):
  // decode steps 4% shorter at batch 64 and 256, the nano-vllm workload 3% faster.
  bool speculative_launch = true;
  // With the overlapped engine: an eager step (prefill or mixed, or past the graphs' rows) whose
  // rows are all sampled on the device returns once enqueued, like a graph step, its ids and
  // logprobs copied into pinned memory that FinishSampled waits for, so the engine builds the next
  // step while it runs, and (speculative_launch) that step may be enqueued behind it. false: such
  // steps run whole inside LaunchSampled (the host waits, the device then waits for the host).
  // Same tokens.
  bool defer_eager_steps = true;
  // Deterministic mode only: GEMMs of <= 16 rows use SmallGemm where its bits were verified equal
  // to the pinned algorithm's (gemm.h), since the pinned large-tile kernels stream weights far
  // below bandwidth at decode-sized m.
  bool small_m_gemm = true;
  // Deterministic mode only: unsplit GEMMs of up to this many rows (<= 64; 0: none), the
  // projections of decode steps, run the kernel chosen per weight shape and batch bucket at load
  // time (gemm.h PrepareDecode): the pinned algorithm, SmallGemm or DecodeGemm (wgmma), whichever
  // timed fastest among those whose rows are bitwise the pinned algorithm's. The same bits.
  int decode_gemm_max_m = kDefaultDecodeGemmMaxM;
  // The choice above times its candidates as a decode replay runs them (gemm.h
  // set_decode_warm_max_m: weights in L2, launches back to back) for the buckets whose weights
  // the backend prefetches (cuda_graphs and up to prefetch_weights_max_rows rows); false: one
  // launch at a time on flushed L2 for every bucket, as before session 36. The same bits.
  bool decode_gemm_choice_warm = true;
  // Whether the decode choice above also times SmallGemm (Gemm::set_decode_choose_small). The
  // same bits either way.
  bool decode_gemm_choose_small = kDefaultDecodeGemmChooseSmall;
  // The LM head takes the decode choice above too, for decode steps of 17 rows up to
  // decode_gemm_max_m (Gemm::set_decode_vocab; SmallGemm keeps 1-16 rows); engine_bench variant
  // nodgemmhead turns it off. The same bits.
  bool decode_gemm_lm_head = kDefaultDecodeGemmLmHead;
  // DecodeGemm CTAs copy this many chunks of their weights before waiting for the previous kernel
  // (ops.h SetDecodeGemmEarlyChunks; process-wide: the last backend created sets it). Same bits.
  int decode_gemm_early_chunks = 2;
  // Where gate_up runs DecodeGemm with 16 or 32 features per CTA (decode steps), SiluMul runs in
  // its epilogue (ops.h DecodeGemmSiluMul): one launch less per layer, the same bits.
  bool fuse_silu = true;
  // Deterministic mode only: batch-invariant split-K (gemm.h): 0 = the built-in rule (default:
  // k of narrow GEMMs such as o_proj / down_proj cut into slices fixed per shape), 1 = off, S > 1
  // = S slices for every GEMM but the LM head whose k allows it (benchmarks). o_proj's and
  // down_proj's partials are summed inside the residual add + RMSNorm that follows them. Other
  // bits than off, so every worker of a deployment alike (the worker's --gemm_k_split; the KV
  // numerics keep peer fetches apart). The default since session 42: an unsplit k = 2048-3072
  // projection is a chain of >= 128 dependent k16 steps, ~5-8 us at batch 1 whatever the kernel
  // (bench/engine/NOTES.md run 23), so decode steps at batch 1-32 run ~0.88x with the rule
  // (H200, qwen3-0.6b, runs 21-23), within noise at 64-256, and prefill pays the f32 partials,
  // 0.93-0.97x (run 28 measures it beside the rule in one call). History: on an H100 (run 8) the
  // rule gained 4-7% at batch 1 and lost up to 3% at batch 64-256 before its partials ran on
  // DecodeGemm at decode sizes and the norm summed them in one pass (run 22).
  int split_k = kDefaultSplitK;
  // With the rule (split_k = 0): a weight's k is cut into S slices while S n <= split_columns
  // (Gemm::Splits). Other values, other bits (deployment-wide, like split_k); benchmarks.
  int split_columns = kDefaultSplitColumns;
  // With the rule: o_proj / down_proj (n = hidden) in at least this many slices (a power of two,
  // 1-64; Gemm::set_split_residual_n). Other values, other bits.
  int split_residual_min = kDefaultSplitResidualMin;
  // Deterministic mode only: the m at which cuBLASLt's heuristic picks the algorithm pinned for
  // every m of a weight shape (gemm.h). 256 by default; on an H100 those picks run 15-20% behind
  // the heuristic's own at m = 4-16 on qwen3-8b and up to 2.6x behind at m = 2048 (NOTES.md run
  // 8), so benchmarks compare other values (engine_bench variants refN). Every worker of a
  // deployment must use the same value: another algorithm gives other bits.
  int gemm_reference_m = 256;
  // Deterministic mode only: GEMMs of at least this many rows (prefill chunks; 0: none) run the
  // cuBLASLt algorithm chosen per weight shape at load time among those whose rows are bitwise the
  // pinned algorithm's (gemm.h PreparePrefill), where one is >= 5% faster than the pinned
  // large-m-unfriendly pick made at gemm_reference_m. The same bits.
  int gemm_prefill_min_m = kDefaultGemmPrefillMinM;
  // AttentionConfig::lead_tiles: 0 (default) lets the planner size fold items (a decode row's
  // first tiles folded into one partial inside the split CTA); < 0 turns them off (benchmarks).
  // Every value gives the same bits.
  int attention_lead_tiles = 0;
  // Deterministic mode with decode graphs: tune the GEMMs at each graph bucket's m up to
  // gemm_tune_max_m (gemm.h SetTuneSizes: the fastest cuBLASLt algorithm whose output is bitwise
  // the pinned one's, found on the first eager step of the bucket). The bits do not change.
  // gemm_tune: for every model. gemm_tune_min_hidden: by default for models of at least this
  // hidden size (0: none). Measured on an H100 (bench/engine/NOTES.md runs 10-11, 14): tuned,
  // qwen3-8b (hidden 4096) decode is 1.19x faster at batch 64 and llama-3.2-1b (hidden 2048)
  // 1.04-1.08x at batch 1-64, which brings both within 5% of cuBLAS's non-deterministic heuristic
  // at every batch (untuned they were 7-10% and 17% behind it); qwen3-0.6b (hidden 1024) is
  // within 5% untuned, and tuned its nano-vllm workload ran 1.6-3.6% slower: it stays untuned.
  // Buckets of m 128 / 256 ran 1.1-1.7x slower per step tuned (cause not found), hence tuning only
  // up to 64.
  bool gemm_tune = false;
  int gemm_tune_min_hidden = kDefaultGemmTuneMinHidden;
  int gemm_tune_max_m = 64;
  // AttentionConfig::finish_rows: a fold item that holds every tile of its rows writes their
  // outputs (no merge pass for them); false: through the merge (benchmarks). The same bits.
  bool attention_finish_rows = true;
  // Benchmarks: cascade groups decode rows by their first tile and shares only the tiles common
  // to a whole group (attention.h CascadeGrouping::kLeadingTiles, the single-level grouping),
  // instead of reading every shared tile once (kEveryTile). The same bits either way.
  bool attention_single_level = false;
  // AttentionConfig::super_tiles, the fold order's super-tile (attention.h): 1 (default) the
  // one-level order; 0 SuperTilesFor (4 on Hopper at head_dim 128 with blocks of a multiple of 16
  // tokens, else 1); 4 only where SuperTilesFor allows it (else NewCudaBackend fails); other
  // values are refused. Measured on an H200 (bench/kernels/RESULTS.md): super-tiles run cascade
  // decode 1.3x faster and plain decode the same, but prefill attention 15-25% slower on today's
  // warp-specialized consumers, hence not the default yet. The two orders give other bits: every
  // worker of a deployment must use the same.
  int attention_super_tiles = 1;
  // Decode steps of whole rows averaging at least this many 64-token tiles run on the persistent
  // warp-specialized kernel (Hopper; attention.h SplitForm 3, DecodeWsMinTiles), as do steps of
  // shorter rows whose (row, kv head) works fit one per consumer (AttentionPlan::one_round), and
  // the planner folds rows whole for it from batch ~16; 0: at any length; -1: never (the
  // shared-memory split kernel, as before it). The same bits either way. Process-wide: the last
  // backend created sets it.
  int persistent_decode_min_tiles = kDefaultPersistentDecodeMinTiles;
  // Programmatic dependent launch for the backend's own kernels (ops.h SetProgrammaticLaunch):
  // a kernel's launch overlaps the previous kernel's tail; it waits for it before touching
  // memory. Process-wide: the last backend created sets it.
  bool programmatic_launch = true;
  // Prefill attention's two bitwise-equal forms (attention.h TunePrefillForm) timed at load on a
  // cold prompt of up to 4096 tokens, the faster made the default (process-wide: the last backend
  // created sets it); false: the warp-specialized form without ping-pong.
  bool tune_prefill_attention = true;
  // Decode graphs of up to this many rows (0: none) hint each layer's weights into the L2
  // cache ahead of the GEMMs that read them (ops.h PrefetchL2, on a side stream joined at the end
  // of the model): a layer's o_proj, gate_up and down_proj weights once its attention is done
  // (with prefetch_weights_early: once its q/k/v are in the KV cache, i.e. during attention), the
  // next layer's qkv weights after the post-attention norm. Prefetching reads nothing any kernel
  // writes and writes nothing, so the bits do not change. Measured on an H200 (qwen3-0.6b, engine
  // NOTES run 20, two calls): batch 64 0.96x the step time without it, batch 1-8 within noise
  // (those GEMMs are not bound by device memory); at batch 256 and on the nano-vllm workload
  // (long contexts) 2-4% slower, as was the early point at batch 64-256 (the prefetch competes
  // with attention's K/V reads): hence up to 64 rows. Only where what one prefetch hints (a layer's
  // o_proj + gate_up + down_proj, or its qkv) fits the device's L2 (qwen3-0.6b: 23 MB of a 50 MB
  // L2): larger weights are evicted before their GEMM reads them, and the prefetch then only adds
  // device-memory traffic (H200, run 29: qwen3-8b 1.44x / 1.27x slower at batch 1 / 64 with it,
  // llama-3.2-1b 1.24x at 1-64); the decode GEMM choice then times with cold weights too. Up to
  // 16 rows since session 46 (kDefaultPrefetchWeightsMaxRows: no gain at 24-64 rows, and a 15%
  // spread at 64 between identical engines with it).
  int prefetch_weights_max_rows = kDefaultPrefetchWeightsMaxRows;
  int prefetch_weights_ctas = 16;  // CTAs of one warp issuing each prefetch's bulk copies
  bool prefetch_weights_early = false;
  int max_graph_batch = 256;  // also capped by max_logits_rows and max_num_tokens
};

// InvalidArgument for bad options.
absl::Status ValidateCudaBackendOptions(const CudaBackendOptions& options);

// Uploads the model's weights as bf16 (the backend owns its copies; `model` may be destroyed
// afterwards), allocates the KV cache, per layer [num_blocks, kv_heads, block_size, head_dim] for
// K and for V, and the activation buffers. Errors: InvalidArgument (options, unsupported shapes
// such as head_dim not in {32, 64, 128, 256}), ResourceExhausted (GPU memory), Internal/
// Unavailable (no device, CUDA or cuBLAS failures).
// Forward() rejects malformed batches with InvalidArgument; logits rows are float32.
// Thread safety: as engine::Backend (one Forward at a time).
absl::StatusOr<std::unique_ptr<engine::Backend>> NewCudaBackend(const model::Model& model,
                                                                const CudaBackendOptions& options);

// Counters of the decode path, for tests and benchmarks: graphs captured, replayed steps, and
// the small-m GEMM verification (gemm.h). All zero for a backend that is not the CUDA backend.
struct CudaGraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  int small_gemm_verified = 0;  // weight shapes whose small-m GEMM matched the pinned one
  int small_gemm_rejected = 0;  // shapes that did not (they stay on cuBLASLt)
  int o_proj_splits = 1, down_proj_splits = 1;  // split-K slices (gemm.h Splits)
  // Tuned decode-sized GEMMs (gemm.h SetTuneSizes): (m, n, k) tuned, and those where a
  // bitwise-equal algorithm faster than the pinned one replaced it; one line per tuning.
  int gemm_tuned = 0, gemm_replaced = 0;
  // Decode graphs with tuned GEMMs timed against the pinned algorithms' graph at capture: kept,
  // or dropped for the pinned one (slower as a whole step).
  int graphs_tuned_kept = 0, graphs_tuned_dropped = 0;
  // Steps (eager or graph) whose attention plan had wide cascade items (attention.h
  // AttentionConfig::wide_rows).
  int64_t wide_cascade_steps = 0;
  // The prefill attention form chosen at load and both forms' times (TunePrefillForm), or why
  // none was timed; empty with tune_prefill_attention off.
  std::string prefill_attention_log;
  std::vector<std::string> gemm_tune_log;
  // Prefill-sized GEMMs (gemm.h PreparePrefill): weight shapes looked at, and those where a
  // faster bitwise-equal algorithm replaced the pinned one; one line per shape.
  int gemm_prefill_shapes = 0, gemm_prefill_replaced = 0;
  std::vector<std::string> gemm_prefill_log;
  // Decode-sized GEMM kernel choices (gemm.h set_decode_max_m), one line per (bucket, shape).
  std::vector<std::string> gemm_decode_log;
  // The host's time in the decode graph steps' launches (host clock, summed over `replays`):
  // the batch checked, padded to its bucket and planned; the metadata staged; its uploads
  // enqueued; the graph launched; the results' copies enqueued (and waited for, where the step
  // is not left in flight).
  // Host time of the first-use costs: the eager steps run before a bucket's first capture (which
  // also make the decode GEMM choices of its m), and the captures with their instantiation.
  int64_t first_steps_ns = 0, captures_ns = 0;
  // Steps PrepareSampled started that the next launch adopted, and that it dropped (another batch).
  int64_t speculated_adopted = 0, speculated_dropped = 0;
  // Eager steps LaunchSampled left in flight (CudaBackendOptions::defer_eager_steps), and the
  // steps PrepareSampled started behind one of them.
  int64_t eager_deferred = 0, speculated_after_eager = 0;
  // Steps offered to PrepareSampled and not started, by the first reason met: 0 nothing in flight,
  // 1 the step in flight not a deferred graph step, 2 a started step or host-tier copies pending,
  // 3 penalty lists, 4 not a decode batch the graphs cover, 5 a row not sampled on the device or a
  // score row, 6 a fed row outside the step in flight, 7 no graph for its bucket, 8 its form's
  // graph not ready (GraphReady), 9 the replay failed.
  int64_t speculate_refused[10] = {};
  int64_t captured_at_load = 0;  // graphs captured by CudaBackendOptions::capture_graphs_at_load
  double load_capture_ms = 0;    // the host time that took (eager steps, captures, replays)
  std::string load_capture_log;  // why those captures stopped early (memory); empty if not
  struct ReplayHost {
    int64_t check_ns = 0, plan_ns = 0, stage_ns = 0, upload_ns = 0, launch_ns = 0, results_ns = 0;
  } replay_host;
};
CudaGraphStats GetCudaGraphStats(const engine::Backend& backend);

}  // namespace cascade::cuda
