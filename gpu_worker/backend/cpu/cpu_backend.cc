// The CPU backend's forward pass. Parallel sections split only independent outputs (matmul
// output columns, attention (row, head) pairs); every reduction runs in one fixed order, so a
// row's result never depends on the batch around it or on whether its keys came from the cache.
#include "gpu_worker/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gpu_worker/backend/cpu/kernels.h"
#include "gpu_worker/backend/cpu/thread_pool.h"

namespace cascade::cpu {
namespace {

using engine::ForwardBatch;
using model::ModelConfig;

// float32 copy of a tensor (which LoadModel() validated).
std::vector<float> F32(const model::Model& m, const std::string& name) {
  const model::TensorView* t = m.Find(name);
  std::vector<float> out(static_cast<size_t>(t->numel()));
  model::ToFloat32(*t, out.data());
  return out;
}

// A weight matrix [rows, cols]. Kept as the checkpoint's bf16 bits when it is bf16, widened
// exactly to float32 while multiplying (same arithmetic, half the memory traffic); float32
// otherwise. Exactly one of the two vectors is non-empty.
struct Matrix {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

// Row-wise concatenation of the named [rows_i, cols] tensors (fused projections).
Matrix LoadMatrix(const model::Model& m, const std::vector<std::string>& names) {
  bool all_bf16 = true;
  for (const std::string& n : names) all_bf16 = all_bf16 && m.Find(n)->dtype == model::DType::kBF16;
  Matrix out;
  for (const std::string& n : names) {
    const model::TensorView* t = m.Find(n);
    if (all_bf16) {
      const size_t old = out.bf16.size();
      out.bf16.resize(old + t->numel());
      std::memcpy(out.bf16.data() + old, t->data, t->nbytes);
    } else {
      const size_t old = out.f32.size();
      out.f32.resize(old + t->numel());
      model::ToFloat32(*t, out.f32.data() + old);
    }
  }
  return out;
}

struct Layer {
  std::vector<float> input_norm;  // [hidden]
  Matrix qkv;                     // [(heads + 2 * kv_heads) * head_dim, hidden]: q, k, v rows
  std::vector<float> q_norm;      // [head_dim] (qwen3 only)
  std::vector<float> k_norm;      // [head_dim] (qwen3 only)
  Matrix o;                       // [hidden, heads * head_dim]
  std::vector<float> post_norm;   // [hidden]
  Matrix gate_up;                 // [2 * intermediate, hidden]: gate rows, then up rows
  Matrix down;                    // [hidden, intermediate]
};

class CpuBackend final : public engine::Backend {
 public:
  CpuBackend(const model::Model& m, const CpuBackendOptions& options)
      : config_(m.config()),
        options_(options),
        pool_(options.num_threads > 0
                  ? options.num_threads
                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        inv_freq_(RopeInvFreq(config_)) {
    set_speculative(options.speculative_launch);
    const ModelConfig& c = config_;
    embed_ = LoadMatrix(m, {"model.embed_tokens.weight"});
    if (!c.tie_word_embeddings) lm_head_ = LoadMatrix(m, {"lm_head.weight"});
    final_norm_ = F32(m, "model.norm.weight");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      Layer l;
      l.input_norm = F32(m, p + "input_layernorm.weight");
      l.qkv = LoadMatrix(m, {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                             p + "self_attn.v_proj.weight"});
      if (c.qk_norm()) {
        l.q_norm = F32(m, p + "self_attn.q_norm.weight");
        l.k_norm = F32(m, p + "self_attn.k_norm.weight");
      }
      l.o = LoadMatrix(m, {p + "self_attn.o_proj.weight"});
      l.post_norm = F32(m, p + "post_attention_layernorm.weight");
      l.gate_up = LoadMatrix(m, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
      l.down = LoadMatrix(m, {p + "mlp.down_proj.weight"});
      layers_.push_back(std::move(l));
    }
    const size_t per_layer =
        static_cast<size_t>(options.num_blocks) * options.block_size * c.kv_size();
    k_cache_.assign(per_layer * c.num_hidden_layers, 0.0f);
    v_cache_.assign(per_layer * c.num_hidden_layers, 0.0f);
  }

  std::string Name() const override { return "cpu"; }
  int64_t NumBlocks() const override { return options_.num_blocks; }
  int BlockSize() const override { return options_.block_size; }
  int VocabSize() const override { return static_cast<int>(config_.vocab_size); }

  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;

  // Host copy of a block: [layer][K, V][block_size, kv_heads, head_dim] float32. Copies are
  // plain memcpy, done when the call returns.
  int64_t KvBlockBytes() const override {
    return 2 * config_.num_hidden_layers * BlockFloats() * int64_t{sizeof(float)};
  }
  absl::Status CopyBlocksToHost(std::span<const engine::BlockCopy> copies) override {
    return CopyBlocks(copies, /*to_host=*/true);
  }
  absl::Status CopyBlocksFromHost(std::span<const engine::BlockCopy> copies) override {
    return CopyBlocks(copies, /*to_host=*/false);
  }

 private:
  // Floats of one block in one layer's K (or V) cache.
  int64_t BlockFloats() const { return int64_t{options_.block_size} * config_.kv_size(); }
  absl::Status CopyBlocks(std::span<const engine::BlockCopy> copies, bool to_host) {
    if (absl::Status s = engine::ValidateBlockCopies(copies, options_.num_blocks); !s.ok())
      return s;
    const int64_t n = BlockFloats(), layer_floats = options_.num_blocks * n;
    for (const engine::BlockCopy& c : copies) {
      auto* host = reinterpret_cast<float*>(c.host);
      for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
        float* k = k_cache_.data() + l * layer_floats + c.block * n;
        float* v = v_cache_.data() + l * layer_floats + c.block * n;
        float* hk = host + 2 * l * n;
        float* hv = hk + n;
        if (to_host) {
          std::memcpy(hk, k, n * sizeof(float));
          std::memcpy(hv, v, n * sizeof(float));
        } else {
          std::memcpy(k, hk, n * sizeof(float));
          std::memcpy(v, hv, n * sizeof(float));
        }
      }
    }
    return absl::OkStatus();
  }

  // y[rows, n] = x[rows, k] . w[n, k]^T, split over output columns.
  void MatMul(const float* x, int64_t rows, int64_t k, const Matrix& w, int64_t n, float* y) {
    pool_.ParallelFor(n, 16, [&](int64_t j0, int64_t j1) {
      if (w.bf16.empty()) {
        MatMulRange(x, rows, k, w.f32.data(), j0, j1, y, n);
      } else {
        MatMulRangeBf16(x, rows, k, w.bf16.data(), j0, j1, y, n);
      }
    });
  }
  // out[hidden] = embedding row of `token`.
  void Embed(int32_t token, float* out) const {
    const int64_t h = config_.hidden_size, base = int64_t{token} * h;
    if (embed_.bf16.empty()) {
      std::copy_n(embed_.f32.data() + base, h, out);
    } else {
      for (int64_t i = 0; i < h; ++i) out[i] = model::Bf16ToFloat(embed_.bf16[base + i]);
    }
  }
  void Attention(const ForwardBatch& b, int64_t layer);

  // Set at construction.
  const ModelConfig config_;
  const CpuBackendOptions options_;
  ThreadPool pool_;
  const std::vector<double> inv_freq_;  // [head_dim / 2]
  Matrix embed_;                        // [vocab, hidden]
  Matrix lm_head_;                      // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;       // [hidden]
  std::vector<Layer> layers_;

  // KV cache, each [layers][num_blocks * block_size][kv_heads][head_dim].
  std::vector<float> k_cache_;
  std::vector<float> v_cache_;

  // Per-step scratch, reused across steps (Forward is single-threaded).
  std::vector<int32_t> row_seq_;   // [tokens] sequence index of each row
  std::vector<int32_t> rope_pos_;  // [tokens] position RoPE uses (global unless faulted)
  std::vector<float> x_;           // [tokens, hidden] residual stream
  std::vector<float> h_;           // [tokens, hidden] normed input / sublayer output
  std::vector<float> qkv_;         // [tokens, (heads + 2 * kv_heads) * head_dim]
  std::vector<float> attn_;        // [tokens, heads * head_dim]
  std::vector<float> gate_up_;     // [tokens, 2 * intermediate]
  std::vector<float> act_;         // [tokens, intermediate]
  std::vector<float> cos_, sin_;   // [tokens, head_dim / 2]
};

absl::Status CpuBackend::Forward(const ForwardBatch& b, std::vector<float>* logits) {
  if (absl::Status s = engine::ValidateForwardBatch(b, {.vocab_size = config_.vocab_size,
                                                        .num_blocks = options_.num_blocks,
                                                        .block_size = options_.block_size});
      !s.ok()) {
    return s;
  }
  const ModelConfig& c = config_;
  const int64_t t = b.num_tokens(), hidden = c.hidden_size, d = c.head_dim;
  const int64_t q_size = c.q_size(), kv_size = c.kv_size(), qkv_cols = q_size + 2 * kv_size;
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t slots_per_layer = options_.num_blocks * options_.block_size;

  row_seq_.resize(t);
  rope_pos_.resize(t);
  for (int s = 0; s < b.num_seqs(); ++s) {
    for (int32_t r = b.query_start[s]; r < b.query_start[s + 1]; ++r) {
      row_seq_[r] = s;
      rope_pos_[r] = options_.debug_fault == DebugFault::kLocalPositions ? r - b.query_start[s]
                                                                         : b.positions[r];
    }
  }
  x_.resize(t * hidden);
  h_.resize(t * hidden);
  qkv_.resize(t * qkv_cols);
  attn_.resize(t * q_size);
  gate_up_.resize(t * 2 * inter);
  act_.resize(t * inter);
  cos_.resize(t * d / 2);
  sin_.resize(t * d / 2);
  for (int64_t r = 0; r < t; ++r) {
    Embed(b.token_ids[r], x_.data() + r * hidden);
    RopeCosSin(inv_freq_, rope_pos_[r], cos_.data() + r * d / 2, sin_.data() + r * d / 2);
  }

  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    for (int64_t r = 0; r < t; ++r) {
      RmsNorm(x_.data() + r * hidden, l.input_norm.data(), hidden, eps, h_.data() + r * hidden);
    }
    MatMul(h_.data(), t, hidden, l.qkv, qkv_cols, qkv_.data());
    float* k_layer = k_cache_.data() + li * slots_per_layer * kv_size;
    float* v_layer = v_cache_.data() + li * slots_per_layer * kv_size;
    for (int64_t r = 0; r < t; ++r) {
      float* q = qkv_.data() + r * qkv_cols;
      float* k = q + q_size;
      const float* v = k + kv_size;
      const float* cs = cos_.data() + r * d / 2;
      const float* sn = sin_.data() + r * d / 2;
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        if (c.qk_norm()) RmsNorm(q + h * d, l.q_norm.data(), d, eps, q + h * d);
        ApplyRope(q + h * d, cs, sn, d);
      }
      for (int64_t h = 0; h < c.num_key_value_heads; ++h) {
        if (c.qk_norm()) RmsNorm(k + h * d, l.k_norm.data(), d, eps, k + h * d);
        ApplyRope(k + h * d, cs, sn, d);
      }
      // Written before any query of this step reads it: a step's own keys are attended to.
      std::copy_n(k, kv_size, k_layer + int64_t{b.slot_mapping[r]} * kv_size);
      std::copy_n(v, kv_size, v_layer + int64_t{b.slot_mapping[r]} * kv_size);
    }
    Attention(b, li);
    MatMul(attn_.data(), t, q_size, l.o, hidden, h_.data());
    for (int64_t i = 0; i < t * hidden; ++i) x_[i] += h_[i];

    for (int64_t r = 0; r < t; ++r) {
      RmsNorm(x_.data() + r * hidden, l.post_norm.data(), hidden, eps, h_.data() + r * hidden);
    }
    MatMul(h_.data(), t, hidden, l.gate_up, 2 * inter, gate_up_.data());
    for (int64_t r = 0; r < t; ++r) {
      const float* gu = gate_up_.data() + r * 2 * inter;
      SwiGlu(gu, gu + inter, inter, act_.data() + r * inter);
    }
    MatMul(act_.data(), t, inter, l.down, hidden, h_.data());
    for (int64_t i = 0; i < t * hidden; ++i) x_[i] += h_[i];
  }

  // Only the requested rows go through the final norm and the LM head (vocab-sized outputs).
  const int64_t n_out = static_cast<int64_t>(b.logits_rows.size());
  for (int64_t i = 0; i < n_out; ++i) {
    RmsNorm(x_.data() + int64_t{b.logits_rows[i]} * hidden, final_norm_.data(), hidden, eps,
            h_.data() + i * hidden);
  }
  const Matrix& head = c.tie_word_embeddings ? embed_ : lm_head_;
  logits->resize(static_cast<size_t>(n_out * c.vocab_size));
  MatMul(h_.data(), n_out, hidden, head, c.vocab_size, logits->data());
  return absl::OkStatus();
}

// attn_[r, h] = softmax over p in [0, last] of (q[r, h] . K[p, h / group]) / sqrt(d), applied to
// V; last = positions[r] (or r's index within the step under kNoCausalOffset). Keys are read
// through the sequence's block table in ascending p, so the sums have one order per (r, h).
void CpuBackend::Attention(const ForwardBatch& b, int64_t layer) {
  const ModelConfig& c = config_;
  const int64_t d = c.head_dim, heads = c.num_attention_heads, kv_size = c.kv_size();
  const int64_t group = heads / c.num_key_value_heads;
  const int64_t qkv_cols = c.q_size() + 2 * kv_size;
  const int64_t bs = options_.block_size;
  const int64_t slots_per_layer = options_.num_blocks * bs;
  const float* k_layer = k_cache_.data() + layer * slots_per_layer * kv_size;
  const float* v_layer = v_cache_.data() + layer * slots_per_layer * kv_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pool_.ParallelFor(b.num_tokens() * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(d);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / heads, h = item % heads, kvh = h / group;
      const int32_t s = row_seq_[r];
      const int64_t last = options_.debug_fault == DebugFault::kNoCausalOffset
                               ? r - b.query_start[s]
                               : b.positions[r];
      const int32_t* table = b.block_ids.data() + b.block_table_start[s];
      const float* q = qkv_.data() + r * qkv_cols + h * d;
      scores.resize(last + 1);
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p <= last; ++p) {
        const int64_t slot = int64_t{table[p / bs]} * bs + p % bs;
        scores[p] = Dot(q, k_layer + slot * kv_size + kvh * d, d) * scale;
        max_score = std::max(max_score, scores[p]);
      }
      float sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = 0; p <= last; ++p) {
        const float e = std::exp(scores[p] - max_score);
        sum += e;
        const int64_t slot = int64_t{table[p / bs]} * bs + p % bs;
        const float* v = v_layer + slot * kv_size + kvh * d;
        for (int64_t i = 0; i < d; ++i) acc[i] += e * v[i];
      }
      float* out = attn_.data() + r * c.q_size() + h * d;
      for (int64_t i = 0; i < d; ++i) out[i] = acc[i] / sum;
    }
  });
}

}  // namespace

absl::Status ValidateCpuBackendOptions(const CpuBackendOptions& o) {
  if (o.num_blocks < 1 || o.block_size < 1 || o.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu backend: need num_blocks >= 1 (got ", o.num_blocks, "), block_size >= 1 (got ",
        o.block_size, "), num_threads >= 0 (got ", o.num_threads, ")"));
  }
  return absl::OkStatus();
}

std::unique_ptr<engine::Backend> NewCpuBackend(const model::Model& model,
                                               const CpuBackendOptions& options) {
  if (!ValidateCpuBackendOptions(options).ok()) return nullptr;
  return std::make_unique<CpuBackend>(model, options);
}

}  // namespace cascade::cpu
