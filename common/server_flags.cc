// Common server flags: see server_flags.h.
#include "common/server_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/absl_compat.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

// Ports are checked while parsing, so a bad one exits 2 with the flag named, like any bad value.
void AddPortFlag(FlagSet* flags, std::string_view name, int* port, int min, std::string_view help) {
  flags->AddCustom(name, "int", absl::StrCat(*port), help, [port, min](std::string_view text) {
    int v;
    if (!absl::SimpleAtoi(ToAbsl(text), &v) || v < min || v > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("expected a port number ", min, "..65535"));
    }
    *port = v;
    return absl::OkStatus();
  });
}

}  // namespace

void RegisterServerFlags(FlagSet* flags, ServerOptions* o) {
  flags->AddString("host", &o->host, "Address to listen on (0.0.0.0, [::], 127.0.0.1, ...).");
  AddPortFlag(flags, "port", &o->port, 0,
              "gRPC port; 0 picks a free one (the ready line on stdout reports it).");
  AddPortFlag(flags, "metrics_port", &o->metrics_port, -1,
              "HTTP port for GET /metrics and /healthz; -1 disables it, 0 picks a free one.");
  flags->AddString("tls_cert", &o->tls.cert_file,
                   "PEM server certificate chain; empty serves plaintext.");
  flags->AddString("tls_key", &o->tls.key_file, "PEM private key for --tls_cert.");
  flags->AddString("tls_client_ca", &o->tls.client_ca_file,
                   "PEM CA bundle; when set, clients must present a certificate it signed (mTLS).");
  flags->AddInt64("max_message_bytes", &o->max_message_bytes,
                  "Largest gRPC message sent or received, in bytes.");
  flags->AddDuration("drain_timeout", &o->drain_timeout,
                     "On SIGTERM/SIGINT, how long in-flight RPCs may run before being cancelled.");
  flags->AddDuration("keepalive_time", &o->keepalive.time,
                     "Ping idle connections this often to detect dead peers.");
  flags->AddDuration("keepalive_timeout", &o->keepalive.timeout,
                     "Close a connection whose ping is not answered within this time.");
  flags->AddDuration("max_connection_age", &o->max_connection_age,
                     "Close connections after this age so clients rebalance; 0 or inf disables.");
  flags->AddDuration("max_connection_age_grace", &o->max_connection_age_grace,
                     "Time RPCs on an aged connection get to finish.");
  flags->AddCustom("log_format", "text|json", o->log_format == LogFormat::kJson ? "json" : "text",
                   "Log line format on stderr.", [o](std::string_view text) {
                     absl::StatusOr<LogFormat> f = ParseLogFormat(text);
                     if (!f.ok()) return f.status();
                     o->log_format = *f;
                     return absl::OkStatus();
                   });
  flags->AddCustom("log_level", "debug|info|warn|error", std::string(LogLevelName(o->log_level)),
                   "Least severe level logged.", [o](std::string_view text) {
                     absl::StatusOr<LogLevel> l = ParseLogLevel(text);
                     if (!l.ok()) return l.status();
                     o->log_level = *l;
                     return absl::OkStatus();
                   });
}

void RegisterClientTlsFlags(FlagSet* flags, std::string_view prefix, ClientTlsOptions* tls) {
  auto name = [prefix](std::string_view suffix) {
    return absl::StrCat(ToAbsl(prefix), ToAbsl(suffix));
  };
  flags->AddBool(name("tls"), &tls->enabled, "Use TLS for this outgoing connection.");
  flags->AddString(name("tls_ca"), &tls->ca_file,
                   "PEM roots to verify the server; empty uses the system's roots.");
  flags->AddString(name("tls_cert"), &tls->cert_file, "PEM client certificate, for mutual TLS.");
  flags->AddString(name("tls_key"), &tls->key_file, "PEM key for the client certificate.");
  flags->AddString(name("tls_server_name"), &tls->target_name_override,
                   "Name expected in the server's certificate, if not the address' host.");
}

}  // namespace cascade::common
