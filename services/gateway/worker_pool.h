// Channels to workers, by address, with this gateway's count of open streams to each, and the
// workers the gateway knows about when the registry is away (last seen, plus --workers).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cascade/v1/worker.grpc.pb.h"
#include "common/transport.h"
#include "services/gateway/router.h"

namespace cascade::gateway {

struct WorkerHandle {
  std::string address;
  std::unique_ptr<cascade::v1::Worker::Stub> stub;
  std::atomic<int32_t> inflight{0};
};

// Thread-safe.
class WorkerPool {
 public:
  WorkerPool(common::ClientChannelOptions channel_options, std::vector<std::string> static_workers);

  // The handle for an address, dialled lazily; never null for a well-formed address.
  std::shared_ptr<WorkerHandle> Get(const std::string& address);

  // Remembers the registry's live workers (for load-only routing while it is away).
  void Remember(const std::vector<Candidate>& live);
  // Everyone known: last seen from the registry plus the static list, without match info.
  std::vector<Candidate> KnownWorkers();
  int32_t Inflight(const std::string& address);

 private:
  const common::ClientChannelOptions channel_options_;
  const std::vector<std::string> static_workers_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<WorkerHandle>> handles_;  // guarded by mu_
  std::map<std::string, Candidate> last_seen_;                    // guarded by mu_
};

}  // namespace cascade::gateway
