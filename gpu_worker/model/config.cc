// config.json parsing: every field a backend relies on is checked here, and features the
// backends do not implement are rejected by name instead of being silently ignored.
#include "gpu_worker/model/config.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace cascade::model {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view file, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", msg));
}

// Text from the file, clipped for an error message (a config can hold any string).
std::string Clip(const std::string& s) {
  return s.size() <= 64 ? s : absl::StrCat(s.substr(0, 64), "...");
}

// Upper bounds on the shape keys: far above any released model (Llama 3.1 405B has hidden
// 16384, intermediate 53248, 126 layers, 128 heads), low enough that every product of them a
// backend computes (vocab * hidden, heads * head_dim, ...) fits in int64.
struct DimLimit {
  const char* key;
  int64_t ModelConfig::*field;
  int64_t max;
};
constexpr DimLimit kDimLimits[] = {
    {"vocab_size", &ModelConfig::vocab_size, int64_t{1} << 24},
    {"hidden_size", &ModelConfig::hidden_size, int64_t{1} << 20},
    {"intermediate_size", &ModelConfig::intermediate_size, int64_t{1} << 22},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, int64_t{1} << 12},
    {"num_attention_heads", &ModelConfig::num_attention_heads, int64_t{1} << 12},
    {"head_dim", &ModelConfig::head_dim, int64_t{1} << 12},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, int64_t{1} << 30},
};

// A token id from the file: an integer in [0, 2^31).
bool IsTokenId(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= std::numeric_limits<int32_t>::max();
  return v.is_number_integer() && v.get<int64_t>() >= 0 &&
         v.get<int64_t>() <= std::numeric_limits<int32_t>::max();
}

// Reads an integer key; `required` keys must be present, others keep `*out`.
absl::Status GetInt(const json& j, absl::string_view file, const char* key, bool required,
                    int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? Bad(file, absl::StrCat("missing required integer \"", key, "\""))
                    : absl::OkStatus();
  }
  if (!it->is_number_integer()) return Bad(file, absl::StrCat("\"", key, "\" must be an integer"));
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetDouble(const json& j, absl::string_view file, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(file, absl::StrCat("\"", key, "\" must be a number"));
  *out = it->get<double>();
  return absl::OkStatus();
}

// Rejects a boolean feature flag that is set to true.
absl::Status RejectTrue(const json& j, absl::string_view file, const char* key, const char* why) {
  auto it = j.find(key);
  if (it != j.end() && it->is_boolean() && it->get<bool>()) {
    return Bad(file, absl::StrCat("\"", key, "\": true is not supported (", why, ")"));
  }
  return absl::OkStatus();
}

// eos_token_id may be an int or a list of ints.
absl::Status AppendEos(const json& j, absl::string_view file, std::vector<int32_t>* ids) {
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<json> items;
  if (it->is_array()) {
    items.assign(it->begin(), it->end());
  } else {
    items.push_back(*it);
  }
  for (const json& v : items) {
    if (!IsTokenId(v)) {
      return Bad(file, "\"eos_token_id\" must be a token id (0..2^31-1) or a list of them");
    }
    int32_t id = static_cast<int32_t>(v.get<int64_t>());
    bool seen = false;
    for (int32_t e : *ids) seen = seen || e == id;
    if (!seen) ids->push_back(id);
  }
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const json& j, absl::string_view file, RopeScaling* rs) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return Bad(file, "\"rope_scaling\" must be an object or null");
  const json& r = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = r.find(key);
    if (t != r.end() && t->is_string()) type = t->get<std::string>();
  }
  if (type == "default") return absl::OkStatus();  // some configs spell "no scaling" this way
  if (type != "llama3") {
    return Bad(file, absl::StrCat("rope_scaling type \"", Clip(type),
                                  "\" is not supported (only \"llama3\" is)"));
  }
  rs->enabled = true;
  for (auto [key, out] :
       {std::pair{"factor", &rs->factor}, std::pair{"low_freq_factor", &rs->low_freq_factor},
        std::pair{"high_freq_factor", &rs->high_freq_factor}}) {
    if (!r.contains(key)) return Bad(file, absl::StrCat("rope_scaling misses \"", key, "\""));
    if (absl::Status s = GetDouble(r, file, key, out); !s.ok()) return s;
  }
  if (absl::Status s = GetInt(r, file, "original_max_position_embeddings", true,
                              &rs->original_max_position_embeddings);
      !s.ok()) {
    return s;
  }
  if (!std::isfinite(rs->factor) || !std::isfinite(rs->low_freq_factor) ||
      !std::isfinite(rs->high_freq_factor) || rs->factor < 1.0 ||
      rs->high_freq_factor <= rs->low_freq_factor || rs->original_max_position_embeddings <= 0) {
    return Bad(file,
               "rope_scaling needs factor >= 1, high_freq_factor > low_freq_factor, "
               "original_max_position_embeddings > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text,
                                             std::string_view file_name) {
  const absl::string_view file(file_name.data(), file_name.size());
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(file, "not a valid JSON object");
  ModelConfig c;
  try {
    std::string type = j.value("model_type", "");
    std::string arch;
    if (j.contains("architectures") && j["architectures"].is_array() &&
        !j["architectures"].empty() && j["architectures"][0].is_string()) {
      arch = j["architectures"][0].get<std::string>();
    }
    if (type == "qwen3" || (type.empty() && arch == "Qwen3ForCausalLM")) {
      c.family = Family::kQwen3;
      c.model_type = "qwen3";
    } else if (type == "llama" || (type.empty() && arch == "LlamaForCausalLM")) {
      c.family = Family::kLlama;
      c.model_type = "llama";
    } else {
      return Bad(file, absl::StrCat("model_type \"", Clip(type), "\" / architecture \"", Clip(arch),
                                    "\" is not supported (qwen3 or llama)"));
    }
    for (auto [key, out] :
         {std::pair{"vocab_size", &c.vocab_size}, std::pair{"hidden_size", &c.hidden_size},
          std::pair{"intermediate_size", &c.intermediate_size},
          std::pair{"num_hidden_layers", &c.num_hidden_layers},
          std::pair{"num_attention_heads", &c.num_attention_heads}}) {
      if (absl::Status s = GetInt(j, file, key, true, out); !s.ok()) return s;
      if (*out <= 0) return Bad(file, absl::StrCat("\"", key, "\" must be positive"));
    }
    c.num_key_value_heads = c.num_attention_heads;
    c.head_dim = c.hidden_size / c.num_attention_heads;
    c.max_position_embeddings = 4096;
    int64_t bos = -1;
    for (absl::Status s :
         {GetInt(j, file, "num_key_value_heads", false, &c.num_key_value_heads),
          GetInt(j, file, "head_dim", false, &c.head_dim),
          GetInt(j, file, "max_position_embeddings", false, &c.max_position_embeddings),
          GetInt(j, file, "bos_token_id", false, &bos),
          GetDouble(j, file, "rms_norm_eps", &c.rms_norm_eps),
          GetDouble(j, file, "rope_theta", &c.rope_theta), AppendEos(j, file, &c.eos_token_ids),
          ParseRopeScaling(j, file, &c.rope_scaling),
          RejectTrue(j, file, "attention_bias", "q/k/v/o projections have no bias"),
          RejectTrue(j, file, "mlp_bias", "MLP projections have no bias"),
          RejectTrue(j, file, "use_sliding_window", "full attention only")}) {
      if (!s.ok()) return s;
    }
    for (const DimLimit& limit : kDimLimits) {
      if (c.*limit.field > limit.max) {
        return Bad(file, absl::StrCat("\"", limit.key, "\" = ", c.*limit.field, " exceeds ",
                                      limit.max, " (no model is this large; corrupt file?)"));
      }
    }
    if (c.max_position_embeddings <= 0) {
      return Bad(file, "\"max_position_embeddings\" must be positive");
    }
    if (bos < -1 || bos > std::numeric_limits<int32_t>::max()) {
      return Bad(file, "\"bos_token_id\" must be a token id (0..2^31-1) or absent");
    }
    c.bos_token_id = static_cast<int32_t>(bos);
    if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
      return Bad(file, "num_attention_heads must be a positive multiple of num_key_value_heads");
    }
    if (c.head_dim <= 0 || c.head_dim % 2 != 0) return Bad(file, "head_dim must be even, > 0");
    if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || !std::isfinite(c.rms_norm_eps) ||
        !std::isfinite(c.rope_theta)) {
      return Bad(file, "rms_norm_eps and rope_theta must be positive and finite");
    }
    if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
      if (!it->is_boolean()) return Bad(file, "\"tie_word_embeddings\" must be a boolean");
      c.tie_word_embeddings = it->get<bool>();
    }
    if (auto it = j.find("hidden_act");
        it != j.end() && it->is_string() && it->get<std::string>() != "silu") {
      return Bad(file, absl::StrCat("hidden_act \"", Clip(it->get<std::string>()),
                                    "\" is not supported (silu only)"));
    }
    // Newer transformers write "dtype" instead of "torch_dtype".
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (auto it = j.find(key); it != j.end() && it->is_string())
        c.torch_dtype = it->get<std::string>();
    }
  } catch (const json::exception& e) {
    return Bad(file, Clip(e.what()));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  std::string path = dir + "/config.json";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*text, path);
  if (!config.ok()) return config.status();
  std::string gen_path = dir + "/generation_config.json";
  if (absl::StatusOr<std::string> gen = ReadFile(gen_path); gen.ok()) {
    json g = json::parse(*gen, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) return Bad(gen_path, "not a valid JSON object");
    if (absl::Status s = AppendEos(g, gen_path, &config->eos_token_ids); !s.ok()) return s;
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j;
  bool qwen = c.family == Family::kQwen3;
  j["architectures"] = {qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen3" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.enabled) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  j["torch_dtype"] = c.torch_dtype;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (!qwen) j["mlp_bias"] = false;
  if (qwen) j["use_sliding_window"] = false;
  return j.dump(2) + "\n";
}

std::vector<std::string> PresetNames() {
  return {"tiny", "qwen3-0.6b", "llama-tiny", "qwen3-8b", "llama-3.2-1b"};
}

absl::StatusOr<ModelConfig> FindPresetConfig(std::string_view name) {
  ModelConfig c;
  c.family = Family::kQwen3;
  c.model_type = "qwen3";
  c.vocab_size = 151936;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {151645, 151643};  // <|im_end|>, <|endoftext|>
  c.bos_token_id = 151643;
  c.torch_dtype = "bfloat16";
  if (name == "tiny") {
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 4096;
  } else if (name == "qwen3-0.6b") {
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
  } else if (name == "llama-tiny") {
    c.family = Family::kLlama;
    c.model_type = "llama";
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    // Llama 3.1's scaling; with head_dim 32 its frequencies fall in all three bands
    // (kept, divided by `factor`, smoothly interpolated).
    c.rope_scaling = {true, 8.0, 1.0, 4.0, 8192};
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 131072;
  } else if (name == "qwen3-8b") {  // Qwen/Qwen3-8B's config.json
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_hidden_layers = 36;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 40960;
  } else if (name == "llama-3.2-1b") {  // meta-llama/Llama-3.2-1B's config.json
    c.family = Family::kLlama;
    c.model_type = "llama";
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_scaling = {true, 32.0, 1.0, 4.0, 8192};  // rope_type llama3
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 131072;
    c.eos_token_ids = {128001, 128008, 128009};
    c.bos_token_id = 128000;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model preset \"", std::string(name),
                     "\" (known: tiny, qwen3-0.6b, llama-tiny, qwen3-8b, llama-3.2-1b)"));
  }
  return c;
}

ModelConfig PresetConfig(std::string_view name) {
  absl::StatusOr<ModelConfig> c = FindPresetConfig(name);
  if (!c.ok()) {
    std::cerr << c.status() << "\n";
    std::abort();
  }
  return *c;
}

}  // namespace cascade::model
