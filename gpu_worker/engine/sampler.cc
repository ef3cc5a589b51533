// Sampling pipeline: penalty -> (greedy | temperature -> top-k -> softmax -> top-p -> min-p ->
// inverse-CDF draw). Candidates are ordered by (probability desc, id asc), so the draw is a pure
// function of the logits, the parameters, the seed and the position.
#include "gpu_worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "gpu_worker/engine/backend.h"
#include "gpu_worker/engine/sample_noise.h"

namespace cascade::engine {
namespace {

// log-softmax of the raw logits for the n best tokens and the sampled one.
LogprobEntry Logprobs(std::span<const float> logits, int32_t sampled, int n) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  LogprobEntry e;
  e.sampled = {sampled, static_cast<float>(logits[sampled] - lse)};
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  n = std::min<int>(n, static_cast<int>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int i = 0; i < n; ++i) e.top.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
  return e;
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

absl::Status ValidateSampling(const SamplingParams& p, int vocab_size, int32_t max_tokens_limit) {
  if (!(p.temperature >= 0.0f && p.temperature <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be in [0, 2], got ", p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in (0, 1], got ", p.top_p));
  }
  if (p.top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_k must be >= 0, or -1 to disable; got ", p.top_k));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.repetition_penalty must be > 0, got ", p.repetition_penalty));
  }
  if (p.max_tokens < 1 || p.max_tokens > max_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens must be in [1, ",
                                                   max_tokens_limit, "], got ", p.max_tokens));
  }
  if (p.logprobs < 0 || p.logprobs > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logprobs must be in [0, 20], got ", p.logprobs));
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

bool DrawsByRowRule(const SamplingParams& p) {
  return p.temperature == 0.0f || (p.top_k <= 0 && p.top_p >= 1.0f && p.min_p == 0.0f);
}

bool SampleableOnDevice(const SamplingParams& p) {
  return DrawsByRowRule(p) && p.repetition_penalty == 1.0f && p.logprobs == 0;
}

double UniformAt(uint64_t seed, int64_t position) {
  uint64_t x = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(position)));
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

SampleResult Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                    int64_t position, std::span<const int32_t> history) {
  SampleResult r;
  std::vector<float> raw;
  if (p.logprobs > 0) raw.assign(logits.begin(), logits.end());

  if (p.repetition_penalty != 1.0f) {
    // Hugging Face's rule: divide positive logits, multiply negative ones, once per distinct token.
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    for (int32_t t : seen) {
      if (t < 0 || static_cast<size_t>(t) >= logits.size()) continue;
      float& v = logits[t];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }

  if (DrawsByRowRule(p)) {
    // Greedy or plain temperature sampling: the rule a GPU backend applies on the device
    // (backend.h, RowSample), so the path a row takes does not change its token.
    r.token_id = SampleRow(logits.data(), static_cast<int>(logits.size()),
                           RowSample{true, p.temperature, seed, position});
  } else {
    const int vocab = static_cast<int>(logits.size());
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    };
    int keep = vocab;
    if (p.top_k > 0 && p.top_k < vocab) keep = p.top_k;
    // Only top-k and top-p need candidates in order; otherwise id order is just as fixed and
    // skips a sort of the whole vocabulary. The best candidate goes first either way (min-p).
    if (keep < vocab) {
      std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
      idx.resize(keep);
    } else if (p.top_p < 1.0f) {
      std::sort(idx.begin(), idx.end(), better);
    } else {
      std::swap(idx[0], idx[Argmax(logits)]);
    }
    const double inv_t = 1.0 / p.temperature;
    const double mx = logits[idx[0]];
    std::vector<double> prob(idx.size());
    double sum = 0.0;
    for (size_t i = 0; i < idx.size(); ++i) {
      prob[i] = std::exp((logits[idx[i]] - mx) * inv_t);
      sum += prob[i];
    }
    size_t n = idx.size();
    if (p.top_p < 1.0f) {
      double acc = 0.0;
      for (size_t i = 0; i < n; ++i) {
        acc += prob[i] / sum;
        if (acc >= p.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      // prob[0] is the best candidate; the rest may be in id order, so zero what falls short.
      const double floor_p = p.min_p * prob[0];
      for (size_t i = 1; i < n; ++i) {
        if (prob[i] < floor_p) prob[i] = 0.0;
      }
    }
    double kept = 0.0;
    for (size_t i = 0; i < n; ++i) kept += prob[i];
    const double u = UniformAt(seed, position) * kept;
    double acc = 0.0;
    r.token_id = idx[0];
    for (size_t i = 0; i < n; ++i) {
      acc += prob[i];
      if (prob[i] > 0.0 && u < acc) {
        r.token_id = idx[i];
        break;
      }
    }
  }
  if (p.logprobs > 0) r.logprobs = Logprobs(raw, r.token_id, p.logprobs);
  return r;
}

}  // namespace cascade::engine
