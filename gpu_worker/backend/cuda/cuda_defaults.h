// The CUDA backend's defaults that the worker's flags and engine_bench repeat: one definition,
// in a header that includes nothing of CUDA, so builds without the CUDA backend (the worker's
// flags on a CPU-only machine) share it. CudaBackendOptions documents what each one means.
#pragma once

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
// CudaBackendOptions::decode_gemm_choose_small: SmallGemm among the decode choice's candidates.
inline constexpr bool kDefaultDecodeGemmChooseSmall = false;
// The two-level fold order's super-tile in 64-token tiles (CudaBackendOptions::
// attention_super_tiles, attention.h SuperTilesFor; the worker's --attention_fold_order=two_level).
inline constexpr int kSuperTiles = 4;

}  // namespace cascade::cuda
