// Default ForwardSampled: full logits from Forward, argmax rows reduced on the host.
#include "gpu_worker/engine/backend.h"

namespace cascade::engine {

absl::Status Backend::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                     std::vector<int32_t>* argmax) {
  std::vector<float> all;
  if (absl::Status s = Forward(batch, &all); !s.ok()) return s;
  const size_t vocab = static_cast<size_t>(VocabSize());
  const size_t rows = batch.logits_rows.size();
  argmax->assign(rows, -1);
  logits->clear();
  for (size_t r = 0; r < rows; ++r) {
    const float* row = all.data() + r * vocab;
    if (!batch.argmax_only.empty() && batch.argmax_only[r]) {
      size_t best = 0;
      for (size_t v = 1; v < vocab; ++v) {
        if (row[v] > row[best]) best = v;
      }
      (*argmax)[r] = static_cast<int32_t>(best);
    } else {
      logits->insert(logits->end(), row, row + vocab);
    }
  }
  return absl::OkStatus();
}

}  // namespace cascade::engine
