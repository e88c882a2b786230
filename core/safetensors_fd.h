// What the safetensors reader (core/safetensors.cpp) and writer (core/safetensors_write.cpp)
// share: an owned file descriptor and the text of errno. Internal to those two files; the
// format and the public API are in core/safetensors.h.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace tg::safetensors::detail {

inline std::string errno_text() { return std::strerror(errno); }

// An owned file descriptor (closed on every path out, errors included).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Returns close()'s result: a failed close can mean the data never reached the disk.
  int close() {
    int r = 0;
    if (fd_ >= 0) r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

}  // namespace tg::safetensors::detail
