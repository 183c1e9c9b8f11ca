#include "daemon/cluster/etcd_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <mutex>
#include <nlohmann/json.hpp>

namespace px {

namespace {

using json = nlohmann::json;

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string unbase64(const std::string& in) {
  if (in.empty()) return "";
  std::string out(3 * (in.size() / 4) + 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return "";
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding's bytes as zeros.
  for (size_t i = in.size(); i > 0 && in[i - 1] == '=' && len > 0; --i) --len;
  out.resize(len);
  return out;
}

// etcd's JSON carries int64 as strings, and leaves out zero values.
int64_t number(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
      return 0;  // a malformed answer reads as absent: callers treat 0 as "none"
    }
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

EtcdClient::KeyValue read_kv(const json& j) {
  EtcdClient::KeyValue kv;
  kv.key = unbase64(j.value("key", ""));
  kv.value = unbase64(j.value("value", ""));
  kv.create_revision = number(j, "create_revision");
  kv.lease = number(j, "lease");
  return kv;
}

size_t append(char* data, size_t size, size_t count, void* reply) {
  static_cast<std::string*>(reply)->append(data, size * count);
  return size * count;
}

}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> endpoints, int64_t timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

EtcdClient::~EtcdClient() {
  curl_easy_cleanup(static_cast<CURL*>(curl_));
}

const std::string& EtcdClient::endpoint() const {
  return endpoints_[current_];
}

bool EtcdClient::post(const std::string& path, const std::string& body, std::string* reply,
                      std::string* error) {
  auto* curl = static_cast<CURL*>(curl_);
  if (!curl) {
    *error = "libcurl could not start";
    return false;
  }
  std::string failures;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    size_t at = (current_ + tried) % endpoints_.size();
    std::string url = "http://" + endpoints_[at] + "/v3/" + path;
    reply->clear();
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms_));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_ms_));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, reply);
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && status == 200) {
      current_ = at;
      return true;
    }
    std::string why =
        rc != CURLE_OK ? curl_easy_strerror(rc) : "HTTP " + std::to_string(status) + ": " + *reply;
    failures += (failures.empty() ? "" : "; ") + endpoints_[at] + ": " + why;
  }
  *error = "no etcd endpoint answered " + path + " (" + failures + ")";
  return false;
}

bool EtcdClient::grant_lease(int64_t ttl_s, int64_t* lease, std::string* error) {
  std::string reply;
  if (!post("lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump(), &reply, error))
    return false;
  json j = json::parse(reply, nullptr, false);
  *lease = j.is_object() ? number(j, "ID") : 0;
  if (*lease == 0) *error = "etcd granted no lease: " + reply;
  return *lease != 0;
}

bool EtcdClient::keep_alive(int64_t lease, bool* alive, std::string* error) {
  std::string reply;
  if (!post("lease/keepalive", json{{"ID", std::to_string(lease)}}.dump(), &reply, error))
    return false;
  json j = json::parse(reply, nullptr, false);
  if (!j.is_object() || !j.contains("result")) {
    *error = "a malformed keep-alive answer from etcd: " + reply;
    return false;
  }
  *alive = number(j["result"], "TTL") > 0;
  return true;
}

bool EtcdClient::revoke_lease(int64_t lease, std::string* error) {
  std::string reply;
  return post("lease/revoke", json{{"ID", std::to_string(lease)}}.dump(), &reply, error);
}

bool EtcdClient::create(const std::string& key, const std::string& value, int64_t lease,
                        bool* created, KeyValue* holder, std::string* error) {
  std::string k = base64(key);
  json put = {{"key", k}, {"value", base64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  json txn = {
      {"compare", json::array({{{"key", k}, {"target", "CREATE"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  std::string reply;
  if (!post("kv/txn", txn.dump(), &reply, error)) return false;
  json j = json::parse(reply, nullptr, false);
  if (!j.is_object() || !j.contains("header")) {
    *error = "a malformed transaction answer from etcd: " + reply;
    return false;
  }
  *created = j.value("succeeded", false);
  if (*created) {
    // The key was created by this transaction: its create revision is the header's.
    holder->key = key;
    holder->value = value;
    holder->create_revision = number(j["header"], "revision");
    holder->lease = lease;
    return true;
  }
  const json& responses = j["responses"];
  if (responses.is_array() && !responses.empty()) {
    const json& range = responses[0]["response_range"];
    if (range.contains("kvs") && !range["kvs"].empty()) {
      *holder = read_kv(range["kvs"][0]);
      return true;
    }
  }
  // It existed at the compare and was gone by the read: let the caller try again.
  *holder = KeyValue{};
  return true;
}

bool EtcdClient::get(const std::string& key, bool* found, KeyValue* kv, std::string* error) {
  std::string reply;
  if (!post("kv/range", json{{"key", base64(key)}}.dump(), &reply, error)) return false;
  json j = json::parse(reply, nullptr, false);
  if (!j.is_object()) {
    *error = "a malformed answer from etcd: " + reply;
    return false;
  }
  *found = j.contains("kvs") && !j["kvs"].empty();
  if (*found) *kv = read_kv(j["kvs"][0]);
  return true;
}

bool EtcdClient::range(const std::string& prefix, std::vector<KeyValue>* kvs, std::string* error) {
  // etcd's prefix read: every key from prefix up to (not including) prefix with its last
  // byte one higher.
  std::string end = prefix;
  if (!end.empty()) ++end.back();
  std::string reply;
  if (!post("kv/range", json{{"key", base64(prefix)}, {"range_end", base64(end)}}.dump(), &reply,
            error))
    return false;
  json j = json::parse(reply, nullptr, false);
  if (!j.is_object()) {
    *error = "a malformed answer from etcd: " + reply;
    return false;
  }
  kvs->clear();
  if (j.contains("kvs"))
    for (const auto& kv : j["kvs"]) kvs->push_back(read_kv(kv));
  return true;
}

bool EtcdClient::remove_if(const std::string& key, int64_t create_revision, std::string* error) {
  std::string k = base64(key);
  json txn = {{"compare", json::array({{{"key", k},
                                        {"target", "CREATE"},
                                        {"create_revision", std::to_string(create_revision)}}})},
              {"success", json::array({{{"request_delete_range", {{"key", k}}}}})}};
  std::string reply;
  return post("kv/txn", txn.dump(), &reply, error);
}

}  // namespace px
