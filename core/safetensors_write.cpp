// Writing safetensors files atomically (save_file): the header is built and every name checked
// before the file system is touched; the data goes to a temporary file next to the target
// (O_TMPFILE where the file system has it), is fsync'ed and renamed over the target; stale
// temporaries of dead processes are removed. The target is the file a symbolic link names,
// and the replacement keeps the replaced file's mode; a file this process could not write
// is refused, not replaced. The format: core/safetensors.h.
#include "core/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <vector>

#include "core/json.h"
#include "core/safetensors_fd.h"

namespace tg::safetensors {

namespace {

using detail::errno_text;
using detail::Fd;

std::atomic<int64_t> g_fail_after{-1};
std::atomic<bool> g_use_tmpfile{true};

// Writes the temporary file; `fail_after` >= 0 simulates a failure after that many bytes.
class TempWriter {
 public:
  TempWriter(int fd, const std::string& path, int64_t fail_after) : fd_(fd), path_(path), fail_after_(fail_after) {}
  void write(const void* src, uint64_t n) {
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
      uint64_t chunk = n;
      if (fail_after_ >= 0) {
        uint64_t left = static_cast<uint64_t>(fail_after_) - std::min<uint64_t>(written_, fail_after_);
        if (left == 0)
          TG_FAIL_AS(IOError, "safetensors: writing '", path_, "' failed after ", written_, " bytes (simulated failure)");
        chunk = std::min(chunk, left);
      }
      ssize_t put = ::write(fd_, p, chunk);
      if (put < 0 && errno == EINTR) continue;
      TG_CHECK_AS(IOError, put > 0, "safetensors: writing '", path_, "' failed after ", written_, " bytes: ", errno_text());
      p += put;
      n -= static_cast<uint64_t>(put);
      written_ += static_cast<uint64_t>(put);
    }
  }

 private:
  int fd_;
  const std::string& path_;
  int64_t fail_after_;
  uint64_t written_ = 0;
};

// "<path>.tmp.<pid>.<n>": unique among this process's saves, and says whose it is.
std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

std::filesystem::path directory_of(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

// The pid of a "<target>.tmp.<pid>.<n>" name, or 0 if `name` is not one.
pid_t temp_owner(const std::string& name, const std::string& prefix) {
  if (!name.starts_with(prefix)) return 0;
  const std::string rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  auto digits = [](std::string_view v) {
    return !v.empty() && v.size() <= 18 && v.find_first_not_of("0123456789") == v.npos;
  };
  if (dot == std::string::npos || !digits(std::string_view(rest).substr(0, dot)) ||
      !digits(std::string_view(rest).substr(dot + 1)))
    return 0;
  const long long pid = std::stoll(rest.substr(0, dot));
  return pid > 0 && pid <= INT32_MAX ? static_cast<pid_t>(pid) : 0;
}

// Removes the temporaries of saves of `path` by processes that no longer exist (killed
// mid-save). Best effort and silent: a file that cannot be removed stays.
void remove_stale_temps(const std::string& path) {
  const std::string prefix = std::filesystem::path(path).filename().string() + ".tmp.";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory_of(path), ec), end; !ec && it != end; it.increment(ec)) {
    const pid_t pid = temp_owner(it->path().filename().string(), prefix);
    // Our own are other threads' saves in progress; EPERM means alive (another user's).
    if (pid == 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    ::unlink(it->path().c_str());
  }
}

// The temporary a save writes: unnamed (O_TMPFILE) where the file system allows, so that
// it dies with the process, else created under its name.
struct TempFile {
  Fd fd{-1};
  std::string name;  // named once complete (or from the start without O_TMPFILE)
  bool unnamed = false;
};

TempFile create_temp(const std::string& path) {
  TempFile t;
  t.name = temp_path_for(path);
  // Naming an O_TMPFILE file goes through /proc/self/fd: without it, do not start one.
  if (g_use_tmpfile.load() && ::access("/proc/self/fd", X_OK) == 0) {
    t.fd = Fd(::open(directory_of(path).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666));
    t.unnamed = t.fd.get() >= 0;
  }
  if (!t.unnamed) {
    // Unsupported (EOPNOTSUPP, EISDIR...) or refused: the named file gives the error, if any.
    t.fd = Fd(::open(t.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    TG_CHECK_AS(IOError, t.fd.get() >= 0, "safetensors: cannot create '", t.name, "' to save '", path, "': ", errno_text(),
                " (is the directory writable?)");
  }
  return t;
}

// Gives a complete unnamed temporary its name, ready for the rename.
void name_temp(TempFile& t, const std::string& path) {
  if (!t.unnamed) return;
  const std::string proc = "/proc/self/fd/" + std::to_string(t.fd.get());
  TG_CHECK_AS(IOError, ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, t.name.c_str(), AT_SYMLINK_FOLLOW) == 0,
              "safetensors: cannot name the temporary file of '", path, "' as '", t.name, "': ", errno_text());
  t.unnamed = false;
}

// Makes the rename itself durable; best effort (some filesystems refuse to fsync a directory).
void sync_directory_of(const std::string& path) {
  int fd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// "0644": the permission bits as chmod takes them.
std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// The file a save of `path` replaces: `path` with its symbolic links followed (a save
// through a link writes the link's target and keeps the link), and that file's status
// when it exists.
struct Target {
  std::string path;
  bool exists = false;
  struct stat status {};
};

// Follows `path` while it names a symbolic link; a link to a missing file gives that
// file's path, as open(O_CREAT) would create it.
std::string follow_symlinks(const std::string& path) {
  constexpr int kMaxLinks = 40;  // the kernel's own limit (ELOOP)
  std::string p = path;
  for (int links = 0;; ++links) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    TG_CHECK_AS(IOError, links < kMaxLinks, "safetensors: cannot save to '", path, "': more than ", kMaxLinks,
                " symbolic links (a loop?)");
    std::error_code ec;
    const std::filesystem::path link = std::filesystem::read_symlink(p, ec);
    TG_CHECK_AS(IOError, !ec, "safetensors: cannot read the symbolic link '", p, "': ", ec.message());
    p = link.is_absolute() ? link.string() : (std::filesystem::path(p).parent_path() / link).string();
  }
}

// Refuses, before anything is written, to replace what a plain write could not: a
// directory or other non-regular file, or a file this process may not write. The test is
// the kernel's own for opening the file for writing (faccessat with the effective ids), so
// a save succeeds exactly where writing the file in place would: root may replace a 0444
// file, as `cp` or open(O_WRONLY) may, and the file keeps its 0444 mode.
Target inspect_target(const std::string& path) {
  Target t;
  t.path = follow_symlinks(path);
  const std::string shown = t.path == path ? "'" + path + "'" : "'" + path + "' (a link to '" + t.path + "')";
  t.exists = ::stat(t.path.c_str(), &t.status) == 0;
  if (!t.exists) return t;
  TG_CHECK_AS(IOError, S_ISREG(t.status.st_mode), "safetensors: cannot save to ", shown,
              ": it exists and is not a regular file");
  if (::faccessat(AT_FDCWD, t.path.c_str(), W_OK, AT_EACCESS) != 0) {
    const std::string why = errno_text();
    TG_FAIL_AS(IOError, "safetensors: cannot save to ", shown, ": the file is not writable (mode ",
               octal_mode(t.status.st_mode), "): ", why, "; it was left as it is");
  }
  return t;
}

// The replacement keeps the replaced file's permission bits (a private 0600 checkpoint
// stays private) and, where this process may set them, its owner and group. A new file
// keeps the mode open() gave it, which respects the umask.
void carry_over_mode(const TempFile& tmp, const Target& target) {
  if (!target.exists) return;
  const struct stat& old = target.status;
  // Owner and group are best effort: only root may give a file away, but a user may set
  // the group to one of their own. Before fchmod: chown clears set-id bits.
  if (::fchown(tmp.fd.get(), old.st_uid, old.st_gid) != 0)
    (void)::fchown(tmp.fd.get(), static_cast<uid_t>(-1), old.st_gid);
  if (::fchmod(tmp.fd.get(), old.st_mode & 07777) != 0) {
    const std::string why = errno_text();
    TG_FAIL_AS(IOError, "safetensors: cannot give the temporary file of '", target.path, "' the mode ",
               octal_mode(old.st_mode), " of the file it replaces: ", why);
  }
}

// Names and metadata must be UTF-8: the format says so, and our reader (as Python's)
// refuses a file that breaks it.
void check_utf8(const std::string& s, const char* what) {
  size_t bad = 0;
  TG_CHECK(json::valid_utf8(s, &bad), "safetensors::save_file: ", what, " '", json::printable(s),
           "' is not valid UTF-8 (ill-formed sequence at byte ", bad,
           "); safetensors names and metadata must be UTF-8");
}

}  // namespace

namespace {

// A floating tensor (f32, f64, or the other half type) as little-endian 2-byte `code`
// values, encoded in slices.
void write_half(TempWriter& out, const Tensor& host, const char* code) {
  constexpr int64_t kSlice = int64_t{1} << 20;
  std::vector<unsigned char> bytes;
  const bool bf16 = std::strcmp(code, "BF16") == 0;
  const int64_t n = host.numel();
  for (int64_t begin = 0; begin < n; begin += kSlice) {
    const int64_t count = std::min(kSlice, n - begin);
    bytes.resize(static_cast<size_t>(2 * count));
    for (int64_t i = 0; i < count; ++i) {
      const double v = host.dtype() == DType::f32   ? static_cast<double>(host.data<float>()[begin + i])
                       : host.dtype() == DType::f64 ? host.data<double>()[begin + i]
                                                    : tg::decode_half(host.dtype(), static_cast<const uint16_t*>(
                                                                                    host.raw_data())[begin + i]);
      const uint16_t h = encode_half(bf16, v);
      bytes[static_cast<size_t>(2 * i)] = static_cast<unsigned char>(h & 0xff);
      bytes[static_cast<size_t>(2 * i + 1)] = static_cast<unsigned char>(h >> 8);
    }
    out.write(bytes.data(), bytes.size());
  }
}

}  // namespace

void save_file(const NamedTensors& tensors, const std::string& path, const Metadata& metadata, FloatFormat floats) {
  const int64_t fail_after = g_fail_after.exchange(-1);
  // Everything is checked and the header built before the file system is touched.
  std::unordered_set<std::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    TG_CHECK(!name.empty(), "safetensors::save_file: tensor ", i, " has an empty name");
    TG_CHECK(name != "__metadata__", "safetensors::save_file: '__metadata__' is reserved and cannot name a tensor");
    check_utf8(name, "tensor name");
    TG_CHECK(t.defined(), "safetensors::save_file: tensor '", name, "' is undefined");
    TG_CHECK(names.insert(name).second, "safetensors::save_file: two tensors are named '", name, "'");
  }
  std::unordered_set<std::string_view> keys;
  for (const auto& [key, value] : metadata) {
    check_utf8(key, "metadata key");
    check_utf8(value, "metadata value");
    TG_CHECK(keys.insert(key).second, "safetensors::save_file: metadata key '", key, "' given twice");
  }
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i) header += ',';
      header += json::quote(metadata[i].first);
      header += ':';
      header += json::quote(metadata[i].second);
    }
    header += "}";
  }
  // The code each tensor is stored as: its own, or the half format for floating tensors.
  const char* half = floats == FloatFormat::f16 ? "F16" : floats == FloatFormat::bf16 ? "BF16" : nullptr;
  const DType half_dtype = floats == FloatFormat::f16 ? DType::f16 : DType::bf16;
  // Encoded value by value: floating tensors stored in a half format they are not already in.
  auto encoded = [&](const Tensor& t) { return half && t.dtype() != DType::i64 && t.dtype() != half_dtype; };
  auto stored_code = [&](const Tensor& t) { return encoded(t) ? half : dtype_code(t.dtype()); };
  auto stored_bytes = [&](const Tensor& t) {
    return encoded(t) ? static_cast<uint64_t>(t.numel()) * 2 : static_cast<uint64_t>(t.nbytes());
  };
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (i || !metadata.empty()) header += ",";
    header += json::quote(name) + ":{\"dtype\":\"" + stored_code(t) + "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) header += ',';
      header += std::to_string(t.size(d));
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + stored_bytes(t)) + "]}";
    offset += stored_bytes(t);
  }
  header += "}";
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const Target target = inspect_target(path);
  remove_stale_temps(target.path);
  TempFile tmp = create_temp(target.path);
  try {
    carry_over_mode(tmp, target);
    TempWriter out(tmp.fd.get(), tmp.name, fail_after);
    out.write(len_bytes, 8);
    out.write(header.data(), header.size());
    for (const auto& [name, t] : tensors) {
      // GPU tensors come to the host one at a time; detach so no tape records the copy.
      Tensor host = t.device().is_cpu() ? t : t.detach().to(Device::cpu());
      if (encoded(host)) {
        write_half(out, host, half);
      } else {
        out.write(host.raw_data(), host.nbytes());
      }
    }
    TG_CHECK_AS(IOError, ::fsync(tmp.fd.get()) == 0, "safetensors: fsync of '", tmp.name, "' failed: ", errno_text());
    name_temp(tmp, target.path);
    TG_CHECK_AS(IOError, tmp.fd.close() == 0, "safetensors: closing '", tmp.name, "' failed: ", errno_text());
    TG_CHECK_AS(IOError, ::rename(tmp.name.c_str(), target.path.c_str()) == 0, "safetensors: renaming '", tmp.name,
                "' to '", target.path, "' failed: ", errno_text());
  } catch (...) {
    tmp.fd.close();
    if (!tmp.unnamed) ::unlink(tmp.name.c_str());
    throw;
  }
  sync_directory_of(target.path);
}

namespace testing {
void fail_next_write_after(int64_t bytes) { g_fail_after.store(bytes); }
void set_use_tmpfile(bool on) { g_use_tmpfile.store(on); }
}  // namespace testing

}  // namespace tg::safetensors
