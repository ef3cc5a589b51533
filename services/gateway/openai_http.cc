// OpenAI-compatible HTTP front; see openai_http.h.
//
// Threads: each loop (an event_base with its evhttp) owns the requests it accepted, and only its
// thread touches them. gRPC callbacks never touch a request: they post a task to its loop. A
// request's gRPC call carries a hold (ClientReadReactor::AddHold), so the call outlives every use
// the loop makes of it; the loop removes the hold once it will touch the call no more, and the
// call's OnDone then posts the end.
//
// libevent rules this leans on (evhttp 2.1): a request is answered exactly once
// (evhttp_send_reply, or evhttp_send_reply_end after _start), even after its connection failed:
// the failure detaches the request from the connection, and the answer then just frees it. The
// connection's close callback is how a failed connection is seen; it is cleared before answering.
// evhttp does not read a connection while its request waits for the answer, so a client that
// hangs up before the first byte of the reply (a non-streamed request, or a stream still waiting
// for its first token) is seen by peeking at the socket every kWatchMs, as nginx does for a
// proxied request: end of stream or an error there cancels the generation.
#include "services/gateway/openai_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "common/client_calls.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/mutex.h"
#include "services/gateway/openai_api.h"

namespace cascade::gateway {
namespace {

using nlohmann::json;

constexpr int kWatchMs = 500;  // how often a request waiting for its answer checks its client

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Reply(evhttp_request* req, int code, const std::string& body, const char* content_type) {
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", content_type);
  evbuffer* buf = evbuffer_new();
  evbuffer_add(buf, body.data(), body.size());
  evhttp_send_reply(req, code, nullptr, buf);
  evbuffer_free(buf);
}

void ReplyError(evhttp_request* req, const absl::Status& s) {
  Reply(req, openai::HttpStatusFor(s), openai::ErrorBody(s).dump(), "application/json");
}

std::string SseLine(const json& j) { return absl::StrCat("data: ", j.dump(), "\n\n"); }

// One event loop: its thread runs the loop and the tasks other threads post to it.
struct Loop {
  OpenAiHttpServer::Impl* impl = nullptr;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  evhttp_bound_socket* listener = nullptr;
  event* wake = nullptr;
  std::thread thread;
  Mutex mu;
  std::vector<absl::AnyInvocable<void() &&>> tasks ABSL_GUARDED_BY(mu);
  std::unordered_set<class Exchange*> open;  // loop thread only

  // Thread-safe (libevent's pthread locking is on).
  void Post(absl::AnyInvocable<void() &&> task) {
    {
      MutexLock lock(&mu);
      tasks.push_back(std::move(task));
    }
    event_active(wake, EV_READ, 0);
  }
  static void OnWake(evutil_socket_t, short, void* arg) {
    auto* loop = static_cast<Loop*>(arg);
    std::vector<absl::AnyInvocable<void() &&>> run;
    {
      MutexLock lock(&loop->mu);
      run.swap(loop->tasks);
    }
    for (auto& task : run) std::move(task)();
  }
};

}  // namespace

struct OpenAiHttpServer::Impl {
  OpenAiHttpOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<cascade::v2::GatewayService::Stub> stub;
  std::vector<std::unique_ptr<Loop>> loops;
  common::ClientCalls calls;
  std::atomic<bool> stopping{false};
  bool shut_down = false;  // Shutdown's own (one caller)
  // The requests being answered (a token each, released once answered), counted and waited
  // for the way `calls` counts their gRPC calls.
  common::ClientCalls answering;

  void Handle(Loop* loop, evhttp_request* req);
};

namespace {

// A Generate call (one choice of a request): its callbacks only post to the loop (see the file
// comment).
class GenerateCall final : public grpc::ClientReadReactor<cascade::v2::GenerateResponse> {
 public:
  GenerateCall(common::ClientCalls::Token token, Loop* loop, class Exchange* ex, int choice)
      : token(std::move(token)), loop_(loop), ex_(ex), choice_(choice) {}
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

  common::ClientCalls::Token token;  // first, so destroyed last: see client_calls.h
  grpc::ClientContext ctx;
  cascade::v2::GenerateRequest request;
  cascade::v2::GenerateResponse msg;

 private:
  Loop* const loop_;
  class Exchange* const ex_;
  const int choice_;
};

// One HTTP request answered through Generate, one call per choice (`n` for each of its prompts);
// lives on its loop until answered. A prompt's first choice starts at once and its others once
// that one's first token (or its end) is there: the prompt is then in its worker's prefix cache
// (and the router's cost counts that once the registry has it), so they need not prefill it
// again. A stream writes one batch of lines at
// a time: a choice's next message is read once its lines are on the socket (evhttp keeps one write
// callback a connection), and lines that arrive meanwhile from other choices go out together in the
// next write.
class Exchange {
 public:
  Exchange(OpenAiHttpServer::Impl* impl, Loop* loop, evhttp_request* req, openai::RequestMeta meta)
      : answering_(impl->answering.Add()),
        impl_(impl),
        loop_(loop),
        req_(req),
        conn_(evhttp_request_get_connection(req)),
        stream_(meta.stream),
        include_usage_(meta.include_usage),
        n_(std::max(1, meta.n)),
        choices_(static_cast<size_t>(n_ * std::max(1, meta.prompts))) {
    const auto id = std::make_shared<std::string>();
    const int64_t created = UnixNow();
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].builder.emplace(meta, impl->options.model_name, created, static_cast<int>(i), id);
    }
    loop_->open.insert(this);
    evhttp_connection_set_closecb(conn_, &Exchange::OnConnClosed, this);
    watch_ = event_new(loop_->base, -1, EV_PERSIST, &Exchange::OnWatch, this);
    const timeval every{0, kWatchMs * 1000};
    if (watch_ != nullptr) event_add(watch_, &every);
    // While a reply is written, evhttp reads the socket only to see it close, into a buffer
    // nothing drains: bound it, or a client could send gigabytes alongside its stream.
    bufferevent_setwatermark(evhttp_connection_get_bufferevent(conn_), EV_READ, 0, 1 << 20);
  }

  void Start(openai::Translated translated, std::string authorization) {
    translated_ = std::move(translated);
    authorization_ = std::move(authorization);
    for (size_t i = 0; i < choices_.size(); i += static_cast<size_t>(n_)) Launch(i);
  }

  // Loop thread, from here on.
  void OnEvent(int i, const cascade::v2::GenerateResponse& e) {
    Choice& c = choices_[static_cast<size_t>(i)];
    c.reading = false;
    if (cancelled_) return Release(c);
    std::vector<json> chunks = c.builder->OnEvent(e);
    if (i % n_ == 0 && (e.has_delta() || e.has_finish())) LaunchRest(i);
    if (!stream_) return Read(c);
    if (!started_) {
      evkeyvalq* h = evhttp_request_get_output_headers(req_);
      evhttp_add_header(h, "Content-Type", "text/event-stream");
      evhttp_add_header(h, "Cache-Control", "no-cache");
      evhttp_send_reply_start(req_, 200, "OK");
      started_ = true;
      if (watch_ != nullptr) event_del(watch_);  // writes see a hang-up from here on
    }
    std::string lines;
    for (const json& chunk : chunks) lines += SseLine(chunk);
    if (lines.empty()) return Read(c);
    pending_ += lines;
    c.queued = true;
    pending_choices_.push_back(i);
    if (!flushing_) Flush();
  }
  void OnEnd(int i) {  // the choice's stream has no more messages
    Choice& c = choices_[static_cast<size_t>(i)];
    c.reading = false;
    Release(c);
  }
  void OnDone(int i, const grpc::Status& st) {
    const absl::Status s = common::FromGrpc(st);
    ++done_;
    if (!s.ok() && status_.ok()) {
      status_ = s;
      Cancel();  // one choice failed: the request did (the others' calls end now)
    } else if (i % n_ == 0) {
      LaunchRest(i);  // (the prompt's first choice ended without a token: the others start now)
    }
    if (done_ < choices_.size()) return;
    if (conn_ != nullptr) evhttp_connection_set_closecb(conn_, nullptr, nullptr);
    if (watch_ != nullptr) event_free(watch_);
    watch_ = nullptr;
    Finish(status_);
    loop_->open.erase(this);
    delete this;
  }
  // Shutdown (or a choice failed, or the client left): end every choice's generation; the client
  // gets what was made and an error.
  void Cancel() {
    if (cancelled_) return;
    cancelled_ = true;
    for (Choice& c : choices_) {  // choices never started: nothing to wait for
      if (!c.launched) ++done_;
      c.launched = true;
    }
    for (Choice& c : choices_) {
      if (c.call != nullptr) c.call->ctx.TryCancel();
    }
    for (Choice& c : choices_) {
      if (!c.reading && !c.queued) Release(c);
    }
  }

 private:
  struct Choice {
    std::optional<openai::ResponseBuilder> builder;
    GenerateCall* call = nullptr;  // null until started, and once released
    bool reading = false;          // a StartRead is outstanding
    bool queued = false;           // its last lines wait for a write (pending_ or in flight)
    bool launched = false;         // its call was started (or never will be: cancelled)
  };

  // Starts choice i's Generate call.
  void Launch(size_t i) {
    Choice& c = choices_[i];
    c.call = new GenerateCall(impl_->calls.Add(), loop_, this, static_cast<int>(i));
    c.call->request = openai::ChoiceRequest(translated_, static_cast<int>(i));
    if (!authorization_.empty()) c.call->ctx.AddMetadata("authorization", authorization_);
    impl_->stub->async()->Generate(&c.call->ctx, &c.call->request, c.call);
    c.call->AddHold();
    Read(c);
    c.call->StartCall();
    c.launched = true;
  }
  // Starts the other choices of the prompt whose first choice is `first` (once).
  void LaunchRest(int first) {
    if (cancelled_) return;
    for (int i = first + 1; i < first + n_; ++i) {
      if (!choices_[static_cast<size_t>(i)].launched) Launch(static_cast<size_t>(i));
    }
  }

  static void OnConnClosed(evhttp_connection*, void* arg) {
    auto* ex = static_cast<Exchange*>(arg);
    ex->conn_ = nullptr;  // freed; the request is detached (answering it just frees it)
    // No write completes now: the choices waiting on one are free to go.
    ex->flushing_ = false;
    for (int i : ex->in_flight_) ex->choices_[static_cast<size_t>(i)].queued = false;
    for (int i : ex->pending_choices_) ex->choices_[static_cast<size_t>(i)].queued = false;
    ex->in_flight_.clear();
    ex->pending_choices_.clear();
    ex->pending_.clear();
    ex->Cancel();
  }
  // The client's side of the socket, peeked (nothing consumed): 0 bytes is its end of stream.
  static void OnWatch(evutil_socket_t, short, void* arg) {
    auto* ex = static_cast<Exchange*>(arg);
    if (ex->cancelled_ || ex->conn_ == nullptr) return;
    const evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(ex->conn_));
    if (fd < 0) return;
    char c = 0;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      ex->Cancel();
    }
  }
  // Writes the lines queued so far; their choices read on once they are on the socket.
  void Flush() {
    flushing_ = true;
    in_flight_.swap(pending_choices_);
    pending_choices_.clear();
    std::string data;
    data.swap(pending_);
    Send(data, &Exchange::OnFlushed);
  }
  static void OnFlushed(evhttp_connection*, void* arg) {
    auto* ex = static_cast<Exchange*>(arg);
    ex->flushing_ = false;
    std::vector<int> written;
    written.swap(ex->in_flight_);
    for (int i : written) {
      Choice& c = ex->choices_[static_cast<size_t>(i)];
      c.queued = false;
      if (ex->cancelled_) {
        ex->Release(c);
      } else {
        ex->Read(c);
      }
    }
    if (ex->cancelled_) {  // lines not yet written stay unwritten
      for (int i : ex->pending_choices_) {
        Choice& c = ex->choices_[static_cast<size_t>(i)];
        c.queued = false;
        ex->Release(c);
      }
      ex->pending_choices_.clear();
      ex->pending_.clear();
    } else if (!ex->pending_.empty()) {
      ex->Flush();
    }
  }
  void Read(Choice& c) {
    c.reading = true;
    c.call->StartRead(&c.call->msg);
  }
  // No more use of the choice's call: its OnDone may come.
  void Release(Choice& c) {
    if (c.call == nullptr) return;
    GenerateCall* call = c.call;
    c.call = nullptr;
    call->RemoveHold();
  }
  void Send(const std::string& data, void (*flushed)(evhttp_connection*, void*)) {
    evbuffer* buf = evbuffer_new();
    evbuffer_add(buf, data.data(), data.size());
    evhttp_send_reply_chunk_with_cb(req_, buf, flushed, flushed ? this : nullptr);
    evbuffer_free(buf);
  }
  void Finish(const absl::Status& s) {
    std::vector<const openai::ResponseBuilder*> builders;
    for (const Choice& c : choices_) builders.push_back(&*c.builder);
    if (!stream_) {
      if (s.ok()) {
        Reply(req_, 200, openai::CombinedFinal(builders, n_).dump(), "application/json");
      } else {
        ReplyError(req_, s);
      }
      return;
    }
    if (!started_) {  // refused before any token: a real HTTP status, not a 200 stream
      ReplyError(req_, s.ok() ? absl::InternalError("the stream ended without an answer") : s);
      return;
    }
    std::string tail;
    if (!s.ok()) {
      tail = SseLine(openai::ErrorBody(s));
    } else if (include_usage_) {
      tail = SseLine(openai::CombinedUsageChunk(builders, n_));
    }
    tail += "data: [DONE]\n\n";
    Send(tail, nullptr);
    evhttp_send_reply_end(req_);
  }

  common::ClientCalls::Token answering_;  // until answered
  OpenAiHttpServer::Impl* const impl_;
  Loop* const loop_;
  evhttp_request* const req_;
  evhttp_connection* conn_;  // null once the connection is gone
  event* watch_ = nullptr;   // OnWatch's timer, until OnDone
  const bool stream_;
  const bool include_usage_;
  const int n_;                    // choices a prompt
  openai::Translated translated_;  // the prompts' requests (a choice's: ChoiceRequest)
  std::string authorization_;
  std::vector<Choice> choices_;       // prompt p's choice s at p n_ + s
  size_t done_ = 0;                   // choices whose OnDone came (or never to start)
  absl::Status status_;               // the first choice's error, else OK
  bool started_ = false;              // the 200 and its headers are sent
  bool flushing_ = false;             // a write is on its way to the socket
  std::string pending_;               // lines waiting for the next write
  std::vector<int> pending_choices_;  // ... and the choices they came from
  std::vector<int> in_flight_;        // the choices whose lines the current write holds
  bool cancelled_ = false;
};

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) {
    loop_->Post([ex = ex_, i = choice_] { ex->OnEnd(i); });
    return;
  }
  loop_->Post([ex = ex_, i = choice_, m = std::move(msg)] { ex->OnEvent(i, m); });
}

void GenerateCall::OnDone(const grpc::Status& s) {
  loop_->Post([ex = ex_, i = choice_, s] { ex->OnDone(i, s); });
  delete this;
}

// GET /v1/models: the gateway's ListModels, answered on the loop.
void ServeModels(OpenAiHttpServer::Impl* impl, Loop* loop, evhttp_request* req,
                 const std::string& authorization) {
  struct Call {
    Call(common::ClientCalls::Token t, common::ClientCalls::Token a)
        : token(std::move(t)), answering(std::move(a)) {}
    common::ClientCalls::Token token;  // destroyed last: see client_calls.h
    common::ClientCalls::Token answering;
    grpc::ClientContext ctx;
    cascade::v2::ListModelsRequest request;
    cascade::v2::ListModelsResponse response;
  };
  auto* call = new Call(impl->calls.Add(), impl->answering.Add());
  if (!authorization.empty()) call->ctx.AddMetadata("authorization", authorization);
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // A unary call's connection is not watched: it ends within its 5 s deadline.
  impl->stub->async()->ListModels(
      &call->ctx, &call->request, &call->response, [loop, req, call](grpc::Status st) {
        loop->Post([req, call, st] {
          if (!st.ok()) {
            ReplyError(req, common::FromGrpc(st));
          } else {
            json data = json::array();
            for (const auto& m : call->response.models()) {
              data.push_back({{"id", m.name()},
                              {"object", "model"},
                              {"created", 0},
                              {"owned_by", "cascade"},
                              {"max_model_len", m.max_context()}});
            }
            Reply(req, 200, json{{"object", "list"}, {"data", data}}.dump(), "application/json");
          }
          delete call;
        });
      });
}

// libevent's own body limit (see OpenAiHttpOptions::max_body_bytes): twice the API's limit, and
// at least 1 MiB over it.
size_t HardBodyLimit(const OpenAiHttpOptions& options) {
  return std::max(2 * options.max_body_bytes, options.max_body_bytes + (size_t{1} << 20));
}

const char* Header(evhttp_request* req, const char* name) {
  return evhttp_find_header(evhttp_request_get_input_headers(req), name);
}

}  // namespace

void OpenAiHttpServer::Impl::Handle(Loop* loop, evhttp_request* req) {
  if (stopping.load()) {
    ReplyError(req, absl::UnavailableError("the gateway is shutting down; retry elsewhere"));
    return;
  }
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const char* raw_path = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
  const std::string path = raw_path != nullptr ? raw_path : "";
  const evhttp_cmd_type cmd = evhttp_request_get_command(req);
  const char* auth = Header(req, "Authorization");
  const std::string authorization = auth != nullptr ? auth : "";
  auto wrong_method = [&](const char* allow) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
    Reply(
        req, 405,
        openai::ErrorBody(absl::InvalidArgumentError(absl::StrCat(path, " takes ", allow))).dump(),
        "application/json");
  };

  if (path == "/health") {
    if (cmd != EVHTTP_REQ_GET) return wrong_method("GET");
    Reply(req, 200, "ok\n", "text/plain");
    return;
  }
  // It travels on as gRPC metadata, and gRPC aborts the process on a value that is not printable
  // ASCII (evhttp passes any byte but CR and LF through).
  if (!std::all_of(authorization.begin(), authorization.end(),
                   [](char c) { return c >= 0x20 && c <= 0x7e; })) {
    ReplyError(req, absl::UnauthenticatedError(
                        "the Authorization header holds a byte that is not printable ASCII; "
                        "send 'Authorization: Bearer <token>'"));
    return;
  }
  if (path == "/v1/models") {
    if (cmd != EVHTTP_REQ_GET) return wrong_method("GET");
    ServeModels(this, loop, req, authorization);
    return;
  }
  openai::Endpoint endpoint;
  if (path == "/v1/completions") {
    endpoint = openai::Endpoint::kCompletions;
  } else if (path == "/v1/chat/completions") {
    endpoint = openai::Endpoint::kChat;
  } else {
    ReplyError(req, absl::NotFoundError("no such route; the API is under /v1"));
    return;
  }
  if (cmd != EVHTTP_REQ_POST) return wrong_method("POST");
  evbuffer* in = evhttp_request_get_input_buffer(req);
  if (evbuffer_get_length(in) > options.max_body_bytes) {
    Reply(req, 413,
          openai::ErrorBody(
              absl::InvalidArgumentError(absl::StrCat(
                  "the request body has ", evbuffer_get_length(in), " bytes; the limit is ",
                  options.max_body_bytes, ": shorten the prompt")))
              .dump(),
          "application/json");
    return;
  }
  std::string body(evbuffer_get_length(in), '\0');
  evbuffer_copyout(in, body.data(), body.size());
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    ReplyError(req, absl::InvalidArgumentError("the request body is not valid JSON"));
    return;
  }
  absl::StatusOr<openai::Translated> t =
      openai::TranslateRequest(parsed, endpoint, options.model_name, options.detokenize);
  if (!t.ok()) {
    ReplyError(req, t.status());
    return;
  }
  t->meta.reasoning = options.reasoning && endpoint == openai::Endpoint::kChat;
  auto* ex = new Exchange(this, loop, req, t->meta);
  ex->Start(std::move(*t), authorization);
}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> channel) {
  static std::once_flag once;
  std::call_once(once, [] {
    evthread_use_pthreads();  // before any event_base: loops are woken from gRPC's threads
    // A write to a connection its client closed must fail with EPIPE (which ends that request),
    // not kill the process; libevent writes without MSG_NOSIGNAL.
    std::signal(SIGPIPE, SIG_IGN);
  });
  std::unique_ptr<OpenAiHttpServer> s(new OpenAiHttpServer());
  s->impl_ = std::make_unique<Impl>();
  Impl* impl = s->impl_.get();
  impl->options = options;
  impl->channel = channel;
  impl->stub = cascade::v2::GatewayService::NewStub(channel);
  const int n = std::max(1, options.threads);
  evutil_socket_t fd = -1;
  for (int i = 0; i < n; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->base = event_base_new();
    loop->http = loop->base != nullptr ? evhttp_new(loop->base) : nullptr;
    if (loop->http == nullptr) return absl::InternalError("libevent: cannot make an event loop");
    loop->wake = event_new(loop->base, -1, EV_PERSIST, &Loop::OnWake, loop.get());
    evhttp_set_max_body_size(loop->http, static_cast<ev_ssize_t>(HardBodyLimit(options)));
    evhttp_set_timeout(loop->http, std::max(1, options.io_timeout_s));
    evhttp_set_allowed_methods(loop->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                               EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                               EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    loop->impl = impl;
    evhttp_set_gencb(
        loop->http,
        [](evhttp_request* req, void* arg) {
          auto* l = static_cast<Loop*>(arg);
          l->impl->Handle(l, req);
        },
        loop.get());
    if (i == 0) {
      loop->listener = evhttp_bind_socket_with_handle(loop->http, options.host.c_str(),
                                                      static_cast<uint16_t>(options.port));
      if (loop->listener == nullptr) {
        evhttp_free(loop->http);
        event_free(loop->wake);
        event_base_free(loop->base);
        return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":",
                                                   options.port,
                                                   " for the OpenAI HTTP front (port in use?)"));
      }
      fd = evhttp_bound_socket_get_fd(loop->listener);
    } else {
      // The loops share the socket; whichever wakes first accepts.
      loop->listener = evhttp_accept_socket_with_handle(loop->http, dup(fd));
    }
    impl->loops.push_back(std::move(loop));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  for (auto& loop : impl->loops) {
    loop->thread =
        std::thread([base = loop->base] { event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY); });
  }
  common::LogInfo("openai_http_started",
                  {{"port", static_cast<long>(s->port_)}, {"threads", static_cast<long>(n)}});
  return s;
}

OpenAiHttpServer::~OpenAiHttpServer() { Shutdown(absl::ZeroDuration()); }

int OpenAiHttpServer::open_requests() const { return impl_->answering.live(); }

void OpenAiHttpServer::StopAccepting() {
  if (impl_->stopping.exchange(true)) return;
  for (auto& loop : impl_->loops) {
    loop->Post([l = loop.get()] {
      if (l->listener != nullptr) evhttp_del_accept_socket(l->http, l->listener);
      l->listener = nullptr;
    });
  }
}

void OpenAiHttpServer::Shutdown(absl::Duration drain) {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  StopAccepting();
  if (!impl_->answering.WaitForNone(absl::ToChronoMilliseconds(drain))) {
    for (auto& loop : impl_->loops) {
      loop->Post([l = loop.get()] {
        for (Exchange* ex : l->open) ex->Cancel();
      });
    }
    // A cancelled stream ends at once, or when its client takes its bytes (io_timeout_s).
    while (!impl_->answering.WaitForNone(std::chrono::seconds(5))) {
      common::LogWarn("openai_http_draining", {{"open", static_cast<long>(open_requests())}});
    }
  }
  for (auto& loop : impl_->loops) {
    // From the loop itself: a break asked before the loop started would be forgotten.
    loop->Post([base = loop->base] { event_base_loopbreak(base); });
    if (loop->thread.joinable()) loop->thread.join();
  }
  for (auto& loop : impl_->loops) {
    evhttp_free(loop->http);  // closes idle keep-alive connections
    event_free(loop->wake);
    event_base_free(loop->base);
  }
  impl_->loops.clear();
  impl_->stub.reset();
  impl_->calls.WaitOrKeep(std::move(impl_->channel), "openai_http");
}

}  // namespace cascade::gateway
