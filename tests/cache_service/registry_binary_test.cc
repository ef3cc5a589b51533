// The cascade-registry binary end to end: starts it on loopback ports, reads its ready line,
// serves a worker and a resolve over gRPC (with internal auth, the default), shows them on
// /metrics, and drains on SIGTERM; refuses to start without certificates or with another role's,
// or with a limit out of its range.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cache_service/client/grpc_registry_client.h"
#include "common/transport.h"
#include "tests/cache_service/registry_test_util.h"
#include "tests/common/test_certs.h"

namespace cascade::registry {
namespace {

// Runs `argv` with stdout and stderr on pipes; returns its pid.
pid_t Spawn(const std::vector<std::string>& args, int* out_fd, int* err_fd) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  *out_fd = out[0];
  *err_fd = err[0];
  return pid;
}

// Reads from `fd` until `re` matches the text so far (or EOF / 10 s).
std::smatch ReadUntil(int fd, const std::regex& re, std::string* text) {
  std::smatch m;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[512];
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::regex_search(*text, m, re)) return m;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text->append(buf, n);
  }
  std::regex_search(*text, m, re);
  return m;
}

using common::Role;
using common::testing::TestCerts;

// The registry binary's --internal_* flags for the test CA.
std::vector<std::string> AuthFlags(Role role = Role::kRegistry) {
  common::InternalAuthOptions a = TestCerts::Default().For(role, "w0");
  return {"--internal_ca=" + a.ca_file, "--internal_cert=" + a.cert_file,
          "--internal_key=" + a.key_file};
}

// A registry client presenting `role`'s certificate.
std::unique_ptr<RegistryClient> ClientAs(const std::string& address, Role role,
                                         const std::string& worker_id = "") {
  auto channel = common::MakeChannel(
      address, TestCerts::Default().Client(role, common::kRegistryServerName, worker_id));
  EXPECT_TRUE(channel.ok()) << channel.status();
  return NewGrpcRegistryClient(*channel);
}

// Runs the binary to its exit; returns the exit code and its stderr in *err.
int RunToExit(const std::vector<std::string>& args, std::string* err) {
  int out_fd = -1, err_fd = -1;
  pid_t pid = Spawn(args, &out_fd, &err_fd);
  if (pid <= 0) return -1;
  char buf[512];
  ssize_t n;
  while ((n = read(err_fd, buf, sizeof(buf))) > 0) err->append(buf, n);
  int status = 0;
  waitpid(pid, &status, 0);
  close(out_fd);
  close(err_fd);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string HttpGet(int port, const std::string& path) {
  std::string cmd = "curl -s http://127.0.0.1:" + std::to_string(port) + path;
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

TEST(RegistryBinaryTest, ServesPrintsReadyLineExportsMetricsAndDrainsOnSigterm) {
  const char* bin_dir = std::getenv("CASCADE_BINARY_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest (CASCADE_BINARY_DIR)";
  std::string bin = std::string(bin_dir) + "/bin/cascade-registry";
  int out_fd = -1, err_fd = -1;
  std::vector<std::string> args = {bin,
                                   "--host=127.0.0.1",
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--sweep_interval_ms=50",
                                   "--lease_ms=5000",
                                   "--max_chunks_per_request=8"};
  for (const std::string& f : AuthFlags()) args.push_back(f);
  pid_t pid = Spawn(args, &out_fd, &err_fd);
  ASSERT_GT(pid, 0);
  std::string out, err;
  std::smatch ready =
      ReadUntil(out_fd, std::regex("cascade-registry serving on ([0-9.]+):([0-9]+)"), &out);
  ASSERT_FALSE(ready.empty()) << out;
  std::string address = ready[1].str() + ":" + ready[2].str();
  std::smatch mport = ReadUntil(err_fd, std::regex("metrics_port=([0-9]+)"), &err);
  ASSERT_FALSE(mport.empty()) << err;
  int metrics_port = std::stoi(mport[1].str());

  // Without a certificate nothing gets in; a worker registers as itself; the gateway resolves.
  EXPECT_EQ(NewGrpcRegistryClient(address)->RegisterWorker(testing::Info("w0")).status().code(),
            absl::StatusCode::kUnavailable);  // plaintext to a TLS port
  auto worker = ClientAs(address, Role::kWorker, "w0");
  ASSERT_TRUE(worker->RegisterWorker(testing::Info("w0")).ok());
  testing::Prompt p{.tokens = {testing::Tokens(32, 1), testing::Tokens(16, 500)}};
  ASSERT_TRUE(worker->ReportEvents("w0", 1, testing::Stored(testing::HeldFor(p, 16, 48))).ok());
  worker.reset();
  auto client = ClientAs(address, Role::kGateway);
  std::vector<hash::ChunkSpec> specs = p.Specs();
  absl::StatusOr<ResolveResult> r = client->Resolve({p.model, p.salt, specs});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->workers.at(0).matched_tokens, 48);
  std::vector<hash::ChunkSpec> many(9, specs[0]);
  absl::Status too_many = client->Resolve({p.model, p.salt, many}).status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kResourceExhausted);

  // The maintenance thread publishes a round's series one after another, so a scrape can land
  // between the resolve counter and the gauges: wait until every expected line is there.
  const std::vector<std::string> expected = {
      "cascade_registry_resolves_total 1", "cascade_registry_chunks 2",
      "cascade_registry_worker_up{model=\"m\",worker=\"w0\"} 1"};
  std::string metrics;
  auto has_all = [&] {
    return std::all_of(expected.begin(), expected.end(), [&](const std::string& line) {
      return metrics.find(line) != std::string::npos;
    });
  };
  for (int i = 0; i < 100 && !has_all(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    metrics = HttpGet(metrics_port, "/metrics");
  }
  for (const std::string& line : expected) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
  }

  // Close our channel first: with it open, the shared plumbing's drain took about 5 s here
  // (reported to common/); the registry itself stops at once.
  client.reset();
  auto t0 = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  close(out_fd);
  close(err_fd);
}

TEST(RegistryBinaryTest, RefusesToStartWithoutCertificatesOrWithAnotherRolesCertificate) {
  const char* bin_dir = std::getenv("CASCADE_BINARY_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest (CASCADE_BINARY_DIR)";
  const std::string bin = std::string(bin_dir) + "/bin/cascade-registry";
  std::string err;
  EXPECT_EQ(RunToExit({bin, "--host=127.0.0.1", "--port=0"}, &err), 2);
  EXPECT_NE(err.find("need --internal_ca, --internal_cert, --internal_key"), std::string::npos)
      << err;
  EXPECT_NE(err.find("--insecure_internal"), std::string::npos) << err;
  err.clear();
  std::vector<std::string> args = {bin, "--host=127.0.0.1", "--port=0"};
  for (const std::string& f : AuthFlags(Role::kGateway)) args.push_back(f);
  EXPECT_EQ(RunToExit(args, &err), 2);
  EXPECT_NE(err.find("names cascade://gateway, not a registry certificate"), std::string::npos)
      << err;
}

// Out-of-range numbers used to get through (only lower bounds were checked): --lease_ms near
// INT64_MAX overflowed `now + lease_ms`, a huge --num_shards aborted on allocation, and the
// default --max_resync_chunks did not fit in a gRPC message.
TEST(RegistryBinaryTest, RefusesOutOfRangeLimitsNamingTheFlagAndItsRange) {
  const char* bin_dir = std::getenv("CASCADE_BINARY_DIR");
  ASSERT_NE(bin_dir, nullptr) << "run through ctest (CASCADE_BINARY_DIR)";
  const std::string bin = std::string(bin_dir) + "/bin/cascade-registry";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--lease_ms=9223372036854775807", "--lease_ms=9223372036854775807: must be in [100, "},
      {"--num_shards=2000000000", "--num_shards=2000000000: must be in [1, 4096]"},
      {"--max_workers=0", "--max_workers=0: must be in [1, "},
      {"--max_resync_chunks=1000000",
       "--max_resync_chunks=1000000: its largest request takes up to "},
  };
  for (const auto& [flag, want] : cases) {
    // Without certificates: the limits are checked first, and a binary that let a bad limit
    // through exits at the certificate check instead of serving (and hanging this test).
    std::string err;
    EXPECT_EQ(RunToExit({bin, "--host=127.0.0.1", "--port=0", flag}, &err), 2)
        << flag << ": " << err;
    EXPECT_NE(err.find("cascade-registry: " + want), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace cascade::registry
