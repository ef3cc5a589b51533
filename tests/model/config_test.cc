// config.json parsing and presets: accepted fields, defaults, and clear rejections of what the
// backends do not implement.
#include "gpu_worker/model/config.h"

#include <string>

#include "gmock/gmock.h"
#include "gpu_worker/model/model.h"
#include "gtest/gtest.h"

namespace cascade::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kQwen3Json[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": true,
  "max_position_embeddings": 40960, "eos_token_id": 151645, "bos_token_id": 151643,
  "torch_dtype": "bfloat16", "attention_bias": false, "use_sliding_window": false,
  "hidden_act": "silu"})";

TEST(ModelConfigTest, ParsesQwen3ConfigLikeTheReferenceCheckpoint) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3Json, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, Family::kQwen3);
  EXPECT_TRUE(c->qk_norm());
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->rope_scaling.enabled);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
  EXPECT_EQ(c->bos_token_id, 151643);
}

TEST(ModelConfigTest, LlamaDefaultsHeadDimAndKvHeadsAndReadsLlama3Scaling) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "eos_token_id": [1, 2], "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
                                                   "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, Family::kLlama);
  EXPECT_FALSE(c->qk_norm());
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1, 2));
  EXPECT_TRUE(c->rope_scaling.enabled);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
}

TEST(ModelConfigTest, DefaultRopeTypeMeansNoScaling) {
  std::string text = kQwen3Json;
  text.pop_back();
  text += R"(, "rope_scaling": {"rope_type": "default"}})";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.enabled);
}

TEST(ModelConfigTest, RejectsUnsupportedFeaturesNamingFileAndKey) {
  struct Case {
    std::string patch;  // replaces the closing brace of kQwen3Json
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {R"(, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})", "linear"},
           {R"(, "rope_scaling": {"rope_type": "llama3", "factor": 2.0}})", "low_freq_factor"},
           {R"(, "attention_bias": true})", "attention_bias"},
           {R"(, "use_sliding_window": true})", "use_sliding_window"},
           {R"(, "hidden_act": "gelu"})", "gelu"},
           {R"(, "model_type": "mistral"})", "mistral"},
           {R"(, "num_key_value_heads": 3})", "num_key_value_heads"},
           {R"(, "hidden_size": "big"})", "hidden_size"},
           {R"(, "eos_token_id": "x"})", "eos_token_id"},
       }) {
    std::string text = kQwen3Json;
    text.pop_back();
    text += c.patch;
    absl::StatusOr<ModelConfig> config = ParseModelConfig(text, "dir/config.json");
    ASSERT_FALSE(config.ok()) << c.patch;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr("dir/config.json")) << c.patch;
    EXPECT_THAT(config.status().message(), HasSubstr(c.want)) << config.status();
  }
  absl::StatusOr<ModelConfig> bad = ParseModelConfig("{not json", "dir/config.json");
  EXPECT_THAT(bad.status().message(), HasSubstr("not a valid JSON"));
  absl::StatusOr<ModelConfig> missing = ParseModelConfig(R"({"model_type": "qwen3"})", "f");
  EXPECT_THAT(missing.status().message(), HasSubstr("vocab_size"));
}

// Found by tests/fuzz/model_loader_fuzz: sizes whose products overflow int64, ids outside int32
// and strings echoed whole into the error are all refused with a short, clear message.
TEST(ModelConfigTest, AbsurdSizesIdsAndLongStringsAreRefusedWithBoundedMessages) {
  struct Case {
    std::string patch;
    std::string want;
  };
  const std::string long_name(5000, 'q');
  for (const Case& c : std::vector<Case>{
           {R"(, "hidden_size": 1099511627776})", "\"hidden_size\" = 1099511627776 exceeds"},
           {R"(, "vocab_size": 1099511627776})", "vocab_size"},
           {R"(, "head_dim": 1099511627776})", "head_dim"},
           {R"(, "max_position_embeddings": 0})", "max_position_embeddings"},
           {R"(, "eos_token_id": [1, 99999999999]})", "eos_token_id"},
           {R"(, "eos_token_id": -3})", "eos_token_id"},
           {R"(, "bos_token_id": 99999999999})", "bos_token_id"},
           {", \"model_type\": \"" + long_name + "\"}", "qqqq..."},
           {", \"hidden_act\": \"" + long_name + "\"}", "qqqq..."},
       }) {
    std::string text = kQwen3Json;
    text.pop_back();
    text += c.patch;
    absl::StatusOr<ModelConfig> config = ParseModelConfig(text, "dir/config.json");
    ASSERT_FALSE(config.ok()) << c.patch.substr(0, 100);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.want)) << config.status();
    EXPECT_LT(config.status().message().size(), 400u) << c.patch.substr(0, 100);
  }
}

TEST(ModelConfigTest, JsonRoundTripKeepsEveryPreset) {
  for (const std::string& name : PresetNames()) {
    ModelConfig p = PresetConfig(name);
    absl::StatusOr<ModelConfig> c = ParseModelConfig(ModelConfigToJson(p), name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family, p.family);
    EXPECT_EQ(c->vocab_size, p.vocab_size);
    EXPECT_EQ(c->hidden_size, p.hidden_size);
    EXPECT_EQ(c->intermediate_size, p.intermediate_size);
    EXPECT_EQ(c->num_hidden_layers, p.num_hidden_layers);
    EXPECT_EQ(c->num_attention_heads, p.num_attention_heads);
    EXPECT_EQ(c->num_key_value_heads, p.num_key_value_heads);
    EXPECT_EQ(c->head_dim, p.head_dim);
    EXPECT_EQ(c->rms_norm_eps, p.rms_norm_eps);
    EXPECT_EQ(c->rope_theta, p.rope_theta);
    EXPECT_EQ(c->rope_scaling.enabled, p.rope_scaling.enabled);
    EXPECT_EQ(c->rope_scaling.factor, p.rope_scaling.factor);
    EXPECT_EQ(c->tie_word_embeddings, p.tie_word_embeddings);
    EXPECT_EQ(c->max_position_embeddings, p.max_position_embeddings);
    EXPECT_EQ(c->eos_token_ids, p.eos_token_ids);
    EXPECT_EQ(c->bos_token_id, p.bos_token_id);
  }
}

TEST(ModelConfigTest, PresetsHaveTheDocumentedShapes) {
  ModelConfig q = PresetConfig("qwen3-0.6b");
  EXPECT_EQ(q.num_hidden_layers, 28);
  EXPECT_EQ(q.hidden_size, 1024);
  EXPECT_EQ(q.num_attention_heads, 16);
  EXPECT_EQ(q.num_key_value_heads, 8);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.vocab_size, 151936);
  EXPECT_TRUE(q.tie_word_embeddings);
  ModelConfig t = PresetConfig("tiny");
  EXPECT_EQ(t.hidden_size, 128);
  EXPECT_THAT(t.eos_token_ids, ElementsAre(151645, 151643));
  ModelConfig l = PresetConfig("llama-tiny");
  EXPECT_EQ(l.family, Family::kLlama);
  EXPECT_FALSE(l.tie_word_embeddings);
  EXPECT_TRUE(l.rope_scaling.enabled);
  EXPECT_FALSE(FindPresetConfig("huge").ok());
}

// Weights of a config, counted from the tensors the loader expects.
int64_t ParameterCount(const ModelConfig& c) {
  int64_t n = 0;
  for (const ExpectedTensor& t : ExpectedTensors(c)) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    n += e;
  }
  return n;
}

// The benchmark presets carry the published checkpoints' shapes, so their weights count as the
// published parameter counts do (Qwen3-8B: 8.19 B; Llama-3.2-1B: 1.24 B).
TEST(ModelConfigTest, BenchmarkPresetsMatchThePublishedCheckpoints) {
  ModelConfig q = PresetConfig("qwen3-8b");
  EXPECT_EQ(q.family, Family::kQwen3);
  EXPECT_EQ(q.num_hidden_layers, 36);
  EXPECT_EQ(q.hidden_size, 4096);
  EXPECT_EQ(q.num_attention_heads, 32);
  EXPECT_EQ(q.num_key_value_heads, 8);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.intermediate_size, 12288);
  EXPECT_EQ(q.vocab_size, 151936);
  EXPECT_FALSE(q.tie_word_embeddings);
  EXPECT_TRUE(q.qk_norm());
  EXPECT_EQ(ParameterCount(q), 8190735360);

  ModelConfig l = PresetConfig("llama-3.2-1b");
  EXPECT_EQ(l.family, Family::kLlama);
  EXPECT_EQ(l.num_hidden_layers, 16);
  EXPECT_EQ(l.hidden_size, 2048);
  EXPECT_EQ(l.num_attention_heads, 32);
  EXPECT_EQ(l.num_key_value_heads, 8);
  EXPECT_EQ(l.head_dim, 64);
  EXPECT_EQ(l.intermediate_size, 8192);
  EXPECT_EQ(l.vocab_size, 128256);
  EXPECT_TRUE(l.tie_word_embeddings);
  EXPECT_FALSE(l.qk_norm());
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_TRUE(l.rope_scaling.enabled);
  EXPECT_EQ(l.rope_scaling.factor, 32.0);
  EXPECT_EQ(ParameterCount(l), 1235814400);
}

}  // namespace
}  // namespace cascade::model
