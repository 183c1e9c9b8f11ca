#include "daemon/cluster/cluster_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace px {
namespace {

void append_part(std::string* out, const std::string& part) {
  uint32_t n = static_cast<uint32_t>(part.size());
  out->append(reinterpret_cast<const char*>(&n), sizeof n);
  out->append(part);
}

}  // namespace

std::string auth_nonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) !=
      1)
    throw std::runtime_error("RAND_bytes failed: no entropy for a cluster nonce");
  return nonce;
}

std::string auth_mac(const std::string& secret, const std::string& role, const std::string& cluster,
                     const std::string& first_nonce, const std::string& second_nonce,
                     uint32_t node_index, uint32_t node_count) {
  std::string data;
  append_part(&data, "parallax cluster auth v1");
  append_part(&data, role);
  append_part(&data, cluster);
  append_part(&data, first_nonce);
  append_part(&data, second_nonce);
  append_part(&data, std::to_string(node_index) + "/" + std::to_string(node_count));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

bool auth_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool read_secret_file(const std::string& path, std::string* secret, std::string* error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *error = path + ": " + strerror(errno);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = path + " is not a regular file";
    return false;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *error = path + " may be read by group or others (mode " + mode +
             "): a cluster secret must be readable only by the service user (chmod 600)";
    return false;
  }
  if (st.st_size > 8192) {
    *error = path + " holds " + std::to_string(st.st_size) +
             " bytes; a cluster secret has 16 to 4096 (e.g. `openssl rand -hex 32`)";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    *error = path + ": cannot read it";
    return false;
  }
  std::string s = text.str();
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  if (s.size() < 16 || s.size() > 4096) {
    *error = path + " holds " + std::to_string(s.size()) +
             " bytes; a cluster secret has 16 to 4096 (e.g. `openssl rand -hex 32`)";
    return false;
  }
  *secret = std::move(s);
  return true;
}

}  // namespace px
