// Daemons authenticate each other at rendezvous with a shared cluster secret: an HMAC-SHA256
// challenge-response over the control connection, both ways, so a daemon without the secret
// can neither join a cluster nor pose as its coordinator. The flow (protocol.capnp):
//   coordinator -> node  Challenge { nonce Nc }                       (on accept)
//   node -> coordinator  Join { ..., nonce Nm, auth = mac("join", Nc, Nm, index, count) }
//   coordinator -> node  AuthProof { auth = mac("coordinator", Nm, Nc) }   (before anything else)
// Each MAC also covers the cluster name; fresh 32-byte nonces on both sides stop replays.
// The fabric (bulk data) is not authenticated (README, Limits).
#pragma once

#include <cstdint>
#include <string>

namespace px {

constexpr size_t kAuthNonceBytes = 32;

// kAuthNonceBytes from the system's CSPRNG (OpenSSL's RAND_bytes).
std::string auth_nonce();
// HMAC-SHA256 over the parts, each length-prefixed so no two part lists collide.
std::string auth_mac(const std::string& secret, const std::string& role, const std::string& cluster,
                     const std::string& first_nonce, const std::string& second_nonce,
                     uint32_t node_index = 0, uint32_t node_count = 0);
// Constant-time comparison (CRYPTO_memcmp).
bool auth_equal(const std::string& a, const std::string& b);

// Reads a cluster secret file: it must be a regular file of 16 to 4096 bytes (trailing
// whitespace ignored) that neither group nor others may read. False with error naming the
// file and what is wrong.
bool read_secret_file(const std::string& path, std::string* secret, std::string* error);

}  // namespace px
