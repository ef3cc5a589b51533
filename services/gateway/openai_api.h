// The OpenAI-compatible API's JSON, mapped onto cascade.v2: a completions or chat-completions
// body becomes a GenerateRequest (chat messages become chunks: system -> SYSTEM, user -> QUERY
// or, marked, CONTEXT, assistant -> ASSISTANT, so prefix reuse works across calls), and Generate
// events become OpenAI's response objects and stream chunks. No HTTP here (openai_http.h serves
// it), so every rule is unit-tested on plain values.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "cascade/v2/gateway.pb.h"

namespace cascade::gateway::openai {

enum class Endpoint { kCompletions, kChat };

// What the HTTP side needs besides the GenerateRequest.
struct RequestMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // logprobs asked for (completions: an int; chat: a bool)
};

struct Translated {
  cascade::v2::GenerateRequest request;
  RequestMeta meta;
};

// Validates an OpenAI request body and translates it. `served_model` is accepted (and an empty
// or missing model means it); another model is NOT_FOUND. Unsupported options (n > 1, tools,
// logit_bias, non-zero presence/frequency penalties, echo, best_of, suffix) are INVALID_ARGUMENT
// naming the field, never silently ignored.
absl::StatusOr<Translated> TranslateRequest(const nlohmann::json& body, Endpoint endpoint,
                                            const std::string& served_model);

// Builds response objects from Generate events. One per request; not thread-safe.
class ResponseBuilder {
 public:
  ResponseBuilder(const RequestMeta& meta, std::string model, int64_t created_unix);

  // Stream chunks (the JSON of one `data:` line each) for one Generate event; may be none.
  std::vector<nlohmann::json> OnEvent(const cascade::v2::GenerateResponse& event);
  // The final usage chunk of a stream (stream_options.include_usage); call after the finish.
  nlohmann::json UsageChunk() const;
  // The whole non-streaming response; call after the finish.
  nlohmann::json Final() const;

  bool finished() const { return finished_; }

 private:
  nlohmann::json Envelope(const char* object) const;
  nlohmann::json Usage() const;
  // `text_offset`: the completion's characters before this delta (completions' text_offset).
  nlohmann::json LogprobsOf(const cascade::v2::TokenDelta& delta, int64_t text_offset) const;

  const RequestMeta meta_;
  const std::string model_;
  const int64_t created_;
  std::string id_;
  std::string text_;
  int64_t text_characters_ = 0;  // code points in text_
  nlohmann::json logprobs_;      // accumulated (non-streaming)
  std::string finish_reason_;
  cascade::v2::Usage usage_;
  bool started_ = false, finished_ = false;
};

// OpenAI's error object for a status: {"error": {"message", "type", "param", "code"}}, and the
// HTTP status it goes with (400, 401, 403, 404, 429, 503, 504, 500).
int HttpStatusFor(const absl::Status& status);
nlohmann::json ErrorBody(const absl::Status& status);

// "stop", "length", or "error" (OpenAI's finish_reason values; an error finish is vLLM's "abort").
std::string FinishReasonName(cascade::v2::FinishReason reason);

}  // namespace cascade::gateway::openai
