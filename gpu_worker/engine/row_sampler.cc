// The host side of sample_rule.h's rule, written for clarity rather than speed: thresholds by
// nth_element and sorting, sums in integers. It is the reference the CUDA kernel must equal.
#include "gpu_worker/engine/row_sampler.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

namespace cascade::engine {
namespace {

// Index of the largest key; the lowest among equal maxima.
int32_t ArgmaxKey(const std::vector<uint32_t>& keys) {
  return static_cast<int32_t>(std::max_element(keys.begin(), keys.end()) - keys.begin());
}

}  // namespace

void RowLogprobsOf(const float* logits, int vocab, int32_t token, int n, RowLogprobs* out) {
  std::vector<uint32_t> keys(vocab);
  for (int v = 0; v < vocab; ++v) keys[v] = OrderKey(Canon(logits[v]));
  const float max_z = KeyValue(keys[ArgmaxKey(keys)]);
  uint64_t sum = 0;
  for (int v = 0; v < vocab; ++v) sum += KeyWeight(keys[v], max_z);
  const double lse = LogSumExp(max_z, sum);
  *out = RowLogprobs{};
  out->sampled = LogprobOf(logits[token], lse);
  n = std::min(n, vocab);
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return keys[a] != keys[b] ? keys[a] > keys[b] : a < b;
  });
  out->num_top = n;
  for (int i = 0; i < n; ++i) {
    out->top_ids[i] = idx[i];
    out->top[i] = LogprobOf(logits[idx[i]], lse);
  }
}

int32_t TokenRank(const float* logits, int vocab, int32_t token) {
  const uint32_t key = OrderKey(Canon(logits[token]));
  int32_t rank = 0;
  for (int v = 0; v < vocab; ++v) rank += OrderKey(Canon(logits[v])) >= key ? 1 : 0;
  return rank;
}

void ScoreRowOf(const float* logits, int vocab, int32_t token, int n, RowLogprobs* out) {
  RowLogprobsOf(logits, vocab, token, n, out);
  out->rank = TokenRank(logits, vocab, token);
}

int32_t SampleRowRule(const float* logits, int vocab, const SampleSpec& spec,
                      std::span<const int32_t> penalty_tokens,
                      std::span<const int32_t> penalty_counts, std::span<const float> penalty_bias,
                      RowLogprobs* logprobs) {
  if (spec.score_token >= 0) {  // a score row: nothing drawn (step 5 and the rank)
    ScoreRowOf(logits, vocab, spec.score_token, spec.logprobs, logprobs);
    return spec.score_token;
  }
  std::vector<bool> penalized;
  std::vector<int32_t> counts;  // by token id, where the row's listed tokens carry entries
  std::vector<float> bias;      // by token id, where the row is biased
  if (spec.repetition_penalty != 1.0f || UsesEntries(spec)) {
    penalized.assign(vocab, false);
    if (UsesEntries(spec)) counts.assign(vocab, 0);
    if (UsesBias(spec)) bias.assign(vocab, 0.0f);
    for (size_t i = 0; i < penalty_tokens.size(); ++i) {
      const int32_t t = penalty_tokens[i];
      if (t < 0 || t >= vocab) continue;
      penalized[t] = true;
      if (!counts.empty() && i < penalty_counts.size()) counts[t] = penalty_counts[i];
      if (!bias.empty() && i < penalty_bias.size()) bias[t] = penalty_bias[i];
    }
  }
  const float inv_t = InvTemperature(spec);
  auto score_key = [&](int v) {
    const bool pen = !penalized.empty() && penalized[v];
    return ScoreKey(logits[v], pen, pen && !counts.empty() ? counts[v] : 0,
                    pen && !bias.empty() ? bias[v] : 0.0f, spec, inv_t);
  };
  if (spec.temperature == 0.0f && spec.logprobs == 0) {  // greedy: one pass, no scratch row
    int32_t best = 0;
    uint32_t best_key = 0;
    for (int v = 0; v < vocab; ++v) {
      const uint32_t k = score_key(v);
      if (v == 0 || k > best_key) best_key = k, best = v;
    }
    return best;
  }
  std::vector<uint32_t> keys(vocab);
  for (int v = 0; v < vocab; ++v) {
    keys[v] = score_key(v);
  }
  const uint32_t max_key = keys[ArgmaxKey(keys)];
  int32_t token = ArgmaxKey(keys);
  if (spec.temperature != 0.0f) {
    uint32_t floor_key = 0;  // keep keys >= floor_key
    if (spec.min_p > 0.0f) floor_key = MinPKey(max_key, spec.min_p);
    if (HasTopK(spec, vocab)) {
      std::vector<uint32_t> sorted = keys;
      std::nth_element(sorted.begin(), sorted.begin() + (spec.top_k - 1), sorted.end(),
                       std::greater<uint32_t>());
      floor_key = std::max(floor_key, sorted[spec.top_k - 1]);
    }
    if (spec.top_p < 1.0f) {
      const float m = KeyValue(max_key);
      std::vector<uint32_t> kept;
      uint64_t total = 0;
      for (uint32_t k : keys) {
        if (k < floor_key) continue;
        kept.push_back(k);
        total += KeyWeight(k, m);
      }
      const uint64_t need = NeedMass(total, spec.top_p);
      std::sort(kept.begin(), kept.end(), std::greater<uint32_t>());
      uint64_t mass = 0;
      for (size_t i = 0; i < kept.size(); ++i) {
        mass += KeyWeight(kept[i], m);
        // A threshold is a value: take all of a group of equal values before testing.
        if (i + 1 < kept.size() && kept[i + 1] == kept[i]) continue;
        if (mass >= need) {
          floor_key = std::max(floor_key, kept[i]);
          break;
        }
      }
    }
    float best = 0.0f;
    token = -1;
    const uint64_t start = StreamStart(spec.seed, spec.position);
    for (int v = 0; v < vocab; ++v) {
      if (keys[v] < floor_key) continue;
      const float score = AddF(KeyValue(keys[v]), GumbelNoise(TokenUniformAt(start, v)));
      if (token < 0 || score > best) best = score, token = v;
    }
  }
  if (spec.logprobs > 0) RowLogprobsOf(logits, vocab, token, spec.logprobs, logprobs);
  return token;
}

}  // namespace cascade::engine
