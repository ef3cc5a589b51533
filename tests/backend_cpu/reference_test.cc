// The CPU backend against an independent, textbook float64 forward pass written here, for Qwen3
// (q/k norm, tied head) and Llama (llama3 RoPE scaling, untied head, 4:1 GQA), in one step and
// in chunked steps that read earlier chunks' keys from the paged cache.
//
// Tolerance: the backend works in float32. Each dot product sums at most 384 terms, so its
// relative rounding error is around sqrt(384) * 2^-24 ~ 1e-6 (worst case 384 * 2^-24 ~ 2e-5);
// two layers, softmax and the norms compound that to ~1e-5 on logits of size ~10. A bound of
// 1e-4 * max(1, max|logit|) leaves margin for that, while any real bug (wrong RoPE pairing,
// missing norm, wrong GQA head, off-by-one mask) moves logits by O(0.1..1).
#include <cmath>
#include <iostream>
#include <numbers>

#include "gpu_worker/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/backend_cpu/test_util.h"

namespace cascade::cpu {
namespace {

using model::ModelConfig;
using testing_util::MakeBatch;
using testing_util::MakeModel;
using testing_util::SeqStep;
using testing_util::SmallVocab;
using testing_util::Tokens;

using Mat = std::vector<double>;  // row-major

Mat W(const model::Model& m, const std::string& name) {
  const model::TensorView* t = m.Find(name);
  std::vector<float> f(t->numel());
  model::ToFloat32(*t, f.data());
  return Mat(f.begin(), f.end());
}

// y[n, out] = x[n, in] * w[out, in]^T
Mat Linear(const Mat& x, int64_t n, int64_t in, const Mat& w, int64_t out) {
  Mat y(n * out, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

// RMSNorm of each `dim`-sized group of x, in place.
void Norm(Mat* x, int64_t dim, const Mat& w, double eps) {
  for (size_t g = 0; g < x->size() / dim; ++g) {
    double* v = x->data() + g * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += v[i] * v[i];
    double r = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) v[i] = v[i] * r * w[i];
  }
}

// Frequency of rotary pair i, written from the Llama 3.1 description in terms of how many
// wavelengths fit in the original context.
double Freq(const ModelConfig& c, int64_t i) {
  double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
  if (!c.rope_scaling.enabled) return f;
  const auto& s = c.rope_scaling;
  double cycles = s.original_max_position_embeddings * f / (2 * std::numbers::pi);
  if (cycles < s.low_freq_factor) return f / s.factor;  // long wavelength: interpolate
  if (cycles > s.high_freq_factor) return f;            // short wavelength: keep
  double mix = (cycles - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return mix * f + (1 - mix) * f / s.factor;
}

// Rotates each head of x[n, heads * d]: pairs (i, i + d/2) by angle pos * Freq(i).
void Rope(Mat* x, int64_t n, int64_t heads, const ModelConfig& c) {
  const int64_t d = c.head_dim;
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x->data() + (p * heads + h) * d;
      for (int64_t i = 0; i < d / 2; ++i) {
        double a = p * Freq(c, i), x1 = v[i], x2 = v[i + d / 2];
        v[i] = x1 * std::cos(a) - x2 * std::sin(a);
        v[i + d / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
  }
}

// Logits [n, vocab] of every position of `tokens` (positions 0..n-1, causal attention).
// `c` is m.config() except where a test changes RoPE to prove the sequence is long enough to
// tell the difference.
Mat ReferenceForward(const model::Model& m, const std::vector<int32_t>& tokens,
                     const ModelConfig& c) {
  const int64_t n = tokens.size(), hid = c.hidden_size, d = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t inter = c.intermediate_size;
  Mat embed = W(m, "model.embed_tokens.weight");
  Mat x(n * hid);
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t i = 0; i < hid; ++i) x[p * hid + i] = embed[tokens[p] * hid + i];
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Mat h = x;
    Norm(&h, hid, W(m, pre + "input_layernorm.weight"), c.rms_norm_eps);
    Mat q = Linear(h, n, hid, W(m, pre + "self_attn.q_proj.weight"), nh * d);
    Mat k = Linear(h, n, hid, W(m, pre + "self_attn.k_proj.weight"), nkv * d);
    Mat v = Linear(h, n, hid, W(m, pre + "self_attn.v_proj.weight"), nkv * d);
    if (c.family == model::Family::kQwen3) {
      Norm(&q, d, W(m, pre + "self_attn.q_norm.weight"), c.rms_norm_eps);
      Norm(&k, d, W(m, pre + "self_attn.k_norm.weight"), c.rms_norm_eps);
    }
    Rope(&q, n, nh, c);
    Rope(&k, n, nkv, c);
    Mat attn(n * nh * d, 0.0);
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t hd = 0; hd < nh; ++hd) {
        const int64_t kvh = hd * nkv / nh;
        std::vector<double> w(p + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= p; ++j) {
          double s = 0;
          for (int64_t i = 0; i < d; ++i)
            s += q[(p * nh + hd) * d + i] * k[(j * nkv + kvh) * d + i];
          w[j] = s / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, w[j]);
        }
        for (double& e : w) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= p; ++j) {
          for (int64_t i = 0; i < d; ++i) {
            attn[(p * nh + hd) * d + i] += w[j] / sum * v[(j * nkv + kvh) * d + i];
          }
        }
      }
    }
    Mat o = Linear(attn, n, nh * d, W(m, pre + "self_attn.o_proj.weight"), hid);
    for (int64_t i = 0; i < n * hid; ++i) x[i] += o[i];
    h = x;
    Norm(&h, hid, W(m, pre + "post_attention_layernorm.weight"), c.rms_norm_eps);
    Mat g = Linear(h, n, hid, W(m, pre + "mlp.gate_proj.weight"), inter);
    Mat u = Linear(h, n, hid, W(m, pre + "mlp.up_proj.weight"), inter);
    for (int64_t i = 0; i < n * inter; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    Mat down = Linear(g, n, inter, W(m, pre + "mlp.down_proj.weight"), hid);
    for (int64_t i = 0; i < n * hid; ++i) x[i] += down[i];
  }
  Norm(&x, hid, W(m, "model.norm.weight"), c.rms_norm_eps);
  Mat head = c.tie_word_embeddings ? embed : W(m, "lm_head.weight");
  return Linear(x, n, hid, head, c.vocab_size);
}

// Compares backend logits rows [first, first + rows) against the reference.
void ExpectClose(const std::vector<float>& got, const Mat& want, int64_t first, int64_t rows,
                 int64_t vocab) {
  double max_ref = 0, max_err = 0;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    max_ref = std::max(max_ref, std::abs(want[first * vocab + i]));
    max_err = std::max(max_err, std::abs(got[i] - want[first * vocab + i]));
  }
  EXPECT_LE(max_err, 1e-4 * std::max(1.0, max_ref)) << "rows from " << first;
  std::cout << "rows [" << first << ", " << first + rows << "): max |err| " << max_err
            << ", max |logit| " << max_ref << "\n";
  EXPECT_GT(max_ref, 1.0);  // not degenerate
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, OneStepAndChunkedPrefillMatchFloat64Reference) {
  const ModelConfig config = SmallVocab(GetParam());
  std::unique_ptr<model::Model> m = MakeModel(config, 11);
  ASSERT_NE(m, nullptr);
  // Long enough that RoPE's low and medium frequencies (where llama3 scaling acts) turn by
  // whole radians.
  const int n = 300;
  const std::vector<int32_t> tokens = Tokens(n, config.vocab_size, 5);
  const Mat want = ReferenceForward(*m, tokens, config);
  if (config.rope_scaling.enabled) {
    ModelConfig unscaled = config;
    unscaled.rope_scaling.enabled = false;
    const Mat other = ReferenceForward(*m, tokens, unscaled);
    double diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(want[i] - other[i]));
    ASSERT_GT(diff, 0.05) << "the test could not tell scaled from unscaled RoPE";
  }
  // Block size 16 and a shuffled block table: keys are found through the table, not by index.
  std::vector<int32_t> blocks;
  for (int i = 0; i < 19; ++i) blocks.push_back((i * 7) % 19);
  CpuBackendOptions options{.num_blocks = 19, .block_size = 16, .num_threads = 2};

  std::unique_ptr<engine::Backend> one = NewCpuBackend(*m, options);
  std::vector<float> logits;
  ASSERT_TRUE(one->Forward(MakeBatch({{tokens, 0, blocks, true}}, 16), &logits).ok());
  ASSERT_EQ(logits.size(), tokens.size() * config.vocab_size);
  ExpectClose(logits, want, 0, n, config.vocab_size);

  std::unique_ptr<engine::Backend> chunked = NewCpuBackend(*m, options);
  for (auto [begin, end] :
       {std::pair{0, 100}, std::pair{100, 237}, std::pair{237, 299}, std::pair{299, 300}}) {
    std::vector<int32_t> part(tokens.begin() + begin, tokens.begin() + end);
    ASSERT_TRUE(chunked->Forward(MakeBatch({{part, begin, blocks, true}}, 16), &logits).ok());
    ExpectClose(logits, want, begin, end - begin, config.vocab_size);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, ReferenceTest, ::testing::Values("tiny", "llama-tiny"));

TEST(ReferenceSelfTest, Llama3ScalingChangesLowFrequenciesOnly) {
  // Guards the reference itself: scaling must divide the lowest frequency by `factor` and keep
  // the highest.
  ModelConfig c = model::PresetConfig("llama-tiny");
  ModelConfig plain = c;
  plain.rope_scaling.enabled = false;
  EXPECT_DOUBLE_EQ(Freq(c, 0), Freq(plain, 0));
  EXPECT_DOUBLE_EQ(Freq(c, c.head_dim / 2 - 1), Freq(plain, c.head_dim / 2 - 1) / 8.0);
}

}  // namespace
}  // namespace cascade::cpu
