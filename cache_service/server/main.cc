// cascade-registry: the chunk registry server. Parses flags, serves ChunkRegistry (plus health,
// reflection and /metrics from the shared plumbing) and sweeps leases in the background.
// Holds soft state only; see docs/ARCHITECTURE.md and cache_service/registry/registry.h.
#include <iostream>

#include "cache_service/registry/registry.h"
#include "cache_service/server/registry_maintenance.h"
#include "cache_service/server/registry_service.h"
#include "common/flags.h"
#include "common/internal_auth.h"
#include "common/server_flags.h"
#include "common/server_runner.h"

int main(int argc, char** argv) {
  using namespace cascade;  // NOLINT: a main() of a few lines
  common::ServerOptions server;
  server.name = "cascade-registry";
  server.port = 50051;
  registry::RegistryOptions options;
  int64_t sweep_interval_ms = 0;

  common::FlagSet flags("cascade-registry",
                        "The Cascade chunk registry: chunk hashes and positions, worker membership "
                        "and residency (soft state, rebuilt by worker resync after a restart).");
  common::RegisterServerFlags(&flags, &server);
  common::InternalAuthOptions auth;
  common::RegisterInternalAuthFlags(&flags, &auth);
  flags.AddInt64("lease_ms", &options.lease_ms,
                 "A worker that does not heartbeat for this long is dropped with its residency.");
  flags.AddInt64("max_chunks", &options.max_chunks,
                 "Chunks tracked; the least recently used are forgotten past it.");
  flags.AddInt("num_shards", &options.num_shards, "Chunk table shards (lock striping).");
  flags.AddInt("max_chunks_per_request", &options.max_chunks_per_request,
               "Resolve: most chunks in one request.");
  flags.AddInt64("max_tokens_per_request", &options.max_tokens_per_request,
                 "Resolve: most tokens over all chunks of one request.");
  flags.AddInt("max_events_per_batch", &options.max_events_per_batch,
               "ReportEvents: most events in one batch.");
  flags.AddInt("max_resync_chunks", &options.max_resync_chunks, "Resync: most chunks in one call.");
  flags.AddInt64("max_pinned_chunks", &options.max_pinned_chunks, "Most chunks pinned at once.");
  flags.AddInt64("sweep_interval_ms", &sweep_interval_ms,
                 "How often expired leases are swept and metrics published (0: lease_ms / 4).");
  if (std::optional<int> exit_code = common::ParseFlags(flags, argc, argv)) return *exit_code;
  if (options.lease_ms < 100 || options.max_chunks < 1 || options.num_shards < 1 ||
      options.max_chunks_per_request < 1 || options.max_tokens_per_request < 1 ||
      options.max_events_per_batch < 1 || options.max_resync_chunks < 1 ||
      options.max_pinned_chunks < 0) {
    std::cerr << "cascade-registry: --lease_ms must be >= 100 and the --max_* and --num_shards "
                 "limits >= 1\n";
    return common::kExitBadFlags;
  }

  if (auto id = common::CheckOwnIdentity(auth, common::Role::kRegistry); !id.ok()) {
    std::cerr << "cascade-registry: " << id.status().message() << "\n";
    return common::kExitBadFlags;
  }
  if (!auth.insecure) server.internal_auth = {auth, registry::RegistryMethodPolicy()};

  registry::Registry reg(options);
  registry::RegistryService service(&reg, server.metrics, /*check_worker_identity=*/!auth.insecure);
  registry::RegistryMaintenance maintenance(&reg, server.metrics, sweep_interval_ms);
  maintenance.Start();
  absl::Status s = common::RunServer(
      server, {{&service, cascade::v2::ChunkRegistryService::service_full_name()}});
  maintenance.Stop();
  if (!s.ok()) {
    std::cerr << "cascade-registry: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
