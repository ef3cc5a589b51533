// cascade.v2 registry messages <-> cascade::registry types, and absl::Status <-> grpc::Status.
// Parsing errors are INVALID_ARGUMENT naming the field (e.g. "events[2].chunk.hash").
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache_service/registry/types.h"
#include "cascade/v2/registry.pb.h"
#include "common/grpc_status.h"

namespace cascade::registry::wire {

namespace v2 = ::cascade::v2;

using common::FromGrpc;
using common::ToGrpc;

// Parses 32 hex characters; `field` names it in the error.
absl::StatusOr<Hash128> ParseHash(const std::string& hex, std::string_view field);
// As ParseHash, but an empty string is the zero hash (a first chunk's parent).
absl::StatusOr<Hash128> ParseOptionalHash(const std::string& hex, std::string_view field);

// Resolve. The specs view into `req` (tokens and salts): valid while `req` lives unchanged.
std::vector<hash::ChunkSpec> SpecsFromProto(const v2::ResolveRequest& req);
void ToProto(const ResolveInput& in, v2::ResolveRequest* req);
void ToProto(const ResolveResult& r, v2::ResolveResponse* resp);
absl::StatusOr<ResolveResult> FromProto(const v2::ResolveResponse& resp);

// Membership.
WorkerLoad FromProto(const v2::WorkerLoad& load);
void ToProto(const WorkerLoad& load, v2::WorkerLoad* out);
WorkerInfo FromProto(const v2::RegisterWorkerRequest& req);
void ToProto(const WorkerInfo& info, v2::RegisterWorkerRequest* req);
void ToProto(const HeartbeatResult& r, v2::HeartbeatResponse* resp);
absl::StatusOr<HeartbeatResult> FromProto(const v2::HeartbeatResponse& resp);

// Residency.
absl::StatusOr<HeldChunk> FromProto(const v2::HeldChunk& c, std::string_view field);
void ToProto(const HeldChunk& c, v2::HeldChunk* out);
absl::StatusOr<std::vector<ChunkEvent>> EventsFromProto(const v2::ReportEventsRequest& req);
void ToProto(const ChunkEvent& e, v2::ChunkEvent* out);
absl::StatusOr<std::vector<HeldChunk>> ChunksFromProto(const v2::ResyncRequest& req);

// The most bytes a ResyncRequest of `chunks` chunks (a ReportEventsRequest of `events` events)
// that the registry accepts takes on the wire: every field at its longest valid encoding. The
// server checks at start that --max_resync_chunks and --max_events_per_batch fit in its
// --max_message_bytes, so a request at the cap gets the cap's answer, not the transport's.
int64_t MaxResyncRequestBytes(int64_t chunks);
int64_t MaxReportEventsRequestBytes(int64_t events);

// Admin.
void ToProto(const ChunkRecord& r, v2::ChunkRecord* out);
void ToProto(const WorkerRecord& r, v2::WorkerRecord* out);
void ToProto(const RegistryStats& s, v2::GetStatsResponse* out);

}  // namespace cascade::registry::wire
