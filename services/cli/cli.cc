// `cascade` dispatch and help, the shared flag helpers, and the offline commands: mkmodel,
// tokenize, detokenize.
#include "services/cli/cli.h"

#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gpu_worker/model/generator.h"
#include "services/cli/command_util.h"
#include "services/tokenizer/tokenizer.h"

namespace cascade::cli {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

struct Command {
  const char* name;
  const char* summary;
};

constexpr Command kCommands[] = {
    {"demo", "start a local stack and show cached == cold on a shared system prompt"},
    {"up", "start registry, workers and gateway locally until Ctrl-C"},
    {"generate", "stream a completion from a gateway (cascade.v2.GatewayService/Generate)"},
    {"mkmodel", "write a model directory with seeded random weights"},
    {"certs", "write a cluster CA and per-role certificates for internal auth"},
    {"tokenize", "stdin: one JSON string per line -> stdout: its token ids"},
    {"detokenize", "stdin: one JSON array of ids per line -> stdout: the text"},
    {"help", "print this text (`cascade <command> --help` for a command's flags)"},
};

}  // namespace

std::string Usage() {
  std::string out =
      "Usage: cascade <command> [flags]\n"
      "Cascade: a prefix-caching LLM server. This tool runs it locally and talks to it.\n\n"
      "Commands:\n";
  for (const Command& c : kCommands) {
    std::string name = c.name;
    name.resize(12, ' ');
    absl::StrAppend(&out, "  ", name, c.summary, "\n");
  }
  absl::StrAppend(&out,
                  "\nStart here: `cascade demo` (needs cascade-registry, cascade-worker and "
                  "cascade-gateway next to this binary).\n");
  return out;
}

std::optional<int> ParseCommandFlags(common::FlagSet& flags, const std::vector<std::string>& args,
                                     std::ostream& out, std::ostream& err) {
  // FlagSet wants argv[0]; its name shows in error messages, so make it the command.
  std::vector<const char*> argv = {"cascade"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  if (std::optional<int> code =
          common::ParseFlags(flags, static_cast<int>(argv.size()), argv.data(), out, err)) {
    return code;
  }
  if (!flags.positional().empty()) {
    err << "cascade: unexpected argument '" << flags.positional().front()
        << "' (flags are written --name=value or --name value; see --help)\n";
    return kExitUsage;
  }
  return std::nullopt;
}

void AddRepeatedString(common::FlagSet* flags, std::string_view name,
                       std::vector<std::string>* values, std::string_view help) {
  flags->AddCustom(name, "string, repeatable", "none", help, [values](std::string_view v) {
    values->emplace_back(v);
    return absl::OkStatus();
  });
}

void AddOptionalDouble(common::FlagSet* flags, std::string_view name, std::optional<double>* value,
                       std::string_view help) {
  flags->AddCustom(name, "double", "unset", help, [value](std::string_view v) {
    double d;
    if (!absl::SimpleAtod(ToAbsl(v), &d)) return absl::InvalidArgumentError("expected a number");
    *value = d;
    return absl::OkStatus();
  });
}

void AddOptionalInt(common::FlagSet* flags, std::string_view name, std::optional<int>* value,
                    std::string_view help) {
  flags->AddCustom(name, "int", "unset", help, [value](std::string_view v) {
    int i;
    if (!absl::SimpleAtoi(ToAbsl(v), &i)) return absl::InvalidArgumentError("expected an integer");
    *value = i;
    return absl::OkStatus();
  });
}

void AddOptionalUint64(common::FlagSet* flags, std::string_view name,
                       std::optional<uint64_t>* value, std::string_view help) {
  flags->AddCustom(name, "uint64", "unset", help, [value](std::string_view v) {
    uint64_t u;
    if (!absl::SimpleAtoi(ToAbsl(v), &u)) {
      return absl::InvalidArgumentError("expected a non-negative integer");
    }
    *value = u;
    return absl::OkStatus();
  });
}

int RunMkmodelCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  model::MkmodelOptions options;
  int64_t seed = 0;
  common::FlagSet flags("cascade mkmodel",
                        "Writes a model directory in Hugging Face layout (config.json, bf16 "
                        "safetensors, tokenizer) with seeded random weights.");
  flags.AddString("preset", &options.preset,
                  "tiny | qwen3-0.6b | llama-tiny | qwen3-8b | llama-3.2-1b");
  flags.AddString("out", &options.out_dir, "output directory (required; created if missing)");
  flags.AddInt64("seed", &seed, "weight seed; same seed, same weights");
  flags.AddInt("shards", &options.shards, "number of safetensors files");
  flags.AddString("tokenizer-dir", &options.tokenizer_dir,
                  "where tokenizer.json is; empty: the Qwen3 tokenizer installed by setup.sh");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (options.out_dir.empty()) {
    err << "cascade mkmodel: --out DIR is required (e.g. --out build/models/tiny)\n";
    return kExitUsage;
  }
  if (seed < 0) {
    err << "cascade mkmodel: --seed must be >= 0\n";
    return kExitUsage;
  }
  options.seed = static_cast<uint64_t>(seed);
  err << "cascade mkmodel: writing preset '" << options.preset << "' to " << options.out_dir
      << " ..." << std::endl;
  if (absl::Status s = model::RunMkmodel(options); !s.ok()) {
    err << "cascade mkmodel: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
  }
  out << options.out_dir << "\n";
  return kExitOk;
}

int RunTokenizeCommand(const std::vector<std::string>& args, bool detokenize, std::istream& in,
                       std::ostream& out, std::ostream& err) {
  const char* name = detokenize ? "cascade detokenize" : "cascade tokenize";
  std::string dir;
  common::FlagSet flags(name, detokenize
                                  ? "Reads one JSON array of token ids per line from stdin and "
                                    "writes the decoded text as a JSON string per line."
                                  : "Reads one JSON string per line from stdin and writes its "
                                    "token ids as a JSON array per line (no chat template).");
  flags.AddString("tokenizer", &dir,
                  "directory with tokenizer.json (a model directory works); empty: the Qwen3 "
                  "tokenizer installed by scripts/setup.sh");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (dir.empty()) dir = model::DefaultTokenizerDir();
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok = tokenizer::Tokenizer::Load(dir);
  if (!tok.ok()) {
    err << name << ": " << tok.status().message()
        << " (pass --tokenizer DIR, or run scripts/setup.sh)\n";
    return kExitFailed;
  }
  absl::Status s = detokenize ? tokenizer::RunDetokenizeCommand(in, out, **tok, &err)
                              : tokenizer::RunTokenizeCommand(in, out, **tok, &err);
  out.flush();
  return s.ok() ? kExitOk : kExitFailed;
}

int RunCli(const std::vector<std::string>& args, std::istream& in, std::ostream& out,
           std::ostream& err) {
  if (args.empty()) {
    err << Usage();
    return kExitUsage;
  }
  const std::string& cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    if (!rest.empty() && rest[0] != "help") return RunCli({rest[0], "--help"}, in, out, err);
    out << Usage();
    return kExitOk;
  }
  if (cmd == "mkmodel") return RunMkmodelCommand(rest, out, err);
  if (cmd == "tokenize") return RunTokenizeCommand(rest, /*detokenize=*/false, in, out, err);
  if (cmd == "detokenize") return RunTokenizeCommand(rest, /*detokenize=*/true, in, out, err);
  if (cmd == "generate") return RunGenerateCommand(rest, out, err);
  if (cmd == "up") return RunUpCommand(rest, out, err);
  if (cmd == "demo") return RunDemoCommand(rest, out, err);
  if (cmd == "certs") return RunCertsCommand(rest, out, err);
  err << "cascade: unknown command '" << cmd << "'. Commands:";
  for (const Command& c : kCommands) err << " " << c.name;
  err << ". Run `cascade help` for what each does.\n";
  return kExitUsage;
}

}  // namespace cascade::cli
