// pxctl's output: JSON objects built field by field (--json) and aligned text tables (the
// default). No JSON library: pxctl only writes JSON, and the test suite parses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pxctl {

// One JSON object, written in the order fields are added.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) {
    return add(key, std::string(value));
  }
  JsonObject& add(const std::string& key, int64_t value);
  JsonObject& add(const std::string& key, uint64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, int64_t{value}); }
  JsonObject& add(const std::string& key, uint32_t value) { return add(key, uint64_t{value}); }
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, bool value);
  // value is JSON already (an object or array made here).
  JsonObject& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string json_string(const std::string& text);               // quoted and escaped
std::string json_array(const std::vector<std::string>& items);  // items are JSON already

// Rows under a header, columns padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  bool empty() const { return rows_.empty(); }
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string human_bytes(uint64_t bytes);  // "1.5 MiB"
std::string human_ms(int64_t ms);         // "2.0 s", "3 h 2 min"

}  // namespace pxctl
