// libFuzzer target: the registry fed what workers and gateways send, as proto bytes, through
// the same wire conversion and core calls as the gRPC service (registry_service.cc). The input
// is a sequence of records [u8 op][u16 little-endian length n][n bytes]; ops are ReportEvents,
// Resync, Resolve, RegisterWorker, Heartbeat, time passing + Sweep, pin/evict of a listed chunk,
// and DeregisterWorker. The registry is small (64 chunks over 4 shards) so the LRU works hard.
// After every record: the table stays within its cap (plus pins), every worker's held count
// equals the chunks that name it as a holder (the index and the holder lists agree) and never
// exceeds the table, and every error message is bounded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache_service/registry/clock.h"
#include "cache_service/registry/registry.h"
#include "cache_service/wire/registry_wire.h"
#include "cascade/v2/registry.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_util.h"

namespace cascade::fuzz {
namespace {

namespace v2 = ::cascade::v2;
using registry::Registry;

constexpr int64_t kMaxChunks = 64;

void Bounded(const absl::Status& s) {
  FUZZ_CHECK(s.message().size() <= kMaxMessageBytes, "error message of %zu bytes",
             s.message().size());
}

template <typename Msg>
bool Parse(std::string_view bytes, Msg* msg) {
  return msg->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void CheckInvariants(Registry& r) {
  registry::RegistryStats stats = r.GetStats();
  FUZZ_CHECK(stats.chunks <= kMaxChunks + stats.pinned_chunks + 4,
             "table holds %lld chunks, cap %lld + %lld pins", static_cast<long long>(stats.chunks),
             static_cast<long long>(kMaxChunks), static_cast<long long>(stats.pinned_chunks));
  for (const registry::WorkerRecord& w : r.ListWorkers()) {
    FUZZ_CHECK(w.chunks <= stats.chunks, "worker %s holds %lld chunks, the table knows %lld",
               w.info.worker_id.c_str(), static_cast<long long>(w.chunks),
               static_cast<long long>(stats.chunks));
    absl::StatusOr<std::vector<registry::ChunkRecord>> listed =
        r.ListChunks(10'000, w.info.worker_id, nullptr);
    if (!listed.ok()) continue;  // its lease ran out between the two calls
    FUZZ_CHECK(static_cast<int64_t>(listed->size()) == w.chunks,
               "worker %s: held count %lld but %zu chunks list it as a holder",
               w.info.worker_id.c_str(), static_cast<long long>(w.chunks), listed->size());
  }
}

void OneInput(const uint8_t* data, size_t size) {
  registry::FakeClock clock;
  registry::RegistryOptions o;
  o.clock = &clock;
  o.lease_ms = 10'000;
  o.max_chunks = kMaxChunks;
  o.num_shards = 4;
  o.max_chunks_per_request = 64;
  o.max_tokens_per_request = 1 << 14;
  o.max_events_per_batch = 256;
  o.max_resync_chunks = 256;
  o.max_pinned_chunks = 8;
  Registry r(o);
  size_t at = 0;
  int records = 0;
  while (at + 3 <= size && records++ < 64) {
    const uint8_t op = data[at] % 8;
    size_t n = data[at + 1] | (static_cast<size_t>(data[at + 2]) << 8);
    at += 3;
    n = std::min(n, size - at);
    std::string_view bytes(reinterpret_cast<const char*>(data + at), n);
    at += n;
    absl::Status st;
    switch (op) {
      case 0: {
        v2::ReportEventsRequest req;
        if (!Parse(bytes, &req)) break;
        absl::StatusOr<std::vector<registry::ChunkEvent>> ev = registry::wire::EventsFromProto(req);
        st = ev.ok() ? r.ReportEvents(req.worker_id(), req.seq(), *ev).status() : ev.status();
        break;
      }
      case 1: {
        v2::ResyncRequest req;
        if (!Parse(bytes, &req)) break;
        absl::StatusOr<std::vector<registry::HeldChunk>> c = registry::wire::ChunksFromProto(req);
        st = c.ok() ? r.Resync(req.worker_id(), *c, req.seq()).status() : c.status();
        break;
      }
      case 2: {
        v2::ResolveRequest req;
        if (!Parse(bytes, &req)) break;
        std::vector<hash::ChunkSpec> specs = registry::wire::SpecsFromProto(req);
        absl::StatusOr<registry::ResolveResult> res =
            r.Resolve({req.model(), req.cache_salt(), specs});
        st = res.status();
        if (res.ok()) {
          FUZZ_CHECK(res->chunks.size() == specs.size(), "resolve lost chunks");
          v2::ResolveResponse resp;
          registry::wire::ToProto(*res, &resp);
          absl::StatusOr<registry::ResolveResult> back = registry::wire::FromProto(resp);
          FUZZ_CHECK(back.ok() && back->chunks.size() == res->chunks.size(),
                     "a resolve answer does not read back");
        }
        break;
      }
      case 3: {
        v2::RegisterWorkerRequest req;
        if (!Parse(bytes, &req)) break;
        st = r.RegisterWorker(registry::wire::FromProto(req)).status();
        break;
      }
      case 4: {
        v2::HeartbeatRequest req;
        if (!Parse(bytes, &req)) break;
        st = r.Heartbeat(req.worker_id(), registry::wire::FromProto(req.load())).status();
        break;
      }
      case 5:
        clock.AdvanceMs(static_cast<int64_t>(n) * 100);
        r.Sweep();
        break;
      case 6: {
        // Pin (odd length) or evict (even) the chunk listed at position n % listed.
        absl::StatusOr<std::vector<registry::ChunkRecord>> listed = r.ListChunks(100, "", nullptr);
        if (!listed.ok() || listed->empty()) break;
        const registry::Hash128 h = (*listed)[n % listed->size()].hash;
        st = (n % 2 == 1) ? r.PinChunk(h, 1 + static_cast<int64_t>(n), std::nullopt).status()
                          : r.EvictChunk(h).status();
        break;
      }
      default:
        st = r.DeregisterWorker(bytes);
        break;
    }
    Bounded(st);
    CheckInvariants(r);
  }
}

}  // namespace
}  // namespace cascade::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field with invalid UTF-8 it parses; that is expected here and
  // would drown the fuzzer's output (and slow it down).
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cascade::fuzz::OneInput(data, size);
  return 0;
}
