// Pulling KV blocks from a peer worker (the receiving side of cascade.v2.WorkerService/FetchKv):
// a client read reactor per fetch, over internal mTLS like the other internal RPCs, with a
// deadline and a bound on the bytes asked for; every message goes through a FetchVerifier, and
// the caller gets the verified blocks or the reason they are not used.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cascade/v2/worker.grpc.pb.h"
#include "common/client_calls.h"
#include "common/mutex.h"
#include "common/transport.h"
#include "gpu_worker/service/kv_transfer.h"

namespace cascade::worker {

struct PeerFetchOptions {
  bool enabled = true;
  absl::Duration timeout = absl::Seconds(10);  // per fetch (and never past the request's)
  int64_t max_bytes = int64_t{8} << 30;        // block bytes one fetch may bring at most
  common::ClientTlsOptions tls;                // how to dial a peer (internal mTLS as a worker)
};

// What a fetch asks for. Keys are this worker's keys for the prompt's blocks [first, first+n).
struct FetchPlan {
  std::string address;  // the holder
  std::string model;
  std::string backend;  // this worker's backend name, block bytes and tokens per block
  int64_t block_bytes = 0;
  int32_t block_size = 0;
  std::vector<hash::Hash128> keys;
  hash::Hash128 first_parent;  // the key before keys[0]; zero when it is block 0
};

// One fetch in flight. Cancel() stops it (its callback then reports kCancelled unless it had
// already finished). Thread-safe.
class PeerFetchCall {
 public:
  virtual ~PeerFetchCall() = default;
  virtual void Cancel() = 0;
};

// Thread-safe. Keeps one channel (and stub) per peer address, at most kMaxPeerChannels of them
// beyond those with a fetch in flight. A channel is let go of only when none of its fetches is
// live, on the thread that calls Fetch or destroys the fetcher: never in a fetch's callback,
// where dropping its last reference corrupts gRPC (common/client_calls.h).
class PeerFetcher {
 public:
  static constexpr size_t kMaxPeerChannels = 256;

  explicit PeerFetcher(PeerFetchOptions options) : options_(std::move(options)) {}
  // Waits for the fetches in flight to end (they have deadlines; the worker cancels them first).
  ~PeerFetcher();

  const PeerFetchOptions& options() const { return options_; }

  // Starts a fetch; `done` runs exactly once, on a gRPC thread (or inline when the channel
  // cannot be made), with the outcome. `deadline` bounds it besides options().timeout.
  std::shared_ptr<PeerFetchCall> Fetch(FetchPlan plan,
                                       std::chrono::system_clock::time_point deadline,
                                       std::function<void(FetchOutcome)> done);

  // The addresses it keeps a channel to, in order (for tests).
  std::vector<std::string> peers();

 private:
  struct Peer {
    std::unique_ptr<cascade::v2::WorkerService::Stub> stub;  // holds the channel
    common::ClientCalls calls;
  };
  // The peer's stub and a token for one more call on it; null when it cannot be dialled.
  std::shared_ptr<Peer> PeerFor(const std::string& address, common::ClientCalls::Token* token,
                                absl::Status* status);

  const PeerFetchOptions options_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cascade::worker
