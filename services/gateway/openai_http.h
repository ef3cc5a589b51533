// The OpenAI-compatible HTTP front of the gateway (`--http_port`): POST /v1/completions and
// /v1/chat/completions (server-sent events when "stream": true, one JSON object otherwise),
// GET /v1/models, GET /health. A thin front: each request is translated (openai_api.h) and sent
// through the gateway's own Generate over an in-process channel, so it gets the same validation,
// auth (the Authorization header travels as metadata), admission, routing, failover and resume
// as a gRPC client. Served by Debian's cpp-httplib; a closed HTTP connection cancels the stream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cascade/v2/gateway.grpc.pb.h"

namespace httplib {
class Server;
}

namespace cascade::gateway {

struct OpenAiHttpOptions {
  std::string host = "0.0.0.0";
  int port = 0;                     // 0 picks a free port
  int threads = 64;                 // concurrent HTTP requests (a stream holds one thread)
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  std::string model_name;           // what /v1/models lists and requests may name
  int64_t max_context = 0;
};

class OpenAiHttpServer {
 public:
  // Binds and starts serving. `channel` reaches the gateway's Generate (in-process).
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(
      const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> channel);
  ~OpenAiHttpServer();  // stops and joins

  int port() const { return port_; }

 private:
  OpenAiHttpServer() = default;
  void Routes();

  OpenAiHttpOptions options_;
  std::unique_ptr<cascade::v2::GatewayService::Stub> stub_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace cascade::gateway
