// `cascade generate`: one streaming Generate call through a gateway; text deltas are printed as
// they arrive, then a summary line on stderr.
#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <optional>

#include "services/cli/cli.h"
#include "services/cli/command_util.h"
#include "services/cli/gateway_client.h"

namespace cascade::cli {

int RunGenerateCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string gateway, system, query, cache_salt, token, model;
  std::vector<std::string> contexts, stops;
  std::optional<int> max_tokens;
  std::optional<double> temperature, top_p;
  int top_k = 0;
  std::optional<uint64_t> seed;
  absl::Duration timeout = absl::Seconds(60);
  bool json = false;

  common::FlagSet flags(
      "cascade generate",
      "Streams a completion from a Cascade gateway (cascade.v2.GatewayService/Generate). The "
      "prompt is "
      "a SYSTEM chunk, CONTEXT chunks and a QUERY chunk, in that order. Text goes to stdout as it "
      "arrives; a summary line (worker, tokens, cached tokens, finish reason, TTFT, tokens/s) "
      "goes to stderr. Exit 1 with the gRPC code on stderr when the call fails.");
  flags.AddString("gateway", &gateway, "gateway HOST:PORT (required), e.g. localhost:50051");
  flags.AddString("system", &system, "system prompt (a SYSTEM chunk); empty: none");
  AddRepeatedString(&flags, "context", &contexts, "a CONTEXT chunk; repeat for several");
  flags.AddString("query", &query, "the user's question (a QUERY chunk; required)");
  flags.AddString("model", &model, "model name; empty: the only one served");
  AddOptionalInt(&flags, "max_tokens", &max_tokens,
                 "most tokens to generate; unset: the "
                 "gateway's --default_max_tokens");
  AddOptionalDouble(&flags, "temperature", &temperature, "0 = greedy; unset: 1");
  AddOptionalDouble(&flags, "top_p", &top_p, "nucleus mass in (0, 1]; unset: 1");
  flags.AddInt("top_k", &top_k, "keep the k most likely tokens; 0: off");
  AddOptionalUint64(&flags, "seed", &seed, "sampling seed, for reproducible sampling");
  AddRepeatedString(&flags, "stop", &stops, "a stop string (not emitted); repeat for several");
  flags.AddString("cache_salt", &cache_salt, "isolates this request's cache (tenants)");
  flags.AddString("token", &token, "bearer token, when the gateway runs with --auth_token");
  flags.AddDuration("timeout", &timeout, "deadline of the whole call");
  flags.AddBool("json", &json, "print each stream message as one JSON line instead");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (gateway.empty() || query.empty()) {
    err << "cascade generate: --gateway HOST:PORT and --query TEXT are required "
           "(start a local gateway with `cascade up`)\n";
    return kExitUsage;
  }

  v2::GenerateRequest request;
  request.set_model(model);
  request.set_cache_salt(cache_salt);
  auto add_chunk = [&request](v2::ChunkKind kind, const std::string& text) {
    v2::Chunk* c = request.add_chunks();
    c->set_kind(kind);
    c->set_text(text);
  };
  if (!system.empty()) add_chunk(v2::CHUNK_KIND_SYSTEM, system);
  for (const std::string& c : contexts) add_chunk(v2::CHUNK_KIND_CONTEXT, c);
  add_chunk(v2::CHUNK_KIND_QUERY, query);
  v2::SamplingParams* s = request.mutable_sampling();
  if (max_tokens) s->set_max_tokens(*max_tokens);
  if (temperature) s->set_temperature(static_cast<float>(*temperature));
  if (top_p) s->set_top_p(static_cast<float>(*top_p));
  s->set_top_k(top_k);
  if (seed) s->set_seed(*seed);
  for (const std::string& stop : stops) s->add_stop(stop);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial(gateway);
  if (!channel.ok()) {
    err << "cascade generate: " << channel.status().message() << "\n";
    return kExitFailed;
  }
  std::unique_ptr<v2::GatewayService::Stub> stub = v2::GatewayService::NewStub(*channel);
  CallOptions call{timeout, token};
  bool printed_text = false;
  absl::StatusOr<GenerateResult> result =
      RunGenerate(*stub, request, call, [&](const v2::GenerateResponse& msg) {
        if (json) {
          std::string line;
          (void)google::protobuf::util::MessageToJsonString(msg, &line);
          out << line << std::endl;
        } else if (msg.has_delta()) {
          out << msg.delta().text() << std::flush;
          printed_text = printed_text || !msg.delta().text().empty();
        }
      });
  if (printed_text) out << "\n" << std::flush;
  if (!result.ok()) {
    err << "cascade generate: " << result.status().message() << "\n";
    if (result.status().code() == absl::StatusCode::kUnavailable) {
      err << "  (is a gateway running at " << gateway << "? `cascade up` starts one)\n";
    }
    return kExitFailed;
  }
  if (!json) err << FormatSummary(*result) << std::endl;
  return kExitOk;
}

}  // namespace cascade::cli
