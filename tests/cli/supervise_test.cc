// `cascade up` supervises its children, tested on the real binaries over loopback (tiny model,
// CPU backend): SIGKILL of the worker serving a long greedy stream costs that stream nothing (it
// resumes on the other worker with exactly the tokens of an uninterrupted cold run), a stream on
// the other worker is untouched, and the killed worker is restarted on its port and registers
// again. A child that keeps dying is given up on while the rest keep serving. The log directory
// `cascade up` makes itself goes when it stops cleanly and stays when a child died.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cascade/v2/registry.grpc.pb.h"
#include "common/internal_auth.h"
#include "gpu_worker/model/generator.h"
#include "services/cli/child_process.h"
#include "services/cli/gateway_client.h"
#include "services/cli/local_stack.h"
#include "services/cli/proc_info.h"
#include "tests/cli/test_util.h"

namespace cascade::cli {
namespace {
using test_util::BinDir;
// A scratch directory named for this test binary.
struct TempDir : test_util::TempDir {
  TempDir() : test_util::TempDir("cascade_supervise_test") {}
};
namespace fs = std::filesystem;

// Polls `done` every 100 ms for at most `limit`.
bool WaitFor(const std::function<bool()>& done, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return done();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Admin client TLS with the certificates `cascade up --log_dir=<dir>/logs` made.
common::ClientTlsOptions AdminTls(const TempDir& dir, std::string_view server_name) {
  common::StackCertPaths certs{dir.path() + "/logs/certs"};
  return common::InternalClientTls(
      {.ca_file = certs.ca(), .cert_file = certs.cert("admin"), .key_file = certs.key("admin")},
      server_name);
}

// Where `cascade up` makes its own log directory when run with `own_log_dir` (its $TMPDIR).
std::string UpTmpDir(const TempDir& dir) { return dir.path() + "/tmp"; }

// The entries of `dir`.
std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

// `cascade up` as a user runs it, as a child process of the test, on free ports.
class UpProcess {
 public:
  // `own_log_dir`: no --log_dir, so `cascade up` makes one under UpTmpDir(dir); otherwise its logs
  // go to <dir>/logs.
  explicit UpProcess(const TempDir& dir, std::vector<std::string> extra = {},
                     bool own_log_dir = false)
      : dir_(dir) {
    std::ostringstream progress;
    const std::string model_dir = dir.path() + "/tiny";
    ok_ = EnsureModel(model_dir, "tiny", &progress).ok() && fs::create_directories(UpTmpDir(dir));
    // Through env(1), which execs `cascade` in the same process, to set its TMPDIR.
    std::vector<std::string> args = {"TMPDIR=" + UpTmpDir(dir),
                                     BinDir() + "/cascade",
                                     "up",
                                     "--port=0",
                                     "--workers=2",
                                     "--backend=cpu",
                                     "--worker_threads=1",
                                     "--model_dir=" + model_dir,
                                     "--ready_timeout=60s"};
    if (!own_log_dir) args.push_back("--log_dir=" + dir.path() + "/logs");
    args.insert(args.end(), extra.begin(), extra.end());
    // `cascade up` prints "  gateway   HOST:PORT  (...)" on stdout once everything is ready.
    ChildSpec spec{"cascade", "/usr/bin/env", args, dir.path() + "/up.log", "  gateway   "};
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spec);
    if (!child.ok()) {
      error_ = child.status().ToString();
      return;
    }
    up_ = std::move(*child);
    absl::StatusOr<std::string> gateway = up_->WaitReady(absl::Seconds(120));
    if (!gateway.ok()) {
      error_ = gateway.status().ToString();
      return;
    }
    gateway_ = DialAddress(*gateway);
  }
  ~UpProcess() {
    if (up_) up_->Stop(absl::Seconds(30));
  }

  bool ready() const { return ok_ && !gateway_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& gateway() const { return gateway_; }
  ChildProcess& process() { return *up_; }
  std::string log() const { return ReadAll(dir_.path() + "/up.log"); }
  // The address `cascade up` listed for `name` ("registry", "worker-1"), from its listing.
  std::string ListedAddress(const std::string& name) const {
    for (absl::string_view line : absl::StrSplit(log(), '\n')) {
      std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (words.size() >= 2 && words[0] == name) return words[1];
    }
    return "";
  }

 private:
  const TempDir& dir_;
  bool ok_ = false;
  std::unique_ptr<ChildProcess> up_;
  std::string gateway_;
  std::string error_;
};

v2::GenerateRequest LongGreedy(const std::string& system, const std::string& query, int tokens) {
  v2::GenerateRequest request;
  v2::Chunk* s = request.add_chunks();
  s->set_kind(v2::CHUNK_KIND_SYSTEM);
  s->set_text(system);
  v2::Chunk* q = request.add_chunks();
  q->set_kind(v2::CHUNK_KIND_QUERY);
  q->set_text(query);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

int LiveWorkers(v2::GatewayService::Stub& stub) {
  absl::StatusOr<v2::ListModelsResponse> models = ListModels(stub, {absl::Seconds(2), ""});
  return models.ok() && models->models_size() > 0 ? models->models(0).workers() : 0;
}

// What one stream brought, read on its own thread.
struct StreamRun {
  std::vector<int32_t> tokens;
  std::string worker;
  int starts = 0;
  v2::GenerateFinish finish;
  grpc::Status status;
};

TEST(SuperviseTest, KilledWorkerCostsNoStreamAndComesBack) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  ASSERT_TRUE(fs::exists(model::DefaultTokenizerDir() + "/tokenizer.json"))
      << "run scripts/setup.sh";
  TempDir dir;
  UpProcess up(dir);
  ASSERT_TRUE(up.ready()) << up.error() << "\n" << up.log();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial(up.gateway());
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(*stub) >= 2; }, absl::Seconds(30))) << up.log();

  // Cold references, one at a time on the idle stack.
  const v2::GenerateRequest victim_request =
      LongGreedy("You are a storyteller who never stops.", "Tell the longest story you know.", 400);
  const v2::GenerateRequest other_request =
      LongGreedy("You are a patient counter.", "Count slowly, in words.", 200);
  const CallOptions call{absl::Seconds(120), ""};
  absl::StatusOr<GenerateResult> want_victim = RunGenerate(*stub, victim_request, call);
  ASSERT_TRUE(want_victim.ok()) << want_victim.status();
  ASSERT_EQ(want_victim->token_ids.size(), 400u);
  absl::StatusOr<GenerateResult> want_other = RunGenerate(*stub, other_request, call);
  ASSERT_TRUE(want_other.ok()) << want_other.status();
  ASSERT_EQ(want_other->token_ids.size(), 200u);

  // The long stream; once it has 10 tokens, the other stream starts (on the other worker, the
  // victim being busy), and once that one streams too, the victim's worker is SIGKILLed.
  absl::Mutex mu;
  StreamRun victim_run, other_run;
  bool other_started = false;
  auto stream = [&](const v2::GenerateRequest& request, StreamRun* run,
                    const std::function<void(const StreamRun&)>& on_tokens) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    std::unique_ptr<grpc::ClientReaderInterface<v2::GenerateResponse>> reader =
        stub->Generate(&ctx, request);
    v2::GenerateResponse msg;
    while (reader->Read(&msg)) {
      absl::MutexLock lock(&mu);
      if (msg.has_start()) {
        ++run->starts;
        run->worker = msg.start().worker_id();
      }
      if (msg.has_delta()) {
        run->tokens.insert(run->tokens.end(), msg.delta().token_ids().begin(),
                           msg.delta().token_ids().end());
        on_tokens(*run);
      }
      if (msg.has_finish()) run->finish = msg.finish();
    }
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu);
    run->status = status;
  };
  std::thread other_thread;
  std::thread victim_thread([&] {
    stream(victim_request, &victim_run, [&](const StreamRun& run) {
      if (run.tokens.size() >= 10 && !other_thread.joinable()) {
        other_thread = std::thread([&] {
          stream(other_request, &other_run, [&](const StreamRun&) { other_started = true; });
        });
      }
    });
  });
  // Nothing returns before both threads are joined (ASSERTs come after).
  std::string victim, other_worker;
  size_t tokens_at_kill = 0;
  bool both_streaming = false;
  {
    absl::MutexLock lock(&mu);
    both_streaming = mu.AwaitWithTimeout(absl::Condition(&other_started), absl::Seconds(60));
    victim = victim_run.worker;
    other_worker = other_run.worker;
    tokens_at_kill = victim_run.tokens.size();
  }
  const pid_t victim_pid =
      both_streaming ? FindChildWithArg(up.process().pid(), "--worker_id=" + victim) : -1;
  const int64_t kill_ms = absl::ToUnixMillis(absl::Now());
  const bool killed = victim_pid > 0 && kill(victim_pid, SIGKILL) == 0;
  victim_thread.join();
  if (other_thread.joinable()) other_thread.join();
  ASSERT_TRUE(both_streaming) << "the second stream never streamed\n" << up.log();
  ASSERT_TRUE(killed) << "no child of cascade up runs " << victim;
  ASSERT_NE(other_worker, victim) << "both streams on one worker: nothing to compare";
  EXPECT_LT(tokens_at_kill, 400u) << "the long stream was over before the kill";

  EXPECT_TRUE(victim_run.status.ok()) << victim_run.status.error_message() << "\n" << up.log();
  EXPECT_EQ(victim_run.starts, 1);
  EXPECT_EQ(victim_run.tokens, want_victim->token_ids) << "the resumed stream differs from cold";
  EXPECT_EQ(victim_run.finish.finish_reason(), v2::FINISH_REASON_LENGTH);
  EXPECT_EQ(victim_run.finish.usage().completion_tokens(), 400);
  EXPECT_TRUE(other_run.status.ok()) << other_run.status.error_message();
  EXPECT_EQ(other_run.tokens, want_other->token_ids);
  EXPECT_EQ(other_run.finish.finish_reason(), v2::FINISH_REASON_LENGTH);
  EXPECT_TRUE(up.process().Running()) << "cascade up stopped: " << up.log();

  // The victim comes back: a new process with its id, answering on the same address, and
  // registered again with the registry (a lease granted after the kill; the dead one's lease
  // could not have been renewed).
  const std::string victim_address = up.ListedAddress(victim);
  const std::string registry_address = up.ListedAddress("registry");
  ASSERT_FALSE(victim_address.empty()) << up.log();
  ASSERT_FALSE(registry_address.empty()) << up.log();
  // ListWorkers is an admin RPC: `cascade up` left the admin certificate in <log_dir>/certs.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> registry_channel =
      common::MakeChannel(registry_address, AdminTls(dir, common::kRegistryServerName));
  ASSERT_TRUE(registry_channel.ok());
  std::unique_ptr<v2::ChunkRegistryService::Stub> registry =
      v2::ChunkRegistryService::NewStub(*registry_channel);
  pid_t new_pid = -1;
  auto registered_again = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v2::ListWorkersResponse workers;
    if (!registry->ListWorkers(&ctx, v2::ListWorkersRequest(), &workers).ok()) return false;
    for (const v2::WorkerRecord& w : workers.workers()) {
      // The registry's lease is 10 s (its default under `cascade up`); a lease ending later
      // than 10 s after the kill was granted to the new process.
      if (w.worker_id() == victim && w.address() == victim_address &&
          w.lease_expires_ms() > kill_ms + 10'000) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(WaitFor(
      [&] {
        new_pid = FindChildWithArg(up.process().pid(), "--worker_id=" + victim);
        return new_pid > 0 && new_pid != victim_pid &&
               GetWorkerStats(victim_address, absl::Seconds(2),
                              AdminTls(dir, common::kWorkerServerName))
                   .ok() &&
               registered_again();
      },
      absl::Seconds(60)))
      << victim << " did not come back (pid now " << new_pid << ")\n"
      << up.log();
  const std::string log = up.log();
  EXPECT_TRUE(
      absl::StrContains(log, absl::StrCat(victim, " (pid ", victim_pid, ") killed by signal 9")))
      << log;
  EXPECT_TRUE(absl::StrContains(log, victim + " is back")) << log;

  stub.reset();
  channel->reset();
  EXPECT_EQ(up.process().Stop(absl::Seconds(30)), "exited with code 0") << up.log();
}

// Holds a TCP port on 127.0.0.1 (listening, without SO_REUSEPORT), so a gRPC server cannot bind it.
class PortBlocker {
 public:
  explicit PortBlocker(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // past TIME_WAIT, not a listener
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    held_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 1) == 0;
  }
  ~PortBlocker() { close(fd_); }
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

// Without --log_dir, `cascade up` logs to a directory of its own under $TMPDIR, which a clean stop
// removes (certificates included): runs of `cascade up` leave nothing behind.
TEST(SuperviseTest, CleanStopRemovesTheLogDirectoryItMade) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  TempDir dir;
  UpProcess up(dir, {}, /*own_log_dir=*/true);
  ASSERT_TRUE(up.ready()) << up.error() << "\n" << up.log();
  const std::vector<std::string> made = List(UpTmpDir(dir));
  ASSERT_EQ(made.size(), 1u) << up.log();
  EXPECT_TRUE(absl::StartsWith(made[0], "cascade-")) << made[0];
  EXPECT_TRUE(fs::exists(UpTmpDir(dir) + "/" + made[0] + "/certs/admin.key")) << up.log();
  EXPECT_EQ(up.process().Stop(absl::Seconds(30)), "exited with code 0") << up.log();
  EXPECT_TRUE(List(UpTmpDir(dir)).empty()) << up.log();
}

// A child that keeps dying is given up on; the others serve on. The logs, which say why it died,
// outlive the stack even in a log directory `cascade up` made itself.
TEST(SuperviseTest, CrashLoopingWorkerIsGivenUpOnAndTheRestServe) {
  ASSERT_FALSE(BinDir().empty()) << "run through ctest (it sets CASCADE_BINARY_DIR)";
  TempDir dir;
  UpProcess up(dir, {"--restart_backoff=1s", "--max_restarts=2"}, /*own_log_dir=*/true);
  ASSERT_TRUE(up.ready()) << up.error() << "\n" << up.log();
  const std::string address = up.ListedAddress("worker-1");
  ASSERT_GT(PortOf(address), 0) << up.log();
  const pid_t pid = FindChildWithArg(up.process().pid(), "--worker_id=worker-1");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Take the worker's port before its restart (a second away): every restart then fails to bind.
  std::unique_ptr<PortBlocker> blocker;
  ASSERT_TRUE(WaitFor(
      [&] {
        blocker = std::make_unique<PortBlocker>(PortOf(address));
        return blocker->held();
      },
      absl::Milliseconds(800)))
      << "could not take port " << PortOf(address);
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(up.log(), "Giving up on worker-1"); },
                      absl::Seconds(60)))
      << up.log();
  EXPECT_TRUE(up.process().Running()) << up.log();

  // The rest serve: worker-0 answers through the gateway.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial(up.gateway());
  ASSERT_TRUE(channel.ok());
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<GenerateResult> r = RunGenerate(
        *stub, LongGreedy("You are brief.", absl::StrCat("Question ", i), 4), {absl::Seconds(60)});
    ASSERT_TRUE(r.ok()) << r.status() << "\n" << up.log();
    EXPECT_EQ(r->start.worker_id(), "worker-0");
  }
  stub.reset();
  channel->reset();
  const std::string how = up.process().Stop(absl::Seconds(30));
  EXPECT_EQ(how, "exited with code 0") << up.log();
  EXPECT_TRUE(absl::StrContains(up.log(), "worker-1 given up on earlier")) << up.log();
  const std::vector<std::string> kept = List(UpTmpDir(dir));
  ASSERT_EQ(kept.size(), 1u) << up.log();
  const std::string log_dir = UpTmpDir(dir) + "/" + kept[0];
  EXPECT_TRUE(fs::exists(log_dir + "/worker-1.log"));
  EXPECT_TRUE(absl::StrContains(up.log(), "the children's logs are in " + log_dir + "/"))
      << up.log();
}

}  // namespace
}  // namespace cascade::cli
