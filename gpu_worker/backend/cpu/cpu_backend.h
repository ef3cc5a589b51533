// The float32 CPU backend: the reference every other backend is tested against, and the default
// where there is no GPU. Exact and batch-invariant rather than fast.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "gpu_worker/engine/backend.h"
#include "gpu_worker/model/model.h"

namespace cascade::cpu {

// Test-only faults reproducing the root causes in DESIGN.md, so tests can prove they catch them.
enum class DebugFault {
  kNone,
  // RoPE at the token's index within this step's part of its sequence instead of its global
  // position (root cause 1: chunks prefilled at local positions).
  kLocalPositions,
  // Query i of this step's part of a sequence sees keys [0, i] instead of [0, positions[i]]
  // (root cause 3: causal mask without the start_pos offset).
  kNoCausalOffset,
};

struct CpuBackendOptions {
  int64_t num_blocks = 1024;  // KV cache capacity: num_blocks * block_size tokens
  int block_size = 16;
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
  DebugFault debug_fault = DebugFault::kNone;
  // engine::Backend::PrepareSampled starts the overlapped schedule's next step at once (the
  // base class's synchronous form: no gain on the CPU, the engine's speculated path exercised).
  bool speculative_launch = false;
};

// InvalidArgument unless num_blocks >= 1, block_size >= 1, num_threads >= 0.
absl::Status ValidateCpuBackendOptions(const CpuBackendOptions& options);

// Converts the model's weights to float32 (the backend owns the copies; `model` may be destroyed
// afterwards) and allocates the KV cache, per layer [num_blocks * block_size, kv_heads, head_dim]
// for K and for V. Returns nullptr if ValidateCpuBackendOptions(options) fails.
// Forward() rejects malformed batches with InvalidArgument and never reads or writes out of
// bounds. Thread safety: as engine::Backend (one Forward at a time).
std::unique_ptr<engine::Backend> NewCpuBackend(const model::Model& model,
                                               const CpuBackendOptions& options);

}  // namespace cascade::cpu
