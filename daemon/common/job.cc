#include "daemon/common/job.h"

#include <vector>

namespace px {

std::string Fingerprint::describe() const {
  if (sparse)
    return "sparse " + std::string(dtype_name(dtype)) + "[" + std::to_string(count) + "x" +
           std::to_string(dim) + "] " + options;
  return std::string(dtype_name(dtype)) + "[" + std::to_string(count) + "] " + reduce_op_name(op) +
         (options.empty() ? "" : " " + options);
}

std::string dense_wire_option(DType wire) {
  return wire == DType::kF32 ? "" : std::string("wire=") + dtype_name(wire);
}

DType dense_wire(const Fingerprint& fingerprint) {
  if (fingerprint.sparse || fingerprint.options.empty()) return DType::kF32;
  for (DType wire : {DType::kBF16, DType::kF16})
    if (fingerprint.options == dense_wire_option(wire)) return wire;
  return DType::kF32;
}

namespace {

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    if (end > at) out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace

std::string Fingerprint::describe_difference(const Fingerprint& other) const {
  if (!sparse && !other.sparse) return describe();  // short enough whole
  std::vector<std::string> mine = words(describe()), theirs = words(other.describe());
  if (mine.size() != theirs.size()) return describe();
  std::string out;
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i] != theirs[i]) out += (out.empty() ? "" : " ") + mine[i];
  return out.empty() ? describe() : out;
}

Job::Job(std::string name, int local_size)
    : name_(std::move(name)), local_size_(local_size), members_(static_cast<size_t>(local_size)) {
  world_.world_size = local_size;
  world_.node_sizes = {local_size};
  auto barrier = std::make_unique<Variable>();
  barrier->id = 0;
  barrier->name = "<barrier>";
  barrier->registered.assign(static_cast<size_t>(local_size), true);
  variables_.push_back(std::move(barrier));
}

bool Job::needs_departed(const Variable& var) const {
  return !departed_.empty() && (!var.fingerprint.sparse || departed_here_);
}

int Job::connected() const {
  int n = 0;
  for (const auto& m : members_) n += m != nullptr;
  return n;
}

int Job::first_free_rank() const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (!members_[i]) return static_cast<int>(i);
  return -1;
}

Variable* Job::find(uint32_t id) {
  return id < variables_.size() ? variables_[id].get() : nullptr;
}

Variable* Job::find_global(uint32_t global_id) {
  auto it = global_ids_.find(global_id);
  if (it != global_ids_.end() && variables_[it->second]->global_id == global_id)
    return variables_[it->second].get();
  for (auto& var : variables_)  // first asked (ids are set once, when every node agreed)
    if (var->global_id == global_id && global_id != 0) {
      global_ids_[global_id] = var->id;
      return var.get();
    }
  return nullptr;
}

Variable* Job::find(const std::string& name) {
  auto it = ids_.find(name);
  return it == ids_.end() ? nullptr : variables_[it->second].get();
}

Variable& Job::add(std::string name, Fingerprint fingerprint, std::string defined_by) {
  auto var = std::make_unique<Variable>();
  var->id = static_cast<uint32_t>(variables_.size());
  var->name = name;
  var->fingerprint = fingerprint;
  var->defined_by = std::move(defined_by);
  var->registered.assign(static_cast<size_t>(local_size_), false);
  ids_[std::move(name)] = var->id;
  variables_.push_back(std::move(var));
  return *variables_.back();
}

uint64_t Job::sparse_table_bytes() const {
  uint64_t bytes = 0;
  for (auto& var : variables_)
    if (var->fingerprint.sparse) bytes += var->fingerprint.bytes() * var->fingerprint.dim;
  return bytes;
}

}  // namespace px
