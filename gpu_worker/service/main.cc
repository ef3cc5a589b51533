// cascade-worker: serves cascade.v2.WorkerService for one model on a CPU or CUDA backend.
#include <iostream>

#include "common/server_flags.h"
#include "gpu_worker/service/worker_server.h"

int main(int argc, char** argv) {
  cascade::worker::WorkerConfig config;
  config.server.name = "cascade-worker";
  config.server.port = 50061;
  cascade::common::FlagSet flags("cascade-worker",
                                 "Cascade GPU worker: prefix-cached prefill and cascade decode.");
  cascade::common::RegisterServerFlags(&flags, &config.server);
  cascade::worker::RegisterWorkerFlags(&flags, &config);
  if (auto code = cascade::common::ParseFlags(flags, argc, argv)) return *code;
  cascade::worker::KeepKvBuffersMapped();
  auto server = cascade::worker::WorkerServer::Start(config);
  if (!server.ok()) {
    std::cerr << "cascade-worker: " << server.status().message() << "\n";
    return 1;
  }
  (*server)->Wait();
  return 0;
}
