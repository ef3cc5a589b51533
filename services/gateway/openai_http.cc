// OpenAI-compatible HTTP front; see openai_http.h.
#include "services/gateway/openai_http.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "services/gateway/openai_api.h"

namespace cascade::gateway {
namespace {

using nlohmann::json;

void SendError(httplib::Response& res, const absl::Status& s) {
  res.status = openai::HttpStatusFor(s);
  res.set_content(openai::ErrorBody(s).dump(), "application/json");
}

std::string SseLine(const json& j) { return absl::StrCat("data: ", j.dump(), "\n\n"); }

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The gRPC call for one HTTP request, with the client's Authorization forwarded.
std::unique_ptr<grpc::ClientContext> CallContext(const httplib::Request& req) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (req.has_header("Authorization")) {
    ctx->AddMetadata("authorization", req.get_header_value("Authorization"));
  }
  return ctx;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    const OpenAiHttpOptions& options, std::shared_ptr<grpc::Channel> channel) {
  std::unique_ptr<OpenAiHttpServer> s(new OpenAiHttpServer());
  s->options_ = options;
  s->stub_ = cascade::v2::GatewayService::NewStub(channel);
  s->server_ = std::make_unique<httplib::Server>();
  const int threads = std::max(1, options.threads);
  s->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->server_->set_payload_max_length(options.max_body_bytes);
  // A client that sends nothing (or drips) is dropped after this long, freeing its thread.
  s->server_->set_read_timeout(10);
  s->server_->set_keep_alive_timeout(5);
  s->Routes();
  const int port = options.port == 0
                       ? s->server_->bind_to_any_port(options.host)
                       : (s->server_->bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.host, ":", options.port,
                                               " for the OpenAI HTTP front (port in use?)"));
  }
  s->port_ = port;
  s->thread_ = std::thread([srv = s->server_.get()] { srv->listen_after_bind(); });
  common::LogInfo("openai_http_started", {{"port", static_cast<long>(port)}});
  return s;
}

OpenAiHttpServer::~OpenAiHttpServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void OpenAiHttpServer::Routes() {
  server_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler wrote its own error
    absl::Status s =
        res.status == 413   ? absl::ResourceExhaustedError("the request body is too large")
        : res.status == 404 ? absl::NotFoundError("no such route; the API is under /v1")
                            : absl::InvalidArgumentError("bad request");
    res.set_content(openai::ErrorBody(s).dump(), "application/json");
  });
  server_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, absl::InternalError("internal error while handling the request"));
      });

  server_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server_->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    // ListModels checks the bearer token like every other RPC.
    auto ctx = CallContext(req);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    cascade::v2::ListModelsResponse models;
    grpc::Status st = stub_->ListModels(ctx.get(), {}, &models);
    if (!st.ok()) {
      SendError(res, common::FromGrpc(st));
      return;
    }
    json data = json::array();
    for (const auto& m : models.models()) {
      data.push_back({{"id", m.name()},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "cascade"},
                      {"max_model_len", m.max_context()}});
    }
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });

  auto generate = [this](openai::Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) {
        SendError(res, absl::InvalidArgumentError("the request body is not valid JSON"));
        return;
      }
      absl::StatusOr<openai::Translated> t =
          openai::TranslateRequest(body, endpoint, options_.model_name);
      if (!t.ok()) {
        SendError(res, t.status());
        return;
      }
      auto ctx = CallContext(req);
      auto reader = stub_->Generate(ctx.get(), t->request);
      auto builder =
          std::make_shared<openai::ResponseBuilder>(t->meta, options_.model_name, UnixNow());
      cascade::v2::GenerateResponse ev;
      if (!t->meta.stream) {
        while (reader->Read(&ev)) builder->OnEvent(ev);
        grpc::Status st = reader->Finish();
        if (!st.ok()) {
          SendError(res, common::FromGrpc(st));
          return;
        }
        res.set_content(builder->Final().dump(), "application/json");
        return;
      }
      // Streaming: wait for the first event, so that a refused request (bad input, no room,
      // no auth) still gets its HTTP status and error object instead of a 200 stream.
      if (!reader->Read(&ev)) {
        SendError(res, common::FromGrpc(reader->Finish()));
        return;
      }
      const bool include_usage = t->meta.include_usage;
      struct Call {
        std::unique_ptr<grpc::ClientContext> ctx;
        std::unique_ptr<grpc::ClientReader<cascade::v2::GenerateResponse>> reader;
        cascade::v2::GenerateResponse first;
      };
      auto call = std::make_shared<Call>(Call{std::move(ctx), std::move(reader), ev});
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream", [call, builder, include_usage](size_t, httplib::DataSink& sink) {
            auto send = [&](const cascade::v2::GenerateResponse& e) {
              for (const json& chunk : builder->OnEvent(e)) {
                const std::string line = SseLine(chunk);
                if (!sink.write(line.data(), line.size())) return false;
              }
              return true;
            };
            bool ok = send(call->first);
            cascade::v2::GenerateResponse e;
            while (ok && call->reader->Read(&e)) ok = send(e);
            if (!ok) {  // the HTTP client went away: stop the generation
              call->ctx->TryCancel();
              call->reader->Finish();
              return false;
            }
            grpc::Status st = call->reader->Finish();
            std::string tail;
            if (!st.ok()) {
              tail = SseLine(openai::ErrorBody(common::FromGrpc(st)));
            } else if (include_usage) {
              tail = SseLine(builder->UsageChunk());
            }
            tail += "data: [DONE]\n\n";
            sink.write(tail.data(), tail.size());
            sink.done();
            return true;
          });
    };
  };
  server_->Post("/v1/completions", generate(openai::Endpoint::kCompletions));
  server_->Post("/v1/chat/completions", generate(openai::Endpoint::kChat));
}

}  // namespace cascade::gateway
