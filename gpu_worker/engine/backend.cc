// Default ForwardSampled: whole logits from Forward, device-sampled rows drawn on the host with
// the same rule the GPU uses.
#include "gpu_worker/engine/backend.h"

#include "gpu_worker/engine/sample_noise.h"

namespace cascade::engine {

int32_t SampleRow(const float* row, int vocab, const RowSample& s) {
  int32_t best = 0;
  if (s.temperature == 0.0f) {
    for (int v = 1; v < vocab; ++v) {
      if (row[v] > row[best]) best = v;
    }
    return best;
  }
  const float inv_t = 1.0f / s.temperature;
  float best_score = GumbelScore(row[0], inv_t, TokenUniform(s.seed, s.position, 0));
  for (int v = 1; v < vocab; ++v) {
    const float score = GumbelScore(row[v], inv_t, TokenUniform(s.seed, s.position, v));
    if (score > best_score) {
      best_score = score;
      best = v;
    }
  }
  return best;
}

absl::Status Backend::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                     std::vector<int32_t>* tokens) {
  std::vector<float> all;
  if (absl::Status s = Forward(batch, &all); !s.ok()) return s;
  const size_t vocab = static_cast<size_t>(VocabSize());
  const size_t rows = batch.logits_rows.size();
  tokens->assign(rows, -1);
  logits->clear();
  for (size_t r = 0; r < rows; ++r) {
    const float* row = all.data() + r * vocab;
    if (!batch.row_samples.empty() && batch.row_samples[r].on_device) {
      (*tokens)[r] = SampleRow(row, static_cast<int>(vocab), batch.row_samples[r]);
    } else {
      logits->insert(logits->end(), row, row + vocab);
    }
  }
  return absl::OkStatus();
}

}  // namespace cascade::engine
