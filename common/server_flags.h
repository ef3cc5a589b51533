// The flags every Cascade server takes (--host, --port, --metrics_port, TLS, message size,
// keepalive, connection age, drain, logging), bound to a ServerOptions; and the client-side TLS
// flags a server uses to reach other Cascade servers.
#pragma once

#include <string_view>

#include "common/flags.h"
#include "common/server_runner.h"
#include "common/transport.h"

namespace cascade::common {

// Registers the common server flags into `flags`, writing into `options`; the defaults shown by
// --help are the values `options` holds now. Both must outlive parsing.
void RegisterServerFlags(FlagSet* flags, ServerOptions* options);

// Registers --<prefix>tls, --<prefix>tls_ca, --<prefix>tls_cert, --<prefix>tls_key and
// --<prefix>tls_server_name for outgoing connections, e.g. prefix "registry_" for the gateway's
// connection to the registry.
void RegisterClientTlsFlags(FlagSet* flags, std::string_view prefix, ClientTlsOptions* tls);

}  // namespace cascade::common
