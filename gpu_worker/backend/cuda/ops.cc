// Op wrappers: check shapes, strides and alignment, then call the launchers and map errors.
#include "gpu_worker/backend/cuda/ops.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/launchers.h"

namespace cascade::cuda {
namespace {

bool SupportedHeadDim(int d) { return d == 32 || d == 64 || d == 128 || d == 256; }
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status Bad(const char* op, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", why));
}

}  // namespace

void SetProgrammaticLaunch(bool on) { internal::SetProgrammaticLaunch(on); }
void SetDecodeGemmEarlyChunks(int chunks) { internal::SetDecodeGemmEarlyChunks(chunks); }

absl::Status EmbeddingGather(const Bf16* table, const int32_t* ids, int n, int hidden, float* out,
                             Stream stream) {
  if (n < 0 || hidden <= 0) return Bad("EmbeddingGather", "bad shape");
  if (n > 0 && (!table || !ids || !out)) return Bad("EmbeddingGather", "null pointer");
  return CudaStatus(internal::LaunchEmbeddingGather(table, ids, n, hidden, out, stream),
                    "EmbeddingGather");
}

absl::Status AddRmsNorm(float* residual, const Bf16* delta, const Bf16* weight, float eps, int n,
                        int d, Bf16* out, Stream stream) {
  if (n < 0 || d <= 0 || !(eps >= 0)) return Bad("AddRmsNorm", "bad shape or eps");
  if (n > 0 && (!residual || !weight || !out)) return Bad("AddRmsNorm", "null pointer");
  return CudaStatus(internal::LaunchAddRmsNorm(residual, delta, weight, eps, n, d, out, stream),
                    "AddRmsNorm");
}

absl::Status AddRmsNormSplit(float* residual, const float* partials, int splits, const Bf16* weight,
                             float eps, int n, int d, Bf16* out, Stream stream) {
  if (n < 0 || d <= 0 || splits < 1 || !(eps >= 0)) {
    return Bad("AddRmsNormSplit", "bad shape, splits or eps");
  }
  if (n > 0 && (!residual || !partials || !weight || !out)) {
    return Bad("AddRmsNormSplit", "null pointer");
  }
  return CudaStatus(
      internal::LaunchAddRmsNormSplit(residual, partials, splits, weight, eps, n, d, out, stream),
      "AddRmsNormSplit");
}

absl::Status QkNormRope(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                        const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm, float eps,
                        const float* inv_freq, Stream stream) {
  if (!SupportedHeadDim(shape.head_dim)) {
    return Bad("QkNormRope", absl::StrCat("head_dim ", shape.head_dim, " not in {32,64,128,256}"));
  }
  if (n < 0 || shape.num_q_heads <= 0 || shape.num_kv_heads <= 0 ||
      row_stride < (shape.num_q_heads + shape.num_kv_heads) * shape.head_dim) {
    return Bad("QkNormRope", "bad shape or row stride");
  }
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return Bad("QkNormRope", "q_norm and k_norm must both be given or both be null");
  }
  if (n > 0 && (!qkv || !positions || !inv_freq)) return Bad("QkNormRope", "null pointer");
  return CudaStatus(internal::LaunchQkNormRope(qkv, n, row_stride, shape, positions, q_norm, k_norm,
                                               eps, inv_freq, stream),
                    "QkNormRope");
}

absl::Status QkNormRopeAppend(Bf16* qkv, int n, int row_stride, const HeadShape& shape,
                              const int32_t* positions, const Bf16* q_norm, const Bf16* k_norm,
                              float eps, const float* inv_freq, const int32_t* slot_mapping,
                              const KvCacheView& cache, Stream stream) {
  if (!SupportedHeadDim(shape.head_dim)) {
    return Bad("QkNormRopeAppend",
               absl::StrCat("head_dim ", shape.head_dim, " not in {32,64,128,256}"));
  }
  if (n < 0 || shape.num_q_heads <= 0 || shape.num_kv_heads <= 0 ||
      row_stride < (shape.num_q_heads + 2 * shape.num_kv_heads) * shape.head_dim) {
    return Bad("QkNormRopeAppend", "bad shape or row stride");
  }
  if (cache.head_dim != shape.head_dim || cache.num_kv_heads != shape.num_kv_heads ||
      cache.block_size <= 0 || cache.num_blocks <= 0) {
    return Bad("QkNormRopeAppend", "cache shape does not match the heads");
  }
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return Bad("QkNormRopeAppend", "q_norm and k_norm must both be given or both be null");
  }
  if (n > 0 && (!qkv || !positions || !inv_freq || !slot_mapping || !cache.k || !cache.v)) {
    return Bad("QkNormRopeAppend", "null pointer");
  }
  if (n > 0 && (row_stride % 8 || !Aligned16(qkv) || !Aligned16(cache.v))) {
    return Bad("QkNormRopeAppend",
               "qkv and the V cache must be 16-byte aligned, row stride a multiple of 8");
  }
  return CudaStatus(
      internal::LaunchQkNormRopeAppend(qkv, n, row_stride, shape, positions, q_norm, k_norm, eps,
                                       inv_freq, slot_mapping, cache, stream),
      "QkNormRopeAppend");
}

absl::Status KvAppend(const Bf16* qkv, int n, int row_stride, int k_offset, int v_offset,
                      const int32_t* slot_mapping, const KvCacheView& cache, Stream stream) {
  if (!SupportedHeadDim(cache.head_dim) || cache.block_size <= 0 || cache.num_kv_heads <= 0 ||
      cache.num_blocks <= 0) {
    return Bad("KvAppend", "bad cache shape");
  }
  const int kv = cache.num_kv_heads * cache.head_dim;
  if (n < 0 || row_stride % 8 || k_offset % 8 || v_offset % 8 || k_offset < 0 || v_offset < 0 ||
      k_offset + kv > row_stride || v_offset + kv > row_stride) {
    return Bad("KvAppend", "row stride and offsets must be multiples of 8 inside the row");
  }
  if (n > 0 && (!Aligned16(qkv) || !Aligned16(cache.k) || !Aligned16(cache.v) || !slot_mapping)) {
    return Bad("KvAppend", "buffers must be 16-byte aligned and non-null");
  }
  return CudaStatus(
      internal::LaunchKvAppend(qkv, n, row_stride, k_offset, v_offset, slot_mapping, cache, stream),
      "KvAppend");
}

absl::Status SiluMul(const Bf16* gu, int n, int inter, Bf16* out, Stream stream) {
  if (n < 0 || inter <= 0 || inter % 8) return Bad("SiluMul", "bad shape");
  if (n > 0 && (!gu || !out)) return Bad("SiluMul", "null pointer");
  if (n > 0 && (!Aligned16(gu) || !Aligned16(out)))
    return Bad("SiluMul", "buffers must be 16-byte aligned");
  return CudaStatus(internal::LaunchSiluMul(gu, n, inter, out, stream), "SiluMul");
}

absl::Status PrefetchL2(const L2Regions& regions, int ctas, Stream stream) {
  if (regions.count < 0 || regions.count > kMaxL2Regions) return Bad("PrefetchL2", "bad count");
  if (ctas < 1 || ctas > 1024) return Bad("PrefetchL2", "ctas must be in [1, 1024]");
  for (int i = 0; i < regions.count; ++i) {
    if (regions.bytes[i] == 0) continue;
    if (regions.data[i] == nullptr) return Bad("PrefetchL2", "null pointer");
    if (!Aligned16(regions.data[i]) || regions.bytes[i] % 16 != 0) {
      return Bad("PrefetchL2", "regions must be 16-byte aligned multiples of 16 bytes");
    }
  }
  return CudaStatus(internal::LaunchPrefetchL2(regions, ctas, stream), "PrefetchL2");
}

absl::Status FeedTokens(int32_t* tokens, const int32_t* feed, const int32_t* sampled, int n,
                        Stream stream) {
  if (n < 0) return Bad("FeedTokens", "bad shape");
  if (n > 0 && (!tokens || !feed || !sampled)) return Bad("FeedTokens", "null pointer");
  return CudaStatus(internal::LaunchFeedTokens(tokens, feed, sampled, n, stream), "FeedTokens");
}

absl::Status GatherRows(const Bf16* in, const int32_t* rows, int n, int d, Bf16* out,
                        Stream stream) {
  if (n < 0 || d <= 0) return Bad("GatherRows", "bad shape");
  if (n > 0 && (!in || !rows || !out)) return Bad("GatherRows", "null pointer");
  return CudaStatus(internal::LaunchGatherRows(in, rows, n, d, out, stream), "GatherRows");
}

absl::Status CopyKvBlocks(void* const* parts, int num_parts, const KvBlockList& blocks, int n,
                          int64_t part_bytes, void* stage, bool to_stage, Stream stream) {
  if (n < 1 || n > kMaxKvBlocksPerCopy || num_parts < 1 || part_bytes <= 0 || part_bytes % 16) {
    return Bad("CopyKvBlocks", absl::StrCat("bad shape: n ", n, ", parts ", num_parts,
                                            ", part_bytes ", part_bytes));
  }
  if (!parts || !stage || !Aligned16(stage))
    return Bad("CopyKvBlocks", "null or unaligned pointer");
  return CudaStatus(
      internal::LaunchKvBlockCopy(parts, num_parts, blocks, n, part_bytes, stage, to_stage, stream),
      "CopyKvBlocks");
}

absl::Status SampleRows(const float* logits, int n, int vocab, const RowSampleParams* params,
                        const int32_t* penalty_tokens, const int32_t* penalty_counts,
                        const float* penalty_bias, int32_t* out, engine::RowLogprobs* logprobs,
                        Stream stream, bool score_rows) {
  if (n < 0 || vocab <= 0) return Bad("SampleRows", "bad shape");
  if (n > 0 && (!logits || !params || !out)) return Bad("SampleRows", "null pointer");
  if (n > 0 && vocab % 4 == 0 && !Aligned16(logits)) {
    return Bad("SampleRows", "logits must be 16-byte aligned");
  }
  return CudaStatus(
      internal::LaunchSampleRows(logits, n, vocab, params, penalty_tokens, penalty_counts,
                                 penalty_bias, out, logprobs, score_rows, stream),
      "SampleRows");
}

absl::Status CountGumbelBoundViolations(unsigned long long* violations, Stream stream) {
  if (!violations) return Bad("CountGumbelBoundViolations", "null pointer");
  return CudaStatus(internal::LaunchGumbelBoundCheck(violations, stream),
                    "CountGumbelBoundViolations");
}

absl::Status SmallGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, bool f32_out,
                       Stream stream, int splits) {
  if (m < 0 || m > 16 || n <= 0 || k <= 0 || n % 8 || splits < 1 || k % (64 * splits)) {
    return Bad("SmallGemm",
               absl::StrCat("bad shape m=", m, " n=", n, " k=", k, " splits=", splits));
  }
  if (splits > 1 && !f32_out) return Bad("SmallGemm", "split partials are f32");
  if (m > 0 && (!x || !w || !y)) return Bad("SmallGemm", "null pointer");
  return CudaStatus(internal::LaunchSmallGemm(x, w, m, n, k, splits, y, f32_out, stream),
                    "SmallGemm");
}

namespace {

absl::Status RunDecodeGemm(const char* op, const Bf16* x, const Bf16* w, int m, int n, int k,
                           void* y, internal::DecodeGemmOut out, Stream stream, int cols_per_cta,
                           int stages, int splits = 1) {
  const int j = cols_per_cta / 8;
  if (splits < 1 || splits > 64 || (splits > 1 && out != internal::DecodeGemmOut::kF32)) {
    return Bad(op, absl::StrCat("splits=", splits, ": 1, or up to 64 with f32 partials"));
  }
  if (m < 0 || m > 64 || n <= 0 || k <= 0 || k % (128 * splits) || n % 8 || cols_per_cta % 8 ||
      (j != 0 && j != 1 && j != 2 && j != 4) || (j != 0 && n % cols_per_cta) ||
      (stages != 0 && stages != 4 && stages != 8 && stages != 16)) {
    return Bad(op, absl::StrCat("bad shape m=", m, " n=", n, " k=", k,
                                " cols_per_cta=", cols_per_cta, " stages=", stages));
  }
  if (m > 0 && (!x || !w || !y)) return Bad(op, "null pointer");
  if (m > 0 && (!Aligned16(x) || !Aligned16(w) || !Aligned16(y))) {
    return Bad(op, "pointers must be 16-byte aligned");
  }
  const internal::DecodeGemmShape pick = internal::DecodeGemmPick(m, n, k / splits);
  internal::DecodeGemmShape shape;
  shape.j = j != 0 ? j : pick.j;
  shape.stages = stages != 0 ? stages : pick.stages;
  if (out == internal::DecodeGemmOut::kSiluMul && (shape.j == 1 || n % 16 != 0)) {
    return Bad(
        op, absl::StrCat("a CTA of ", 8 * shape.j,
                         " features cannot hold gate and up blocks (16 or 32 needed; n=", n, ")"));
  }
  if (internal::DecodeGemmSmemBytes(m, shape) > (227u << 10)) {
    return Bad(op, absl::StrCat(stages, " stages of ", cols_per_cta,
                                " features do not fit a CTA's shared memory at m=", m));
  }
  const cudaError_t err = internal::LaunchDecodeGemm(x, w, m, n, k, y, out, shape, stream, splits);
  if (err == cudaErrorNotSupported) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": this GPU has no wgmma (sm_90a) machine code"));
  }
  return CudaStatus(err, op);
}

}  // namespace

absl::Status DecodeGemm(const Bf16* x, const Bf16* w, int m, int n, int k, void* y, bool f32_out,
                        Stream stream, int cols_per_cta, int stages, int splits) {
  return RunDecodeGemm("DecodeGemm", x, w, m, n, k, y,
                       f32_out ? internal::DecodeGemmOut::kF32 : internal::DecodeGemmOut::kBf16,
                       stream, cols_per_cta, stages, splits);
}

absl::Status DecodeGemmSiluMul(const Bf16* x, const Bf16* w_gate_up, int m, int n, int k, Bf16* act,
                               Stream stream, int cols_per_cta, int stages) {
  return RunDecodeGemm("DecodeGemmSiluMul", x, w_gate_up, m, n, k, act,
                       internal::DecodeGemmOut::kSiluMul, stream, cols_per_cta, stages);
}

absl::Status SplitReduce(const float* partials, int splits, int m, int n, void* y, bool f32_out,
                         Stream stream) {
  const int64_t count = static_cast<int64_t>(m) * n;
  if (m < 0 || n <= 0 || splits < 1 || count % 4) {
    return Bad("SplitReduce", absl::StrCat("bad shape m=", m, " n=", n, " splits=", splits));
  }
  if (count > 0 && (!partials || !y)) return Bad("SplitReduce", "null pointer");
  if (!Aligned16(partials) || !Aligned16(y)) return Bad("SplitReduce", "unaligned pointer");
  return CudaStatus(internal::LaunchSplitReduce(partials, splits, count, y, f32_out, stream),
                    "SplitReduce");
}

absl::Status ArgmaxRows(const float* logits, int n, int vocab, int32_t* out, Stream stream) {
  if (n < 0 || vocab <= 0) return Bad("ArgmaxRows", "bad shape");
  if (n > 0 && (!logits || !out)) return Bad("ArgmaxRows", "null pointer");
  return CudaStatus(internal::LaunchArgmaxRows(logits, n, vocab, out, stream), "ArgmaxRows");
}

absl::StatusOr<int> SplitCtasPerWave(int head_dim, int num_kv_heads, int split_form) {
  if (!SupportedHeadDim(head_dim) || num_kv_heads <= 0) return Bad("SplitCtasPerWave", "bad shape");
  int ctas = 0;
  absl::Status st = CudaStatus(
      internal::SplitCtasPerWave(head_dim, num_kv_heads, split_form, &ctas), "SplitCtasPerWave");
  if (!st.ok()) return st;
  return ctas;
}

absl::Status Attention(const AttentionArgs& args, const AttentionPlanView& plan, Stream stream) {
  const KvCacheView& c = args.cache;
  if (!SupportedHeadDim(c.head_dim)) {
    return Bad("Attention", absl::StrCat("head_dim ", c.head_dim, " not in {32,64,128,256}"));
  }
  if (c.num_kv_heads <= 0 || args.num_q_heads <= 0 || args.num_q_heads % c.num_kv_heads != 0) {
    return Bad("Attention", "num_q_heads must be a positive multiple of num_kv_heads");
  }
  if (c.block_size <= 0 || kTileTokens % c.block_size != 0) {
    return Bad("Attention", absl::StrCat("block_size must divide ", kTileTokens));
  }
  if (c.num_blocks * c.num_kv_heads * c.block_size > INT32_MAX) {  // 32-bit cache row index
    return Bad("Attention", "KV cache has more than 2^31 (block, head, slot) rows");
  }
  if (args.q_row_stride < args.num_q_heads * c.head_dim || args.q_row_stride % 8 != 0 ||
      !Aligned16(args.q) || !Aligned16(c.k) || !Aligned16(c.v)) {
    return Bad("Attention",
               "q row stride must cover the heads, be a multiple of 8, and buffers "
               "16-byte aligned");
  }
  const int group = args.num_q_heads / c.num_kv_heads;
  if (group > kMaxQueriesPerCta || plan.max_split_rows * group > kMaxQueriesPerCta ||
      plan.max_final_rows * group > PrefillQueriesPerCta(c.head_dim)) {
    return Bad("Attention",
               absl::StrCat("plan has more queries per CTA than the kernel supports ",
                            "(GQA group ", group, " of at most ", kMaxQueriesPerCta, ")"));
  }
  if (plan.num_split > 0 && (!args.partial_o || !args.partial_ml || !plan.partial_base)) {
    return Bad("Attention", "split items need the partial workspace");
  }
  if (plan.super_tiles < 1 || (plan.super_tiles > 1 && c.head_dim != 128)) {
    return Bad("Attention", absl::StrCat("super_tiles ", plan.super_tiles,
                                         ": the two-level fold order runs at head_dim 128 only"));
  }
  const bool graph = plan.split_count != nullptr;
  if (plan.num_wide < 0 || (!graph && plan.num_wide > plan.num_split) ||
      (graph && plan.num_wide > 0 && (!plan.wide_items || !plan.wide_count))) {
    return Bad("Attention", absl::StrCat("num_wide ", plan.num_wide, " outside [0, num_split ",
                                         plan.num_split, "] or without its graph-mode arrays"));
  }
  if (plan.wide_sched != nullptr && plan.wide_ctas < 1) {
    return Bad("Attention", absl::StrCat("wide_sched given with wide_ctas ", plan.wide_ctas,
                                         " (the schedule's CTAs, >= 1)"));
  }
  if (plan.num_wide > 0) {
    absl::StatusOr<int> wide_rows = WideCascadeRows(c.head_dim, group, c.block_size);
    if (!wide_rows.ok()) return wide_rows.status();
    if (*wide_rows == 0) {
      return Bad("Attention",
                 "wide cascade items need head_dim 128, a GQA group <= 8, blocks of a multiple of "
                 "16 tokens and a compute capability 9.0 GPU (WideCascadeRows)");
    }
  }
  if (plan.num_split > 0 && AttentionPlanView::OnPersistentDecode(plan.split_form) &&
      plan.ws_work == nullptr) {
    return Bad("Attention",
               "split forms 3 and 6 (the persistent decode kernel) need the work counter");
  }
  if (!args.out || !args.positions || !args.block_ids) return Bad("Attention", "null pointer");
  if (args.prefill_path == PrefillPath::kWgmma && plan.num_final > 0) {
    constexpr char kNeeds[] =
        "Attention: the wgmma prefill kernel needs head_dim 128 on a compute capability 9.0 GPU "
        "(H100, H200); use PrefillPath::kAuto";
    if (c.head_dim != 128) return absl::FailedPreconditionError(kNeeds);
    absl::StatusOr<bool> wgmma = WgmmaPrefillAvailable();
    if (!wgmma.ok()) return wgmma.status();
    if (!*wgmma) return absl::FailedPreconditionError(kNeeds);
  }
  return CudaStatus(internal::LaunchAttention(args, plan, stream), "Attention");
}

absl::StatusOr<bool> WgmmaPrefillAvailable() {
  bool available = false;
  absl::Status st = CudaStatus(internal::WgmmaAvailable(&available), "WgmmaPrefillAvailable");
  if (!st.ok()) return st;
  return available;
}

absl::StatusOr<int> PersistentDecodeCtas(int head_dim, int group, int block_size) {
  absl::StatusOr<bool> hopper = WgmmaPrefillAvailable();
  if (!hopper.ok()) return hopper.status();
  if (!*hopper || head_dim != 128 || group > 8 || block_size % 16 != 0) return 0;
  int device = 0, sms = 0;
  absl::Status st = CudaStatus(cudaGetDevice(&device), "PersistentDecodeCtas");
  if (st.ok()) {
    st = CudaStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                    "PersistentDecodeCtas");
  }
  if (!st.ok()) return st;
  return sms;
}

absl::StatusOr<int> SuperTilesFor(int head_dim, int block_size) {
  absl::StatusOr<bool> hopper = WgmmaPrefillAvailable();
  if (!hopper.ok()) return hopper.status();
  return *hopper && head_dim == 128 && block_size % 16 == 0 ? kSuperTiles : 1;
}

absl::StatusOr<int> WideCascadeRows(int head_dim, int group, int block_size) {
  // Wide items run where the persistent kernels do (the same Hopper, shape and block conditions).
  absl::StatusOr<int> ctas = PersistentDecodeCtas(head_dim, group, block_size);
  if (!ctas.ok()) return ctas.status();
  return *ctas > 0 && group >= 1 ? PrefillQueriesPerCta(head_dim) / group : 0;
}

}  // namespace cascade::cuda
