// Host launchers of the kernels in *.cu (internal to the library). Each enqueues its kernel on
// `stream`, checks cudaGetLastError() and returns it; none synchronizes, allocates, throws or
// exits. Shapes are checked by the op wrappers in ops.cc, which call these.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_worker/backend/cuda/kernel_types.h"

namespace cascade::cuda::internal {

void SetProgrammaticLaunch(bool on);  // see ops.h (defined in kernels.cu)
cudaError_t LaunchEmbeddingGather(const Bf16* table, const int32_t* ids, int n, int hidden,
                                  float* out, cudaStream_t stream);
// in_registers: the kernel that keeps a row in registers (d <= 4096); false: the element loop
// (any d). The same bits either way (CudaKernels.AddRmsNormRegisterRowsMatchTheElementLoop).
cudaError_t LaunchAddRmsNorm(float* residual, const Bf16* delta, const Bf16* weight, float eps,
                             int n, int d, Bf16* out, cudaStream_t stream,
                             bool in_registers = true);
// AddRmsNorm whose delta is the slice-order sum of split-K partials [splits, n, d] f32, rounded to
// bf16 (ops.h AddRmsNormSplit).
cudaError_t LaunchAddRmsNormSplit(float* residual, const float* partials, int splits,
                                  const Bf16* weight, float eps, int n, int d, Bf16* out,
                                  cudaStream_t stream);
cudaError_t LaunchQkNormRope(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                             const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                             float eps, const float* inv_freq, cudaStream_t stream);
cudaError_t LaunchQkNormRopeAppend(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                                   const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                                   float eps, const float* inv_freq, const int32_t* slot_mapping,
                                   const KvCacheView& cache, cudaStream_t stream);
cudaError_t LaunchKvAppend(const Bf16* qkv, int n, int row_stride, int k_offset, int v_offset,
                           const int32_t* slot_mapping, const KvCacheView& cache,
                           cudaStream_t stream);
cudaError_t LaunchSiluMul(const Bf16* gu, int n, int inter, Bf16* out, cudaStream_t stream);
// ops.h PrefetchL2: `ctas` CTAs issue bulk L2 prefetches of the regions (a plain launch: it reads
// nothing any kernel writes, so it neither waits for nor is waited on programmatically).
cudaError_t LaunchPrefetchL2(const L2Regions& regions, int ctas, cudaStream_t stream);
cudaError_t LaunchFeedTokens(int32_t* tokens, const int32_t* feed, const int32_t* sampled, int n,
                             cudaStream_t stream);
cudaError_t LaunchGatherRows(const Bf16* in, const int32_t* rows, int n, int d, Bf16* out,
                             cudaStream_t stream);
cudaError_t LaunchArgmaxRows(const float* logits, int n, int vocab, int32_t* out,
                             cudaStream_t stream);
// See sample.cu. penalty_tokens / penalty_counts / penalty_bias: indexed by each spec's penalty
// range; logprobs: [n], written for rows where engine::WantsLogprobs; score_rows: some row may
// be a score row (a second launch runs them).
cudaError_t LaunchSampleRows(const float* logits, int n, int vocab, const RowSampleParams* params,
                             const int32_t* penalty_tokens, const int32_t* penalty_counts,
                             const float* penalty_bias, int32_t* out, engine::RowLogprobs* logprobs,
                             bool score_rows, cudaStream_t stream);
size_t SampleRowsSmemBytes(int vocab);
// Benchmarks only: LaunchSampleRows launches the sampler twice on the same logits (it writes the
// same outputs again), so a timeline shows its time right after the LM head beside its time on
// logits already read once (bench/engine/NOTES.md run 42). Default off.
void SetSampleTwiceForTiming(bool on);
cudaError_t LaunchGumbelBoundCheck(unsigned long long* violations, cudaStream_t stream);
// CTAs per kv head that fill exactly one wave of the split attention kernel on the current device.
cudaError_t SplitCtasPerWave(int head_dim, int num_kv_heads, int split_form, int* ctas);
// See small_gemm.cu. REQUIRES: m <= 16, n % 8 == 0, k % (64 splits) == 0; splits > 1: f32_out
// (y: [splits, m, n] partials).
cudaError_t LaunchSmallGemm(const Bf16* x, const Bf16* w, int m, int n, int k, int splits, void* y,
                            bool f32_out, cudaStream_t stream);
// See decode_gemm.cu: y = x w^T for m <= 64 on wgmma (sm_90a). j: 8 j output features per CTA (1,
// 2 or 4), stages: 4, 8 or 16 (0, 0: DecodeGemmPick's choice). REQUIRES: k % 128 == 0,
// n % (8 j) == 0, 16-byte aligned x and w. cudaErrorNotSupported where wgmma is not available.
struct DecodeGemmShape {
  int j = 0, stages = 0;
};
DecodeGemmShape DecodeGemmPick(int m, int n, int k);
void SetDecodeGemmEarlyChunks(int chunks);  // see ops.h
// Dynamic shared memory of a launch (at most 227 KB fit a CTA).
size_t DecodeGemmSmemBytes(int m, DecodeGemmShape shape);
// y: bf16 or f32 [m, n]; or kSiluMul: w a gate_up weight in 8-row blocks (swiglu.cuh), y the
// bf16 SwiGLU activation [m, n / 2] (ops.h DecodeGemmSiluMul; shape.j must be 2 or 4).
enum class DecodeGemmOut { kBf16 = 0, kF32 = 1, kSiluMul = 2 };
// splits > 1 (kF32 only): the split-K partial products instead, y: [splits, m, n] f32, slice s =
// k columns [s k / splits, (s + 1) k / splits) accumulated from zero (REQUIRES k % (128 splits)
// == 0): what Gemm::RunPartials hands out.
cudaError_t LaunchDecodeGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y,
                             DecodeGemmOut out, DecodeGemmShape shape, cudaStream_t stream,
                             int splits = 1);
// y[i] = sum over s in order of partials[s count + i], as bf16 or f32. REQUIRES: count % 4 == 0.
cudaError_t LaunchSplitReduce(const float* partials, int splits, int64_t count, void* y,
                              bool f32_out, cudaStream_t stream);
// See ops.h CopyKvBlocks. parts: device array [num_parts] of cache bases.
cudaError_t LaunchKvBlockCopy(void* const* parts, int num_parts, const KvBlockList& blocks, int n,
                              int64_t part_bytes, void* stage, bool to_stage, cudaStream_t stream);
cudaError_t LaunchAttention(const AttentionArgs& args, const AttentionPlanView& plan,
                            cudaStream_t stream);
// Whether the current device runs the sm_90a machine code (the wgmma prefill kernel).
cudaError_t WgmmaAvailable(bool* available);
// Benchmark knob (process-wide) for the wgmma prefill: the default form (0: PrefillForm()), the
// warp-specialized kernel with the ping-pong schedule (1), the two-warpgroup kernel (2, also the
// kernel for block sizes that are not a multiple of 16), the warp-specialized kernel without
// ping-pong (3). Every one gives the same bits.
void SetWgmmaPrefillVariant(int variant);
// The default form of the warp-specialized prefill (process-wide; attention.h TunePrefillForm):
// 0 without ping-pong (initially), 1 with it.
int PrefillForm();
void SetPrefillForm(int form);
// Benchmarks only: the split kernel. 0 (default): the plan's AttentionPlanView::split_form; 1:
// the shared-memory form with tile t + 1's K and V copied while tile t is computed; 2: the
// shared-memory form, each tile's K and V copied at the start of its step; 3: the register form
// (head_dim <= 128; else as 2). Every variant gives the same bits.
void SetSplitVariant(int variant);
// Benchmarks only: whether the split kernel launched after the wide cascade kernel runs its items
// while that kernel still runs (default) or waits for it first, as every other kernel waits for
// the one before it. The same bits either way.
void SetSplitOverlapsWide(bool on);
// Tests and benchmarks: DecodeWsKernel's consumers in the decode-shaped form (the keys and head
// dims as the MMA's 64 rows, a work's <= 8 q-rows as its 8 columns) or in the 64-row form (the
// q-rows repeated over 64 MMA rows; default). The same bits either way.
void SetDecodeWsN8(bool on);
// Tests and benchmarks: DecodeWsKernel's K/V ring (16-token pieces, the one-level order, the 64-row
// consumer form, steps without wide cascade items) as half-stages of 32 keys, a work's last tile
// of at most 32 keys in one (default), or as whole 64-key stages. The same bits either way.
void SetDecodeWsHalfRing(bool on);
// Benchmarks: with the half-stage ring on, cascade steps' own tiles on it too (default off: whole
// stages there; bench/kernels/NOTES.md session 53). The same bits either way.
void SetDecodeWsHalfRingOnCascade(bool on);
// Tests only: the grid of split form 3's persistent kernel (DecodeWsKernel); 0 (default): one CTA
// per SM. A small grid makes each consumer run many items (its rings wrap many times).
void SetDecodeWsCtas(int ctas);
// Tests only: the grid of the persistent warp-specialized prefill kernel; 0 (default): one CTA per
// SM (at most one per work). A small grid makes each CTA run many works (its rings wrap).
void SetPrefillWsCtas(int ctas);
// Benchmarks only: the persistent warp-specialized prefill kernel's per-work timeline (wide
// cascade items and prefill; attention_hopper.cuh WsTraceSlot) into `trace`, which holds
// `works` x kTraceSlotsPerWork stamps and then 4 per CTA; nullptr stops it. cudaErrorNotSupported
// unless the library was built with -DCASCADE_WS_TRACE=ON (the product build stamps nothing).
inline constexpr int kTraceSlotsPerWork = 19;  // attention_hopper.cuh kWsTraceSlots
cudaError_t SetWsTrace(uint64_t* trace, int works);
// Benchmarks only: the same for the persistent decode kernel (DecodeWsKernel; attention_hopper.cuh
// DwTraceSlot), in the same layout.
cudaError_t SetDwTrace(uint64_t* trace, int works);

}  // namespace cascade::cuda::internal
