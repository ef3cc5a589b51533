// engine::Backend on one GPU: schedule-free forward of a ForwardBatch through the Qwen3/Llama
// decoder with bf16 weights, a float32 residual stream, and the kernels of ops.h / attention.h.
#include "gpu_worker/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cuda/attention.h"
#include "gpu_worker/backend/cuda/device.h"
#include "gpu_worker/backend/cuda/gemm.h"
#include "gpu_worker/backend/cuda/ops.h"

namespace cascade::cuda {
namespace {

#define RETURN_IF_ERROR(expr)              \
  do {                                     \
    absl::Status _st = (expr);             \
    if (!_st.ok()) return _st;             \
  } while (0)
#define ASSIGN_OR_RETURN(lhs, expr)        \
  auto lhs##_or = (expr);                  \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = std::move(*lhs##_or)

// HF's inverse frequencies (double, rounded to float once), with Llama-3 scaling if configured.
std::vector<float> InvFreq(const model::ModelConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<float> out(d / 2);
  const model::RopeScaling& s = c.rope_scaling;
  for (int64_t i = 0; i < d / 2; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    if (s.enabled) {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > old_len / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelen >= old_len / s.high_freq_factor) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

// Appends tensor `name` as bf16 bits to `out`.
absl::Status AppendBf16(const model::Model& m, const std::string& name, std::vector<uint16_t>* out) {
  const model::TensorView* t = m.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("cuda backend: missing tensor ", name));
  const size_t n = static_cast<size_t>(t->numel()), at = out->size();
  out->resize(at + n);
  if (t->dtype == model::DType::kBF16) {
    std::memcpy(out->data() + at, t->data, n * 2);
  } else {
    std::vector<float> f(n);
    model::ToFloat32(*t, f.data());
    for (size_t i = 0; i < n; ++i) (*out)[at + i] = model::FloatToBf16(f[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> UploadBf16(const model::Model& m,
                                        const std::vector<std::string>& names) {
  std::vector<uint16_t> host;
  for (const std::string& n : names) RETURN_IF_ERROR(AppendBf16(m, n, &host));
  ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(host.size() * 2));
  RETURN_IF_ERROR(CopyToDevice(buf.data(), host.data(), host.size() * 2));
  return buf;
}

struct Layer {
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;
  DeviceBuffer wqkv;  // [(hq + 2 hkv) D, H]: q, k, v projections stacked
  DeviceBuffer wo;    // [H, hq D]
  DeviceBuffer wgu;   // [2 I, H]: gate then up
  DeviceBuffer wd;    // [H, I]
  DeviceBuffer k_cache, v_cache;
};

class CudaBackend final : public engine::Backend {
 public:
  CudaBackend(const model::ModelConfig& c, const CudaBackendOptions& o) : c_(c), o_(o) {}
  ~CudaBackend() override {
    if (stream_ != nullptr) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_));
  }

  absl::Status Init(const model::Model& m);

  std::string Name() const override { return "cuda"; }
  int64_t NumBlocks() const override { return num_blocks_; }
  int BlockSize() const override { return o_.block_size; }
  int VocabSize() const override { return static_cast<int>(c_.vocab_size); }
  absl::Status Forward(const engine::ForwardBatch& batch, std::vector<float>* logits) override {
    return Run(batch, /*sampled=*/false, logits, nullptr);
  }
  // Greedy rows are reduced to their argmax on the device: 4 bytes back instead of a
  // vocabulary-sized float32 row (608 KB for Qwen3), which made decode host-bound.
  absl::Status ForwardSampled(const engine::ForwardBatch& batch, std::vector<float>* logits,
                              std::vector<int32_t>* argmax) override {
    return Run(batch, /*sampled=*/true, logits, argmax);
  }

 private:
  absl::Status Check(const engine::ForwardBatch& b) const;
  absl::Status Run(const engine::ForwardBatch& b, bool sampled, std::vector<float>* logits,
                   std::vector<int32_t>* argmax);
  absl::Status EnsureCapacity(DeviceBuffer* buf, size_t bytes);

  // Set at construction.
  const model::ModelConfig c_;
  const CudaBackendOptions o_;
  int hq_ = 0, hkv_ = 0, d_ = 0, hidden_ = 0, inter_ = 0, qkv_cols_ = 0;
  int64_t num_blocks_ = 0;
  Stream stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::vector<Layer> layers_;
  DeviceBuffer embed_, final_norm_, lm_head_storage_;
  const Bf16* lm_head_ = nullptr;
  DeviceBuffer inv_freq_;
  // Activations, [max_num_tokens, ...].
  DeviceBuffer residual_, x_, qkv_, attn_, delta_, gu_, act_, xl_, logits_;
  // Grown on demand.
  DeviceBuffer meta_, partial_o_, partial_lse_, argmax_, sample_params_;
  std::vector<int32_t> argmax_host_;
  std::vector<RowSampleParams> sample_host_;
  std::vector<int32_t> meta_host_;
};

absl::Status CudaBackend::Init(const model::Model& m) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  cudaStream_t s;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"));
  stream_ = reinterpret_cast<Stream>(s);
  hq_ = static_cast<int>(c_.num_attention_heads);
  hkv_ = static_cast<int>(c_.num_key_value_heads);
  d_ = static_cast<int>(c_.head_dim);
  hidden_ = static_cast<int>(c_.hidden_size);
  inter_ = static_cast<int>(c_.intermediate_size);
  qkv_cols_ = (hq_ + 2 * hkv_) * d_;
  if (d_ != 32 && d_ != 64 && d_ != 128 && d_ != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: head_dim ", d_, " not supported (32, 64, 128, 256)"));
  }
  if (hidden_ % 8 || inter_ % 8 || c_.vocab_size % 8) {
    return absl::InvalidArgumentError("cuda backend: hidden, intermediate and vocab sizes must be "
                                      "multiples of 8");
  }
  ASSIGN_OR_RETURN(gemm, Gemm::Create(o_.batch_invariant));
  gemm_ = std::move(gemm);

  ASSIGN_OR_RETURN(embed, UploadBf16(m, {"model.embed_tokens.weight"}));
  embed_ = std::move(embed);
  ASSIGN_OR_RETURN(fnorm, UploadBf16(m, {"model.norm.weight"}));
  final_norm_ = std::move(fnorm);
  if (c_.tie_word_embeddings) {
    lm_head_ = embed_.as<Bf16>();
  } else {
    ASSIGN_OR_RETURN(head, UploadBf16(m, {"lm_head.weight"}));
    lm_head_storage_ = std::move(head);
    lm_head_ = lm_head_storage_.as<Bf16>();
  }
  std::vector<float> inv = InvFreq(c_);
  ASSIGN_OR_RETURN(inv_buf, DeviceBuffer::Allocate(inv.size() * 4));
  RETURN_IF_ERROR(CopyToDevice(inv_buf.data(), inv.data(), inv.size() * 4));
  inv_freq_ = std::move(inv_buf);

  for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
#define UPLOAD(field, ...)                                  \
  {                                                         \
    ASSIGN_OR_RETURN(buf_, UploadBf16(m, {__VA_ARGS__}));   \
    l.field = std::move(buf_);                              \
  }
    UPLOAD(input_norm, p + "input_layernorm.weight");
    UPLOAD(post_norm, p + "post_attention_layernorm.weight");
    if (c_.qk_norm()) {
      UPLOAD(q_norm, p + "self_attn.q_norm.weight");
      UPLOAD(k_norm, p + "self_attn.k_norm.weight");
    }
    UPLOAD(wqkv, p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
           p + "self_attn.v_proj.weight");
    UPLOAD(wo, p + "self_attn.o_proj.weight");
    UPLOAD(wgu, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight");
    UPLOAD(wd, p + "mlp.down_proj.weight");
#undef UPLOAD
    layers_.push_back(std::move(l));
  }

  const size_t t = o_.max_num_tokens;
  auto alloc = [](DeviceBuffer* b, size_t bytes) -> absl::Status {
    ASSIGN_OR_RETURN(buf, DeviceBuffer::Allocate(bytes));
    *b = std::move(buf);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(alloc(&residual_, t * hidden_ * 4));
  RETURN_IF_ERROR(alloc(&x_, t * hidden_ * 2));
  RETURN_IF_ERROR(alloc(&qkv_, t * qkv_cols_ * 2));
  RETURN_IF_ERROR(alloc(&attn_, t * hq_ * d_ * 2));
  RETURN_IF_ERROR(alloc(&delta_, t * hidden_ * 2));
  RETURN_IF_ERROR(alloc(&gu_, t * 2 * inter_ * 2));
  RETURN_IF_ERROR(alloc(&act_, t * inter_ * 2));
  RETURN_IF_ERROR(alloc(&xl_, static_cast<size_t>(o_.max_logits_rows) * hidden_ * 2));
  RETURN_IF_ERROR(alloc(&logits_, static_cast<size_t>(o_.max_logits_rows) * c_.vocab_size * 4));

  const size_t block_bytes = static_cast<size_t>(hkv_) * o_.block_size * d_ * 2;  // K or V
  num_blocks_ = o_.num_blocks;
  if (num_blocks_ == 0) {
    size_t free_b = 0, total_b = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
    num_blocks_ = static_cast<int64_t>(free_b * o_.kv_cache_fraction /
                                       (2.0 * block_bytes * c_.num_hidden_layers));
    if (num_blocks_ < 1) return absl::ResourceExhaustedError("cuda backend: no room for KV cache");
  }
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(alloc(&l.k_cache, num_blocks_ * block_bytes));
    RETURN_IF_ERROR(alloc(&l.v_cache, num_blocks_ * block_bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Check(const engine::ForwardBatch& b) const {
  const int n = b.num_tokens(), s = b.num_seqs();
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError("cuda backend: " + m); };
  if (n > o_.max_num_tokens) {
    return bad(absl::StrCat(n, " tokens exceed max_num_tokens ", o_.max_num_tokens));
  }
  if (static_cast<int>(b.positions.size()) != n || static_cast<int>(b.slot_mapping.size()) != n ||
      static_cast<int>(b.query_start.size()) != s + 1 ||
      static_cast<int>(b.block_table_start.size()) != s + 1) {
    return bad("batch vectors have inconsistent sizes");
  }
  for (int i = 0; i < s; ++i) {
    if (b.query_start[i + 1] < b.query_start[i] ||
        b.block_table_start[i + 1] < b.block_table_start[i]) {
      return bad("offsets must be non-decreasing");
    }
  }
  if (b.block_table_start[0] != 0 ||
      b.block_table_start[s] != static_cast<int32_t>(b.block_ids.size())) {
    return bad("block_table_start does not cover block_ids");
  }
  for (int32_t id : b.token_ids) {
    if (id < 0 || id >= c_.vocab_size) return bad(absl::StrCat("token id ", id, " out of range"));
  }
  for (int32_t blk : b.block_ids) {
    if (blk < 0 || blk >= num_blocks_) return bad(absl::StrCat("block id ", blk, " out of range"));
  }
  for (int32_t slot : b.slot_mapping) {
    if (slot >= num_blocks_ * o_.block_size) return bad(absl::StrCat("slot ", slot, " out of range"));
  }
  for (size_t i = 0; i < b.logits_rows.size(); ++i) {
    if (b.logits_rows[i] < 0 || b.logits_rows[i] >= n ||
        (i > 0 && b.logits_rows[i] <= b.logits_rows[i - 1])) {
      return bad("logits_rows must be ascending rows of the batch");
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::EnsureCapacity(DeviceBuffer* buf, size_t bytes) {
  if (buf->size() >= bytes) return absl::OkStatus();
  RETURN_IF_ERROR(Synchronize(stream_));  // the old buffer may still be in use
  ASSIGN_OR_RETURN(nb, DeviceBuffer::Allocate(std::max(bytes, buf->size() * 2)));
  *buf = std::move(nb);
  return absl::OkStatus();
}

absl::Status CudaBackend::Run(const engine::ForwardBatch& b, bool sampled,
                              std::vector<float>* logits, std::vector<int32_t>* argmax) {
  RETURN_IF_ERROR(Check(b));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o_.device), "cudaSetDevice"));
  const int n = b.num_tokens();
  auto on_device = [&](size_t r) {
    return sampled && !b.row_samples.empty() && b.row_samples[r].on_device;
  };
  size_t full_rows = 0;
  for (size_t r = 0; r < b.logits_rows.size(); ++r) full_rows += on_device(r) ? 0 : 1;
  logits->resize(full_rows * c_.vocab_size);
  if (sampled) argmax->assign(b.logits_rows.size(), -1);
  if (n == 0) return absl::OkStatus();

  AttentionConfig acfg{hq_, hkv_, d_, o_.block_size, o_.cascade};
  AttentionBatch ab{b.positions.data(),         n,
                    b.query_start.data(),       b.context_lens.data(),
                    b.block_table_start.data(), b.block_ids.data(),
                    b.num_seqs()};
  AttentionPlan plan;
  RETURN_IF_ERROR(PlanAttention(acfg, ab, &plan));

  // All int32 metadata in one upload; segments 16-byte aligned.
  meta_host_.clear();
  auto put = [&](const std::vector<int32_t>& v) {
    const size_t at = meta_host_.size();
    meta_host_.insert(meta_host_.end(), v.begin(), v.end());
    meta_host_.resize((meta_host_.size() + 3) / 4 * 4);
    return at;
  };
  const size_t o_tok = put(b.token_ids), o_pos = put(b.positions), o_slot = put(b.slot_mapping);
  const size_t o_blk = put(b.block_ids), o_fi = put(plan.final_items), o_si = put(plan.split_items);
  const size_t o_rows = put(plan.item_rows), o_base = put(plan.partial_base);
  const size_t o_merge = put(plan.merge_list), o_lrows = put(b.logits_rows);
  RETURN_IF_ERROR(EnsureCapacity(&meta_, meta_host_.size() * 4));
  RETURN_IF_ERROR(EnsureCapacity(&partial_o_, std::max(1, plan.num_partials) * size_t{4} * hq_ * d_));
  RETURN_IF_ERROR(EnsureCapacity(&partial_lse_, std::max(1, plan.num_partials) * size_t{4} * hq_));
  RETURN_IF_ERROR(CopyAsync(meta_.data(), meta_host_.data(), meta_host_.size() * 4, stream_));
  const int32_t* meta = meta_.as<int32_t>();

  AttentionPlanView view{meta + o_fi,    plan.num_final(),  meta + o_si,
                         plan.num_split(), meta + o_rows,   meta + o_base,
                         meta + o_merge, plan.num_merge(),  plan.max_final_rows,
                         plan.max_split_rows};
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const Bf16* x = x_.as<Bf16>();
  Bf16* xm = x_.as<Bf16>();
  float* res = residual_.as<float>();

  RETURN_IF_ERROR(EmbeddingGather(embed_.as<Bf16>(), meta + o_tok, n, hidden_, res, stream_));
  const Bf16* pending = nullptr;  // delta not yet added to the residual
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(AddRmsNorm(res, pending, l.input_norm.as<Bf16>(), eps, n, hidden_, xm, stream_));
    RETURN_IF_ERROR(gemm_->Run(x, l.wqkv.as<Bf16>(), n, qkv_cols_, hidden_, qkv_.data(),
                               GemmOut::kBf16, stream_));
    RETURN_IF_ERROR(QkNormRope(qkv_.as<Bf16>(), n, qkv_cols_, HeadShape{hq_, hkv_, d_}, meta + o_pos,
                               c_.qk_norm() ? l.q_norm.as<Bf16>() : nullptr,
                               c_.qk_norm() ? l.k_norm.as<Bf16>() : nullptr, eps,
                               inv_freq_.as<float>(), stream_));
    KvCacheView cache{l.k_cache.as<Bf16>(), l.v_cache.as<Bf16>(), num_blocks_, o_.block_size, hkv_,
                      d_};
    RETURN_IF_ERROR(KvAppend(qkv_.as<Bf16>(), n, qkv_cols_, hq_ * d_, (hq_ + hkv_) * d_,
                             meta + o_slot, cache, stream_));
    AttentionArgs args{qkv_.as<Bf16>(), qkv_cols_, cache, meta + o_pos, meta + o_blk,
                       attn_.as<Bf16>(), partial_o_.as<float>(), partial_lse_.as<float>(),
                       1.f / std::sqrt(static_cast<float>(d_)), hq_};
    RETURN_IF_ERROR(Attention(args, view, stream_));
    RETURN_IF_ERROR(gemm_->Run(attn_.as<Bf16>(), l.wo.as<Bf16>(), n, hidden_, hq_ * d_,
                               delta_.data(), GemmOut::kBf16, stream_));
    RETURN_IF_ERROR(AddRmsNorm(res, delta_.as<Bf16>(), l.post_norm.as<Bf16>(), eps, n, hidden_, xm,
                               stream_));
    RETURN_IF_ERROR(gemm_->Run(x, l.wgu.as<Bf16>(), n, 2 * inter_, hidden_, gu_.data(),
                               GemmOut::kBf16, stream_));
    RETURN_IF_ERROR(SiluMul(gu_.as<Bf16>(), n, inter_, act_.as<Bf16>(), stream_));
    RETURN_IF_ERROR(gemm_->Run(act_.as<Bf16>(), l.wd.as<Bf16>(), n, hidden_, inter_, delta_.data(),
                               GemmOut::kBf16, stream_));
    pending = delta_.as<Bf16>();
  }
  RETURN_IF_ERROR(AddRmsNorm(res, pending, final_norm_.as<Bf16>(), eps, n, hidden_, xm, stream_));

  const int rows = static_cast<int>(b.logits_rows.size());
  const int64_t vocab = c_.vocab_size;
  if (sampled) {
    RETURN_IF_ERROR(EnsureCapacity(&argmax_, std::max(rows, 1) * sizeof(int32_t)));
    sample_host_.assign(rows, RowSampleParams{});
    for (int r = 0; r < rows && !b.row_samples.empty(); ++r) {
      const engine::RowSample& s = b.row_samples[r];
      sample_host_[r] = RowSampleParams{s.temperature, s.seed, s.position};
    }
    RETURN_IF_ERROR(EnsureCapacity(&sample_params_, std::max(rows, 1) * sizeof(RowSampleParams)));
    RETURN_IF_ERROR(CopyAsync(sample_params_.data(), sample_host_.data(),
                              rows * sizeof(RowSampleParams), stream_));
  }
  size_t full_done = 0;
  for (int r0 = 0; r0 < rows; r0 += o_.max_logits_rows) {
    const int m = std::min(o_.max_logits_rows, rows - r0);
    RETURN_IF_ERROR(GatherRows(x, meta + o_lrows + r0, m, hidden_, xl_.as<Bf16>(), stream_));
    RETURN_IF_ERROR(gemm_->Run(xl_.as<Bf16>(), lm_head_, m, static_cast<int>(vocab), hidden_,
                               logits_.data(), GemmOut::kF32, stream_));
    if (sampled) {
      // Greedy and temperature rows are drawn on the device (RowSample); the per-row
      // parameters ride in the same upload as the rest of the step's metadata.
      RETURN_IF_ERROR(SampleRows(logits_.as<float>(), m, static_cast<int>(vocab),
                                 sample_params_.as<RowSampleParams>() + r0,
                                 argmax_.as<int32_t>() + r0, stream_));
    }
    // Whole rows only where the caller samples on the host; runs of them copy in one go.
    for (int i = 0; i < m;) {
      if (on_device(r0 + i)) {
        ++i;
        continue;
      }
      int j = i;
      while (j < m && !on_device(r0 + j)) ++j;
      RETURN_IF_ERROR(CopyAsync(logits->data() + full_done * vocab,
                                logits_.as<float>() + static_cast<int64_t>(i) * vocab,
                                (j - i) * vocab * 4, stream_));
      full_done += j - i;
      i = j;
    }
    RETURN_IF_ERROR(Synchronize(stream_));  // logits_ is reused by the next chunk of rows
  }
  if (sampled && rows > 0) {
    argmax_host_.resize(rows);
    RETURN_IF_ERROR(CopyAsync(argmax_host_.data(), argmax_.data(), rows * sizeof(int32_t), stream_));
    RETURN_IF_ERROR(Synchronize(stream_));
    for (int r = 0; r < rows; ++r) {
      if (on_device(r)) (*argmax)[r] = argmax_host_[r];
    }
  }
  return Synchronize(stream_);
}

}  // namespace

absl::Status ValidateCudaBackendOptions(const CudaBackendOptions& o) {
  if (o.block_size <= 0 || kTileTokens % o.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: block_size ", o.block_size, " must divide ", kTileTokens));
  }
  if (o.num_blocks < 0 || o.max_num_tokens <= 0 || o.max_logits_rows <= 0 ||
      !(o.kv_cache_fraction > 0 && o.kv_cache_fraction < 1) || o.device < 0) {
    return absl::InvalidArgumentError("cuda backend: bad options");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<engine::Backend>> NewCudaBackend(const model::Model& model,
                                                                const CudaBackendOptions& options) {
  RETURN_IF_ERROR(ValidateCudaBackendOptions(options));
  if (DeviceCount() == 0) return absl::UnavailableError("cuda backend: no CUDA device");
  auto b = std::make_unique<CudaBackend>(model.config(), options);
  RETURN_IF_ERROR(b->Init(model));
  return std::unique_ptr<engine::Backend>(std::move(b));
}

}  // namespace cascade::cuda
