// The CUDA backend's defaults that the worker's flags and engine_bench repeat: one definition,
// in a header that includes nothing of CUDA, so builds without the CUDA backend (the worker's
// flags on a CPU-only machine) share it. CudaBackendOptions documents what each one means.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cascade::cuda {

// CudaBackendOptions::gemm_tune_min_hidden: the GEMMs are tuned at the decode buckets by default
// for models of at least this hidden size (llama-3.2-1b and larger).
inline constexpr int kDefaultGemmTuneMinHidden = 2048;
// CudaBackendOptions::decode_gemm_max_m: decode-sized GEMMs up to this many rows run the kernel
// chosen per batch bucket at load time.
inline constexpr int kDefaultDecodeGemmMaxM = 64;
// CudaBackendOptions::gemm_prefill_min_m: GEMMs of at least this many rows (prefill chunks) run the
// bitwise-equal cuBLASLt algorithm chosen per weight shape at load time.
inline constexpr int kDefaultGemmPrefillMinM = 1024;
// CudaBackendOptions::persistent_decode_min_tiles: steps of whole decode rows averaging at least
// this many 64-token tiles (or of one round of works) run on the persistent decode kernel
// (Hopper). 2 since its consumers run the softmax on one warp (session 21: 1.25x the
// shared-memory kernel on 3-tile rows, H200); rows of one tile were not measured.
inline constexpr int kDefaultPersistentDecodeMinTiles = 2;
// CudaBackendOptions::split_k: 0, the batch-invariant split-K rule (gemm.h), 1 = off; the
// worker's --gemm_k_split (rule / off).
inline constexpr int kDefaultSplitK = 0;
// CudaBackendOptions::split_columns: the rule cuts a weight's k into S slices while S n stays
// within this many output columns (gemm.h Splits): o_proj / down_proj of qwen3-0.6b into 4, of
// llama-3.2-1b into 2; qwen3-8b's (n = 4096) by kDefaultSplitResidualMin alone.
inline constexpr int kDefaultSplitColumns = 4096;
// CudaBackendOptions::split_residual_min: under the rule, o_proj / down_proj (n = hidden) are cut
// in at least this many slices (1: by split_columns alone, the rule before session 45). 2 since
// session 45: qwen3-8b decode 0.84 / 0.84 / 0.98 / 0.96x at batch 1 / 8 / 64 / 256, prefill
// 0.98-0.99x (H200, engine NOTES.md run 31); other presets unchanged.
inline constexpr int kDefaultSplitResidualMin = 2;
// CudaBackendOptions::decode_gemm_choose_small: SmallGemm among the decode choice's candidates.
inline constexpr bool kDefaultDecodeGemmChooseSmall = false;
// CudaBackendOptions::decode_gemm_lm_head: the LM head in the decode choice at 17-64 rows. On
// since session 55 (H200, qwen3-0.6b: DecodeGemm picked at 24 / 32 / 48-64 rows, 94-129 us vs the
// pinned kernel's 115-152; the step 0.95x at batch 24, within noise at 32 / 64; every GPU test
// passing; bench/engine/NOTES.md run 43).
inline constexpr bool kDefaultDecodeGemmLmHead = true;
// The two-level fold order's super-tile in 64-token tiles (CudaBackendOptions::
// attention_super_tiles, attention.h SuperTilesFor; the worker's --attention_fold_order=two_level).
inline constexpr int kSuperTiles = 4;

// CudaBackendOptions::prefetch_weights_max_rows: captured decode steps of up to this many rows
// prefetch each layer's later weights into L2. 16 since session 46 (64 before): on an H200,
// qwen3-0.6b, three engines each, no prefetch / prefetch at 24-64 rows 0.98-0.99x (prompt 128) and
// 0.97 / 0.93x at 32 / 64 (prompt 512), and with it batch 64's step spread 1.74-2.03 ms between
// identical engines (1.78-1.82 without: the "unexplained" spread of sessions 42-45); at 16 rows
// within 1% either way (bench/engine/NOTES.md run 32).
inline constexpr int kDefaultPrefetchWeightsMaxRows = 16;
// Whether the decode graphs' L2 weight prefetch (CudaBackendOptions::prefetch_weights_max_rows) is
// used for a model on a device with an L2 of l2_bytes: what one prefetch hints, a layer's o_proj +
// gate_up + down_proj (hidden x (q_width + 3 inter) bf16 values) or its qkv (hidden x (q_width +
// 2 kv_width)), must fit the L2. Larger weights are evicted before their GEMMs read them and the
// prefetch only adds device-memory traffic (H200: qwen3-8b decode 1.44x slower at batch 1 with it,
// llama-3.2-1b 1.24x; bench/engine/NOTES.md run 29). q_width / kv_width: heads x head_dim.
inline constexpr bool PrefetchFitsL2(int64_t hidden, int64_t q_width, int64_t kv_width,
                                     int64_t inter, int64_t l2_bytes) {
  const int64_t after_attention = 2 * hidden * (q_width + 3 * inter);
  const int64_t qkv = 2 * hidden * (q_width + 2 * kv_width);
  return std::max(after_attention, qkv) <= l2_bytes;
}

// The batch-invariant split-K rule's slice count for a weight of n output features and k inputs
// (Gemm::Splits with split_k = 0, before it checks that cuBLASLt has an algorithm for the
// slices): a shape of the residual's width (n == residual_n: o_proj / down_proj) is cut in at
// least residual_min slices, then S doubles while 2 S n <= columns; every slice's k a multiple of
// 64. qwen3-0.6b's o_proj / down_proj: 4, llama-3.2-1b's: 2, qwen3-8b's: 2; qkv, gate_up and the
// LM head of the three: 1.
inline constexpr int SplitRuleSlices(int64_t n, int64_t k, int64_t columns, int64_t residual_n,
                                     int residual_min) {
  int s = 1;
  if (n == residual_n) {
    while (s < residual_min && k % (128 * s) == 0) s *= 2;
  }
  while (2 * s * n <= columns && k % (128 * s) == 0) s *= 2;
  return s;
}

}  // namespace cascade::cuda
