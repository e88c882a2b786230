#include "core/error.h"

#include <cstring>

namespace tg::detail {

namespace {
// This file is <root>/core/error.cpp, so its own __FILE__ tells where the root is as the
// compiler saw it; every file of the project (library, tests, examples, and tapegrad's
// inline headers expanded in them) is named under that root and gets it stripped. Done
// here rather than with -fmacro-prefix-map, which would have to reach every target that
// expands TG_CHECK, and would leave this file nothing to find the root from.
constexpr const char kSelf[] = "core/error.cpp";

std::size_t root_prefix_length() {
  const std::size_t n = std::strlen(__FILE__), self = sizeof(kSelf) - 1;
  if (n >= self && std::strcmp(__FILE__ + n - self, kSelf) == 0) return n - self;
  return 0;  // an unexpected layout: keep paths as they are rather than cut them wrongly
}
}  // namespace

const char* project_relative(const char* file) {
  static const std::size_t prefix = root_prefix_length();
  if (file && prefix > 0 && std::strncmp(file, __FILE__, prefix) == 0) return file + prefix;
  return file;
}

std::string located(const char* file, int line, const std::string& msg) {
  return concat(msg, " [", project_relative(file), ":", line, "]");
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(located(file, line, msg));
}

}  // namespace tg::detail
