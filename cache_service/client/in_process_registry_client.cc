// RegistryClient over a Registry in the same process.
#include "cache_service/client/registry_client.h"
#include "cache_service/registry/registry.h"

namespace cascade::registry {
namespace {

class InProcessRegistryClient final : public RegistryClient {
 public:
  explicit InProcessRegistryClient(Registry* registry) : registry_(registry) {}

  absl::StatusOr<ResolveResult> Resolve(const ResolveInput& in) override {
    return registry_->Resolve(in);
  }
  absl::StatusOr<int64_t> PinChunk(const Hash128& hash, int64_t ttl_s,
                                   const std::optional<HeldChunk>& chunk_if_unknown) override {
    return registry_->PinChunk(hash, ttl_s, chunk_if_unknown);
  }
  absl::StatusOr<RegisterResult> RegisterWorker(const WorkerInfo& info) override {
    return registry_->RegisterWorker(info);
  }
  absl::StatusOr<HeartbeatResult> Heartbeat(std::string_view worker_id,
                                            const WorkerLoad& load) override {
    return registry_->Heartbeat(worker_id, load);
  }
  absl::StatusOr<ReportResult> ReportEvents(std::string_view worker_id, uint64_t seq,
                                            std::span<const ChunkEvent> events) override {
    return registry_->ReportEvents(worker_id, seq, events);
  }
  absl::StatusOr<int> Resync(std::string_view worker_id, std::span<const HeldChunk> chunks,
                             uint64_t seq) override {
    return registry_->Resync(worker_id, chunks, seq);
  }
  absl::Status Deregister(std::string_view worker_id) override {
    return registry_->DeregisterWorker(worker_id);
  }

 private:
  Registry* const registry_;  // not owned
};

}  // namespace

std::unique_ptr<RegistryClient> NewInProcessRegistryClient(Registry* registry) {
  return std::make_unique<InProcessRegistryClient>(registry);
}

}  // namespace cascade::registry
