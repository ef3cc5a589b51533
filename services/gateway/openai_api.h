// The OpenAI-compatible API's JSON, mapped onto cascade.v2: a completions or chat-completions
// body becomes a GenerateRequest (chat messages become chunks: system -> SYSTEM, user -> QUERY
// or, marked, CONTEXT, assistant -> ASSISTANT, so prefix reuse works across calls), and Generate
// events become OpenAI's response objects and stream chunks. No HTTP here (openai_http.h serves
// it), so every rule is unit-tested on plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cascade/v2/gateway.pb.h"

namespace cascade::gateway::openai {

enum class Endpoint { kCompletions, kChat };

// Choices a request may ask for (`n`): each is a Generate stream of its own over the same prompt
// (the HTTP front starts the others once the first has a token, so they find the prompt in a
// prefix cache and their decode steps share its tiles through cascade attention).
inline constexpr int kMaxChoices = 16;
// Prompts a /v1/completions request may list (each with its n choices), and choices in all.
inline constexpr int kMaxPrompts = 64;
inline constexpr int kMaxChoicesInAll = 64;

// What the HTTP side needs besides the GenerateRequest.
struct RequestMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // logprobs asked for (completions: an int; chat: a bool)
  int n = 1;                   // choices a prompt, 1 to kMaxChoices
  int prompts = 1;             // prompts (a completions prompt list), 1 to kMaxPrompts
  // Completions' `echo`: each prompt's text, which its choices' text starts with (null: no echo).
  std::shared_ptr<const std::vector<std::string>> echo;
  // echo with logprobs: the prompt's tokens lead the choice's logprobs (the first with a null
  // logprob), from the request's sampling.prompt_logprobs.
  bool echo_logprobs = false;
  int echo_top = 0;  // echo_logprobs: the top tokens its lists take (completions' logprobs)
  // vLLM's prompt_logprobs (0-20; -1: not asked): the whole response lists each prompt token's
  // logprob, rank and that many top tokens (a completion choice's `prompt_logprobs`, a chat
  // response's).
  int prompt_logprobs = -1;
  // The request's stop_token_ids: a choice that one of them ended reports it as its stop_reason
  // (vLLM's), one the model's EOS ended reports null.
  std::vector<int32_t> stop_token_ids;
  // Chat: Qwen3's reasoning goes to `reasoning_content` (the gateway's --reasoning_parser=qwen3,
  // vLLM's flag of that name): ReasoningSplitter.
  bool reasoning = false;
};

// Qwen3's reasoning parser: a chat completion that starts with "<think>" carries its reasoning up
// to "</think>" and its answer after it (the answer keeps what follows "</think>" as generated);
// one that does not start so is all answer, and one cut off before "</think>" (max_tokens) is all
// reasoning. Fed the completion's text in pieces (a stream's deltas), each piece splits into its
// reasoning and content parts the way the whole text would; only what could still become
// "<think>" at the start or "</think>" later is held back, until the next piece or Finish().
class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  Parts Add(std::string_view piece);
  Parts Finish();  // what was held back (the completion ended)

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_ = State::kStart;
  std::string held_;
};

// Token ids to their text (the gateway's tokenizer), for echoing a token-id prompt: valid UTF-8.
using Detokenize = std::function<absl::StatusOr<std::string>(std::span<const int32_t>)>;

struct Translated {
  cascade::v2::GenerateRequest request;  // the (first) prompt's
  RequestMeta meta;
  // A completions prompt list's other prompts, in order: `request` with other chunks.
  std::vector<cascade::v2::GenerateRequest> more_prompts;
};

// Validates an OpenAI request body and translates it. `served_model` is accepted (and an empty
// or missing model means it); another model is NOT_FOUND. Unsupported options (tools, best_of,
// suffix; echo on chat, with logprobs (the prompt's logprobs are not computed), of the chunks
// extension's templated kinds, or of token ids without `detokenize`) and n outside 1 to
// kMaxChoices are INVALID_ARGUMENT naming the field, never silently ignored. `detokenize` gives
// a token-id prompt's text for echo.
absl::StatusOr<Translated> TranslateRequest(const nlohmann::json& body, Endpoint endpoint,
                                            const std::string& served_model,
                                            const Detokenize& detokenize = nullptr);

// The Generate request of choice `index` (0-based; prompt index / n, OpenAI's order) of a
// request: that prompt's request, its sampling.seed plus index % n where the client gave a seed
// (so a prompt's choices differ and each is reproducible; a prompt's first choice is what the
// prompt alone gives). Without one the gateway draws a seed per stream.
cascade::v2::GenerateRequest ChoiceRequest(const Translated& t, int index);

// Builds response objects from Generate events. One per choice of a request; not thread-safe.
class ResponseBuilder {
 public:
  // `index`: the choice's index in every object it builds. `shared_id`: the completion id the
  // choices of one request share (set from the first choice to start; null: this one's own).
  ResponseBuilder(const RequestMeta& meta, std::string model, int64_t created_unix, int index = 0,
                  std::shared_ptr<std::string> shared_id = nullptr);

  // Stream chunks (the JSON of one `data:` line each) for one Generate event; may be none.
  std::vector<nlohmann::json> OnEvent(const cascade::v2::GenerateResponse& event);
  // The final usage chunk of a stream (stream_options.include_usage); call after the finish.
  nlohmann::json UsageChunk() const;
  // The whole non-streaming response; call after the finish.
  nlohmann::json Final() const;

  bool finished() const { return finished_; }
  // The choice's usage (the finish's; before it, the start's prompt and cached tokens).
  const cascade::v2::Usage& usage() const { return usage_; }

 private:
  nlohmann::json Envelope(const char* object) const;
  nlohmann::json Usage() const;
  // `text_offset`: the completion's characters before this delta (completions' text_offset).
  nlohmann::json LogprobsOf(const cascade::v2::TokenDelta& delta, int64_t text_offset) const;
  // Completions' form (tokens, token_logprobs, top_logprobs, text_offset) of `entries`, the
  // first at text_offset characters (advanced past them), at most max_top top tokens each (-1:
  // all).
  static nlohmann::json CompletionLogprobs(
      const google::protobuf::RepeatedPtrField<cascade::v2::LogprobEntry>& entries,
      int64_t* text_offset, int max_top = -1);
  // vLLM's prompt_logprobs entry for one prompt token, with `top` top tokens.
  static nlohmann::json PromptLogprobEntry(const cascade::v2::LogprobEntry& e, int top);
  // Appends completions-form logprobs `from` to `into` (null: none yet).
  static void AppendCompletionLogprobs(const nlohmann::json& from, nlohmann::json* into);
  // Completions' echo: the text of this choice's prompt.
  const std::string& EchoText() const;
  // echo_logprobs: the prompt's text and logprobs, once, before anything generated.
  void FlushPromptLogprobs(std::vector<nlohmann::json>* out);
  // A chat stream chunk's delta for a piece's parts (adds them to reasoning_ and content_):
  // {"content"} and / or {"reasoning_content"} where not empty, {"content": ""} where both are
  // and `force` (a chunk that carries logprobs), else null (nothing to send).
  nlohmann::json ChatDelta(const ReasoningSplitter::Parts& parts, bool force);

  const RequestMeta meta_;
  const std::string model_;
  const int64_t created_;
  const int index_;
  std::shared_ptr<std::string> id_;  // shared by a request's choices
  std::string text_;                 // completions: the choice's text
  int64_t text_characters_ = 0;      // code points in text_
  // Chat: text_ as content and reasoning (all content unless meta_.reasoning splits it).
  ReasoningSplitter splitter_;
  std::string reasoning_, content_;
  nlohmann::json logprobs_;  // accumulated (non-streaming)
  // echo_logprobs: the prompt's logprobs so far (completions' form), the characters they cover,
  // and whether they were handed on (FlushPromptLogprobs).
  nlohmann::json prompt_logprobs_;
  int64_t prompt_characters_ = 0;
  nlohmann::json vllm_prompt_logprobs_;  // meta_.prompt_logprobs >= 0: vLLM's list so far
  bool prompt_flushed_ = false;
  std::string finish_reason_;
  nlohmann::json stop_reason_;  // vLLM's: the stop string, the requested stop token id, or null
  cascade::v2::Usage usage_;
  bool started_ = false, finished_ = false;
};

// The non-streaming response and the stream's final usage chunk of a request whose choices were
// built by `choices` (in choice order, each finished; `n` a prompt): the choices side by side,
// and usage with each prompt counted once (its first choice's prompt and cached tokens) and every
// choice's completion tokens. One choice: what its builder's Final() / UsageChunk() give.
nlohmann::json CombinedFinal(const std::vector<const ResponseBuilder*>& choices, int n);
nlohmann::json CombinedUsageChunk(const std::vector<const ResponseBuilder*>& choices, int n);

// OpenAI's error object for a status: {"error": {"message", "type", "param", "code"}}, and the
// HTTP status it goes with (400, 401, 403, 404, 429, 503, 504, 500).
int HttpStatusFor(const absl::Status& status);
nlohmann::json ErrorBody(const absl::Status& status);

// "stop", "length", or "error" (OpenAI's finish_reason values; an error finish is vLLM's "abort").
std::string FinishReasonName(cascade::v2::FinishReason reason);

}  // namespace cascade::gateway::openai
