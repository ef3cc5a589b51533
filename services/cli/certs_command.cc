// `cascade certs`: makes a cluster CA and a certificate per role for internal auth
// (common/internal_auth.h) into a directory: what the Kubernetes Job runs to fill the
// Secrets, and what an operator runs to rotate. With --ca_key it issues one more worker's
// certificate from an existing CA instead.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cert_gen.h"
#include "services/cli/cli.h"
#include "services/cli/command_util.h"

namespace cascade::cli {

int RunCertsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string out_dir, worker_ids, worker_prefix = "worker-", ca_key, add_worker;
  int workers = 0;
  absl::Duration validity = absl::Hours(24 * 365);
  bool write_ca_key = false;
  bool write_auth_token = false;
  common::FlagSet flags(
      "cascade certs",
      "Writes a new cluster CA (ca.crt) and certificates for internal auth into --out: "
      "registry.crt/key, gateway.crt/key, admin.crt/key, and worker.<id>.crt/key per worker. "
      "Each names its role in a URI SAN (cascade://gateway, cascade://worker/<id>, ...). Keys "
      "are written 0600. With --add_worker and --ca_key, issues one worker certificate from the "
      "CA already in --out.");
  flags.AddString("out", &out_dir, "directory to write (created if missing); required");
  flags.AddInt("workers", &workers, "worker certificates for <worker_prefix>0 .. N-1");
  flags.AddString("worker_prefix", &worker_prefix, "id prefix for --workers");
  flags.AddString("worker_ids", &worker_ids, "comma-separated worker ids (besides --workers)");
  flags.AddDuration("validity", &validity, "how long the certificates are valid");
  flags.AddBool("write_ca_key", &write_ca_key,
                "also write ca.key, to issue more worker certificates later (keep it offline)");
  flags.AddBool("write_auth_token", &write_auth_token,
                "also write auth-token: a random bearer token for the gateway's --auth_token_file");
  flags.AddString("ca_key", &ca_key, "with --add_worker: the CA key matching <out>/ca.crt");
  flags.AddString("add_worker", &add_worker,
                  "issue only this worker's certificate (needs --ca_key)");
  if (std::optional<int> code = ParseCommandFlags(flags, args, out, err)) return *code;
  if (out_dir.empty() || workers < 0 || workers > 4096 || validity < absl::Hours(1)) {
    err << "cascade certs: need --out, --workers in [0, 4096] and --validity >= 1h\n";
    return kExitUsage;
  }
  if (!add_worker.empty() || !ca_key.empty()) {
    if (add_worker.empty() || ca_key.empty()) {
      err << "cascade certs: --add_worker and --ca_key go together\n";
      return kExitUsage;
    }
    if (absl::Status s = common::WriteWorkerCert(out_dir, ca_key, add_worker, validity); !s.ok()) {
      err << "cascade certs: " << s.message() << "\n";
      return kExitFailed;
    }
    out << "wrote " << common::StackCertPaths{out_dir}.worker_cert(add_worker) << "\n";
    return kExitOk;
  }
  common::StackCertOptions options;
  options.validity = validity;
  options.write_ca_key = write_ca_key;
  for (int i = 0; i < workers; ++i) options.worker_ids.push_back(absl::StrCat(worker_prefix, i));
  for (absl::string_view id : absl::StrSplit(worker_ids, ',', absl::SkipWhitespace())) {
    options.worker_ids.emplace_back(id);
  }
  absl::StatusOr<common::StackCertPaths> paths = common::WriteStackCerts(out_dir, options);
  if (!paths.ok()) {
    err << "cascade certs: " << paths.status().message() << "\n";
    return paths.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
  }
  if (write_auth_token) {
    if (absl::Status s = common::WriteRandomToken(out_dir + "/auth-token"); !s.ok()) {
      err << "cascade certs: " << s.message() << "\n";
      return kExitFailed;
    }
  }
  out << "wrote a new CA and " << 3 + options.worker_ids.size() << " certificates to " << out_dir
      << (write_auth_token ? " (and auth-token)" : "") << "\n";
  return kExitOk;
}

}  // namespace cascade::cli
