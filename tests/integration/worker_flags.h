// Named flags of px_test_worker's scenarios: `px_test_worker SCENARIO [--name VALUE |
// --switch]...`. Each scenario declares the flags it takes (a ScenarioSpec); the command
// line is checked against it before the worker connects: a positional word, an unknown
// flag, a flag given twice, a value flag without its value, a required flag left out, or a
// value of the wrong kind (not a whole number, not one of the choices) ends the worker at
// once with exit code 2 and a line naming the problem and the scenario's flags.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pxt {

// A value flag: "NAME[?][:KIND]". '?': the flag may be left out. KIND: "n" a whole number,
// "n,n" a comma-separated list of them, "a|b|c" one of the words; none: any text.
struct FlagDef {
  std::string name;
  bool optional = false;
  enum Kind { kText, kNumber, kNumbers, kChoice } kind = kText;
  std::vector<std::string> choices;

  explicit FlagDef(const std::string& decl) {
    size_t colon = decl.find(':');
    name = decl.substr(0, colon);
    if (!name.empty() && name.back() == '?') {
      optional = true;
      name.pop_back();
    }
    if (colon == std::string::npos) return;
    std::string k = decl.substr(colon + 1);
    if (k == "n") {
      kind = kNumber;
    } else if (k == "n,n") {
      kind = kNumbers;
    } else {
      kind = kChoice;
      for (size_t at = 0;;) {
        size_t bar = k.find('|', at);
        choices.push_back(k.substr(at, bar - at));
        if (bar == std::string::npos) break;
        at = bar + 1;
      }
    }
  }

  std::string describe() const {
    std::string v = kind == kNumber    ? "N"
                    : kind == kNumbers ? "N,N,..."
                    : kind == kText    ? "TEXT"
                                       : "";
    for (size_t i = 0; i < choices.size(); ++i) v += (i ? "|" : "") + choices[i];
    std::string text = optional ? "[--" : "--";
    text += name;
    text += ' ';
    text += v;
    if (optional) text += ']';
    return text;
  }
};

struct ScenarioSpec {
  std::string name;
  std::vector<std::string> values;    // FlagDef declarations: "count:n", "route?:ps|hybrid"
  std::vector<std::string> switches;  // flags that stand alone: --sparse
  std::string about;                  // one line for --help
};

// "--a N --b x|y [--c TEXT] [--d]" for usage lines.
inline std::string describe_flags(const ScenarioSpec& spec) {
  std::string text;
  for (auto& v : spec.values) {
    if (!text.empty()) text += ' ';
    text += FlagDef(v).describe();
  }
  for (auto& s : spec.switches) {
    if (!text.empty()) text += ' ';
    text += "[--";
    text += s;
    text += ']';
  }
  return text.empty() ? "(no flags)" : text;
}

[[noreturn]] inline void usage_error(const ScenarioSpec& spec, const std::string& what) {
  fprintf(stdout, "USAGE px_test_worker %s: %s; it takes %s\n", spec.name.c_str(), what.c_str(),
          describe_flags(spec).c_str());
  fflush(stdout);
  exit(2);
}

class Flags {
 public:
  // Parses and checks argv[0..argc) (what follows the scenario name) against spec, which
  // must outlive this object.
  Flags(const ScenarioSpec& spec, int argc, char** argv) : spec_(spec) {
    for (auto& decl : spec_.values) defs_.emplace_back(decl);
    for (int i = 0; i < argc; ++i) {
      std::string word = argv[i];
      if (word.rfind("--", 0) != 0 || word.size() == 2)
        usage_error(spec_, "unexpected argument '" + word + "' (flags are --name value)");
      std::string name = word.substr(2);
      if (values_.count(name) || switches_.count(name))
        usage_error(spec_, "flag " + word + " given twice");
      bool is_switch = false;
      for (auto& s : spec_.switches) is_switch = is_switch || s == name;
      if (is_switch) {
        switches_.insert(name);
        continue;
      }
      const FlagDef* def = find(name);
      if (!def) usage_error(spec_, "unknown flag " + word);
      if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
        usage_error(spec_, "flag " + word + " needs a value");
      values_[name] = argv[++i];
      if (def->kind == FlagDef::kNumber) number(name, values_[name]);
      if (def->kind == FlagDef::kNumbers) u64_list(name);
      if (def->kind == FlagDef::kChoice) choice(name);
    }
    for (auto& def : defs_)
      if (!def.optional && !values_.count(def.name))
        usage_error(spec_, "missing flag --" + def.name);
  }

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool on(const std::string& name) const { return switches_.count(name) != 0; }

  const std::string& str(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) usage_error(spec_, "missing flag --" + name);
    return it->second;
  }
  std::string str(const std::string& name, const std::string& fallback) const {
    return has(name) ? str(name) : fallback;
  }

  uint64_t u64(const std::string& name) const { return number(name, str(name)); }
  uint64_t u64(const std::string& name, uint64_t fallback) const {
    return has(name) ? u64(name) : fallback;
  }
  int i32(const std::string& name) const { return static_cast<int>(u64(name)); }

  // --counts 1,7,1000
  std::vector<uint64_t> u64_list(const std::string& name) const {
    std::vector<uint64_t> out;
    const std::string& text = str(name);
    for (size_t at = 0;;) {
      size_t comma = text.find(',', at);
      out.push_back(number(name, text.substr(at, comma - at)));
      if (comma == std::string::npos) return out;
      at = comma + 1;
    }
  }

  // The index of the value among the flag's declared choices.
  int choice(const std::string& name) const {
    const std::string& v = str(name);
    const FlagDef* def = find(name);
    std::string all;
    for (size_t i = 0; def && i < def->choices.size(); ++i) {
      if (def->choices[i] == v) return static_cast<int>(i);
      all += (i ? ", " : "") + def->choices[i];
    }
    usage_error(spec_, "--" + name + " '" + v + "' is not one of " + all);
  }

 private:
  const FlagDef* find(const std::string& name) const {
    for (auto& def : defs_)
      if (def.name == name) return &def;
    return nullptr;
  }

  uint64_t number(const std::string& name, const std::string& text) const {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = strtoull(text.c_str(), &end, 10);
    if (text.empty() || text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0)
      usage_error(spec_, "--" + name + " '" + text + "' is not a whole number");
    return v;
  }

  const ScenarioSpec& spec_;
  std::vector<FlagDef> defs_;
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
};

}  // namespace pxt
