// The `cascade` tool's offline behaviour: help and exit codes, flag errors, mkmodel output that
// loads, and tokenize/detokenize round trips through the same entry point main() uses.
#include "services/cli/cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_worker/model/generator.h"
#include "gpu_worker/model/model.h"
#include "services/cli/child_process.h"
#include "tests/cli/test_util.h"

namespace cascade::cli {
namespace {
using test_util::BinDir;
// A scratch directory named for this test binary.
struct TempDir : test_util::TempDir {
  TempDir() : test_util::TempDir("cascade_cli_test") {}
};
namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;
  std::string err;
};

CliRun Cli(const std::vector<std::string>& args, const std::string& stdin_text = "") {
  std::istringstream in(stdin_text);
  std::ostringstream out, err;
  int code = RunCli(args, in, out, err);
  return {code, out.str(), err.str()};
}

TEST(CliTest, HelpListsEveryCommandAndExitsZero) {
  for (const char* form : {"help", "--help", "-h"}) {
    CliRun r = Cli({form});
    EXPECT_EQ(r.code, kExitOk) << form;
    for (const char* cmd : {"demo", "up", "generate", "mkmodel", "tokenize", "detokenize"}) {
      EXPECT_NE(r.out.find(cmd), std::string::npos) << form << " lacks " << cmd;
    }
  }
}

TEST(CliTest, NoCommandPrintsUsageAndExitsTwo) {
  CliRun r = Cli({});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("Usage: cascade <command>"), std::string::npos);
}

TEST(CliTest, UpRefusesAnHttpPortThatIsNotOneWithUsage) {
  for (const char* bad : {"--http_port=-2", "--http_port=70000"}) {
    CliRun r = Cli({"up", bad});
    EXPECT_EQ(r.code, kExitUsage) << bad;
    EXPECT_NE(r.err.find("--http_port must be a port number"), std::string::npos) << r.err;
  }
}

TEST(CliTest, UnknownCommandSaysSoAndExitsTwo) {
  CliRun r = Cli({"frobnicate", "--x"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cascade help"), std::string::npos) << r.err;
}

TEST(CliTest, EveryCommandHasHelpThatExitsZero) {
  for (const char* cmd : {"generate", "up", "demo", "mkmodel", "tokenize", "detokenize"}) {
    CliRun r = Cli({cmd, "--help"});
    EXPECT_EQ(r.code, kExitOk) << cmd;
    EXPECT_NE(r.out.find(std::string("Usage: cascade ") + cmd), std::string::npos) << r.out;
    CliRun via_help = Cli({"help", cmd});
    EXPECT_EQ(via_help.code, kExitOk) << cmd;
    EXPECT_EQ(via_help.out, r.out) << cmd;
  }
  EXPECT_NE(Cli({"generate", "--help"}).out.find("--cache_salt"), std::string::npos);
  EXPECT_NE(Cli({"up", "--help"}).out.find("--worker_base_port"), std::string::npos);
}

TEST(CliTest, BadFlagsExitTwoWithTheFlagNamed) {
  CliRun unknown = Cli({"generate", "--gateway=localhost:1", "--query=q", "--bogus=1"});
  EXPECT_EQ(unknown.code, kExitUsage);
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;

  CliRun bad_value =
      Cli({"generate", "--gateway", "localhost:1", "--query", "q", "--max_tokens", "many"});
  EXPECT_EQ(bad_value.code, kExitUsage);
  EXPECT_NE(bad_value.err.find("max_tokens"), std::string::npos) << bad_value.err;

  CliRun missing = Cli({"generate", "--query", "q"});
  EXPECT_EQ(missing.code, kExitUsage);
  EXPECT_NE(missing.err.find("--gateway"), std::string::npos) << missing.err;

  CliRun positional = Cli({"up", "now"});
  EXPECT_EQ(positional.code, kExitUsage);
  EXPECT_NE(positional.err.find("'now'"), std::string::npos) << positional.err;

  EXPECT_EQ(Cli({"up", "--workers=0"}).code, kExitUsage);
  EXPECT_EQ(Cli({"demo", "--requests=2"}).code, kExitUsage);
  EXPECT_EQ(Cli({"mkmodel"}).code, kExitUsage);  // --out is required
}

TEST(CliTest, GenerateAgainstNothingFailsWithTheGrpcCode) {
  // Port 1 on loopback has no listener: the call fails fast with UNAVAILABLE.
  CliRun r = Cli({"generate", "--gateway=127.0.0.1:1", "--query=hi", "--timeout=2s"});
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_TRUE(r.err.find("UNAVAILABLE") != std::string::npos ||
              r.err.find("DEADLINE_EXCEEDED") != std::string::npos)
      << r.err;
}

TEST(CliTest, MkmodelWritesAModelThatLoads) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  std::string out_dir = dir.path() + "/tiny";
  CliRun r = Cli({"mkmodel", "--preset", "tiny", "--out", out_dir, "--seed", "7", "--shards=2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(fs::exists(out_dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out_dir + "/tokenizer.json"));
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadModel(out_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Cli({"mkmodel", "--preset", "no-such-preset", "--out", out_dir}).code, kExitUsage);
}

TEST(CliTest, TokenizeThenDetokenizeGivesTheTextBack) {
  const std::string dir = model::DefaultTokenizerDir();
  if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer at " << dir;
  const std::string input =
      "\"Hello, world!\"\n\"Prefix caches reuse KV \\u00e9t\\u00e9 \\u4f60\\u597d\"\n\n"
      "\"<|im_start|>system\\nHi<|im_end|>\\n\"\n";
  CliRun tok = Cli({"tokenize", "--tokenizer", dir}, input);
  ASSERT_EQ(tok.code, kExitOk) << tok.err;
  std::istringstream lines(tok.out);
  std::string first;
  std::getline(lines, first);
  EXPECT_EQ(first.front(), '[');
  EXPECT_NE(tok.out.find("151644"), std::string::npos) << "<|im_start|> is one token";

  CliRun detok = Cli({"detokenize", "--tokenizer", dir}, tok.out);
  ASSERT_EQ(detok.code, kExitOk) << detok.err;
  CliRun again = Cli({"tokenize", "--tokenizer", dir}, detok.out);
  ASSERT_EQ(again.code, kExitOk) << again.err;
  EXPECT_EQ(again.out, tok.out);
  EXPECT_NE(detok.out.find("Hello, world!"), std::string::npos) << detok.out;
}

TEST(CliTest, TokenizeReportsTheBadLine) {
  const std::string dir = model::DefaultTokenizerDir();
  if (!fs::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer at " << dir;
  CliRun r = Cli({"tokenize", "--tokenizer", dir}, "\"ok\"\nnot json\n");
  EXPECT_EQ(r.code, kExitFailed);
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  CliRun missing = Cli({"tokenize", "--tokenizer", "/nonexistent-dir"}, "\"x\"\n");
  EXPECT_EQ(missing.code, kExitFailed);
  EXPECT_NE(missing.err.find("--tokenizer"), std::string::npos) << missing.err;
}

TEST(CliTest, AddressesParse) {
  EXPECT_EQ(PortOf("127.0.0.1:50051"), 50051);
  EXPECT_EQ(PortOf("[::]:8080"), 8080);
  EXPECT_EQ(PortOf("localhost"), -1);
  EXPECT_EQ(PortOf("host:99999"), -1);
  EXPECT_EQ(DialAddress("0.0.0.0:5"), "127.0.0.1:5");
  EXPECT_EQ(DialAddress("[::]:5"), "127.0.0.1:5");
  EXPECT_EQ(DialAddress("10.0.0.2:5"), "10.0.0.2:5");
}

}  // namespace
}  // namespace cascade::cli
