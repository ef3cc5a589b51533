// libFuzzer target: the model loader on arbitrary bytes. Byte 0 picks the mode:
//   0: the rest is config.json text: ParseModelConfig must refuse it with a status or accept a
//      config that ModelConfigToJson writes back and ParseModelConfig reads back equal.
//   1: the rest is a safetensors file (written to a scratch file, then memory-mapped by
//      SafetensorsFile::Open): an accepted file's tensors lie inside the data area, sized
//      numel * dtype size, and every byte of each converts (so ASan sees any out-of-bounds view).
//   2: a whole model directory: [u16 little-endian length n][n bytes config.json][the rest is
//      model.safetensors], loaded by LoadModel.
// Error messages must stay bounded (they name files and tensors taken from the input).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_worker/model/config.h"
#include "gpu_worker/model/model.h"
#include "gpu_worker/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace cascade::fuzz {
namespace {

// One scratch directory per process, removed at exit.
const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr ? tmp : "/tmp") + "/cascade-fuzz-model-XXXXXX";
    FUZZ_CHECK(mkdtemp(templ.data()) != nullptr, "mkdtemp failed");
    auto* d = new std::string(templ);
    std::atexit([] {
      for (const char* f : {"/config.json", "/model.safetensors", "/x.safetensors"}) {
        unlink((ScratchDir() + f).c_str());
      }
      rmdir(ScratchDir().c_str());
    });
    return d;
  }();
  return *dir;
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, "cannot write %s", path.c_str());
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0, "short write to %s", path.c_str());
    done += static_cast<size_t>(n);
  }
  close(fd);
}

void CheckBounded(const absl::Status& s) {
  FUZZ_CHECK(s.message().size() <= kMaxMessageBytes, "error message of %zu bytes: %.200s...",
             s.message().size(), std::string(s.message()).c_str());
}

void Config(std::string_view text) {
  absl::StatusOr<model::ModelConfig> c = model::ParseModelConfig(text, "config.json");
  if (!c.ok()) {
    CheckBounded(c.status());
    return;
  }
  const std::string json = model::ModelConfigToJson(*c);
  absl::StatusOr<model::ModelConfig> back = model::ParseModelConfig(json, "config.json");
  FUZZ_CHECK(back.ok(), "an accepted config does not read back: %s",
             std::string(back.status().message()).c_str());
  FUZZ_CHECK(
      back->model_type == c->model_type && back->vocab_size == c->vocab_size &&
          back->hidden_size == c->hidden_size && back->intermediate_size == c->intermediate_size &&
          back->num_hidden_layers == c->num_hidden_layers &&
          back->num_attention_heads == c->num_attention_heads &&
          back->num_key_value_heads == c->num_key_value_heads && back->head_dim == c->head_dim &&
          back->rms_norm_eps == c->rms_norm_eps && back->rope_theta == c->rope_theta &&
          back->rope_scaling.enabled == c->rope_scaling.enabled &&
          back->tie_word_embeddings == c->tie_word_embeddings &&
          back->max_position_embeddings == c->max_position_embeddings &&
          back->eos_token_ids == c->eos_token_ids && back->bos_token_id == c->bos_token_id,
      "config differs after a write/read round trip");
}

void Safetensors(const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/x.safetensors";
  WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<model::SafetensorsFile>> f = model::SafetensorsFile::Open(path);
  if (!f.ok()) {
    CheckBounded(f.status());
    return;
  }
  std::vector<float> out;
  for (const model::TensorView& t : (*f)->tensors()) {
    FUZZ_CHECK(t.numel() >= 0, "negative numel");
    FUZZ_CHECK(t.nbytes == static_cast<size_t>(t.numel()) * model::DTypeSize(t.dtype),
               "tensor '%s': nbytes %zu != numel * dtype size", t.name.c_str(), t.nbytes);
    FUZZ_CHECK(t.nbytes <= size, "tensor '%s' is larger than the file", t.name.c_str());
    out.resize(static_cast<size_t>(t.numel()));
    model::ToFloat32(t, out.data());
  }
}

void Directory(const uint8_t* data, size_t size) {
  if (size < 2) return;
  size_t n = data[0] | (static_cast<size_t>(data[1]) << 8);
  data += 2;
  size -= 2;
  n = std::min(n, size);
  WriteFile(ScratchDir() + "/config.json", data, n);
  WriteFile(ScratchDir() + "/model.safetensors", data + n, size - n);
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadModel(ScratchDir());
  if (!m.ok()) {
    CheckBounded(m.status());
    return;
  }
  for (const model::ExpectedTensor& e : model::ExpectedTensors((*m)->config())) {
    const model::TensorView* t = (*m)->Find(e.name);
    FUZZ_CHECK(t != nullptr && t->shape == e.shape, "tensor %s missing or misshapen",
               e.name.c_str());
  }
}

}  // namespace
}  // namespace cascade::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cascade::fuzz;
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      Config(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
      break;
    case 1:
      Safetensors(data + 1, size - 1);
      break;
    default:
      Directory(data + 1, size - 1);
      break;
  }
  return 0;
}
