// Reading safetensors files: the streaming header parser and its validation (read_header), the
// tensors (read_tensors, load_file) and the dtype codes. The format and the checks are described
// in core/safetensors.h; writing is in core/safetensors_write.cpp.
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "core/json.h"
#include "core/safetensors_fd.h"

namespace tg::safetensors {

// The format is little-endian; tensors are written straight from memory.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Dims of one header entry: far more than any tensor has (tapegrad holds kMaxDims), few
// enough that a hostile "shape": [0, 0, 0, ...] cannot make the parser allocate gigabytes.
constexpr size_t kMaxHeaderDims = 64;

using detail::errno_text;
using detail::Fd;

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Only regular files: opening a FIFO for reading blocks until a writer comes (forever), a
// device may have side effects. stat() refuses them without opening; the open itself is
// non-blocking and fstat() checks the file actually opened, in case the path was replaced
// in between.
Fd open_for_reading(const std::string& path) {
  struct stat st {};
  TG_CHECK_AS(IOError, ::stat(path.c_str(), &st) == 0, "safetensors: cannot open '", path, "' for reading: ", errno_text());
  TG_CHECK_AS(IOError, S_ISREG(st.st_mode), "safetensors: cannot read '", path, "': it is ", file_kind(st.st_mode),
              ", not a regular file");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  TG_CHECK_AS(IOError, fd.get() >= 0, "safetensors: cannot open '", path, "' for reading: ", errno_text());
  TG_CHECK_AS(IOError, ::fstat(fd.get(), &st) == 0, "safetensors: cannot stat '", path, "': ", errno_text());
  TG_CHECK_AS(IOError, S_ISREG(st.st_mode), "safetensors: cannot read '", path, "': it is ", file_kind(st.st_mode),
              ", not a regular file");
  return fd;
}

// Reads exactly `n` bytes at `offset`; a short read means the file changed or is truncated.
void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TG_CHECK_AS(IOError, got >= 0, "safetensors: reading ", what, " of '", path, "' at byte ", offset, " failed: ", errno_text());
    TG_CHECK_AS(IOError, got > 0, "safetensors: '", path, "' ends at byte ", offset, " while reading ", what,
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

// The byte count of an entry's tensor, checked: the non-zero dims, times the element size,
// must fit in int64 whatever their order, so that [0, 2^62, 2^62] fails as [2^62, 2^62, 0]
// does rather than passing as an empty tensor with overflowing strides (core/checked.h).
void check_entry(const TensorInfo& info, uint64_t esize, uint64_t shape_at, uint64_t offsets_at) {
  const std::string& name = info.name;
  uint64_t extent_bytes = esize;
  bool zero = false, overflow = false;
  for (int64_t n : info.shape) {
    if (n == 0) zero = true;
    else overflow = overflow || __builtin_mul_overflow(extent_bytes, static_cast<uint64_t>(n), &extent_bytes);
  }
  const uint64_t kMaxBytes = static_cast<uint64_t>(INT64_MAX);
  TG_CHECK(!overflow && extent_bytes <= kMaxBytes, "tensor '", name, "' ", info.dtype, Shape(info.shape),
           " at byte ", shape_at, " is too large: its non-zero dims need ",
           overflow ? std::string("more than 2^64") : std::to_string(extent_bytes), " bytes, over INT64_MAX");
  TG_CHECK(info.begin <= info.end, "tensor '", name, "' has data_offsets [", info.begin, ", ", info.end,
           "] with begin > end at byte ", offsets_at);
  const uint64_t bytes = zero ? 0 : extent_bytes;
  TG_CHECK(bytes == info.end - info.begin, "tensor '", name, "' ", info.dtype, Shape(info.shape), " needs ", bytes,
           " bytes but its data_offsets [", info.begin, ", ", info.end, "] at byte ", offsets_at, " hold ",
           info.end - info.begin);
}

// Builds a Header from the parse's events, checking the format's schema as they come:
// {"__metadata__": {"key": "value", ...}, "name": {"dtype": ..., "shape": [...],
// "data_offsets": [begin, end]}, ...}, nothing else. Nothing but the entries is kept, so
// memory is proportional to what the header describes, not to a document tree. Errors
// are tg::Error "tensor 'x' ... at byte N" (N a file offset).
class HeaderBuilder : public json::Handler {
 public:
  explicit HeaderBuilder(Header& h) : h_(h) {}

  void begin_object(std::size_t at) override {
    switch (state_) {
      case State::start: state_ = State::root; return;
      case State::root:
        if (key_ == "__metadata__") {
          state_ = State::metadata;
          return;
        }
        entry_ = TensorInfo{};
        entry_.name = key_;
        entry_.header_offset = at;
        seen_dtype_ = seen_shape_ = seen_offsets_ = false;
        state_ = State::entry;
        return;
      default: wrong(json::Value::Kind::object, at);
    }
  }
  void begin_array(std::size_t at) override {
    if (state_ == State::entry && field_ == Field::shape) {
      state_ = State::shape;
      shape_at_ = at;
    } else if (state_ == State::entry && field_ == Field::offsets) {
      state_ = State::offsets;
      offsets_at_ = at;
      n_offsets_ = 0;
    } else {
      wrong(json::Value::Kind::array, at);
    }
  }
  void key(std::string&& name, std::size_t at) override {
    if (state_ == State::root || state_ == State::metadata) {
      key_ = std::move(name);
      return;
    }
    // state_ == entry: the only other place keys occur (deeper objects are refused).
    if (name == "dtype") field_ = Field::dtype, seen_dtype_ = true;
    else if (name == "shape") field_ = Field::shape, seen_shape_ = true;
    else if (name == "data_offsets") field_ = Field::offsets, seen_offsets_ = true;
    else TG_FAIL("tensor '", entry_.name, "' has an unknown field \"", json::printable(name), "\" at byte ", at);
  }
  void scalar(json::Value&& v) override {
    if (state_ == State::metadata && v.is_string()) {
      h_.metadata.emplace_back(std::move(key_), std::move(v.text));
    } else if (state_ == State::entry && field_ == Field::dtype && v.is_string()) {
      entry_.dtype = std::move(v.text);
      esize_ = element_size(entry_.dtype);
      TG_CHECK(esize_ > 0, "tensor '", entry_.name, "' has unknown dtype \"", json::printable(entry_.dtype),
               "\" at byte ", v.offset);
    } else if (state_ == State::shape) {
      TG_CHECK(entry_.shape.size() < kMaxHeaderDims, "tensor '", entry_.name, "' has more than ", kMaxHeaderDims,
               " dims at byte ", shape_at_);
      entry_.shape.push_back(size_of(v, "shape"));
    } else if (state_ == State::offsets) {
      TG_CHECK(n_offsets_ < 2, "tensor '", entry_.name, "': data_offsets at byte ", offsets_at_,
               " must be an array [begin, end]");
      const uint64_t o = offset_of(v);
      (n_offsets_++ == 0 ? entry_.begin : entry_.end) = o;
    } else {
      wrong(v.kind, v.offset);
    }
  }
  void end_array() override {
    if (state_ == State::offsets)
      TG_CHECK(n_offsets_ == 2, "tensor '", entry_.name, "': data_offsets at byte ", offsets_at_,
               " must be an array [begin, end]");
    state_ = State::entry;  // arrays are only accepted inside entries
  }
  void end_object() override {
    if (state_ == State::entry) {
      TG_CHECK(seen_dtype_ && seen_shape_ && seen_offsets_, "tensor '", entry_.name, "' at byte ",
               entry_.header_offset, " lacks ",
               !seen_dtype_ ? "\"dtype\"" : !seen_shape_ ? "\"shape\"" : "\"data_offsets\"");
      check_entry(entry_, esize_, shape_at_, offsets_at_);
      h_.tensors.push_back(std::move(entry_));
    }
    state_ = state_ == State::root ? State::done : State::root;
  }

 private:
  enum class State { start, root, metadata, entry, shape, offsets, done };
  enum class Field { dtype, shape, offsets };

  // A value of the wrong kind where it stands; says what was expected there.
  [[noreturn]] void wrong(json::Value::Kind kind, std::size_t at) const {
    const char* found = json::kind_name(kind);
    switch (state_) {
      case State::start: TG_FAIL("the header at byte ", at, " must be an object, found ", found);
      case State::root:
        if (key_ == "__metadata__")
          TG_FAIL("__metadata__ at byte ", at, " must be an object of strings, found ", found);
        TG_FAIL("the entry of tensor '", json::printable(key_), "' at byte ", at, " must be an object, found ", found);
      case State::metadata:
        TG_FAIL("metadata \"", json::printable(key_), "\" at byte ", at, " must be a string, found ", found);
      case State::entry:
        if (field_ == Field::dtype)
          TG_FAIL("tensor '", entry_.name, "': dtype at byte ", at, " must be a string, found ", found);
        if (field_ == Field::shape)
          TG_FAIL("tensor '", entry_.name, "': shape at byte ", at, " must be an array, found ", found);
        TG_FAIL("tensor '", entry_.name, "': data_offsets at byte ", at, " must be an array [begin, end], found ",
                found);
      default:
        TG_FAIL("tensor '", entry_.name, "': ", state_ == State::shape ? "shape" : "data_offsets", " at byte ", at,
                " must hold numbers, found ", found);
    }
  }

  // json::Value::as_size, without building its message for the common valid case.
  int64_t size_of(const json::Value& v, const char* field) const {
    if (v.is_number() && !v.text.empty() && v.text.size() <= 18 &&
        v.text.find_first_not_of("0123456789") == std::string::npos)
      return std::stoll(v.text);  // at most 18 digits: fits
    return v.as_size((std::string(field) + " of tensor '" + entry_.name + "'").c_str());
  }

  // A data offset: past int64's range it lies past the end of any file, and is reported
  // as that rather than as a number too long.
  uint64_t offset_of(const json::Value& v) const {
    constexpr std::string_view kMax = "9223372036854775807";
    const std::string& t = v.text;
    const bool integer = v.is_number() && !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
    if (integer && (t.size() > kMax.size() || (t.size() == kMax.size() && t > kMax)))
      TG_FAIL("tensor '", entry_.name, "': data_offsets value ", json::printable(t, 40), " at byte ", v.offset,
              " lies past the end of the data section (", h_.file_size - h_.data_start,
              " bytes; offsets are at most 2^63 - 1)");
    return static_cast<uint64_t>(size_of(v, "data_offsets"));
  }

  Header& h_;
  State state_ = State::start;
  Field field_ = Field::dtype;
  std::string key_;  // the last key of the root or of __metadata__
  TensorInfo entry_;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  uint64_t esize_ = 0, shape_at_ = 0, offsets_at_ = 0;
  int n_offsets_ = 0;
};

}  // namespace

const TensorInfo* Header::find(const std::string& name) const {
  if (by_name_.empty()) {
    for (const TensorInfo& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second >= tensors.size()) return nullptr;
  return &tensors[it->second];
}

void Header::reindex() {
  by_name_.clear();
  by_name_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) by_name_.emplace(tensors[i].name, i);
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
    case DType::i64: return "I64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  TG_FAIL("safetensors: no code for dtype ", static_cast<int>(t));
}

DType dtype_from_code(const std::string& code, const std::string& tensor_name) {
  if (code == "F32") return DType::f32;
  if (code == "F64") return DType::f64;
  if (code == "I64") return DType::i64;
  if (code == "BF16") return DType::bf16;
  if (code == "F16") return DType::f16;
  TG_FAIL("safetensors: tensor '", tensor_name, "' has dtype ", code,
          ", which tapegrad cannot hold (it has F32, F64, I64, BF16 and F16)");
}

Header read_header(const std::string& path) {
  Fd fd = open_for_reading(path);
  struct stat st {};
  TG_CHECK_AS(IOError, ::fstat(fd.get(), &st) == 0, "safetensors: cannot stat '", path, "': ", errno_text());
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

  // Errors of the JSON itself are "corrupt header"; those of the schema name the tensor.
  HeaderBuilder builder(h);
  try {
    json::parse(text, builder, 8);
  } catch (const Error& e) {
    const bool json_error = std::string_view(e.what()).starts_with("json:");
    TG_FAIL("safetensors: '", path, "': ", json_error ? "corrupt header: " : "", e.what());
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
  h.reindex();
  return h;
}

NamedTensors read_tensors(const std::string& path, const Header& header, const std::vector<std::string>& names,
                          bool widen_half) {
  // Check every tensor before reading any, so that a bad one costs no I/O.
  std::vector<const TensorInfo*> infos;
  for (const std::string& name : names) {
    const TensorInfo* info = header.find(name);
    TG_CHECK(info != nullptr, "safetensors: '", path, "' has no tensor '", name, "'");
    if (!(widen_half && is_half_code(info->dtype))) dtype_from_code(info->dtype, name);
    TG_CHECK(info->shape.size() <= static_cast<size_t>(kMaxDims), "safetensors: tensor '", name, "' of '", path,
             "' has ", info->shape.size(), " dims; tapegrad tensors have at most ", kMaxDims);
    infos.push_back(info);
  }
  Fd fd = open_for_reading(path);
  NamedTensors out;
  for (const TensorInfo* info : infos) {
    // F16 / BF16: read, then widened to f32 when asked; otherwise read as bf16 / f16 tensors.
    const bool half = widen_half && is_half_code(info->dtype);
    Tensor t = Tensor::empty(Shape(info->shape), {.dtype = half ? DType::f32 : dtype_from_code(info->dtype, info->name)});
    const uint64_t bytes = half ? static_cast<uint64_t>(t.numel()) * 2 : t.nbytes();
    // The header may have been built by the caller rather than by read_header: the byte
    // range read must be the buffer's size, or the read would run past it.
    TG_CHECK(info->begin <= info->end && bytes == info->end - info->begin, "safetensors: tensor '", info->name,
             "' ", info->dtype, Shape(info->shape), " needs ", bytes, " bytes but its data_offsets [", info->begin,
             ", ", info->end, "] do not hold that many");
    const std::string what = "tensor '" + info->name + "'";
    if (!half) {
      read_exact(fd.get(), t.raw_data(), bytes, header.data_start + info->begin, path, what);
    } else {
      std::vector<unsigned char> raw(bytes);
      read_exact(fd.get(), raw.data(), bytes, header.data_start + info->begin, path, what);
      decode_half(info->dtype, raw.data(), static_cast<float*>(t.raw_data()), static_cast<size_t>(t.numel()));
    }
    out.emplace_back(info->name, std::move(t));
  }
  return out;
}

NamedTensors load_file(const std::string& path, Metadata* metadata, bool widen_half) {
  Header h = read_header(path);
  std::vector<std::string> names;
  for (const TensorInfo& t : h.tensors) names.push_back(t.name);
  NamedTensors out = read_tensors(path, h, names, widen_half);
  if (metadata) *metadata = h.metadata;
  return out;
}


}  // namespace tg::safetensors
