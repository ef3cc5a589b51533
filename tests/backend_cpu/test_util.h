// Helpers for the CPU backend tests: write and load a seeded random model, and lay out
// ForwardBatches the way the engine's scheduler does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/engine/backend.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#include "gtest/gtest.h"
#include "tests/common/scratch_dir.h"

namespace cascade::cpu::testing_util {

// A model with `config` and seeded random weights (nullptr, with a test failure, if it does not
// load). Its directory is gone when this returns: the weights stay readable through the model's
// memory mappings (Linux keeps a deleted file while it is mapped), and nothing reads the
// directory again (model->dir() names a directory that no longer exists).
inline std::unique_ptr<model::Model> MakeModel(const model::ModelConfig& config, uint64_t seed) {
  test_support::ScratchDir dir("cascade_cpu");
  absl::Status s = model::WriteRandomModel(dir.path(), config, seed, /*tokenizer_dir=*/"");
  EXPECT_TRUE(s.ok()) << s;
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadModel(dir.path());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// A preset with a small vocabulary so that float64 references stay fast.
inline model::ModelConfig SmallVocab(const std::string& preset, int64_t vocab = 512) {
  model::ModelConfig c = model::PresetConfig(preset);
  c.vocab_size = vocab;
  c.eos_token_ids = {1};
  c.bos_token_id = 0;
  return c;
}

// One sequence's part of a step: tokens at positions start_pos, start_pos + 1, ... with the
// sequence's block table (covering at least start_pos + tokens.size() positions).
struct SeqStep {
  std::vector<int32_t> tokens;
  int32_t start_pos = 0;
  std::vector<int32_t> blocks;
  bool all_logits = false;  // logits for every row, else only for the last
};

inline engine::ForwardBatch MakeBatch(const std::vector<SeqStep>& seqs, int block_size) {
  engine::ForwardBatch b;
  b.query_start.push_back(0);
  b.block_table_start.push_back(0);
  for (const SeqStep& s : seqs) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t pos = s.start_pos + static_cast<int32_t>(i);
      b.token_ids.push_back(s.tokens[i]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(s.blocks[pos / block_size] * block_size + pos % block_size);
      if (s.all_logits || i + 1 == s.tokens.size()) b.logits_rows.push_back(b.num_tokens() - 1);
    }
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(s.start_pos + static_cast<int32_t>(s.tokens.size()));
    b.block_ids.insert(b.block_ids.end(), s.blocks.begin(), s.blocks.end());
    b.block_table_start.push_back(static_cast<int32_t>(b.block_ids.size()));
  }
  return b;
}

// Deterministic pseudo-random token ids in [0, vocab).
inline std::vector<int32_t> Tokens(int n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> out;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(static_cast<int32_t>((x >> 8) % vocab));
  }
  return out;
}

}  // namespace cascade::cpu::testing_util
