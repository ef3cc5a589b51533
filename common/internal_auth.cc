// Internal mTLS with roles: see internal_auth.h. Certificates are verified here, with OpenSSL,
// rather than in the TLS handshake: gRPC is told to request a client certificate without
// verifying it, so that a call without one, or with one from another CA, gets UNAUTHENTICATED
// with a reason instead of a handshake failure the client can only report as UNAVAILABLE. The
// handshake still proves the client holds the certificate's key.
#include "common/internal_auth.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/absl_compat.h"
#include "common/bounded_text.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

constexpr std::string_view kScheme = "cascade://";
constexpr std::string_view kWorkerPrefix = "worker/";

struct Free {
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

Owned<X509> ParsePem(std::string_view pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return Owned<X509>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

// Every certificate in a PEM bundle, in order.
std::vector<Owned<X509>> ParsePemBundle(std::string_view pem) {
  std::vector<Owned<X509>> out;
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(c);
  ERR_clear_error();  // the read past the last certificate leaves an error queued
  return out;
}

absl::StatusOr<PeerIdentity> IdentityOf(X509* cert) {
  Owned<GENERAL_NAMES> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  std::string seen;
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
    if (n->type != GEN_URI) continue;
    const ASN1_IA5STRING* s = n->d.uniformResourceIdentifier;
    std::string_view uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                         static_cast<size_t>(ASN1_STRING_length(s)));
    if (!absl::StartsWith(ToAbsl(uri), ToAbsl(kScheme))) continue;
    return ParseIdentityUri(uri);
  }
  return absl::InvalidArgumentError(
      "the certificate names no Cascade identity (a URI SAN cascade://gateway, cascade://admin, "
      "cascade://registry or cascade://worker/<id>)");
}

// Verifies client certificates against the cluster CA bundle and remembers the ones that passed
// (until they expire), since every call on a connection presents the same certificate.
// Thread-safe.
class CertVerifier {
 public:
  static absl::StatusOr<std::unique_ptr<CertVerifier>> Load(const std::string& ca_file) {
    absl::StatusOr<std::string> pem = ReadFileToString(ca_file);
    if (!pem.ok()) return pem.status();
    std::vector<Owned<X509>> cas = ParsePemBundle(*pem);
    if (cas.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ca_file, " holds no PEM certificate (--internal_ca: the cluster CA)"));
    }
    auto v = std::unique_ptr<CertVerifier>(new CertVerifier());
    v->store_.reset(X509_STORE_new());
    for (const Owned<X509>& ca : cas) X509_STORE_add_cert(v->store_.get(), ca.get());
    return v;
  }

  absl::StatusOr<PeerIdentity> Verify(std::string_view leaf_pem,
                                      const std::vector<grpc::string_ref>& chain) {
    const std::time_t now = std::time(nullptr);
    {
      absl::MutexLock lock(&mu_);
      auto it = verified_.find(ToAbsl(leaf_pem));
      if (it != verified_.end() && now < it->second.not_after) return it->second.identity;
    }
    Owned<X509> leaf = ParsePem(leaf_pem);
    if (leaf == nullptr) {
      ERR_clear_error();
      return absl::UnauthenticatedError("the client certificate does not parse");
    }
    Owned<STACK_OF(X509)> untrusted(sk_X509_new_null());
    for (const grpc::string_ref& c : chain) {
      for (Owned<X509>& x : ParsePemBundle(std::string_view(c.data(), c.size()))) {
        sk_X509_push(untrusted.get(), x.release());
      }
    }
    Owned<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
    if (!X509_STORE_CTX_init(ctx.get(), store_.get(), leaf.get(), untrusted.get())) {
      ERR_clear_error();
      return absl::InternalError("cannot set up certificate verification");
    }
    X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
    if (X509_verify_cert(ctx.get()) != 1) {
      const int err = X509_STORE_CTX_get_error(ctx.get());
      ERR_clear_error();
      return absl::UnauthenticatedError(
          absl::StrCat("the client certificate is not valid for the cluster CA (--internal_ca): ",
                       X509_verify_cert_error_string(err)));
    }
    absl::StatusOr<PeerIdentity> id = IdentityOf(leaf.get());
    if (!id.ok()) return absl::UnauthenticatedError(id.status().message());
    std::time_t not_after = now + 3600;
    ASN1_TIME* end = X509_getm_notAfter(leaf.get());
    int days = 0, secs = 0;
    if (ASN1_TIME_diff(&days, &secs, nullptr, end) == 1) {
      not_after = std::min<std::time_t>(not_after, now + days * 86400L + secs);
    }
    absl::MutexLock lock(&mu_);
    if (verified_.size() >= kMaxCached) verified_.clear();
    verified_[std::string(leaf_pem)] = {*id, not_after};
    return *id;
  }

 private:
  static constexpr size_t kMaxCached = 4096;
  struct Entry {
    PeerIdentity identity;
    std::time_t not_after;  // re-verify from then on (expiry; at most an hour)
  };
  CertVerifier() = default;

  Owned<X509_STORE> store_;  // set at construction; X509_STORE verifies concurrently
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> verified_ ABSL_GUARDED_BY(mu_);
};

bool OpenToAll(std::string_view method) {
  return absl::StartsWith(ToAbsl(method), "/grpc.health.v1.Health/") ||
         absl::StartsWith(ToAbsl(method), "/grpc.reflection.v1alpha.ServerReflection/") ||
         absl::StartsWith(ToAbsl(method), "/grpc.reflection.v1.ServerReflection/");
}

std::string RoleList(const std::set<Role>& roles) {
  std::vector<std::string> names;
  for (Role r : roles) names.emplace_back(RoleName(r));
  return absl::StrJoin(names, " or ");
}

class InternalAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  InternalAuthProcessor(std::unique_ptr<CertVerifier> verifier, MethodPolicy policy)
      : verifier_(std::move(verifier)), policy_(std::move(policy)) {}

  // Verification is CPU work of microseconds (cached per certificate): run it inline.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path == metadata.end()) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "the call names no method");
    }
    const std::string_view method(path->second.data(), path->second.size());
    std::vector<grpc::string_ref> leaf =
        context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if (leaf.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "internal RPCs need a client certificate from the cluster CA "
                          "(--internal_cert and --internal_key); servers run with "
                          "--insecure_internal take none");
    }
    absl::StatusOr<PeerIdentity> id =
        verifier_->Verify(std::string_view(leaf[0].data(), leaf[0].size()),
                          context->FindPropertyValues(GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME));
    if (!id.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(id.status().message()));
    }
    if (OpenToAll(method)) return grpc::Status::OK;
    auto allowed = policy_.find(method);
    if (allowed == policy_.end() || !allowed->second.contains(id->role)) {
      std::string who = allowed == policy_.end() ? "no role" : RoleList(allowed->second);
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat(Excerpt(ToAbsl(method), 128), " is for ", who,
                                       "; the caller is ", id->ToString()));
    }
    return grpc::Status::OK;
  }

 private:
  const std::unique_ptr<CertVerifier> verifier_;
  const MethodPolicy policy_;
};

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kGateway:
      return "gateway";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kRegistry:
      return "registry";
  }
  return "?";
}

std::string IdentityUri(Role role, std::string_view worker_id) {
  if (role == Role::kWorker) {
    return absl::StrCat(ToAbsl(kScheme), ToAbsl(kWorkerPrefix), ToAbsl(worker_id));
  }
  return absl::StrCat(ToAbsl(kScheme), ToAbsl(RoleName(role)));
}

std::string PeerIdentity::ToString() const { return IdentityUri(role, worker_id); }

absl::StatusOr<PeerIdentity> ParseIdentityUri(std::string_view uri) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", Excerpt(ToAbsl(uri), 96),
        "' is not a Cascade identity (cascade://gateway, cascade://admin, cascade://registry or "
        "cascade://worker/<id>)"));
  };
  if (!absl::StartsWith(ToAbsl(uri), ToAbsl(kScheme))) return bad();
  std::string_view rest = uri.substr(kScheme.size());
  for (Role r : {Role::kGateway, Role::kAdmin, Role::kRegistry}) {
    if (rest == RoleName(r)) return PeerIdentity{r, ""};
  }
  if (absl::StartsWith(ToAbsl(rest), ToAbsl(kWorkerPrefix))) {
    std::string_view id = rest.substr(kWorkerPrefix.size());
    if (!id.empty() && id.size() <= 128 && id.find('/') == std::string_view::npos) {
      return PeerIdentity{Role::kWorker, std::string(id)};
    }
  }
  return bad();
}

absl::StatusOr<PeerIdentity> IdentityOfCertificate(std::string_view cert_pem) {
  Owned<X509> cert = ParsePem(cert_pem);
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("not a PEM certificate");
  }
  return IdentityOf(cert.get());
}

void RegisterInternalAuthFlags(FlagSet* flags, InternalAuthOptions* o) {
  flags->AddString("internal_ca", &o->ca_file,
                   "PEM cluster CA bundle that internal peers' certificates must chain to");
  flags->AddString("internal_cert", &o->cert_file,
                   "PEM certificate naming this process (URI SAN cascade://<role>) for internal "
                   "RPCs, as client and as server");
  flags->AddString("internal_key", &o->key_file, "PEM private key of --internal_cert");
  flags->AddBool("insecure_internal", &o->insecure,
                 "internal RPCs in plaintext with no identities or roles: anyone who can reach "
                 "the registry or a worker may call any of its RPCs (trusted networks only)");
}

absl::Status ValidateInternalAuth(const InternalAuthOptions& o) {
  if (o.insecure) {
    if (!o.ca_file.empty() || !o.cert_file.empty() || !o.key_file.empty()) {
      return absl::InvalidArgumentError(
          "--insecure_internal contradicts --internal_ca/--internal_cert/--internal_key");
    }
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  if (o.ca_file.empty()) missing.push_back("--internal_ca");
  if (o.cert_file.empty()) missing.push_back("--internal_cert");
  if (o.key_file.empty()) missing.push_back("--internal_key");
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "internal RPCs are authenticated by default and need ", absl::StrJoin(missing, ", "),
      " (`cascade certs --out DIR` makes a CA and certificates); --insecure_internal runs them "
      "in plaintext with no authentication"));
}

absl::StatusOr<PeerIdentity> CheckOwnIdentity(const InternalAuthOptions& o, Role role) {
  if (absl::Status s = ValidateInternalAuth(o); !s.ok()) return s;
  if (o.insecure) return PeerIdentity{role, ""};
  absl::StatusOr<std::string> pem = ReadFileToString(o.cert_file);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<PeerIdentity> id = IdentityOfCertificate(*pem);
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--internal_cert ", o.cert_file, ": ", id.status().message()));
  }
  if (id->role != role) {
    return absl::InvalidArgumentError(absl::StrCat("--internal_cert ", o.cert_file, " names ",
                                                   id->ToString(), ", not a ",
                                                   ToAbsl(RoleName(role)), " certificate"));
  }
  return id;
}

ClientTlsOptions InternalClientTls(const InternalAuthOptions& o, std::string_view server_name) {
  ClientTlsOptions tls;
  if (o.insecure) return tls;
  tls.enabled = true;
  tls.ca_file = o.ca_file;
  tls.cert_file = o.cert_file;
  tls.key_file = o.key_file;
  tls.target_name_override = std::string(server_name);
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeInternalServerCredentials(
    const InternalServerAuth& auth) {
  const InternalAuthOptions& f = auth.files;
  if (absl::Status s = ValidateInternalAuth(f); !s.ok()) return s;
  if (f.insecure) return absl::InvalidArgumentError("internal auth is off (--insecure_internal)");
  absl::StatusOr<std::unique_ptr<CertVerifier>> verifier = CertVerifier::Load(f.ca_file);
  if (!verifier.ok()) return verifier.status();
  absl::StatusOr<std::string> ca = ReadFileToString(f.ca_file);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadFileToString(f.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFileToString(f.key_file);
  if (!key.ok()) return key.status();
  if (ParsePem(*cert) == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(f.cert_file, " holds no PEM certificate"));
  }
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  options.pem_root_certs = *ca;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  creds->SetAuthMetadataProcessor(
      std::make_shared<InternalAuthProcessor>(*std::move(verifier), auth.policy));
  return creds;
}

std::optional<PeerIdentity> CallerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::nullopt;
  std::vector<grpc::string_ref> leaf = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (leaf.empty()) return std::nullopt;
  absl::StatusOr<PeerIdentity> id =
      IdentityOfCertificate(std::string_view(leaf[0].data(), leaf[0].size()));
  if (!id.ok()) return std::nullopt;
  return *id;
}

grpc::Status CheckWorkerIdentity(const grpc::ServerContextBase& context,
                                 std::string_view worker_id) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty()) {
    return grpc::Status::OK;  // an insecure server: no identities (the processor ran otherwise)
  }
  std::optional<PeerIdentity> caller = CallerIdentity(context);
  if (caller && caller->role == Role::kAdmin) return grpc::Status::OK;
  if (caller && caller->role == Role::kWorker && caller->worker_id == worker_id) {
    return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(caller ? caller->ToString() : std::string("the caller"),
                   " may not act for worker '", Excerpt(ToAbsl(worker_id), 128), "'"));
}

}  // namespace cascade::common
