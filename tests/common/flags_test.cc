// Flag parsing: typed values in both spellings, --help exits 0 with the usage, and unknown
// flags or bad values exit 2 with a message that names the flag.
#include "common/flags.h"

#include <sstream>
#include <vector>

#include "common/server_flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cascade::common {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

struct Args {
  explicit Args(std::vector<std::string> a) : args(std::move(a)) {
    args.insert(args.begin(), "prog");
    for (auto& s : args) argv.push_back(s.c_str());
  }
  int argc() const { return static_cast<int>(argv.size()); }
  std::vector<std::string> args;
  std::vector<const char*> argv;
};

struct Values {
  std::string s = "x";
  int64_t i = 7;
  int n = 1;
  double d = 0.5;
  bool b = false;
  bool on = true;
  absl::Duration t = absl::Seconds(10);
};

void Register(FlagSet& flags, Values& v) {
  flags.AddString("name", &v.s, "a string");
  flags.AddInt64("count", &v.i, "an int64");
  flags.AddInt("small", &v.n, "an int");
  flags.AddDouble("ratio", &v.d, "a double");
  flags.AddBool("verbose", &v.b, "a bool");
  flags.AddBool("on", &v.on, "a bool on by default");
  flags.AddDuration("timeout", &v.t, "a duration");
}

TEST(FlagsTest, ParsesEveryTypeInBothSpellings) {
  FlagSet flags("prog");
  Values v;
  Register(flags, v);
  Args args({"--name=hello world", "--count", "-42", "--small=3", "--ratio", "2.5", "--verbose",
             "--noon", "--timeout=1m30s", "pos1", "--", "--not-a-flag"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv.data()).ok());
  EXPECT_EQ(v.s, "hello world");
  EXPECT_EQ(v.i, -42);
  EXPECT_EQ(v.n, 3);
  EXPECT_DOUBLE_EQ(v.d, 2.5);
  EXPECT_TRUE(v.b);
  EXPECT_FALSE(v.on);
  EXPECT_EQ(v.t, absl::Seconds(90));
  EXPECT_THAT(flags.positional(), ::testing::ElementsAre("pos1", "--not-a-flag"));
  EXPECT_FALSE(flags.help_requested());
}

TEST(FlagsTest, BoolTakesExplicitValueButNeverTheNextArgument) {
  FlagSet flags("prog");
  Values v;
  Register(flags, v);
  Args args({"--on=false", "--verbose", "true"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv.data()).ok());
  EXPECT_FALSE(v.on);
  EXPECT_TRUE(v.b);
  EXPECT_THAT(flags.positional(), ::testing::ElementsAre("true"));
}

TEST(FlagsTest, HelpPrintsNameTypeDefaultAndHelpAndExitsZero) {
  FlagSet flags("prog", "Does things.");
  Values v;
  Register(flags, v);
  Args args({"--count=3", "--help"});
  std::ostringstream out, err;
  EXPECT_THAT(ParseFlags(flags, args.argc(), args.argv.data(), out, err), Optional(0));
  EXPECT_THAT(out.str(), HasSubstr("Does things."));
  EXPECT_THAT(out.str(), HasSubstr("--count (int64, default 7)"));
  EXPECT_THAT(out.str(), HasSubstr("an int64"));
  EXPECT_THAT(out.str(), HasSubstr("--timeout (duration, default 10s)"));
  EXPECT_THAT(out.str(), HasSubstr("--name (string, default \"x\")"));
  EXPECT_EQ(err.str(), "");
}

TEST(FlagsTest, UnknownFlagExitsTwoNamingIt) {
  FlagSet flags("prog");
  Values v;
  Register(flags, v);
  Args args({"--bogus=1"});
  std::ostringstream out, err;
  EXPECT_THAT(ParseFlags(flags, args.argc(), args.argv.data(), out, err), Optional(2));
  EXPECT_THAT(err.str(), HasSubstr("unknown flag --bogus"));
  EXPECT_THAT(err.str(), HasSubstr("--help"));
}

TEST(FlagsTest, BadValuesExitTwoNamingFlagAndValue) {
  for (std::string arg :
       {"--count=12x", "--small=99999999999", "--ratio=fast", "--timeout=10", "--verbose=maybe"}) {
    FlagSet flags("prog");
    Values v;
    Register(flags, v);
    Args args({arg});
    std::ostringstream out, err;
    EXPECT_THAT(ParseFlags(flags, args.argc(), args.argv.data(), out, err), Optional(2)) << arg;
    std::string name = arg.substr(0, arg.find('='));
    EXPECT_THAT(err.str(), HasSubstr("for flag " + name)) << err.str();
  }
}

TEST(FlagsTest, MissingValueAndSingleDashAreErrors) {
  FlagSet flags("prog");
  Values v;
  Register(flags, v);
  Args missing({"--count"});
  EXPECT_THAT(flags.Parse(missing.argc(), missing.argv.data()).message(),
              HasSubstr("--count needs a value"));
  FlagSet flags2("prog");
  Register(flags2, v);
  Args dash({"-count=3"});
  EXPECT_FALSE(flags2.Parse(dash.argc(), dash.argv.data()).ok());
}

TEST(FlagsTest, ValidGoodInputContinues) {
  FlagSet flags("prog");
  Values v;
  Register(flags, v);
  Args args({"--count=5"});
  std::ostringstream out, err;
  EXPECT_EQ(ParseFlags(flags, args.argc(), args.argv.data(), out, err), std::nullopt);
  EXPECT_EQ(v.i, 5);
}

TEST(ServerFlagsTest, FillsServerOptions) {
  FlagSet flags("server");
  ServerOptions o;
  RegisterServerFlags(&flags, &o);
  Args args({"--host=127.0.0.1", "--port", "8080", "--metrics_port=-1", "--tls_cert=c.pem",
             "--tls_key=k.pem", "--tls_client_ca=ca.pem", "--max_message_bytes=1024",
             "--drain_timeout=3s", "--log_format=json", "--log_level=debug", "--keepalive_time=20s",
             "--max_connection_age=0s"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv.data()).ok());
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 8080);
  EXPECT_EQ(o.metrics_port, -1);
  EXPECT_EQ(o.tls.cert_file, "c.pem");
  EXPECT_EQ(o.tls.key_file, "k.pem");
  EXPECT_EQ(o.tls.client_ca_file, "ca.pem");
  EXPECT_EQ(o.max_message_bytes, 1024);
  EXPECT_EQ(o.drain_timeout, absl::Seconds(3));
  EXPECT_EQ(o.log_format, LogFormat::kJson);
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
  EXPECT_EQ(o.keepalive.time, absl::Seconds(20));
  EXPECT_EQ(o.max_connection_age, absl::ZeroDuration());
}

TEST(ServerFlagsTest, RejectsOutOfRangePortAndUnknownLogLevel) {
  for (std::string arg : {"--port=70000", "--port=-1", "--metrics_port=-2", "--log_level=verbose",
                          "--log_format=xml"}) {
    FlagSet flags("server");
    ServerOptions o;
    RegisterServerFlags(&flags, &o);
    Args args({arg});
    std::ostringstream out, err;
    EXPECT_THAT(ParseFlags(flags, args.argc(), args.argv.data(), out, err), Optional(2)) << arg;
    EXPECT_THAT(err.str(), HasSubstr(arg.substr(0, arg.find('=')))) << err.str();
  }
}

TEST(ServerFlagsTest, ClientTlsFlagsTakeAPrefix) {
  FlagSet flags("server");
  ClientTlsOptions tls;
  RegisterClientTlsFlags(&flags, "registry_", &tls);
  Args args({"--registry_tls", "--registry_tls_ca=ca.pem", "--registry_tls_server_name=reg"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv.data()).ok());
  EXPECT_TRUE(tls.enabled);
  EXPECT_EQ(tls.ca_file, "ca.pem");
  EXPECT_EQ(tls.target_name_override, "reg");
}

}  // namespace
}  // namespace cascade::common
