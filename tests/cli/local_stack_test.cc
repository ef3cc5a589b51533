// `cascade up`'s process handling against the real binaries: registry, a worker and the gateway
// start as child processes on free ports, one Generate through the gateway streams a start,
// deltas and a finish; and a child that dies before its ready line is reported with its log.
#include "services/cli/local_stack.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#include "services/cli/child_process.h"
#include "services/cli/cli.h"
#include "services/cli/gateway_client.h"
#include "tests/cli/test_util.h"

namespace cascade::cli {
namespace {
using test_util::BinDir;
// A scratch directory named for this test binary.
struct TempDir : test_util::TempDir {
  TempDir() : test_util::TempDir("cascade_stack_test") {}
};
namespace fs = std::filesystem;

// One CPU worker on the tiny model (under `dir`, made by EnsureModel), free ports, logs in `dir`.
StackOptions TinyCpuStack(const TempDir& dir) {
  StackOptions options;
  options.bin_dir = BinDir();
  options.model_dir = dir.path() + "/tiny";
  options.log_dir = dir.path() + "/logs";
  options.backend = "cpu";
  options.workers = 1;
  options.worker_threads = 1;
  options.ready_timeout = absl::Seconds(30);
  options.stop_grace = absl::Seconds(10);
  return options;
}

// One worker per GPU: CUDA_VISIBLE_DEVICES decides what is visible when set, else the driver's
// /proc folder; workers go round-robin over the GPUs, and sharers of a GPU split its KV memory.
TEST(LocalStackTest, CountsVisibleGpusFromTheEnvironmentOrTheDriver) {
  EXPECT_EQ(CountVisibleGpus("0,1,2", "/nonexistent"), 3);
  EXPECT_EQ(CountVisibleGpus("GPU-1a2b,GPU-3c4d", "/nonexistent"), 2);
  EXPECT_EQ(CountVisibleGpus("", "/nonexistent"), 0);
  EXPECT_EQ(CountVisibleGpus("-1", "/nonexistent"), 0);
  EXPECT_EQ(CountVisibleGpus("1,-1,2", "/nonexistent"), 1);
  EXPECT_EQ(CountVisibleGpus(nullptr, "/nonexistent"), 0);
  TempDir tmp;
  const std::filesystem::path dir = std::filesystem::path(tmp.path()) / "gpus";
  std::filesystem::create_directories(dir / "0000:18:00.0");
  std::filesystem::create_directories(dir / "0000:2a:00.0");
  EXPECT_EQ(CountVisibleGpus(nullptr, dir.string()), 2);
}

TEST(LocalStackTest, PlacesOneWorkerPerGpuAndSplitsASharedGpu) {
  EXPECT_TRUE(PlaceWorkersOnGpus(3, 0).empty());
  std::vector<GpuPlacement> even = PlaceWorkersOnGpus(4, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(even[i].device, i);
    EXPECT_DOUBLE_EQ(even[i].kv_cache_fraction, 0.8);
  }
  // 3 workers on 2 GPUs: GPU 0 holds workers 0 and 2, which should each end with 0.4 of it.
  std::vector<GpuPlacement> shared = PlaceWorkersOnGpus(3, 2);
  EXPECT_EQ(shared[0].device, 0);
  EXPECT_EQ(shared[1].device, 1);
  EXPECT_EQ(shared[2].device, 0);
  EXPECT_DOUBLE_EQ(shared[1].kv_cache_fraction, 0.8);
  const double first = shared[0].kv_cache_fraction;
  const double second = shared[2].kv_cache_fraction * (1.0 - first);  // of the whole GPU
  EXPECT_NEAR(first, 0.4, 1e-12);
  EXPECT_NEAR(second, 0.4, 1e-12);
  for (const GpuPlacement& p : PlaceWorkersOnGpus(8, 1)) {
    EXPECT_GT(p.kv_cache_fraction, 0);
    EXPECT_LT(p.kv_cache_fraction, 1);
  }
}

// Two `cascade up` making the same default model at once (two terminals, or the e2e tests at -j2
// on a fresh build) must each end with a whole model: it is generated beside the target and
// renamed into place, so none loads a half-written one, and no temp dir is left behind.
TEST(LocalStackTest, ConcurrentModelPreparationsEachSeeAWholeModel) {
  const std::string tokenizer_dir = model::DefaultTokenizerDir();
  ASSERT_TRUE(fs::exists(tokenizer_dir + "/tokenizer.json"))
      << "no tokenizer at " << tokenizer_dir << ": run scripts/setup.sh";
  TempDir dir;
  const std::string target = dir.path() + "/models/tiny";
  constexpr int kMakers = 4;
  std::vector<absl::Status> made(kMakers);
  std::vector<std::thread> makers;
  for (int i = 0; i < kMakers; ++i) {
    makers.emplace_back([&, i] {
      made[i] = EnsureModel(target, "tiny", nullptr);
      // Right after its own call returns, each must find a model that loads.
      if (made[i].ok()) made[i] = model::LoadModel(target).status();
    });
  }
  for (std::thread& t : makers) t.join();
  for (int i = 0; i < kMakers; ++i) EXPECT_TRUE(made[i].ok()) << "maker " << i << ": " << made[i];
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path() + "/models")) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "tiny") << "left behind: " << e.path();
  }
  EXPECT_EQ(entries, 1);
}

TEST(LocalStackTest, ChildThatExitsBeforeItsReadyLineIsReportedWithItsLog) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  TempDir dir;
  ChildSpec spec{"cascade-registry",
                 BinDir() + "/cascade-registry",
                 {"--no_such_flag=1"},
                 dir.path() + "/registry.log"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> ready = (*child)->WaitReady(absl::Seconds(10));
  ASSERT_FALSE(ready.ok());
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kUnavailable) << ready.status();
  EXPECT_NE(ready.status().message().find("exited with code 2"), std::string::npos)
      << ready.status();
  EXPECT_NE(ready.status().message().find("no_such_flag"), std::string::npos) << ready.status();

  spec.path = BinDir() + "/no-such-binary";
  EXPECT_EQ(ChildProcess::Spawn(spec).status().code(), absl::StatusCode::kNotFound);
}

TEST(LocalStackTest, StackOfRealBinariesServesAGenerateStreamAndStops) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  for (const char* binary : {"cascade-registry", "cascade-worker"}) {
    ASSERT_TRUE(fs::exists(BinDir() + "/" + binary)) << binary << " not built in " << BinDir();
  }
  if (!fs::exists(BinDir() + "/cascade-gateway")) {
    GTEST_SKIP() << "cascade-gateway is not built in " << BinDir()
                 << " (services/gateway/ not there yet): nothing to send Generate through";
  }
  const std::string tokenizer_dir = model::DefaultTokenizerDir();
  ASSERT_TRUE(fs::exists(tokenizer_dir + "/tokenizer.json"))
      << "no tokenizer at " << tokenizer_dir << ": run scripts/setup.sh";
  TempDir dir;
  std::ostringstream progress;
  StackOptions options = TinyCpuStack(dir);
  ASSERT_TRUE(EnsureModel(options.model_dir, "tiny", &progress).ok()) << progress.str();
  absl::StatusOr<std::unique_ptr<LocalStack>> stack = LocalStack::Start(options, &progress);
  ASSERT_TRUE(stack.ok()) << stack.status() << "\n" << progress.str();
  EXPECT_GT((*stack)->gateway_port(), 0);
  EXPECT_GT(PortOf((*stack)->registry().address), 0);
  ASSERT_EQ((*stack)->workers().size(), 1u);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial((*stack)->gateway().address);
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  v2::GenerateRequest request;
  v2::Chunk* system = request.add_chunks();
  system->set_kind(v2::CHUNK_KIND_SYSTEM);
  system->set_text("You are a test.");
  v2::Chunk* query = request.add_chunks();
  query->set_kind(v2::CHUNK_KIND_QUERY);
  query->set_text("Say something.");
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(6);
  request.mutable_sampling()->set_ignore_eos(true);
  std::vector<v2::GenerateResponse::EventCase> order;
  absl::StatusOr<GenerateResult> result =
      RunGenerate(*stub, request, CallOptions{absl::Seconds(30), ""},
                  [&](const v2::GenerateResponse& msg) { order.push_back(msg.event_case()); });
  ASSERT_TRUE(result.ok()) << result.status() << "\nlogs in " << (*stack)->log_dir();
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(order.front(), v2::GenerateResponse::kStart);
  EXPECT_EQ(order.back(), v2::GenerateResponse::kFinish);
  EXPECT_GT(result->deltas, 0);
  EXPECT_EQ(result->start.worker_id(), "worker-0");
  EXPECT_GT(result->start.prompt_tokens(), 0);
  EXPECT_EQ(result->token_ids.size(), 6u);
  EXPECT_EQ(result->finish.usage().completion_tokens(), 6);
  EXPECT_EQ(result->finish.finish_reason(), v2::FINISH_REASON_LENGTH);
  EXPECT_GE(result->ttft_ms, 0);

  absl::StatusOr<v2::WorkerServiceGetStatsResponse> stats =
      GetWorkerStats((*stack)->workers()[0].address, absl::Seconds(5),
                     (*stack)->AdminTls(common::kWorkerServerName));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->generation_tokens(), 6);

  // The `generate` command against the same gateway: text on stdout, the summary on stderr.
  std::istringstream no_input;
  std::ostringstream out, err;
  int code = RunCli({"generate", "--gateway", (*stack)->gateway().address, "--system", "Be brief.",
                     "--query", "Hello?", "--max_tokens=3", "--temperature=0", "--timeout=30s"},
                    no_input, out, err);
  EXPECT_EQ(code, 0) << err.str();
  EXPECT_FALSE(out.str().empty());
  EXPECT_NE(err.str().find("worker-0: prompt"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("completion 3 tokens"), std::string::npos) << err.str();

  EXPECT_EQ((*stack)->FindDeadChild(), std::nullopt);
  stub.reset();  // an idle client channel would stretch the gateway's drain
  channel->reset();
  const absl::Time stop_start = absl::Now();
  (*stack)->Stop(&progress);
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(8))
      << "children stopped on SIGTERM, no SIGKILL";
  EXPECT_NE(progress.str().find("gateway exited with code 0"), std::string::npos) << progress.str();
}

// The OpenAI HTTP front on a free port: the stack reports the port the gateway bound, the API
// answers as soon as Start returns (the gateway prints its ready line only once the front
// listens), and a gateway killed by SIGKILL comes back on the same HTTP port.
TEST(LocalStackTest, HttpFrontOnAFreePortIsReportedAndKeptAcrossAGatewayRestart) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  for (const char* binary : {"cascade-registry", "cascade-worker", "cascade-gateway"}) {
    ASSERT_TRUE(fs::exists(BinDir() + "/" + binary)) << binary << " not built in " << BinDir();
  }
  ASSERT_TRUE(fs::exists(model::DefaultTokenizerDir() + "/tokenizer.json"))
      << "run scripts/setup.sh";
  TempDir dir;
  std::ostringstream progress;
  StackOptions options = TinyCpuStack(dir);
  ASSERT_TRUE(EnsureModel(options.model_dir, "tiny", &progress).ok()) << progress.str();
  options.http_port = 0;
  options.restart.initial_backoff = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<LocalStack>> stack = LocalStack::Start(options, &progress);
  ASSERT_TRUE(stack.ok()) << stack.status() << "\n" << progress.str();
  const int port = (*stack)->http_port();
  ASSERT_GT(port, 0) << progress.str();
  EXPECT_NE(port, (*stack)->gateway_port());
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30);
  httplib::Result models = http.Get("/v1/models");
  ASSERT_TRUE(models) << "no HTTP answer on port " << port << " right after Start";
  EXPECT_EQ(models->status, 200) << models->body;
  EXPECT_NE(models->body.find("\"object\":\"list\""), std::string::npos) << models->body;

  const pid_t old_pid = (*stack)->States().back().pid;
  ASSERT_EQ((*stack)->States().back().role, "gateway");
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  std::ostringstream log;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool back = false;
  while (!back && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    (*stack)->Supervise(&log);
    const ChildState gw = (*stack)->States().back();
    back = gw.phase == ChildState::Phase::kServing && gw.pid != old_pid;
  }
  ASSERT_TRUE(back) << log.str();
  EXPECT_EQ((*stack)->http_port(), port);
  models = http.Get("/v1/models");
  ASSERT_TRUE(models) << "the restarted gateway does not answer on HTTP port " << port << "\n"
                      << log.str();
  EXPECT_EQ(models->status, 200) << models->body;
  (*stack)->Stop(&progress);
}

}  // namespace
}  // namespace cascade::cli
