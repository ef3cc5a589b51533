// Streams in flight on a server, and whether new ones are still let in. A server draining with
// gRPC's own Shutdown closes each connection as soon as its last call completes on the server,
// and a client still writing on it (flow-control updates) then loses what it had not read: a
// stream's last messages and its status. So a draining server first closes the gate (new streams
// are refused, UNAVAILABLE, by the service), lets the streams in flight finish while it still
// holds their connections, waits a moment for their last frames to land, and only then stops.
// Thread-safe.
#pragma once

#include <string_view>

#include "absl/time/time.h"
#include "common/mutex.h"

namespace cascade::common {

class StreamGate {
 public:
  // Counts a new stream in; false (nothing counted) once draining.
  bool Enter();
  // A stream counted by Enter() ended (its RPC is done).
  void Leave();
  // Lets no stream in from now on, then waits until none is in flight or `deadline`; once some
  // had to finish and all did, waits `linger` more (within the deadline) for their last frames
  // to reach the clients. Logs "streams_drained" with `server`.
  void Drain(absl::Time deadline, absl::Duration linger, std::string_view server);

 private:
  Mutex mu_;
  CondVar ended_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cascade::common
