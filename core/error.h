// Errors: one exception family and one family of check macros.
// Every message names the op and the offending shapes; TG_CHECK adds file:line, with the
// file's path relative to the project (never the build machine's absolute path).
//
// The family, so a caller can catch what it can handle and let the rest through:
//   Error             everything tapegrad throws (catch this to catch them all)
//   ├ ShapeError      shapes that do not fit together (the message shows them)
//   ├ DTypeError      a dtype the op does not take, or operands of different dtypes
//   ├ DeviceError     operands on different devices, or a device that does not exist
//   ├ IOError         a file that cannot be opened, read (or ends early), or written; a
//   │                 file that reads fine but whose contents are malformed (a bad header,
//   │                 inconsistent offsets) is a plain Error, a format problem, not I/O
//   ├ UnsupportedError a valid request this build or this GPU does not implement
//   │ └ CaptureError   an op that cannot run inside a CUDA graph capture (core/cuda_graph.h)
//   ├ CudaError       a CUDA runtime call failed (the call and CUDA's error string)
//   ├ DistError       a collective failed, timed out waiting for other ranks, or the ranks
//   │                 disagree (dist/: shapes, parameter lists)
//   └ OutOfMemory     an allocation failed; the allocator stays usable
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

class ShapeError : public Error {
 public:
  using Error::Error;
};
class DTypeError : public Error {
 public:
  using Error::Error;
};
class DeviceError : public Error {
 public:
  using Error::Error;
};
class IOError : public Error {
 public:
  using Error::Error;
};
class UnsupportedError : public Error {
 public:
  using Error::Error;
};
class CaptureError : public UnsupportedError {
 public:
  using UnsupportedError::UnsupportedError;
};
class CudaError : public Error {
 public:
  using Error::Error;
};
class DistError : public Error {
 public:
  using Error::Error;
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
// `file` relative to the project root: __FILE__ is absolute when the build passes absolute
// paths, and a user's error report should not carry the build machine's directories.
const char* project_relative(const char* file);
// msg + " [file:line]", the text every check macro throws.
std::string located(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
// Throws E (a subclass of Error constructible from a string) with the located message.
template <class E>
[[noreturn]] void throw_as(const char* file, int line, const std::string& msg) {
  throw E(located(file, line, msg));
}
}  // namespace detail
}  // namespace tg

#define TG_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) ::tg::detail::throw_error(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__)); \
  } while (0)

// TG_CHECK with the exception's class: TG_CHECK_AS(ShapeError, a.shape() == b.shape(), ...).
// The class is named inside namespace tg (ShapeError, not tg::ShapeError).
#define TG_CHECK_AS(type, cond, ...)                                                \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::tg::detail::throw_as<::tg::type>(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TG_FAIL(...) ::tg::detail::throw_error(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__))
#define TG_FAIL_AS(type, ...) \
  ::tg::detail::throw_as<::tg::type>(__FILE__, __LINE__, ::tg::detail::concat(__VA_ARGS__))
