// What workers and the gateway use to talk to the chunk registry. An interface, so their tests
// can use the in-process client (or their own fake) and inject faults; the gRPC client is in
// grpc_registry_client.h. Types are the registry's plain structs (cache_service/registry/types.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_service/registry/types.h"

namespace cascade::registry {

class Registry;

// Errors are the registry's (INVALID_ARGUMENT, NOT_FOUND for an unknown worker: re-register and
// Resync, RESOURCE_EXHAUSTED past a cap) plus, over the network, UNAVAILABLE and
// DEADLINE_EXCEEDED when the registry is away (the gateway then routes on load alone).
// Implementations are thread-safe.
class RegistryClient {
 public:
  virtual ~RegistryClient() = default;

  // Gateway.
  virtual absl::StatusOr<ResolveResult> Resolve(const ResolveInput& in) = 0;
  // Resolve without holding the caller's thread (the gateway calls it from gRPC's reaction
  // threads, a handful for the whole process). `done` runs exactly once, on another thread or,
  // when the answer is at hand (the in-process registry), inline. Thread-safe.
  using ResolveDone = absl::AnyInvocable<void(absl::StatusOr<ResolveResult>) &&>;
  virtual void ResolveAsync(const ResolveInput& in, ResolveDone done) {
    std::move(done)(Resolve(in));
  }
  // Pins a chunk for `ttl_s` seconds (RegisterChunk); `chunk_if_unknown` lets it be pinned
  // before any worker has reported it. Returns the pin deadline in unix ms.
  virtual absl::StatusOr<int64_t> PinChunk(const Hash128& hash, int64_t ttl_s,
                                           const std::optional<HeldChunk>& chunk_if_unknown) = 0;
  // PinChunk without holding the caller's thread, as ResolveAsync. `done` runs exactly once.
  using PinDone = absl::AnyInvocable<void(absl::StatusOr<int64_t>) &&>;
  virtual void PinChunkAsync(const Hash128& hash, int64_t ttl_s,
                             const std::optional<HeldChunk>& chunk_if_unknown, PinDone done) {
    std::move(done)(PinChunk(hash, ttl_s, chunk_if_unknown));
  }

  // Workers. A new registry_epoch in a response means the registry restarted: RegisterWorker
  // and Resync.
  virtual absl::StatusOr<RegisterResult> RegisterWorker(const WorkerInfo& info) = 0;
  virtual absl::StatusOr<HeartbeatResult> Heartbeat(std::string_view worker_id,
                                                    const WorkerLoad& load) = 0;
  // Batches are numbered 1, 2, ... after each registration (or seq+1 after Resync(seq)).
  virtual absl::StatusOr<ReportResult> ReportEvents(std::string_view worker_id, uint64_t seq,
                                                    std::span<const ChunkEvent> events) = 0;
  virtual absl::StatusOr<int> Resync(std::string_view worker_id, std::span<const HeldChunk> chunks,
                                     uint64_t seq) = 0;
  virtual absl::Status Deregister(std::string_view worker_id) = 0;
};

// Calls `registry` directly (no network): for tests and single-process setups. `registry` is
// not owned and must outlive the client.
std::unique_ptr<RegistryClient> NewInProcessRegistryClient(Registry* registry);

}  // namespace cascade::registry
