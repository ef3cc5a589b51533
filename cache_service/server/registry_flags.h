// cascade-registry's own flags: registration, and the range check that runs after parsing. Each
// numeric flag has an upper bound as well as a lower one, so a typo cannot overflow a deadline
// (`now + lease_ms`) or abort the start on a huge allocation (`--num_shards`).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "cache_service/registry/registry.h"
#include "common/flags.h"

namespace cascade::registry {

// Registers the registry's flags; each writes into `*options` or `*sweep_interval_ms`, which
// must outlive parsing. Their current values are the defaults --help shows.
void RegisterRegistryFlags(common::FlagSet* flags, RegistryOptions* options,
                           int64_t* sweep_interval_ms);

// INVALID_ARGUMENT naming the first flag out of its range ("--lease_ms=5: must be in [100,
// 86400000]"), or a --max_resync_chunks / --max_events_per_batch whose largest request would
// not fit in `max_message_bytes` (the server's --max_message_bytes). main() exits 2 on it.
absl::Status CheckRegistryFlags(const RegistryOptions& options, int64_t sweep_interval_ms,
                                int64_t max_message_bytes);

}  // namespace cascade::registry
