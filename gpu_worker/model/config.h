// Model hyper-parameters read from a Hugging Face `config.json` (+ `generation_config.json`),
// validated so that every backend can trust them, and the presets the generator writes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace cascade::model {

enum class Family { kQwen3, kLlama };

// Llama-3 style RoPE frequency scaling ("rope_type": "llama3"); the only kind supported, because
// any other kind changes the positional encoding in a way a backend would silently get wrong.
struct RopeScaling {
  bool enabled = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Family family = Family::kQwen3;
  std::string model_type = "qwen3";  // "qwen3" | "llama"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: query head h reads KV head h / (heads / kv_heads)
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head.weight absent; the embedding matrix is reused
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;  // config.json's, then generation_config.json's extra ones
  int32_t bos_token_id = -1;           // -1: none
  std::string torch_dtype = "bfloat16";

  // Qwen3 applies an RMSNorm over head_dim to each query and key head before RoPE.
  bool qk_norm() const { return family == Family::kQwen3; }
  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
};

// Parses and validates config.json text. `file` only names the source in error messages.
// Errors: InvalidArgument naming the file and the offending key.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view file);

// Reads `dir`/config.json (NotFound if absent) and, if present, `dir`/generation_config.json,
// whose eos_token_id entries are appended to eos_token_ids (without duplicates).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// config.json text for `config` in Hugging Face layout; ParseModelConfig() reads it back equal.
std::string ModelConfigToJson(const ModelConfig& config);

// Presets: "tiny" (Qwen3 family, 2 layers, hidden 128), "qwen3-0.6b" (the reference shape),
// "llama-tiny" (Llama family, untied head, llama3 RoPE scaling), and two published shapes for
// benchmarks: "qwen3-8b" (36 layers, hidden 4096, 32/8 heads, untied head) and "llama-3.2-1b"
// (16 layers, hidden 2048, 32/8 heads of 64, tied embeddings, llama3 RoPE scaling, theta 5e5).
// All but llama-3.2-1b use the Qwen3 vocabulary (151936), so the Qwen3 tokenizer fits them;
// llama-3.2-1b keeps Llama 3's 128256 (Qwen3 token ids past that are out of range: feed ids).
absl::StatusOr<ModelConfig> FindPresetConfig(std::string_view name);
// REQUIRES: `name` is one of PresetNames(); aborts otherwise (for constant names in code/tests).
ModelConfig PresetConfig(std::string_view name);
std::vector<std::string> PresetNames();

}  // namespace cascade::model
