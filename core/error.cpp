#include "core/error.h"

namespace tg::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(concat(msg, " [", file, ":", line, "]"));
}

}  // namespace tg::detail
