// Writes a random model (preset, seed) to DIR and the CUDA backend's logits of one prompt to
// DIR/cuda_logits.bin (float32 [num_tokens, vocab], every row), for tests/gpu/hf_compare.py.
//   cuda_hf_logits_dump PRESET SEED DIR TOKEN...
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_worker/backend/cuda/cuda_backend.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"

int main(int argc, char** argv) {
  using namespace cascade;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s PRESET SEED DIR TOKEN...\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[3];
  absl::Status st = model::WriteRandomModel(dir, model::PresetConfig(argv[1]),
                                            std::strtoull(argv[2], nullptr, 10), "");
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  auto m = model::LoadModel(dir);
  if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  cuda::CudaBackendOptions o;
  o.num_blocks = 256;
  o.max_num_tokens = 2048;
  auto b = cuda::NewCudaBackend(**m, o);
  if (!b.ok()) return std::fprintf(stderr, "%s\n", b.status().ToString().c_str()), 1;
  engine::ForwardBatch batch;
  const int n = argc - 4;
  for (int i = 0; i < n; ++i) {
    batch.token_ids.push_back(std::atoi(argv[4 + i]));
    batch.positions.push_back(i);
    batch.slot_mapping.push_back(i);  // blocks 0.. in order
    batch.logits_rows.push_back(i);
  }
  batch.query_start = {0, n};
  batch.context_lens = {n};
  const int blocks = (n + o.block_size - 1) / o.block_size;
  for (int i = 0; i < blocks; ++i) batch.block_ids.push_back(i);
  batch.block_table_start = {0, blocks};
  std::vector<float> logits;
  st = (*b)->Forward(batch, &logits);
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  FILE* f = std::fopen((dir + "/cuda_logits.bin").c_str(), "wb");
  std::fwrite(logits.data(), 4, logits.size(), f);
  std::fclose(f);
  std::printf("wrote %d x %d logits\n", n, (*b)->VocabSize());
  return 0;
}
