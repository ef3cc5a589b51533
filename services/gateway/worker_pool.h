// Clients of workers, by address, with this gateway's count of open streams to each, and the
// workers the gateway knows about when the registry is away (last seen, plus --workers).
// A client (and its channel) whose worker the registry has not listed for evict_after, that is
// not in --workers and that no attempt holds, is let go of: worker pods come back under new
// addresses, and a long-running gateway would otherwise keep a channel per address ever seen.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/transport.h"
#include "services/gateway/router.h"
#include "services/gateway/worker_client.h"

namespace cascade::gateway {

struct WorkerHandle {
  std::string address;
  std::unique_ptr<WorkerClient> client;
  std::atomic<int32_t> inflight{0};
};

// Makes the client for an address; null when the address cannot be dialled.
using WorkerClientFactory = std::function<std::unique_ptr<WorkerClient>(const std::string&)>;

// Thread-safe.
class WorkerPool {
 public:
  // gRPC clients over channels made with `channel_options`.
  WorkerPool(common::ClientChannelOptions channel_options, std::vector<std::string> static_workers);
  // Clients from `factory` (tests: scripted fakes).
  WorkerPool(WorkerClientFactory factory, std::vector<std::string> static_workers);
  // Destroys the clients here, on the caller's thread, while handles may still be held by
  // attempts finishing on gRPC threads (their last reference must not end a client there).
  ~WorkerPool();

  // The handle for an address, made lazily; never null for a well-formed address.
  std::shared_ptr<WorkerHandle> Get(const std::string& address);

  // Remembers the registry's live workers (for load-only routing while it is away), and lets go
  // of the clients of workers gone longer than evict_after (see above).
  void Remember(const std::vector<Candidate>& live);
  // 5 minutes by default: a worker missing a few heartbeats keeps its channel.
  void set_evict_after(std::chrono::steady_clock::duration d);
  // The addresses it holds a client for, in order.
  std::vector<std::string> Clients();
  // Everyone known: last seen from the registry plus the static list, without match info.
  std::vector<Candidate> KnownWorkers();
  int32_t Inflight(const std::string& address);

 private:
  // Set at construction.
  const WorkerClientFactory factory_;
  const std::vector<std::string> static_workers_;

  struct Entry {
    std::shared_ptr<WorkerHandle> handle;
    std::chrono::steady_clock::time_point used_at;  // last listed live or asked for
  };

  Mutex mu_;
  std::map<std::string, Entry> handles_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Candidate> last_seen_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::duration evict_after_ ABSL_GUARDED_BY(mu_) = std::chrono::minutes(5);
};

}  // namespace cascade::gateway
