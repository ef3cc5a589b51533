// RegistryClient over gRPC, with a deadline on every call.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cache_service/client/registry_client.h"

namespace cascade::registry {

struct GrpcRegistryClientOptions {
  // Deadline of each call. Resolve is on every request's path, so it gets a short one: when
  // the registry is slow the gateway should route on load rather than wait.
  int64_t timeout_ms = 3000;
  int64_t resolve_timeout_ms = 500;
  // Resync carries everything a worker holds: it may take longer than the other calls.
  int64_t resync_timeout_ms = 5000;
  // Used by the address overload; null = insecure (loopback, tests). For TLS build a channel
  // (e.g. common::MakeChannel) and use the channel overload.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  int64_t max_message_bytes = 64 << 20;  // resyncs of large caches are big
};

// Dials `address` (host:port) lazily; failures show up as UNAVAILABLE on calls.
std::unique_ptr<RegistryClient> NewGrpcRegistryClient(
    const std::string& address, const GrpcRegistryClientOptions& options = {});
std::unique_ptr<RegistryClient> NewGrpcRegistryClient(
    std::shared_ptr<grpc::Channel> channel, const GrpcRegistryClientOptions& options = {});

}  // namespace cascade::registry
