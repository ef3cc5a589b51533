// The example server binary, run as a real process the way scripts run Cascade's servers:
// --help exits 0, a bad flag exits 2, a busy port exits 1 with a message, and a serving server
// prints its ready line and drains and exits 0 on SIGTERM.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

extern char** environ;

namespace cascade::common {
namespace {

using ::testing::HasSubstr;

// A child process with its stdout and stderr on pipes.
struct Child {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
};

Child Spawn(const std::vector<std::string>& args) {
  int out[2], err[2];
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(err), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, err[0]);
  std::vector<std::string> all = {CASCADE_EXAMPLE_SERVER};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child child;
  EXPECT_EQ(posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  child.out = out[0];
  child.err = err[0];
  return child;
}

// Reads `fd` until `needle` appears, EOF, or the timeout.
std::string ReadUntil(int fd, const std::string& needle, absl::Duration timeout) {
  std::string text;
  absl::Time end = absl::Now() + timeout;
  while (needle.empty() || text.find(needle) == std::string::npos) {
    int ms = static_cast<int>(absl::ToInt64Milliseconds(end - absl::Now()));
    if (ms <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) break;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

int WaitExit(Child& child, absl::Duration timeout = absl::Seconds(20)) {
  absl::Time end = absl::Now() + timeout;
  int status = 0;
  while (::waitpid(child.pid, &status, WNOHANG) == 0) {
    if (absl::Now() > end) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      ADD_FAILURE() << "child did not exit in time";
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::close(child.out);
  ::close(child.err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ExampleServerTest, HelpExitsZeroAndListsCommonFlags) {
  Child c = Spawn({"--help"});
  std::string out = ReadUntil(c.out, "", absl::Seconds(10));
  EXPECT_EQ(WaitExit(c), 0);
  for (const char* flag :
       {"--host", "--port", "--metrics_port", "--tls_cert", "--tls_key", "--tls_client_ca",
        "--max_message_bytes", "--drain_timeout", "--log_format", "--log_level"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST(ExampleServerTest, BadFlagExitsTwoNamingIt) {
  Child c = Spawn({"--port=abc"});
  std::string err = ReadUntil(c.err, "", absl::Seconds(10));
  EXPECT_EQ(WaitExit(c), 2);
  EXPECT_THAT(err, HasSubstr("--port"));
}

TEST(ExampleServerTest, BusyPortExitsOneWithMessage) {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.handle_signals = false;
  o.print_ready_line = false;
  ServerRunner holder(o);
  ASSERT_TRUE(holder.Start().ok());
  Child c = Spawn({"--host=127.0.0.1", "--port=" + std::to_string(holder.port())});
  std::string err = ReadUntil(c.err, "cannot listen", absl::Seconds(10));
  EXPECT_EQ(WaitExit(c), 1);
  EXPECT_THAT(err, HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(holder.port())));
}

TEST(ExampleServerTest, PrintsReadyLineServesAndDrainsOnSigterm) {
  Child c = Spawn({"--host=127.0.0.1", "--port=0", "--metrics_port=0", "--log_format=json"});
  std::string out = ReadUntil(c.out, "\n", absl::Seconds(20));
  const std::string prefix = "cascade-example-server serving on 127.0.0.1:";
  ASSERT_THAT(out, ::testing::StartsWith(prefix));
  int port = std::stoi(out.substr(prefix.size()));
  ASSERT_GT(port, 0);

  auto channel = MakeChannel("127.0.0.1:" + std::to_string(port), ClientTlsOptions{});
  ASSERT_TRUE(channel.ok());
  grpc::health::v1::HealthCheckResponse::ServingStatus s;
  ASSERT_TRUE(testing::CheckHealth(*channel, "cascade.v2.GatewayService", &s).ok());
  EXPECT_EQ(s, grpc::health::v1::HealthCheckResponse::SERVING);
  // An idle synchronous client in gRPC 1.51 reads its connection only every 5 s (the backup
  // poller), so the server's GOAWAY handshake would wait that long; a client that goes away
  // keeps this test fast. The drain is bounded by --drain_timeout either way.
  channel->reset();

  ASSERT_EQ(::kill(c.pid, SIGTERM), 0);
  std::string err = ReadUntil(c.err, "server_stopped", absl::Seconds(20));
  EXPECT_EQ(WaitExit(c), 0);
  EXPECT_THAT(err, HasSubstr("\"event\":\"shutdown_signal\""));
  EXPECT_THAT(err, HasSubstr("\"event\":\"server_draining\""));
  EXPECT_THAT(err, HasSubstr("\"event\":\"server_stopped\""));
  EXPECT_THAT(err, HasSubstr("\"deadline_reached\":false"));
}

}  // namespace
}  // namespace cascade::common
