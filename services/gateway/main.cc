// cascade-gateway: the public entry point (cascade.v2.GatewayService).
#include <iostream>

#include "common/server_flags.h"
#include "services/gateway/gateway_server.h"

int main(int argc, char** argv) {
  cascade::gateway::GatewayConfig config;
  config.server.name = "cascade-gateway";
  config.server.port = 50051;
  cascade::common::FlagSet flags("cascade-gateway",
                                 "Cascade gateway: routes generate streams to the worker holding "
                                 "the longest cached prefix.");
  cascade::common::RegisterServerFlags(&flags, &config.server);
  cascade::gateway::RegisterGatewayFlags(&flags, &config);
  cascade::common::RegisterClientTlsFlags(&flags, "registry_", &config.registry_tls);
  cascade::common::RegisterClientTlsFlags(&flags, "worker_", &config.worker_tls);
  if (auto code = cascade::common::ParseFlags(flags, argc, argv)) return *code;
  auto server = cascade::gateway::GatewayServer::Start(config);
  if (!server.ok()) {
    std::cerr << "cascade-gateway: " << server.status().message() << "\n";
    return 1;
  }
  (*server)->Wait();
  return 0;
}
