// cascade-registry: the chunk registry server. Parses flags, serves ChunkRegistry (plus health,
// reflection and /metrics from the shared plumbing) and sweeps leases in the background.
// Holds soft state only; see docs/ARCHITECTURE.md and cache_service/registry/registry.h.
#include <iostream>

#include "cache_service/registry/registry.h"
#include "cache_service/server/registry_flags.h"
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
  registry::RegisterRegistryFlags(&flags, &options, &sweep_interval_ms);
  if (std::optional<int> exit_code = common::ParseFlags(flags, argc, argv)) return *exit_code;
  if (absl::Status s =
          registry::CheckRegistryFlags(options, sweep_interval_ms, server.max_message_bytes);
      !s.ok()) {
    std::cerr << "cascade-registry: " << s.message() << "\n";
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
