#include "common/args.h"

#include <cmath>
#include <cstdlib>
#include <limits>
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
      if (switches_.count(name)) throw std::invalid_argument("option --" + name + " takes no value, got '" + a + "'");
    } else if (!switches_.count(name)) {
      value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0 ? argv[++i] : "";
    }
    // An error only if the program reads it (else finish() calls it unknown).
    if (value.empty()) missing_value_.insert(name);
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

std::invalid_argument bad_value(const std::string& name, const std::string& text, const std::string& expected) {
  return std::invalid_argument("--" + name + " expects " + expected + ", got '" + text + "'");
}

// The whole of `text` read by `parse` (std::stoll, std::stod), or an error naming the option.
template <typename T, typename Parse>
T parse_whole(const std::string& name, const std::string& text, const std::string& expected, Parse parse) {
  try {
    size_t used = 0;
    T r = parse(text, &used);
    if (used == text.size()) return r;
  } catch (const std::exception&) {  // std::stoll's out_of_range included: "expects" says what fits
  }
  throw bad_value(name, text, expected);
}

// "a positive integer", "a non-negative integer no larger than 1024", ...: what an option of
// that range expects. The upper bound is mentioned when `with_max` (when it was the bound
// missed, or the text no number): a "--batch 0" error need not recite INT32_MAX.
std::string describe_int_range(int64_t min, int64_t max, bool with_max) {
  constexpr int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  const std::string kind = min == lowest ? "an integer"
                           : min == 1    ? "a positive integer"
                           : min == 0    ? "a non-negative integer"
                                         : "an integer >= " + std::to_string(min);
  return with_max && max != highest ? kind + " no larger than " + std::to_string(max) : kind;
}

// A finite number that `in_range` accepts, or an error naming the option.
double parse_number(const std::string& name, const std::string& text, const std::string& expected,
                    bool (*in_range)(double)) {
  const double v = parse_whole<double>(name, text, expected, [](const std::string& t, size_t* used) {
    return std::stod(t, used);
  });
  if (!std::isfinite(v) || !in_range(v)) throw bad_value(name, text, expected);
  return v;
}

}  // namespace

int64_t Args::get_int(const std::string& name, int64_t fallback) {
  return get_int_in(name, fallback, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

int64_t Args::get_int_in(const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  const std::string text = get(name, "");  // empty only when not given: get() rejects `--name=`
  if (text.empty()) return fallback;
  const int64_t v = parse_whole<int64_t>(name, text, describe_int_range(min, max, true),
                                        [](const std::string& t, size_t* used) { return std::stoll(t, used); });
  if (v < min || v > max) throw bad_value(name, text, describe_int_range(min, max, v > max));
  return v;
}

int64_t Args::get_positive_int(const std::string& name, int64_t fallback, int64_t max) {
  return get_int_in(name, fallback, 1, max);
}

int64_t Args::get_nonnegative_int(const std::string& name, int64_t fallback, int64_t max) {
  return get_int_in(name, fallback, 0, max);
}

uint64_t Args::get_seed(const std::string& name, uint64_t fallback) {
  if (!has(name)) return fallback;
  return static_cast<uint64_t>(get_nonnegative_int(name, 0, std::numeric_limits<int64_t>::max()));
}

double Args::get_double(const std::string& name, double fallback) {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  return parse_number(name, text, "a finite number", [](double) { return true; });
}

double Args::get_positive_double(const std::string& name, double fallback) {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  return parse_number(name, text, "a positive finite number", [](double v) { return v > 0; });
}

double Args::get_fraction(const std::string& name, double fallback) {
  const std::string text = get(name, "");
  if (text.empty()) return fallback;
  return parse_number(name, text, "a number from 0 to 1", [](double v) { return v >= 0 && v <= 1; });
}

std::vector<std::string> Args::get_list(const std::string& name, const std::vector<std::string>& fallback) {
  const std::string v = get(name, "");
  if (v.empty()) return fallback;
  std::vector<std::string> items = split(v, ',');
  if (items.empty()) throw bad_value(name, v, "a comma-separated list");
  return items;
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
