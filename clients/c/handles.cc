// The handle table: opaque handles are ids from one counter that never repeats, mapped to
// the objects they name. A stale handle (freed, or its client disconnected) is not found,
// so bindings that free in any order get PX_ERR_NOT_FOUND instead of a dangling pointer.
// Lookups take a shared lock and return shared_ptrs that keep the objects alive for the
// call; the cost is one hash lookup per call.
#include <atomic>
#include <shared_mutex>

#include "clients/c/client_internal.h"

namespace px {
namespace {

struct Table {
  std::shared_mutex mutex;
  std::unordered_map<uint64_t, std::shared_ptr<Client>> clients;
  std::unordered_map<uint64_t, VarRef> vars;
  std::unordered_map<uint64_t, RequestRef> requests;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: handles may be used from atexit paths
  return *t;
}

std::atomic<uint64_t> next_handle{1};

template <typename H>
H* to_handle(uint64_t id) {
  return reinterpret_cast<H*>(static_cast<uintptr_t>(id));
}

template <typename H>
uint64_t to_id(H* handle) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
}

}  // namespace

px_client* add_client_handle(std::shared_ptr<Client> client) {
  uint64_t id = next_handle.fetch_add(1);
  client->handle = id;
  std::unique_lock lock(table().mutex);
  table().clients.emplace(id, std::move(client));
  return to_handle<px_client>(id);
}

px_var* add_var_handle(const std::shared_ptr<Client>& client, Var* var) {
  uint64_t id = next_handle.fetch_add(1);
  var->handle = id;
  std::unique_lock lock(table().mutex);
  table().vars.emplace(id, VarRef{client, var});
  return to_handle<px_var>(id);
}

px_request* add_request_handle(const std::shared_ptr<Client>& client,
                               std::shared_ptr<Request> request) {
  uint64_t id = next_handle.fetch_add(1);
  request->handle = id;
  std::unique_lock lock(table().mutex);
  table().requests.emplace(id, RequestRef{client, std::move(request)});
  return to_handle<px_request>(id);
}

bool find_client(px_client* handle, ClientRef* out) {
  std::shared_lock lock(table().mutex);
  auto it = table().clients.find(to_id(handle));
  if (it == table().clients.end()) return false;
  out->client = it->second;
  return true;
}

bool find_var(px_var* handle, VarRef* out) {
  std::shared_lock lock(table().mutex);
  auto it = table().vars.find(to_id(handle));
  if (it == table().vars.end()) return false;
  *out = it->second;
  return true;
}

bool find_request(px_request* handle, RequestRef* out) {
  std::shared_lock lock(table().mutex);
  auto it = table().requests.find(to_id(handle));
  if (it == table().requests.end()) return false;
  *out = it->second;
  return true;
}

void remove_request_handle(uint64_t handle) {
  RequestRef doomed;  // released after the lock
  std::unique_lock lock(table().mutex);
  auto it = table().requests.find(handle);
  if (it == table().requests.end()) return;
  doomed = std::move(it->second);
  table().requests.erase(it);
}

void remove_client_handles(Client& client) {
  std::vector<uint64_t> vars, requests;
  {
    std::lock_guard<std::mutex> lock(client.mutex);
    for (auto& v : client.vars) vars.push_back(v->handle);
    for (auto& [r, owner] : client.requests) requests.push_back(r->handle);
  }
  std::vector<std::shared_ptr<Client>> doomed_clients;
  std::vector<VarRef> doomed_vars;
  std::vector<RequestRef> doomed_requests;
  std::unique_lock lock(table().mutex);
  auto c = table().clients.find(client.handle);
  if (c != table().clients.end()) {
    doomed_clients.push_back(std::move(c->second));
    table().clients.erase(c);
  }
  for (uint64_t id : vars) {
    auto it = table().vars.find(id);
    if (it == table().vars.end()) continue;
    doomed_vars.push_back(std::move(it->second));
    table().vars.erase(it);
  }
  for (uint64_t id : requests) {
    auto it = table().requests.find(id);
    if (it == table().requests.end()) continue;
    doomed_requests.push_back(std::move(it->second));
    table().requests.erase(it);
  }
  lock.unlock();  // the client may be destroyed as these go out of scope
}

}  // namespace px
