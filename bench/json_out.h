// Writing the benchmarks' --json output (tg_bench, tg_zoo) without a JSON library.
#pragma once
#include <cmath>
#include <sstream>
#include <string>

namespace bench {

// JSON has no inf or nan: a check that met a non-finite value reports null.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

}  // namespace bench
