// Validation of an engine::ForwardBatch against a backend's limits, so a malformed batch from a
// scheduler bug becomes InvalidArgument instead of an out-of-bounds read or write.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "gpu_worker/engine/backend.h"

namespace cascade::cpu {

// Checks sizes, offsets, token ids < vocab_size, block ids < num_blocks, positions inside each
// sequence's block table and below its context_len, slot_mapping equal to the slot the block
// table gives for the token's position, and logits_rows ascending and in range.
absl::Status CheckForwardBatch(const engine::ForwardBatch& batch, int64_t vocab_size,
                               int64_t num_blocks, int block_size);

}  // namespace cascade::cpu
