// Certificate generation with OpenSSL 3: see cert_gen.h.
#include "common/cert_gen.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/absl_compat.h"
#include "common/internal_auth.h"
#include "common/transport.h"

namespace cascade::common {
namespace {

using internal::ToAbsl;

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

absl::Status SslError(std::string_view what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat("OpenSSL: ", ToAbsl(what), ": ", buf));
}

absl::StatusOr<std::string> BioString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  if (n <= 0) return SslError("empty PEM output");
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)) {
    return SslError("writing a private key");
  }
  return BioString(bio.get());
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) return SslError("writing a certificate");
  return BioString(bio.get());
}

// A signed certificate and its key, as PEM.
absl::StatusOr<CertAndKey> ToPems(X509* cert, EVP_PKEY* key) {
  CertAndKey out;
  absl::StatusOr<std::string> pem = CertPem(cert);
  if (!pem.ok()) return pem.status();
  out.cert_pem = *pem;
  absl::StatusOr<std::string> key_pem = KeyPem(key);
  if (!key_pem.ok()) return key_pem.status();
  out.key_pem = *key_pem;
  return out;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || !X509_add_ext(cert, ext.get(), -1)) {
    return SslError(absl::StrCat("extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

// A certificate for `key` named `cn`, valid from an hour ago for `validity`, with a random
// 127-bit serial; issuer and signature are set by the caller.
absl::StatusOr<Owned<X509>> NewCert(EVP_PKEY* key, std::string_view cn, absl::Duration validity) {
  Owned<X509> cert(X509_new());
  if (cert == nullptr || !X509_set_version(cert.get(), 2)) return SslError("X509_new");
  Owned<BIGNUM> serial(BN_new());
  if (!BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return SslError("serial number");
  }
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_time_adj_ex(
          X509_getm_notAfter(cert.get()), static_cast<int>(absl::ToInt64Hours(validity) / 24),
          static_cast<long>(absl::ToInt64Seconds(validity) % 86400), nullptr) == nullptr) {
    return SslError("validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  std::string cn_str(cn);
  if (!X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                  reinterpret_cast<const unsigned char*>(cn_str.c_str()), -1, -1,
                                  0) ||
      !X509_set_pubkey(cert.get(), key)) {
    return SslError("subject");
  }
  return cert;
}

absl::StatusOr<Owned<EVP_PKEY>> NewKey() {
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return SslError("generating a P-256 key");
  return key;
}

absl::Status WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  ::fchmod(fd, mode);  // O_CREAT's mode does not apply to a file that was already there
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WritePair(const std::string& cert_path, const std::string& key_path,
                       const CertAndKey& pair) {
  if (absl::Status s = WriteFile(key_path, pair.key_pem, 0600); !s.ok()) return s;
  return WriteFile(cert_path, pair.cert_pem, 0644);
}

absl::StatusOr<CertAndKey> IssueWorker(const CertAndKey& ca, const std::string& id,
                                       absl::Duration validity) {
  CertRequest r;
  r.common_name = absl::StrCat("cascade worker ", id);
  r.uris = {IdentityUri(Role::kWorker, id)};
  r.dns_names = {kWorkerServerName};
  r.server = true;
  r.validity = validity;
  return IssueCert(ca, r);
}

}  // namespace

absl::StatusOr<CertAndKey> NewCertAuthority(std::string_view common_name, absl::Duration validity) {
  absl::StatusOr<Owned<EVP_PKEY>> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Owned<X509>> cert = NewCert(key->get(), common_name, validity);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  if (!X509_set_issuer_name(c, X509_get_subject_name(c))) return SslError("issuer");
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(c, c, nid, value); !s.ok()) return s;
  }
  if (!X509_sign(c, key->get(), EVP_sha256())) return SslError("signing the CA");
  return ToPems(c, key->get());
}

absl::StatusOr<CertAndKey> IssueCert(const CertAndKey& ca, const CertRequest& request) {
  Owned<BIO> ca_bio(BIO_new_mem_buf(ca.cert_pem.data(), static_cast<int>(ca.cert_pem.size())));
  Owned<X509> ca_cert(PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr));
  if (ca_cert == nullptr) return SslError("reading the CA certificate");
  Owned<BIO> key_bio(BIO_new_mem_buf(ca.key_pem.data(), static_cast<int>(ca.key_pem.size())));
  Owned<EVP_PKEY> ca_key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (ca_key == nullptr) return SslError("reading the CA key");
  if (request.uris.empty() && request.dns_names.empty()) {
    return absl::InvalidArgumentError("a certificate needs at least one URI or DNS name");
  }

  absl::StatusOr<Owned<EVP_PKEY>> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Owned<X509>> cert = NewCert(key->get(), request.common_name, request.validity);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  if (!X509_set_issuer_name(c, X509_get_subject_name(ca_cert.get()))) return SslError("issuer");
  std::vector<std::string> sans;
  for (const std::string& u : request.uris) sans.push_back("URI:" + u);
  for (const std::string& d : request.dns_names) sans.push_back("DNS:" + d);
  const std::string eku = request.server ? "serverAuth,clientAuth" : "clientAuth";
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, std::string("critical,CA:FALSE")},
        std::pair{NID_key_usage, std::string("critical,digitalSignature,keyAgreement")},
        std::pair{NID_ext_key_usage, eku},
        std::pair{NID_subject_alt_name, absl::StrJoin(sans, ",")},
        std::pair{NID_authority_key_identifier, std::string("keyid:always")}}) {
    if (absl::Status s = AddExtension(c, ca_cert.get(), nid, value); !s.ok()) return s;
  }
  if (!X509_sign(c, ca_key.get(), EVP_sha256())) return SslError("signing the certificate");
  return ToPems(c, key->get());
}

std::string StackCertPaths::cert(std::string_view role) const {
  return absl::StrCat(dir, "/", ToAbsl(role), ".crt");
}
std::string StackCertPaths::key(std::string_view role) const {
  return absl::StrCat(dir, "/", ToAbsl(role), ".key");
}
std::string StackCertPaths::worker_cert(std::string_view worker_id) const {
  return absl::StrCat(dir, "/worker.", ToAbsl(worker_id), ".crt");
}
std::string StackCertPaths::worker_key(std::string_view worker_id) const {
  return absl::StrCat(dir, "/worker.", ToAbsl(worker_id), ".key");
}

absl::Status ValidateWorkerIdForCert(std::string_view id) {
  bool ok = !id.empty() && id.size() <= 128 && id != "." && id != "..";
  for (char c : id) {
    ok = ok &&
         (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker id '", ToAbsl(id.substr(0, 64)),
        "' cannot name a certificate: use 1 to 128 of the characters A-Z a-z 0-9 . _ -"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StackCertPaths> WriteStackCerts(const std::string& dir,
                                               const StackCertOptions& options) {
  for (const std::string& id : options.worker_ids) {
    if (absl::Status s = ValidateWorkerIdForCert(id); !s.ok()) return s;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  ::chmod(dir.c_str(), 0700);
  StackCertPaths paths{dir};
  absl::StatusOr<CertAndKey> ca = NewCertAuthority("cascade internal CA", options.validity);
  if (!ca.ok()) return ca.status();
  if (absl::Status s = WriteFile(paths.ca(), ca->cert_pem, 0644); !s.ok()) return s;
  if (options.write_ca_key) {
    if (absl::Status s = WriteFile(dir + "/ca.key", ca->key_pem, 0600); !s.ok()) return s;
  }
  struct RoleCert {
    const char* name;
    Role role;
    bool server;
  };
  for (const RoleCert& r :
       {RoleCert{"registry", Role::kRegistry, true}, RoleCert{"gateway", Role::kGateway, false},
        RoleCert{"admin", Role::kAdmin, false}}) {
    CertRequest req;
    req.common_name = absl::StrCat("cascade ", r.name);
    req.uris = {IdentityUri(r.role)};
    if (r.server) req.dns_names = {kRegistryServerName};
    req.server = r.server;
    req.validity = options.validity;
    absl::StatusOr<CertAndKey> c = IssueCert(*ca, req);
    if (!c.ok()) return c.status();
    if (absl::Status s = WritePair(paths.cert(r.name), paths.key(r.name), *c); !s.ok()) return s;
  }
  for (const std::string& id : options.worker_ids) {
    absl::StatusOr<CertAndKey> c = IssueWorker(*ca, id, options.validity);
    if (!c.ok()) return c.status();
    if (absl::Status s = WritePair(paths.worker_cert(id), paths.worker_key(id), *c); !s.ok()) {
      return s;
    }
  }
  return paths;
}

absl::Status WriteRandomToken(const std::string& path) {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return SslError("RAND_bytes");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return WriteFile(path, token + "\n", 0600);
}

absl::Status WriteWorkerCert(const std::string& dir, const std::string& ca_key_file,
                             const std::string& worker_id, absl::Duration validity) {
  if (absl::Status s = ValidateWorkerIdForCert(worker_id); !s.ok()) return s;
  StackCertPaths paths{dir};
  CertAndKey ca;
  absl::StatusOr<std::string> cert = ReadFileToString(paths.ca());
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFileToString(ca_key_file);
  if (!key.ok()) return key.status();
  ca.cert_pem = *cert;
  ca.key_pem = *key;
  absl::StatusOr<CertAndKey> c = IssueWorker(ca, worker_id, validity);
  if (!c.ok()) return c.status();
  return WritePair(paths.worker_cert(worker_id), paths.worker_key(worker_id), *c);
}

}  // namespace cascade::common
