// A small client of etcd v3 through its JSON gateway (POST /v3/...), over libcurl: the
// handful of calls membership needs (leases, a create-if-absent transaction, a read, a
// prefix read, a compare-and-delete). Why not gRPC: Debian 12 packages gRPC but not etcd's
// generated stubs, and generating them needs etcd's .proto tree with googleapis' annotations, which
// Debian does not ship either; the gateway is part of every etcd 3.4 and speaks the same
// calls as JSON. Blocking: used from the membership thread (and once at start-up), never
// from the event loop. Each call tries the endpoints in turn from the last that answered.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace px {

class EtcdClient {
 public:
  struct KeyValue {
    std::string key, value;
    int64_t create_revision = 0;
    int64_t lease = 0;
  };

  // endpoints: "host:port"; timeout_ms bounds each HTTP request (connect included).
  EtcdClient(std::vector<std::string> endpoints, int64_t timeout_ms);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A lease of ttl_s seconds: its id.
  bool grant_lease(int64_t ttl_s, int64_t* lease, std::string* error);
  // Renews it; *alive false when etcd no longer knows it (it expired).
  bool keep_alive(int64_t lease, bool* alive, std::string* error);
  bool revoke_lease(int64_t lease, std::string* error);
  // Puts key = value under lease if the key does not exist. *created says whether it did;
  // *holder is the key as it is after the call (ours or the one already there).
  bool create(const std::string& key, const std::string& value, int64_t lease, bool* created,
              KeyValue* holder, std::string* error);
  // *found false if there is no such key.
  bool get(const std::string& key, bool* found, KeyValue* kv, std::string* error);
  // Every key that starts with prefix.
  bool range(const std::string& prefix, std::vector<KeyValue>* kvs, std::string* error);
  // Deletes key if its create revision is still create_revision (nobody else's key).
  bool remove_if(const std::string& key, int64_t create_revision, std::string* error);
  // The endpoint that answered last ("host:port"), for messages.
  const std::string& endpoint() const;

 private:
  // POSTs body to /v3/<path> at each endpoint in turn until one answers with HTTP 200.
  bool post(const std::string& path, const std::string& body, std::string* reply,
            std::string* error);

  std::vector<std::string> endpoints_;
  size_t current_ = 0;
  int64_t timeout_ms_;
  void* curl_ = nullptr;  // CURL*
};

}  // namespace px
