#include "common/args.h"

#include <cstdlib>
#include <iostream>
#include <stdexcept>

namespace ex {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

Args::Args(int argc, char** argv, std::set<std::string> switches)
    : program_(argc > 0 ? argv[0] : "program"), switches_(std::move(switches)) {
  switches_.insert("help");
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "' (options start with --)");
    std::string name = a.substr(2), value = "1";
    if (auto eq = name.find('='); eq != std::string::npos) {  // --steps=5
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (!switches_.count(name)) {
      if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        value = argv[++i];
      } else {  // an error only if the program reads it (else finish() calls it unknown)
        value.clear();
        missing_value_.insert(name);
      }
    }
    values_[name] = value;
  }
}

bool Args::has(const std::string& name) {
  read_.insert(name);
  return values_.count(name) > 0;
}

std::string Args::get(const std::string& name, const std::string& fallback) {
  read_.insert(name);
  if (missing_value_.count(name)) throw std::invalid_argument("option --" + name + " needs a value");
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

namespace {
// The whole of `text` read by `parse` (std::stoll, std::stod), or an error naming the option.
template <typename T, typename Parse>
T parse_whole(const std::string& name, const std::string& text, const char* expected, Parse parse) {
  try {
    size_t used = 0;
    T r = parse(text, &used);
    if (used == text.size()) return r;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument("--" + name + " expects " + expected + ", got '" + text + "'");
}
}  // namespace

int64_t Args::get_int(const std::string& name, int64_t fallback) {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  return parse_whole<int64_t>(name, v, "an integer", [](const std::string& t, size_t* used) {
    return std::stoll(t, used);
  });
}

double Args::get_double(const std::string& name, double fallback) {
  std::string v = get(name, "");
  if (v.empty()) return fallback;
  return parse_whole<double>(name, v, "a number", [](const std::string& t, size_t* used) {
    return std::stod(t, used);
  });
}

std::vector<std::string> Args::get_list(const std::string& name, const std::vector<std::string>& fallback) {
  std::string v = get(name, "");
  return v.empty() ? fallback : split(v, ',');
}

void Args::finish(const std::string& usage) {
  if (values_.count("help")) {
    std::cout << "usage: " << program_ << " " << usage << "\n";
    std::exit(0);
  }
  for (const auto& [name, value] : values_)
    if (!read_.count(name))
      throw std::invalid_argument("unknown option --" + name + "\nusage: " + program_ + " " + usage);
}

}  // namespace ex
