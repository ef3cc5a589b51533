// The gateway's side of one worker: a Generate stream per attempt of a turn (turn.h). The gRPC
// implementation (NewGrpcWorkerClient) is what serves; unit tests hand WorkerPool a factory of
// scripted fakes instead, so failover and exact resume are tested without a network.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "cascade/v2/worker.grpc.pb.h"

namespace cascade::gateway {

// Receives one stream's events. Calls come one at a time, from any thread, possibly inline in
// WorkerCall::Start; OnDone is the last.
class WorkerCallObserver {
 public:
  virtual ~WorkerCallObserver() = default;
  // One message from the worker. Returns false to stop reading: the call is cancelled (the
  // worker frees the sequence) and OnDone follows.
  virtual bool OnMessage(const cascade::v2::WorkerServiceGenerateResponse& msg) = 0;
  // How the stream ended: OK after the worker's finish, else the worker's or the transport's
  // status (UNAVAILABLE when it cannot be reached or died, DEADLINE_EXCEEDED at the deadline,
  // CANCELLED after Cancel or a false OnMessage).
  virtual void OnDone(const grpc::Status& status) = 0;
};

struct WorkerCallOptions {
  std::chrono::system_clock::time_point deadline;  // the stream ends DEADLINE_EXCEEDED here
  std::string request_id;                          // for the worker's logs (x-request-id)
};

// One Generate stream. It keeps itself alive from Start until OnDone has returned, so the
// caller may drop its reference at any time.
class WorkerCall {
 public:
  virtual ~WorkerCall() = default;
  // Sends the request and starts reading. Callbacks may run before Start returns, so the
  // caller must not hold a lock the observer takes. Called once.
  virtual void Start() = 0;
  // Ends the stream early (client cancel); safe before Start, after OnDone and concurrently
  // with callbacks. OnDone follows with CANCELLED unless the stream had already ended.
  virtual void Cancel() = 0;
};

// One worker's endpoint. Thread-safe.
class WorkerClient {
 public:
  // The gRPC client's waits until its calls are gone (client_calls.h): destroy it on a thread
  // of your own, never from a call's callback.
  virtual ~WorkerClient() = default;
  // A stream for `request`, not yet started. REQUIRES: `request` and `observer` stay valid and
  // `request` unchanged until the observer's OnDone returns.
  virtual std::shared_ptr<WorkerCall> Generate(
      const cascade::v2::WorkerServiceGenerateRequest& request, const WorkerCallOptions& options,
      WorkerCallObserver* observer) = 0;
};

// The real client, over a channel to a worker's cascade.v2.WorkerService service.
std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::Channel> channel);

}  // namespace cascade::gateway
