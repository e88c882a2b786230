#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/json.h"

namespace tg::safetensors {

// The format is little-endian; tensors are written straight from memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::atomic<int64_t> g_fail_after{-1};

std::string errno_text() { return std::strerror(errno); }

// An owned file descriptor (closed on every path out, errors included).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
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

Fd open_for_reading(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TG_CHECK(fd >= 0, "safetensors: cannot open '", path, "' for reading: ", errno_text());
  return Fd(fd);
}

// Reads exactly `n` bytes at `offset`; a short read means the file changed or is truncated.
void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TG_CHECK(got >= 0, "safetensors: reading ", what, " of '", path, "' at byte ", offset, " failed: ", errno_text());
    TG_CHECK(got > 0, "safetensors: '", path, "' ends at byte ", offset, " while reading ", what,
             " (the file was truncated)");
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// Bytes per element of every dtype the format defines; 0 for an unknown code.
uint64_t element_size(const std::string& code) {
  static const std::pair<const char*, uint64_t> table[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},    {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
      {"C64", 8}};
  for (const auto& [name, size] : table)
    if (code == name) return size;
  return 0;
}

// One header entry: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, nothing else.
TensorInfo parse_entry(const std::string& name, const json::Value& v, uint64_t base) {
  TensorInfo info;
  info.name = name;
  info.header_offset = base + v.offset;
  auto where = [&](const json::Value& at) { return base + at.offset; };
  TG_CHECK(v.is_object(), "safetensors: the entry of tensor '", name, "' at byte ", where(v),
           " must be an object, found ", json::kind_name(v.kind));
  const json::Value *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [key, member] : v.members) {
    if (key == "dtype") dtype = &member;
    else if (key == "shape") shape = &member;
    else if (key == "data_offsets") offsets = &member;
    else TG_FAIL("safetensors: tensor '", name, "' has an unknown field \"", key, "\" at byte ", where(member));
  }
  TG_CHECK(dtype && shape && offsets, "safetensors: tensor '", name, "' at byte ", where(v), " lacks ",
           !dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\"");
  TG_CHECK(dtype->is_string(), "safetensors: tensor '", name, "': dtype at byte ", where(*dtype),
           " must be a string");
  info.dtype = dtype->text;
  const uint64_t esize = element_size(info.dtype);
  TG_CHECK(esize > 0, "safetensors: tensor '", name, "' has unknown dtype \"", info.dtype, "\" at byte ",
           where(*dtype));
  TG_CHECK(shape->is_array(), "safetensors: tensor '", name, "': shape at byte ", where(*shape),
           " must be an array");
  const std::string shape_what = "shape of tensor '" + name + "'";
  for (const json::Value& d : shape->items) info.shape.push_back(d.as_size(shape_what.c_str(), base));
  // The bounds of a tensor of this shape (core/checked.h): the non-zero dims, times the
  // element size, must fit in int64 whatever their order, so that [0, 2^62, 2^62] fails as
  // [2^62, 2^62, 0] does rather than passing as an empty tensor with overflowing strides.
  uint64_t extent_bytes = esize;
  bool zero = false, overflow = false;
  for (int64_t n : info.shape) {
    if (n == 0) zero = true;
    else overflow = overflow || __builtin_mul_overflow(extent_bytes, static_cast<uint64_t>(n), &extent_bytes);
  }
  const uint64_t kMaxBytes = static_cast<uint64_t>(INT64_MAX);
  TG_CHECK(!overflow && extent_bytes <= kMaxBytes, "safetensors: tensor '", name, "' ", info.dtype,
           Shape(info.shape), " at byte ", where(*shape), " is too large: its non-zero dims need ",
           overflow ? std::string("more than 2^64") : std::to_string(extent_bytes), " bytes, over INT64_MAX");
  TG_CHECK(offsets->is_array() && offsets->items.size() == 2, "safetensors: tensor '", name,
           "': data_offsets at byte ", where(*offsets), " must be an array [begin, end]");
  std::string what = "data_offsets of tensor '" + name + "'";
  info.begin = static_cast<uint64_t>(offsets->items[0].as_size(what.c_str(), base));
  info.end = static_cast<uint64_t>(offsets->items[1].as_size(what.c_str(), base));
  TG_CHECK(info.begin <= info.end, "safetensors: tensor '", name, "' has data_offsets [", info.begin, ", ",
           info.end, "] with begin > end at byte ", where(*offsets));
  const uint64_t bytes = zero ? 0 : extent_bytes;
  TG_CHECK(bytes == info.end - info.begin, "safetensors: tensor '", name, "' ", info.dtype, Shape(info.shape),
           " needs ", bytes, " bytes but its data_offsets [", info.begin, ", ", info.end, "] at byte ",
           where(*offsets), " hold ", info.end - info.begin);
  return info;
}

}  // namespace

const TensorInfo* Header::find(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const std::string* Header::find_metadata(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

const char* dtype_code(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    default: return "I64";
  }
}

DType dtype_from_code(const std::string& code, const std::string& tensor_name) {
  if (code == "F32") return DType::f32;
  if (code == "F64") return DType::f64;
  if (code == "I64") return DType::i64;
  TG_FAIL("safetensors: tensor '", tensor_name, "' has dtype ", code,
          ", which tapegrad cannot hold (it has F32, F64 and I64)");
}

Header read_header(const std::string& path) {
  Fd fd = open_for_reading(path);
  struct stat st {};
  TG_CHECK(::fstat(fd.get(), &st) == 0, "safetensors: cannot stat '", path, "': ", errno_text());
  Header h;
  h.file_size = static_cast<uint64_t>(st.st_size);
  TG_CHECK(h.file_size >= 8, "safetensors: '", path, "' holds ", h.file_size,
           " bytes, fewer than the 8-byte header length at byte 0 (truncated or not a safetensors file)");
  unsigned char len_bytes[8];
  read_exact(fd.get(), len_bytes, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TG_CHECK(n <= kMaxHeaderBytes, "safetensors: '", path, "': header length ", n,
           " at byte 0 exceeds the format's limit of ", kMaxHeaderBytes, " bytes (corrupt file?)");
  TG_CHECK(n <= h.file_size - 8, "safetensors: '", path, "': header length ", n, " at byte 0 runs past the end of the ",
           h.file_size, "-byte file (truncated?)");
  std::string text(n, '\0');
  read_exact(fd.get(), text.data(), n, 8, path, "the header");
  h.data_start = 8 + n;
  TG_CHECK(n > 0 && text[0] == '{', "safetensors: '", path, "': the header at byte 8 must start with '{'");

  json::Value root;
  try {
    root = json::parse(text, 8);
  } catch (const Error& e) {
    TG_FAIL("safetensors: '", path, "': corrupt header: ", e.what());
  }
  for (const auto& [key, v] : root.members) {
    if (key == "__metadata__") {
      TG_CHECK(v.is_object(), "safetensors: '", path, "': __metadata__ at byte ", 8 + v.offset,
               " must be an object of strings");
      for (const auto& [mk, mv] : v.members) {
        TG_CHECK(mv.is_string(), "safetensors: '", path, "': metadata \"", mk, "\" at byte ", 8 + mv.offset,
                 " must be a string, found ", json::kind_name(mv.kind));
        h.metadata.emplace_back(mk, mv.text);
      }
      continue;
    }
    try {
      h.tensors.push_back(parse_entry(key, v, 8));
    } catch (const Error& e) {
      TG_FAIL("'", path, "': ", e.what());
    }
  }

  // The byte ranges must tile the data section: sorted by begin, each starts where the
  // previous ended, the last ends at the end of the file. This catches truncation,
  // trailing garbage and overlapping tensors alike.
  const uint64_t data_size = h.file_size - h.data_start;
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : h.tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const TensorInfo* t : order) {
    TG_CHECK(t->end <= data_size, "safetensors: '", path, "': tensor '", t->name, "' data_offsets [", t->begin, ", ",
             t->end, "] run past the end of the data section (", data_size, " bytes from byte ", h.data_start,
             "; the file is truncated)");
    TG_CHECK(t->begin >= expected, "safetensors: '", path, "': tensor '", t->name, "' data_offsets [", t->begin,
             ", ", t->end, "] overlap the previous tensor, which ends at data byte ", expected);
    TG_CHECK(t->begin == expected, "safetensors: '", path, "': tensor '", t->name, "' data_offsets [", t->begin,
             ", ", t->end, "] leave a gap after file byte ", h.data_start + expected,
             " (each tensor must start where the previous one ends)");
    expected = t->end;
  }
  TG_CHECK(expected == data_size, "safetensors: '", path, "': the tensors end at data byte ", expected, " but the file holds ",
           data_size - expected, " more bytes after it (file byte ", h.data_start + expected, ")");
  return h;
}

NamedTensors read_tensors(const std::string& path, const Header& header, const std::vector<std::string>& names) {
  // Check every tensor before reading any, so that a bad one costs no I/O.
  std::vector<const TensorInfo*> infos;
  for (const std::string& name : names) {
    const TensorInfo* info = header.find(name);
    TG_CHECK(info != nullptr, "safetensors: '", path, "' has no tensor '", name, "'");
    dtype_from_code(info->dtype, name);
    TG_CHECK(info->shape.size() <= static_cast<size_t>(kMaxDims), "safetensors: tensor '", name, "' of '", path,
             "' has ", info->shape.size(), " dims; tapegrad tensors have at most ", kMaxDims);
    infos.push_back(info);
  }
  Fd fd = open_for_reading(path);
  NamedTensors out;
  for (const TensorInfo* info : infos) {
    Tensor t = Tensor::empty(Shape(info->shape), {.dtype = dtype_from_code(info->dtype, info->name)});
    // The header may have been built by the caller rather than by read_header: the byte
    // range read must be the buffer's size, or the read would run past it.
    TG_CHECK(info->begin <= info->end && t.nbytes() == info->end - info->begin, "safetensors: tensor '",
             info->name, "' ", describe(t), " needs ", t.nbytes(), " bytes but its data_offsets [", info->begin,
             ", ", info->end, "] do not hold that many");
    read_exact(fd.get(), t.raw_data(), info->end - info->begin, header.data_start + info->begin, path,
               "tensor '" + info->name + "'");
    out.emplace_back(info->name, std::move(t));
  }
  return out;
}

NamedTensors load_file(const std::string& path, Metadata* metadata) {
  Header h = read_header(path);
  std::vector<std::string> names;
  for (const TensorInfo& t : h.tensors) names.push_back(t.name);
  NamedTensors out = read_tensors(path, h, names);
  if (metadata) *metadata = h.metadata;
  return out;
}

namespace {

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
          TG_FAIL("safetensors: writing '", path_, "' failed after ", written_, " bytes (simulated failure)");
        chunk = std::min(chunk, left);
      }
      ssize_t put = ::write(fd_, p, chunk);
      if (put < 0 && errno == EINTR) continue;
      TG_CHECK(put > 0, "safetensors: writing '", path_, "' failed after ", written_, " bytes: ", errno_text());
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

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// Makes the rename itself durable; best effort (some filesystems refuse to fsync a directory).
void sync_directory_of(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void save_file(const NamedTensors& tensors, const std::string& path, const Metadata& metadata) {
  const int64_t fail_after = g_fail_after.exchange(-1);
  // Everything is checked and the header built before the file system is touched.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    TG_CHECK(!name.empty(), "safetensors::save_file: tensor ", i, " has an empty name");
    TG_CHECK(name != "__metadata__", "safetensors::save_file: '__metadata__' is reserved and cannot name a tensor");
    TG_CHECK(t.defined(), "safetensors::save_file: tensor '", name, "' is undefined");
    for (size_t j = 0; j < i; ++j)
      TG_CHECK(tensors[j].first != name, "safetensors::save_file: two tensors are named '", name, "'");
  }
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      for (size_t j = 0; j < i; ++j)
        TG_CHECK(metadata[j].first != metadata[i].first, "safetensors::save_file: metadata key '",
                 metadata[i].first, "' given twice");
      if (i) header += ',';
      header += json::quote(metadata[i].first);
      header += ':';
      header += json::quote(metadata[i].second);
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (i || !metadata.empty()) header += ",";
    header += json::quote(name) + ":{\"dtype\":\"" + dtype_code(t.dtype()) + "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) header += ',';
      header += std::to_string(t.size(d));
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  header += "}";
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const std::string tmp = temp_path_for(path);
  int raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  TG_CHECK(raw_fd >= 0, "safetensors: cannot create '", tmp, "' to save '", path, "': ", errno_text(),
           " (is the directory writable?)");
  Fd fd(raw_fd);
  try {
    TempWriter out(fd.get(), tmp, fail_after);
    out.write(len_bytes, 8);
    out.write(header.data(), header.size());
    for (const auto& [name, t] : tensors) {
      // GPU tensors come to the host one at a time; detach so no tape records the copy.
      Tensor host = t.device().is_cpu() ? t : t.detach().to(Device::cpu());
      out.write(host.raw_data(), host.nbytes());
    }
    TG_CHECK(::fsync(fd.get()) == 0, "safetensors: fsync of '", tmp, "' failed: ", errno_text());
    TG_CHECK(fd.close() == 0, "safetensors: closing '", tmp, "' failed: ", errno_text());
    TG_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "safetensors: renaming '", tmp, "' to '", path,
             "' failed: ", errno_text());
  } catch (...) {
    fd.close();
    ::unlink(tmp.c_str());
    throw;
  }
  sync_directory_of(path);
}

namespace testing {
void fail_next_write_after(int64_t bytes) { g_fail_after.store(bytes); }
}  // namespace testing

}  // namespace tg::safetensors
