// CUDA ops of the Cascade backend: shape-checking wrappers over the kernels in *.cu.
// CUDA-free on purpose (host code and tests include it without nvcc). All pointers are device
// pointers, tensors are row-major and dense unless a stride is given; bf16 is stored as its
// 16 raw bits (`Bf16`); arithmetic inside every kernel is float32.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "gpu_worker/backend/cuda/kernel_types.h"

namespace cascade::cuda {

// Programmatic dependent launch for every kernel of this library (pdl.cuh): on by default.
// A kernel may then start while the previous kernel in the stream still runs, and it reads what
// no kernel writes before it waits for that kernel: weights (norm weights, rotary frequencies,
// GEMM weights) and step metadata (positions, KV slots, attention plan arrays). So metadata must
// reach the device by a copy (or by a kernel at least two launches earlier), never by the kernel
// launched just before the op that reads it.
// Process-wide (it is how the kernels are launched, not what they compute; results are the same
// either way); set it before work is enqueued, e.g. when a backend is created.
void SetProgrammaticLaunch(bool on);

// out[i, :] = float(table[ids[i], :]).  table: [vocab, hidden] bf16, ids: [n], out: [n, hidden]
// f32. REQUIRES: every id in [0, vocab) (the backend checks ids on the host).
absl::Status EmbeddingGather(const Bf16* table, const int32_t* ids, int n, int hidden, float* out,
                             Stream stream);

// residual[i, :] += delta[i, :] (if delta != nullptr), then
// out[i, :] = bf16(residual[i, :] * rsqrt(mean(residual[i, :]^2) + eps) * weight[:]).
// residual: [n, d] f32 (in/out), delta: [n, d] bf16 or nullptr, weight: [d] bf16, out: [n, d] bf16.
absl::Status AddRmsNorm(float* residual, const Bf16* delta, const Bf16* weight, float eps, int n,
                        int d, Bf16* out, Stream stream);

// AddRmsNorm with delta = bf16(((p[0] + p[1]) + ...) + p[splits - 1]), the slice-order sum of the
// fp32 partial products of a split-K GEMM (Gemm::RunPartials): the same bits as SplitReduce to
// bf16 followed by AddRmsNorm, in one pass. partials: [splits, n, d] f32.
absl::Status AddRmsNormSplit(float* residual, const float* partials, int splits, const Bf16* weight,
                             float eps, int n, int d, Bf16* out, Stream stream);

// Per-head RMSNorm (optional) and rotary embedding, in place, on the q and k heads of a fused
// QKV buffer. qkv: [n, row_stride] bf16 whose row holds num_q_heads q heads then num_kv_heads
// k heads (then v heads, untouched), each head_dim wide. positions: [n] global positions.
// q_norm / k_norm: [head_dim] bf16 weights, or nullptr to skip the norm.
// inv_freq: [head_dim / 2] f32 (scaling already applied). HF rotate_half convention:
//   x'[i] = x[i] cos - x[i + D/2] sin,  x'[i + D/2] = x[i + D/2] cos + x[i] sin,
//   angle = float(position) * inv_freq[i].
absl::Status QkNormRope(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                        const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm, float eps,
                        const float* inv_freq, Stream stream);

// QkNormRope, then KvAppend of the k and v heads (k heads at column num_q_heads * head_dim, v
// heads right after them), in one launch: the same bits in qkv and in the cache as the two ops.
// REQUIRES: row_stride >= (num_q_heads + 2 num_kv_heads) * head_dim and a multiple of 8, qkv and
// cache.v 16-byte aligned, cache.head_dim and cache.num_kv_heads equal to the shape's.
absl::Status QkNormRopeAppend(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                              const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                              float eps, const float* inv_freq, const int32_t* slot_mapping,
                              const KvCacheView& cache, Stream stream);

// Writes the k and v heads of each token of a fused QKV buffer ([n, row_stride], k heads at
// column k_offset, v heads at v_offset) into its slot. slot_mapping: [n]; a negative slot skips
// the token (padding). REQUIRES: slots < num_blocks * block_size (checked on the host).
absl::Status KvAppend(const Bf16* qkv, int n, int row_stride, int k_offset, int v_offset,
                      const int32_t* slot_mapping, const KvCacheView& cache, Stream stream);

// out[i, c] = bf16(silu(gate) * up) for the gate and up columns of intermediate feature c in
// gu[i, :]: gu is [n, 2*inter] bf16 as the fused gate_up GEMM writes it, its columns in blocks
// of 8 gate then 8 up features (gate c at c / 8 * 16 + c % 8, up 8 columns on; the backend
// interleaves the gate_up weight rows so), out: [n, inter] bf16. REQUIRES: inter % 8 == 0, gu and
// out 16-byte aligned.
absl::Status SiluMul(const Bf16* gu, int n, int inter, Bf16* out, Stream stream);

// Copies rows: out[i, :] = in[rows[i], :]. in: [*, d] bf16, rows: [n], out: [n, d] bf16.
// Hints the L2 cache to fetch `regions` (read-only data a later kernel reads, such as the next
// GEMM's weights) with bulk prefetches issued by `ctas` CTAs of one warp; returns once they are
// issued, not fetched. It reads and writes nothing, so it changes no result; meant for a side
// stream beside the kernels it runs ahead of. REQUIRES: every region 16-byte aligned and a
// multiple of 16 bytes (InvalidArgument otherwise), count <= kMaxL2Regions, ctas in [1, 1024].
absl::Status PrefetchL2(const L2Regions& regions, int ctas, Stream stream);

absl::Status GatherRows(const Bf16* in, const int32_t* rows, int n, int d, Bf16* out,
                        Stream stream);

// tokens[i] = sampled[feed[i]] for each i < n with feed[i] >= 0, others left (device arrays: a
// speculated decode step's inputs taken from the sampled ids of the step before it).
absl::Status FeedTokens(int32_t* tokens, const int32_t* feed, const int32_t* sampled, int n,
                        Stream stream);

// y[m, n] = x[m, k] * w[n, k]^T for m <= 16 rows (bf16 in, f32 or bf16 out), each element one
// fp32 accumulator over k ascending in m16n8k16 tensor-core steps (small_gemm.cu). Gemm uses it
// for decode-sized m only where it verified the bits against its pinned cuBLASLt algorithm.
// splits > 1: the split-K partial products instead, y: [splits, m, n] f32, slice s = k columns
// [s k / splits, (s + 1) k / splits) accumulated from zero (f32_out must be true).
// REQUIRES: n % 8 == 0, k % (64 splits) == 0, 4-byte aligned x and w.
absl::Status SmallGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, bool f32_out,
                       Stream stream, int splits = 1);

// y = x w^T (the Hugging Face Linear: x [m, k], w [n, k], y [m, n] bf16 or f32) for m <= 64 on
// Hopper's warpgroup MMA, each element one fp32 accumulator over k ascending in k16 steps (the
// accumulation of SmallGemm and of the pinned cuBLASLt kernels; gemm.cc checks the bits per shape
// before it uses this). cols_per_cta (8, 16 or 32) and stages (4, 8, 16): the CTA shape, 0 for
// the built-in choice. REQUIRES: k % 128 == 0, n % cols_per_cta == 0, 16-byte aligned x and w.
// kUnimplemented where the device lacks wgmma (not an sm_90 GPU). splits > 1: the split-K partial
// products instead (as SmallGemm's), y: [splits, m, n] f32 (f32_out must be true), slice s = k
// columns [s k / splits, (s + 1) k / splits) accumulated from zero; REQUIRES k % (128 splits) == 0.
absl::Status DecodeGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, bool f32_out,
                        Stream stream, int cols_per_cta = 0, int stages = 0, int splits = 1);
// DecodeGemm with SiluMul fused into its epilogue: act [m, n / 2] bf16 = SiluMul(x w^T), bitwise
// what DecodeGemm to bf16 followed by SiluMul gives (the same bf16 rounding of each gate and up
// value, the same silu expression), without the [m, n] intermediate or the second launch.
// w_gate_up: [n, k] rows in SiluMul's blocks of 8 gate then 8 up rows. cols_per_cta 16 or 32
// (or 0: the built-in choice, which must give 16 or 32); otherwise as DecodeGemm.
absl::Status DecodeGemmSiluMul(const Bf16* x, const Bf16* w_gate_up, int m, int n, int k, Bf16* act,
                               Stream stream, int cols_per_cta = 0, int stages = 0);

// How many of its first 128-k chunks of weights a DecodeGemm CTA copies before it waits for the
// previous kernel (programmatic launch lets it start while that kernel runs): 2 by default, 0 to
// copy nothing early, at most the CTA's stages - 2. Weights only (no kernel writes them). Two
// chunks measured 2-3% faster decode steps than none at batch 1-64 on an H100; all S - 2 of them
// (bulk traffic beside the previous kernel) 5% slower (bench/engine/NOTES.md run 12).
// Process-wide, like SetProgrammaticLaunch; the same bits.
void SetDecodeGemmEarlyChunks(int chunks);

// y[r, c] = sum over s = 0, 1, .. of partials[s, r, c], added in that order in fp32, then stored
// as bf16 (round to nearest even) or f32. partials: [splits, m, n] f32; y: [m, n].
// REQUIRES: m n % 4 == 0, 16-byte aligned pointers.
absl::Status SplitReduce(const float* partials, int splits, int m, int n, void* y, bool f32_out,
                         Stream stream);

// out[i] = argmax_j logits[i, j] (lowest index among ties; NaN never wins).
// logits: [n, vocab] f32, out: [n] int32.
absl::Status ArgmaxRows(const float* logits, int n, int vocab, int32_t* out, Stream stream);

// out[r] = the token engine::SampleRowRule picks for row r of logits [n, vocab] (float32) with
// params[r] (engine/sample_rule.h's rule: logit bias, penalties, temperature, min-p, top-k,
// top-p, Gumbel-max draw), and logprobs[r] its logprobs where engine::WantsLogprobs(params[r]);
// a score row (params[r].score_token >= 0) is not drawn: out[r] is its token, logprobs[r] its
// logprobs and rank. score_rows: some row may be one (false: none is; their rows are skipped).
// penalty_tokens: the ids params[r].penalty_start/count index (device; may be null when no row
// lists any), each in [0, vocab); penalty_counts: their generated counts (device, parallel, -1
// for a token listed for its bias alone; may be null when no row's listed tokens carry entries:
// engine::UsesEntries), such a row's ids ascending; penalty_bias: their logit biases (device,
// parallel; may be null when no row is biased). REQUIRES: params[r].logprobs <=
// engine::kMaxLogprobs; logprobs non-null if any row asks for them. A cluster of 1-8 CTAs per
// row; no host synchronization (graph-capturable).
absl::Status SampleRows(const float* logits, int n, int vocab, const RowSampleParams* params,
                        const int32_t* penalty_tokens, const int32_t* penalty_counts,
                        const float* penalty_bias, int32_t* out, engine::RowLogprobs* logprobs,
                        Stream stream, bool score_rows = false);

// *violations (device, one counter; the call zeroes it) = how many of the 2^24 uniforms
// engine::TokenUniform gives (engine::UniformOf) have a Gumbel noise above the bounds SampleRows'
// draw prunes with (sample.cu). Must be 0 for SampleRows to equal the host rule.
absl::Status CountGumbelBoundViolations(unsigned long long* violations, Stream stream);

// Gathers whole KV blocks into a dense staging buffer (to_stage) or scatters them back.
// parts: device array [num_parts] of per-layer cache bases (K of layer l at 2l, V at 2l + 1),
// each [num_blocks, part_bytes]; stage: [n, num_parts, part_bytes]. Block b of the list is
// parts[p] + blocks.ids[b] * part_bytes <-> stage + (b * num_parts + p) * part_bytes.
// REQUIRES: 1 <= n <= kMaxKvBlocksPerCopy, part_bytes % 16 == 0, ids in range (the backend
// checks them on the host).
absl::Status CopyKvBlocks(void* const* parts, int num_parts, const KvBlockList& blocks, int n,
                          int64_t part_bytes, void* stage, bool to_stage, Stream stream);

}  // namespace cascade::cuda
