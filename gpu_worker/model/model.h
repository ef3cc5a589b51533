// A loaded model: validated config plus memory-mapped weights in Hugging Face layout
// (`model.safetensors`, or shards listed by `model.safetensors.index.json`).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/safetensors.h"

namespace cascade::model {

// A tensor the architecture needs, with its exact shape (HF names, [out, in] for projections).
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor `config` needs, in a fixed order:
//   model.embed_tokens.weight                       [vocab, hidden]
//   per layer i, prefix model.layers.{i}.:
//     input_layernorm.weight                        [hidden]
//     self_attn.q_proj.weight                       [heads * head_dim, hidden]
//     self_attn.k_proj.weight, self_attn.v_proj.weight [kv_heads * head_dim, hidden]
//     self_attn.o_proj.weight                       [hidden, heads * head_dim]
//     self_attn.q_norm.weight, self_attn.k_norm.weight [head_dim]   (qwen3 only)
//     post_attention_layernorm.weight               [hidden]
//     mlp.gate_proj.weight, mlp.up_proj.weight      [intermediate, hidden]
//     mlp.down_proj.weight                          [hidden, intermediate]
//   model.norm.weight                               [hidden]
//   lm_head.weight                                  [vocab, hidden]  (unless tied)
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Immutable after loading; thread-safe to read. Weights stay memory-mapped for its lifetime.
class Model {
 public:
  const ModelConfig& config() const { return config_; }
  // The model directory's last path component (what requests name the model by).
  const std::string& name() const { return name_; }
  const std::string& dir() const { return dir_; }
  // nullptr if absent. Every ExpectedTensors() entry is present with its exact shape.
  const TensorView* Find(std::string_view name) const;

 private:
  friend absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir);
  Model() = default;

  ModelConfig config_;
  std::string name_;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const TensorView*> tensors_;  // points into files_
};

// Loads `dir`. Errors (each message names the file and, where one is at fault, the tensor):
// NotFound for a missing config.json, weights file, shard, or expected tensor; InvalidArgument
// for bad JSON, unsupported features, truncated files, bad headers and wrong shapes.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir);

}  // namespace cascade::model
