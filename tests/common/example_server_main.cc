// The shape of every Cascade server's main(): parse flags, build the services, RunServer.
// This one serves an empty Gateway (every method UNIMPLEMENTED) plus health and reflection.
#include <iostream>

#include "cascade/v2/gateway.grpc.pb.h"
#include "common/flags.h"
#include "common/server_flags.h"
#include "common/server_runner.h"

int main(int argc, char** argv) {
  cascade::common::ServerOptions options;
  options.name = "cascade-example-server";
  cascade::common::FlagSet flags("cascade-example-server", "An example of the server plumbing.");
  cascade::common::RegisterServerFlags(&flags, &options);
  if (std::optional<int> code = cascade::common::ParseFlags(flags, argc, argv)) return *code;

  cascade::v2::GatewayService::CallbackService gateway;
  absl::Status status = cascade::common::RunServer(
      options, {{&gateway, cascade::v2::GatewayService::service_full_name()}});
  if (!status.ok()) {
    std::cerr << options.name << ": " << status.message() << "\n";
    return 1;
  }
  return 0;
}
