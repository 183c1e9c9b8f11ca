#include "tools/pxctl/output.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace pxctl {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char hex[8];
          snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]";
}

void JsonObject::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += json_string(k) + ":";
}

JsonObject& JsonObject::add(const std::string& k, const std::string& value) {
  key(k);
  body_ += json_string(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, double value) {
  key(k);
  char text[40];
  snprintf(text, sizeof text, "%.9g", std::isfinite(value) ? value : 0.0);
  body_ += text;
  return *this;
}

JsonObject& JsonObject::add(const std::string& k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::add_raw(const std::string& k, const std::string& json) {
  key(k);
  body_ += json;
  return *this;
}

std::string Table::str() const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], cells[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i) {
      out += cells[i];
      if (i + 1 < cells.size()) out += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header_);
  for (const auto& r : rows_) out += line(r);
  return out;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char text[32];
  if (u == 0)
    snprintf(text, sizeof text, "%" PRIu64 " B", bytes);
  else
    snprintf(text, sizeof text, "%.1f %s", v, units[u]);
  return text;
}

std::string human_ms(int64_t ms) {
  char text[48];
  if (ms < 1000)
    snprintf(text, sizeof text, "%" PRId64 " ms", ms);
  else if (ms < 60000)
    snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000);
  else if (ms < 3600000)
    snprintf(text, sizeof text, "%" PRId64 " min %" PRId64 " s", ms / 60000, ms / 1000 % 60);
  else
    snprintf(text, sizeof text, "%" PRId64 " h %" PRId64 " min", ms / 3600000, ms / 60000 % 60);
  return text;
}

}  // namespace pxctl
