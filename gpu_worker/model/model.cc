// Model loading: config, then the weight files, then a check that every tensor the architecture
// needs is there with its exact shape, so backends can index weights without checks.
#include "gpu_worker/model/model.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace cascade::model {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Bounded, since a shape or a name may come from a corrupt file: an error message stays short.
std::string ShapeString(const std::vector<int64_t>& shape) {
  if (shape.size() <= 8) return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  std::vector<int64_t> head(shape.begin(), shape.begin() + 8);
  return absl::StrCat("[", absl::StrJoin(head, ", "), ", ... (", shape.size(), " dims)]");
}

std::string Clip(const std::string& s) {
  return s.size() <= 64 ? s : absl::StrCat(s.substr(0, 64), "...");
}

// Reads the weight_map of a sharded checkpoint: tensor name -> shard file name.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadIndex(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"weight_map\" object"));
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [name, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map entry for '", Clip(name), "' is not a file name"));
    }
    out.emplace_back(name, file.get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.qk_norm()) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, inter}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

const TensorView* Model::Find(std::string_view name) const {
  auto it = tensors_.find(absl::string_view(name.data(), name.size()));
  return it == tensors_.end() ? nullptr : it->second;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  auto model = std::unique_ptr<Model>(new Model());
  model->config_ = *std::move(config);
  model->dir_ = dir;
  size_t slash = dir.find_last_of('/');
  model->name_ = slash == std::string::npos ? dir : dir.substr(slash + 1);

  // Where each tensor is expected to be found (for messages when it is missing).
  std::string single = dir + "/model.safetensors";
  std::string index = dir + "/model.safetensors.index.json";
  std::string where;
  if (FileExists(single)) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(single);
    if (!f.ok()) return f.status();
    model->files_.push_back(*std::move(f));
    for (const TensorView& t : model->files_.back()->tensors()) model->tensors_[t.name] = &t;
    where = single;
  } else if (FileExists(index)) {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> map = ReadIndex(index);
    if (!map.ok()) return map.status();
    absl::flat_hash_map<std::string, SafetensorsFile*> shards;
    for (const auto& [name, shard] : *map) {
      auto it = shards.find(shard);
      if (it == shards.end()) {
        std::string path = dir + "/" + shard;
        if (!FileExists(path)) {
          return absl::NotFoundError(absl::StrCat(dir, "/", Clip(shard), ": shard listed in ",
                                                  index, " (for tensor '", Clip(name),
                                                  "') does not exist"));
        }
        absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
        if (!f.ok()) return f.status();
        model->files_.push_back(*std::move(f));
        it = shards.emplace(shard, model->files_.back().get()).first;
      }
      const TensorView* found = nullptr;
      for (const TensorView& t : it->second->tensors()) {
        if (t.name == name) found = &t;
      }
      if (found == nullptr) {
        return absl::NotFoundError(absl::StrCat(it->second->path(), ": tensor '", Clip(name),
                                                "' listed in ", index, " is not in the shard"));
      }
      model->tensors_[name] = found;
    }
    where = index;
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no model.safetensors or ", "model.safetensors.index.json"));
  }

  for (const ExpectedTensor& e : ExpectedTensors(model->config_)) {
    const TensorView* t = model->Find(e.name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(where, ": missing tensor '", e.name, "'"));
    }
    if (t->shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor '", e.name, "' has shape ",
                                                     ShapeString(t->shape), ", expected ",
                                                     ShapeString(e.shape)));
    }
  }
  return model;
}

}  // namespace cascade::model
