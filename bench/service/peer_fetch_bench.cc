// Peer KV fetch vs re-prefill (issue 13): two workers in this process, each a real gRPC server
// on loopback with internal mTLS (a throwaway CA), on one backend (CUDA: both on the same GPU,
// so the KV still goes GPU -> host -> gRPC -> host -> GPU, as between two GPUs of one host).
// Per prompt length: worker 0 prefills a fresh prompt cold (the time the receiver would spend
// re-prefilling it), then worker 1 serves the same prompt told that worker 0 holds it, fetching
// the blocks; both calls end after one sampled token (with logprobs), and the fetched call must
// give the cold call's token and logprob bits. Prints a table and the router's crossover flags
// fitted from it (docs: bench/service/RESULTS.md).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cascade/v2/worker.grpc.pb.h"
#include "common/cert_gen.h"
#include "common/flags.h"
#include "common/internal_auth.h"
#include "common/log.h"
#include "gpu_worker/model/config.h"
#include "gpu_worker/model/generator.h"
#include "gpu_worker/service/peer_fetch.h"
#include "gpu_worker/service/worker_server.h"

namespace cascade {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "cuda";
  std::string preset = "qwen3-0.6b";
  std::string model_dir;  // empty: $TMPDIR/cascade_peer_<preset>, generated when missing
  std::string lengths = "2048,8192,32768";
  int reps = 3;
  int64_t kv_blocks = 0;            // per worker; 0: enough for the longest prompt
  int64_t receiver_host_bytes = 0;  // 0: enough for the longest prompt
  int max_batched_tokens = 8192;
  bool keep_buffers = true;  // worker::KeepKvBuffersMapped, as the worker binary does
  // "e2e": re-prefill vs a Generate that fetches (exactness checked); "transport": FetchKv
  // alone, from a holder whose host tier was seeded with random blocks (no prefill).
  std::string mode = "e2e";
};

struct Call {
  grpc::Status status;
  double ms = 0;
  int64_t cached = -1;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> bits;  // logprobs as bits
};

cascade::v2::WorkerServiceGenerateRequest Prompt(int len, uint32_t seed) {
  std::mt19937 rng(seed);
  cascade::v2::WorkerServiceGenerateRequest r;
  r.set_request_id("peer-bench-" + std::to_string(seed));
  auto* sys = r.add_chunks();
  sys->set_kind(cascade::v2::CHUNK_KIND_SYSTEM);
  for (int i = 0; i < len; ++i) sys->add_token_ids(static_cast<int32_t>(100 + rng() % 150000));
  auto* q = r.add_chunks();
  q->set_kind(cascade::v2::CHUNK_KIND_QUERY);
  for (int i = 0; i < 16; ++i) q->add_token_ids(static_cast<int32_t>(100 + rng() % 150000));
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_seed(seed);
  r.mutable_sampling()->set_max_tokens(1);
  r.mutable_sampling()->set_logprobs(5);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

void Bits(float f, std::vector<uint32_t>* out) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  out->push_back(u);
}

Call Generate(cascade::v2::WorkerService::Stub& stub,
              const cascade::v2::WorkerServiceGenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  Call c;
  const auto t0 = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  cascade::v2::WorkerServiceGenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_start()) c.cached = m.start().cached_tokens();
    for (int32_t t : m.tokens().token_ids()) c.tokens.push_back(t);
    for (const auto& lp : m.tokens().logprobs()) {
      Bits(lp.sampled().logprob(), &c.bits);
      for (const auto& t : lp.top()) Bits(t.logprob(), &c.bits);
    }
  }
  c.status = reader->Finish();
  c.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return c;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// CPU time of the whole process (both workers, every thread), in ms.
double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Transport alone: worker 0's host tier holds random blocks under a random key chain (written
// by a request carrying them as peer blocks, as a receiver's import does); a PeerFetcher with
// worker 1's identity fetches them over loopback mTLS, and each fetch is timed from the call to
// the verified outcome (its header, first block and checks from FetchTimings). No import.
int RunTransport(const Options& o, const std::vector<int>& lengths, worker::WorkerServer& holder,
                 const common::InternalAuthOptions& client_auth) {
  engine::Engine& engine = holder.loop().engine();
  const int64_t block_bytes = engine.backend().KvBlockBytes();
  const int bs = engine.backend().BlockSize();
  std::mt19937_64 rng(7);
  worker::PeerFetchOptions po;
  po.tls = common::InternalClientTls(client_auth, common::kWorkerServerName);
  po.timeout = absl::Seconds(120);
  po.max_bytes = int64_t{1} << 40;
  worker::PeerFetcher fetcher(po);
  common::SetLogLevel(common::LogLevel::kDebug);  // the holder's fetch_kv_served lines
  const auto fetch = [&](const std::vector<hash::Hash128>& keys) {
    worker::FetchPlan plan;
    plan.address = holder.address();
    plan.model = engine.options().model_name;
    plan.backend = engine.backend().KvNumerics();
    plan.block_bytes = block_bytes;
    plan.block_size = bs;
    plan.keys = keys;
    std::promise<worker::FetchOutcome> p;
    const double cpu0 = ProcessCpuMs();
    const auto t0 = Clock::now();
    auto call =
        fetcher.Fetch(std::move(plan), std::chrono::system_clock::now() + std::chrono::seconds(120),
                      [&p](worker::FetchOutcome out) { p.set_value(std::move(out)); });
    worker::FetchOutcome out = p.get_future().get();
    const double ms = MsSince(t0);
    return std::make_tuple(ms, ProcessCpuMs() - cpu0, std::move(out));
  };
  std::printf(
      "| prefix tokens | blocks | KV MB | fetch ms | GB/s | CPU ms | CPU ms/MB | header ms | "
      "first block ms | "
      "last block ms | end ms | verify ms | messages |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::pair<double, double>> points;  // (MB, ms)
  bool ok = true;
  for (int len : lengths) {
    const int64_t n = len / bs;
    engine::Request seed;
    seed.request_id = "seed-" + std::to_string(len);
    seed.chunks.push_back({.kind = 1, .tokens = std::vector<int32_t>(16, 1000 + len % 1000)});
    seed.sampling.max_tokens = 1;
    std::vector<hash::Hash128> keys;
    hash::Hash128 parent;
    for (int64_t i = 0; i < n; ++i) {
      engine::PeerBlock b{{rng(), rng()}, parent, std::string(block_bytes, '\0')};
      for (char& c : b.bytes) c = static_cast<char>(rng());
      parent = b.key;
      keys.push_back(b.key);
      seed.peer_blocks.push_back(std::move(b));
    }
    std::promise<void> seeded;
    auto sub = holder.loop().Submit(std::move(seed), [&seeded](const engine::SequenceOutput& s) {
      if (s.finished) seeded.set_value();
    });
    if (!sub.ok()) {
      std::fprintf(stderr, "seed: %s\n", sub.status().ToString().c_str());
      return 1;
    }
    seeded.get_future().get();
    std::vector<double> ms, cpu;
    worker::FetchTimings t;
    for (int rep = 0; rep < o.reps; ++rep) {
      auto [m, c, out] = fetch(keys);
      if (out.result != worker::FetchResult::kOk || static_cast<int64_t>(out.blocks.size()) != n) {
        std::fprintf(stderr, "len %d: fetch %s: %s (%zu blocks)\n", len,
                     std::string(worker::FetchResultName(out.result)).c_str(), out.detail.c_str(),
                     out.blocks.size());
        ok = false;
        break;
      }
      ms.push_back(m);
      cpu.push_back(c);
      if (rep == 0 || m <= *std::min_element(ms.begin(), ms.end())) t = out.timings;
    }
    if (ms.empty()) continue;
    const double mb = static_cast<double>(n * block_bytes) / 1e6;
    const double med = Median(ms);
    points.push_back({mb, med});
    const double cpu_med = Median(cpu);
    std::printf(
        "| %d | %lld | %.0f | %.1f | %.3f | %.0f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %lld "
        "|\n",
        len, static_cast<long long>(n), mb, med, mb / med, cpu_med, cpu_med / mb, t.header_ms,
        t.first_block_ms, t.last_block_ms, t.end_ms, t.verify_ms,
        static_cast<long long>(t.messages));
    std::fflush(stdout);
  }
  if (points.size() > 1) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (auto [x, y] : points) {
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    const double k = static_cast<double>(points.size());
    const double b = (k * sxy - sx * sy) / (k * sxx - sx * sx);
    std::printf("\nfit: fetch ms = %.1f + %.3f x MB (%.3f GB/s marginal)\n", (sy - b * sx) / k, b,
                1.0 / b);
  }
  return ok ? 0 : 1;
}

int Run(const Options& o) {
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(o.lengths, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 16) {
      std::fprintf(stderr, "bad --lengths\n");
      return 2;
    }
    lengths.push_back(n);
  }
  const int longest = *std::max_element(lengths.begin(), lengths.end());
  absl::StatusOr<model::ModelConfig> cfg = model::FindPresetConfig(o.preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 2;
  }
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  const std::string dir =
      o.model_dir.empty() ? (tmp / ("cascade_peer_" + o.preset)).string() : o.model_dir;
  if (!std::filesystem::exists(dir + "/config.json")) {
    if (absl::Status s = model::WriteRandomModel(dir, *cfg, 1, ""); !s.ok()) {
      std::fprintf(stderr, "mkmodel: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  // Internal mTLS as in production: a throwaway CA, a certificate per worker and the client's.
  const std::string cert_dir = (tmp / ("cascade_peer_certs_" + std::to_string(getpid()))).string();
  absl::StatusOr<common::StackCertPaths> certs =
      common::WriteStackCerts(cert_dir, {.worker_ids = {"w0", "w1"}});
  if (!certs.ok()) {
    std::fprintf(stderr, "certs: %s\n", certs.status().ToString().c_str());
    return 1;
  }
  const int bs = 16;
  const int64_t blocks = o.kv_blocks > 0 ? o.kv_blocks : (longest + 64) / bs + 64;
  const int64_t bytes_per_token =
      2 * cfg->num_hidden_layers * cfg->kv_size() * (o.backend == "cpu" ? 4 : 2);
  const int64_t host_bytes = o.receiver_host_bytes > 0
                                 ? o.receiver_host_bytes
                                 : (longest + 64) * bytes_per_token + (int64_t{64} << 20);
  const bool transport = o.mode == "transport";
  if (!transport && o.mode != "e2e") {
    std::fprintf(stderr, "bad --mode\n");
    return 2;
  }
  std::vector<std::unique_ptr<worker::WorkerServer>> workers;
  for (int i = 0; i < (transport ? 1 : 2); ++i) {
    worker::WorkerConfig w;
    w.server.host = "127.0.0.1";
    w.server.port = 0;
    w.server.handle_signals = false;
    w.server.print_ready_line = false;
    w.model_dir = dir;
    w.backend = o.backend;
    w.kv_blocks = blocks;
    w.block_size = bs;
    w.max_batched_tokens = o.max_batched_tokens;
    w.max_context = longest + 256;
    w.host_kv_bytes = i == 1 || transport ? host_bytes : (int64_t{64} << 20);
    w.worker_id = "w" + std::to_string(i);
    w.internal_auth = {.ca_file = certs->ca(),
                       .cert_file = certs->worker_cert(w.worker_id),
                       .key_file = certs->worker_key(w.worker_id)};
    w.peer_fetch.timeout = absl::Seconds(120);
    w.peer_fetch.max_bytes = host_bytes;
    auto s = worker::WorkerServer::Start(w);
    if (!s.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", i, s.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*s));
  }
  if (transport) {
    std::printf(
        "# peer_fetch_bench --mode=transport: backend %s, preset %s, %d fetches per length "
        "(median), loopback gRPC with internal mTLS\n\n",
        workers[0]->loop().engine().backend().Name().c_str(), o.preset.c_str(), o.reps);
    const int rc = RunTransport(o, lengths, *workers[0],
                                {.ca_file = certs->ca(),
                                 .cert_file = certs->worker_cert("w1"),
                                 .key_file = certs->worker_key("w1")});
    for (auto& w : workers) w->Shutdown(absl::Seconds(1));
    std::filesystem::remove_all(cert_dir);
    return rc;
  }
  std::vector<std::unique_ptr<cascade::v2::WorkerService::Stub>> stubs;
  for (auto& w : workers) {
    common::InternalAuthOptions gw{.ca_file = certs->ca(),
                                   .cert_file = certs->cert("gateway"),
                                   .key_file = certs->key("gateway")};
    auto ch =
        common::MakeChannel(w->address(), common::InternalClientTls(gw, common::kWorkerServerName));
    if (!ch.ok()) return 1;
    stubs.push_back(cascade::v2::WorkerService::NewStub(*ch));
  }
  const std::string device = workers[0]->loop().engine().backend().Name();
  std::printf(
      "# peer_fetch_bench: backend %s, preset %s, %d reps per length, KV %lld blocks of "
      "%d tokens per worker, %lld KV bytes per token, two workers in one process over "
      "loopback gRPC with internal mTLS\n\n",
      device.c_str(), o.preset.c_str(), o.reps, static_cast<long long>(blocks), bs,
      static_cast<long long>(bytes_per_token));
  // Warm both (first-call setup, graph captures): a short prompt each, not timed.
  for (int i = 0; i < 2; ++i) Generate(*stubs[i], Prompt(64, 999 + i));

  std::printf(
      "| prefix tokens | KV MB | re-prefill ms | peer fetch ms | fetch GB/s | speedup "
      "| cached tokens | fetched == cold |\n|---:|---:|---:|---:|---:|---:|---:|---|\n");
  struct Row {
    int len;
    double prefill_ms, fetch_ms;
  };
  std::vector<Row> rows;
  bool all_equal = true;
  uint32_t seed = 1;
  for (int len : lengths) {
    std::vector<double> prefill, fetch;
    bool equal = true;
    int64_t cached = 0;
    for (int rep = 0; rep < o.reps; ++rep) {
      cascade::v2::WorkerServiceGenerateRequest req = Prompt(len, seed++);
      const Call cold = Generate(*stubs[0], req);
      req.mutable_peer()->set_worker_id("w0");
      req.mutable_peer()->set_address(workers[0]->address());
      req.mutable_peer()->set_tokens(len);
      const auto before = workers[1]->loop().engine().Stats();
      const Call got = Generate(*stubs[1], req);
      const auto after = workers[1]->loop().engine().Stats();
      if (!cold.status.ok() || !got.status.ok()) {
        std::fprintf(stderr, "len %d: cold %s / fetched %s\n", len,
                     cold.status.error_message().c_str(), got.status.error_message().c_str());
        return 1;
      }
      const bool same = cold.tokens == got.tokens && cold.bits == got.bits && !cold.bits.empty();
      equal = equal && same;
      cached = got.cached;
      if (after.peer_imported_blocks - before.peer_imported_blocks != len / bs) {
        std::fprintf(
            stderr, "len %d: the fetch fell back (%lld blocks imported)\n", len,
            static_cast<long long>(after.peer_imported_blocks - before.peer_imported_blocks));
        equal = false;
      }
      prefill.push_back(cold.ms);
      fetch.push_back(got.ms);
    }
    all_equal = all_equal && equal;
    const double kv_mb = static_cast<double>(len / bs * bs * bytes_per_token) / 1e6;
    const Row r{len, Median(prefill), Median(fetch)};
    rows.push_back(r);
    std::printf("| %d | %.0f | %.1f | %.1f | %.2f | %.2fx | %lld | %s |\n", len, kv_mb,
                r.prefill_ms, r.fetch_ms, kv_mb / r.fetch_ms, r.prefill_ms / r.fetch_ms,
                static_cast<long long>(cached), equal ? "yes (tokens + logprob bits)" : "NO");
    std::fflush(stdout);
  }
  // Fit fetch ms = a + b * tokens over the lengths (least squares), and prefill tokens/s from the
  // longest; the router's flags follow from them (README, router.h).
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Row& r : rows) {
    sx += r.len;
    sy += r.fetch_ms;
    sxx += static_cast<double>(r.len) * r.len;
    sxy += r.len * r.fetch_ms;
  }
  const double n = static_cast<double>(rows.size());
  const double b = rows.size() > 1 ? (n * sxy - sx * sy) / (n * sxx - sx * sx) : sy / sx;
  const double a = rows.size() > 1 ? (sy - b * sx) / n : 0;
  const double bandwidth = static_cast<double>(bytes_per_token) / (b / 1000.0);
  std::printf("\nfit: fetch ms = %.1f + %.5f x tokens (%.2f GB/s end to end)\n", a, b,
              bandwidth / 1e9);
  for (const Row& r : rows) {
    const double tps = r.len / (r.prefill_ms / 1000.0);
    const double ratio = tps * bytes_per_token / bandwidth;
    std::printf("at %d tokens: prefill %.0f tokens/s -> route_fetch weight %.3f (fetch %s)\n",
                r.len, tps, ratio, ratio < 1 ? "wins" : "loses");
  }
  const Row& last = rows.back();
  std::printf(
      "router flags: --route_fetch_bandwidth=%.3g --route_prefill_tokens_per_s=%.0f "
      "--route_fetch_overhead_ms=%.0f\n",
      bandwidth, last.len / (last.prefill_ms / 1000.0), std::max(0.0, a));
  std::printf("fetched == cold (tokens and logprob bits) in every call: %s\n",
              all_equal ? "OK" : "FAILED");
  for (auto& w : workers) w->Shutdown(absl::Seconds(1));
  std::filesystem::remove_all(cert_dir);
  return all_equal ? 0 : 1;
}

}  // namespace
}  // namespace cascade

int main(int argc, char** argv) {
  cascade::Options o;
  cascade::common::FlagSet f("cascade_peer_fetch_bench", "peer KV fetch vs re-prefill");
  f.AddString("backend", &o.backend, "cpu or cuda");
  f.AddString("preset", &o.preset, "model shape (mkmodel preset)");
  f.AddString("model_dir", &o.model_dir,
              "model directory; empty: generated under $TMPDIR (else /tmp)");
  f.AddString("lengths", &o.lengths, "prefix lengths in tokens, comma-separated");
  f.AddInt("reps", &o.reps, "prompts per length (medians reported)");
  f.AddInt64("kv_blocks", &o.kv_blocks, "KV blocks per worker; 0: enough for the longest");
  f.AddInt64("receiver_host_bytes", &o.receiver_host_bytes,
             "the receiver's host KV tier; 0: enough for the longest");
  f.AddInt("max_batched_tokens", &o.max_batched_tokens, "prefill chunk (tokens per step)");
  f.AddBool("keep_buffers", &o.keep_buffers,
            "keep freed KV buffers mapped (worker::KeepKvBuffersMapped), as cascade-worker does");
  f.AddString("mode", &o.mode,
              "e2e (re-prefill vs a fetching Generate) or transport (FetchKv alone, seeded "
              "holder)");
  if (std::optional<int> code = cascade::common::ParseFlags(f, argc, argv)) return *code;
  if (o.keep_buffers && !cascade::worker::KeepKvBuffersMapped()) {
    std::fprintf(stderr, "KeepKvBuffersMapped: not applied (not glibc?)\n");
  }
  return cascade::Run(o);
}
