// The OpenAI-compatible HTTP front of the gateway (`--http_port`): POST /v1/completions and
// /v1/chat/completions (server-sent events when "stream": true, one JSON object otherwise),
// GET /v1/models, GET /health. A thin front: each request is translated (openai_api.h) and sent
// through the gateway's own Generate over an in-process channel, so it gets the same validation,
// auth (the Authorization header travels as metadata), admission, routing, failover and resume
// as a gRPC client.
//
// Event-driven (Debian's libevent evhttp on a few loop threads, gRPC's callback client API), so an
// open stream holds no thread: how many requests run at once is the gateway's admission's
// business (`--max_concurrent`), not this front's. A stream reads its next gRPC message only once
// the last one is written to the socket, so a slow reader holds one message, not its whole
// answer; a connection that takes none of its bytes for `io_timeout_s` is closed, and a closed
// connection cancels its generation.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cascade/v2/gateway.grpc.pb.h"
#include "services/gateway/openai_api.h"

namespace cascade::gateway {

struct OpenAiHttpOptions {
  std::string host = "0.0.0.0";
  int port = 0;     // 0 picks a free port
  int threads = 2;  // event-loop threads (they share the listening socket)
  // Larger bodies get 413 with an OpenAI error body (JSON). libevent 2.1 answers bodies over its
  // own limit itself, with an HTML page and before reading them; that limit is set above this one
  // (HardBodyLimit), so a body a little too large reaches the handler and its JSON error, while a
  // far larger one is still refused without being read.
  size_t max_body_bytes = 8 << 20;
  int io_timeout_s = 30;   // a connection silent (or not reading) this long is closed
  std::string model_name;  // what /v1/models lists and requests may name
  int64_t max_context = 0;
  // The gateway's tokenizer's decode, for echoing token-id prompts (null: such echo is refused).
  openai::Detokenize detokenize;
  // Chat completions: Qwen3's reasoning (a leading <think>...</think>) as `reasoning_content`
  // (openai::ReasoningSplitter; the gateway's --reasoning_parser=qwen3). Off: all is content.
  bool reasoning = false;
};

class OpenAiHttpServer {
 public:
  // Binds and starts serving. `channel` reaches the gateway's Generate (in-process).
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(
      const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> channel);
  ~OpenAiHttpServer();  // Shutdown(zero)

  // Stops taking connections and answers new requests 503. Thread-safe; returns at once.
  void StopAccepting();
  // StopAccepting, then lets open requests run for up to `drain`, cancels the rest and waits for
  // them (a stream whose client reads nothing ends within io_timeout_s), then stops the loops.
  // Idempotent. REQUIRES: not on a loop or gRPC callback thread.
  void Shutdown(absl::Duration drain);

  int port() const { return port_; }
  // Requests being answered now (tests and metrics).
  int open_requests() const;

  struct Impl;  // the loops and their requests (openai_http.cc)

 private:
  OpenAiHttpServer() = default;

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace cascade::gateway
