// Our implementation of the standard grpc.health.v1.Health service (Check and Watch) on the
// callback API. We implement it rather than enable gRPC's built-in one so that draining can flip
// every service to NOT_SERVING first and then end Watch streams, which would otherwise hold the
// server's shutdown until its deadline.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace cascade::common {

class HealthWatchReactor;

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The server as a whole ("") starts NOT_SERVING; ServerRunner flips it once it is up.
  HealthService();
  // REQUIRES: the gRPC server serving this has shut down (no reactor is left).
  ~HealthService() override;

  // Sets (and, the first time, registers) a service's state; Watch streams on it see the change.
  // Ignored after Shutdown(), so a late caller cannot make a draining server look healthy.
  // Thread-safe.
  void SetServingStatus(std::string_view service, bool serving);
  // Marks every known service, and "", NOT_SERVING. Thread-safe.
  void SetAllNotServing();
  // SetAllNotServing(), then ends every Watch stream with UNAVAILABLE once it has delivered
  // NOT_SERVING; new Watch calls get NOT_SERVING and end at once. Idempotent, thread-safe.
  void Shutdown();
  // Whether `service` is known and SERVING. Thread-safe.
  bool IsServing(std::string_view service) const;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  friend class HealthWatchReactor;
  void Unregister(HealthWatchReactor* reactor);
  ServingStatus StatusOf(std::string_view service) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, ServingStatus, std::less<>> statuses_ ABSL_GUARDED_BY(mu_);
  // Live Watch streams. A reactor removes itself in OnDone, under mu_, before it is deleted.
  std::set<HealthWatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cascade::common
