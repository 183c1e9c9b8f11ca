// A fabric endpoint outside a cluster's address table that sends a daemon tagged messages
// with the tags its collectives use (test_cluster_auth.cc): the daemon must never deliver
// them into its receives. Usage:
//   px_stray_sender fi_sockaddr_in://127.0.0.1:PORT SECONDS
// Sends for SECONDS, in every tag of allreduce, barrier and sparse traffic of variables 1..8
// and steps 0..63, messages of 64 and 8192 bytes (a matched one would fail an exact
// receive or change a sum); prints "SENT n DELIVERED d FAILED f PENDING p" (delivered:
// sends the provider completed, i.e. that left for the daemon).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/collectives/collective_transport.h"
#include "transport/fabric/fabric_endpoint.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: px_stray_sender fi_sockaddr_in://HOST:PORT SECONDS\n");
    return 2;
  }
  std::string target = argv[1];
  const std::string prefix = "fi_sockaddr_in://";
  size_t colon = target.rfind(':');
  if (target.rfind(prefix, 0) != 0 || colon == std::string::npos) {
    fprintf(stderr, "px_stray_sender: '%s' is not fi_sockaddr_in://HOST:PORT\n", argv[1]);
    return 2;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(target.substr(colon + 1))));
  std::string host = target.substr(prefix.size(), colon - prefix.size());
  if (inet_pton(AF_INET, host.c_str(), &to.sin_addr) != 1) {
    fprintf(stderr, "px_stray_sender: bad host '%s'\n", host.c_str());
    return 2;
  }
  std::string error;
  px::FabricOptions options;
  auto endpoint = px::FabricEndpoint::open(options, &error);
  if (!endpoint) {
    fprintf(stderr, "px_stray_sender: %s\n", error.c_str());
    return 1;
  }
  std::string daemon(reinterpret_cast<const char*>(&to), sizeof to);
  if (!endpoint->set_peers({daemon, endpoint->address()}, 1, &error)) {
    fprintf(stderr, "px_stray_sender: %s\n", error.c_str());
    return 1;
  }
  endpoint->start();
  std::vector<char> small(64, '\x7f'), large(8192, '\x7f');  // NaN-like bytes in any f32
  std::atomic<long> pending{0}, failed{0}, delivered{0};
  long sent = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(std::stoi(argv[2]));
  const px::TagKind kinds[] = {px::TagKind::kAllreduce, px::TagKind::kBarrier,
                               px::TagKind::kSparseRequest, px::TagKind::kSparseReply};
  // The receiver's provider may stop reading a connection whose messages match nothing:
  // then sends stop completing, and the sender stops at its deadline.
  auto before_end = [&] { return std::chrono::steady_clock::now() < end; };
  while (before_end()) {
    for (auto kind : kinds)
      for (uint32_t var = 1; var <= 8; ++var)
        for (uint64_t step = 0; step < 64 && before_end(); ++step)
          for (uint64_t algorithm = 0; algorithm < 4; ++algorithm) {
            uint64_t tag = px::make_tag(kind, var, step) | algorithm;
            const auto& buffer = (algorithm & 1) ? large : small;
            while (pending.load() > 256 && before_end())
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            if (!before_end()) break;
            ++pending;
            ++sent;
            endpoint->send(0, tag, buffer.data(), buffer.size(),
                           [&pending, &failed, &delivered](bool ok, const std::string&) {
                             ++(ok ? delivered : failed);
                             --pending;
                           });
          }
  }
  auto drained = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (pending.load() > 0 && std::chrono::steady_clock::now() < drained)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  printf("SENT %ld DELIVERED %ld FAILED %ld PENDING %ld\n", sent, delivered.load(), failed.load(),
         pending.load());
  fflush(stdout);
  // Sends still posted belong to a connection the receiver stopped reading: exit without
  // waiting for them (closing the endpoint would).
  _exit(0);
}
