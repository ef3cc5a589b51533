// Helpers for the common/ tests: a streaming service whose pace the test controls, a
// raw HTTP GET, and a health client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace cascade::common::testing {

// Gateway whose Generate streams `messages` empty responses, one every `interval`, from its own
// thread per call, and finishes OK; a cancelled call stops early with CANCELLED.
class PacedStreamService final : public cascade::v2::GatewayService::CallbackService {
 public:
  PacedStreamService(int messages, absl::Duration interval)
      : messages_(messages), interval_(interval) {}

  grpc::ServerWriteReactor<cascade::v2::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const cascade::v2::GenerateRequest* request) override;

  int calls_started() const { return calls_started_.load(); }
  int calls_cancelled() const { return calls_cancelled_.load(); }

 private:
  friend class PacedReactor;
  const int messages_;
  const absl::Duration interval_;
  std::atomic<int> calls_started_{0};
  std::atomic<int> calls_cancelled_{0};
};

// A TCP connection to 127.0.0.1:port (close-on-exec); -1 when refused.
int ConnectLoopback(int port);

// One HTTP/1.1 GET over a plain socket; returns the whole response (status line, headers,
// body), or "" when it cannot connect.
std::string HttpGet(int port, const std::string& path);

// Health Check against `channel`; returns the gRPC status and sets *status_out.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         grpc::health::v1::HealthCheckResponse::ServingStatus* status_out,
                         absl::Duration timeout = absl::Seconds(5));

}  // namespace cascade::common::testing
