// Errors: one exception family and one family of check macros.
// Every message names the op and the offending shapes; TG_CHECK adds file:line.
#pragma once
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised when a device allocation fails; the allocator stays usable afterwards.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& msg, std::size_t requested, std::size_t in_use)
      : Error(msg), requested_bytes(requested), bytes_in_use(in_use) {}
  std::size_t requested_bytes;
  std::size_t bytes_in_use;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail
}  // namespace tg

#define TG_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) ::tg::detail::throw_error(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TG_FAIL(...) ::tg::detail::throw_error(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__))
