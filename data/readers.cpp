#include "data/readers.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <limits>

namespace tg::data {
namespace {

// A file read by offset: every read is checked against the file's size first, so a
// truncated file is reported with the offset and the size it should have had, not as a
// short read somewhere later.
class File {
 public:
  File(const char* reader, const std::string& path) : reader_(reader), path_(path) {
    in_.open(path, std::ios::binary);
    if (!in_) TG_FAIL_AS(IOError, reader_, ": cannot open '", path_, "': ", std::strerror(errno));
    in_.seekg(0, std::ios::end);
    const std::streamoff end = in_.tellg();
    if (!in_ || end < 0) TG_FAIL_AS(IOError, reader_, ": cannot determine the size of '", path_, "'");
    size_ = static_cast<uint64_t>(end);
  }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Throws IOError unless [offset, offset + n) lies inside the file; `what` names the part
  // for the message.
  void require(uint64_t offset, uint64_t n, const std::string& what) const {
    if (offset > size_ || n > size_ - offset) truncated(offset, detail::concat(n, " bytes"), what);
  }

  // The byte count of `count` elements of `elem_size` bytes at `offset`, checked against
  // the rest of the file. A header can claim any count: the check divides rather than
  // multiplies so that the product cannot wrap, and it runs before anything is allocated.
  uint64_t require_elements(uint64_t offset, int64_t count, int elem_size, const std::string& what) const {
    const uint64_t n = static_cast<uint64_t>(count), size = static_cast<uint64_t>(elem_size);
    if (offset > size_ || n > (size_ - offset) / size) {
      uint64_t bytes = 0;
      const bool wraps = __builtin_mul_overflow(n, size, &bytes);
      truncated(offset, wraps ? detail::concat(n, " x ", size, " bytes") : detail::concat(bytes, " bytes"), what);
    }
    return n * size;
  }

  // Reads [offset, offset + n) into a new buffer (std::vector<uint8_t> or std::string),
  // allocated only once the file is known to hold that many bytes.
  template <class Buffer>
  Buffer read_new(uint64_t offset, uint64_t n, const std::string& what) {
    require(offset, n, what);
    Buffer buf(static_cast<std::size_t>(n), '\0');
    read(offset, buf.data(), n, what);
    return buf;
  }

  // Reads [offset, offset + n) into dst; `what` names the part for the message.
  void read(uint64_t offset, void* dst, uint64_t n, const std::string& what) {
    require(offset, n, what);
    if (n == 0) return;
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_) TG_FAIL_AS(IOError, reader_, ": '", path_, "': reading ", what, " at byte offset ", offset, " failed");
  }

  // A malformed file: a plain Error, at `offset`.
  template <class... Args>
  [[noreturn]] void malformed(uint64_t offset, const Args&... args) const {
    TG_FAIL(reader_, ": '", path_, "' at byte offset ", offset, ": ", args...);
  }
  template <class... Args>
  [[noreturn]] void unsupported(uint64_t offset, const Args&... args) const {
    TG_FAIL_AS(UnsupportedError, reader_, ": '", path_, "' at byte offset ", offset, ": ", args...);
  }

 private:
  [[noreturn]] void truncated(uint64_t offset, const std::string& needed, const std::string& what) const {
    TG_FAIL_AS(IOError, reader_, ": '", path_, "' is truncated: ", what, " needs ", needed, " at byte offset ", offset,
               ", but the file ends at byte ", size_);
  }

  const char* reader_;
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// ---- element conversion -------------------------------------------------------------------

enum class Kind { sint, uint, flt, boolean };
struct ElemType {
  Kind kind;
  int size;  // bytes
  bool big_endian;
};

std::string hex(unsigned v, int digits) {
  static const char* xd = "0123456789abcdef";
  std::string s = "0x";
  for (int d = digits - 1; d >= 0; --d) s += xd[(v >> (4 * d)) & 0xF];
  return s;
}

uint64_t load_bits(const uint8_t* p, int size, bool big_endian) {
  uint64_t v = 0;
  for (int b = 0; b < size; ++b) {
    const uint64_t byte = p[big_endian ? b : size - 1 - b];
    v = (v << 8) | byte;
  }
  return v;
}

// Converts n elements of type t at src into a new tensor of `shape` and `dtype`. `base`
// is the data's offset in the file, for the message about a u8 value past int64's range.
Tensor convert(const File& f, uint64_t base, const uint8_t* src, ElemType t, const Shape& shape, DType dtype) {
  if (t.kind == Kind::flt && dtype == DType::i64)
    TG_FAIL_AS(DTypeError, "reading '", f.path(), "': floating-point data cannot be read as i64");
  TG_CHECK_AS(DTypeError, !is_half(dtype), "reading '", f.path(), "' as ", dtype_name(dtype), ": ", dtype_name(dtype),
              " tensors are storage-only for now; read as f32 and convert with .to()");
  Tensor out = Tensor::empty(shape, {.dtype = dtype});
  const int64_t n = out.numel();
  const bool native_copy = !t.big_endian && ((t.kind == Kind::flt && t.size == 4 && dtype == DType::f32) ||
                                             (t.kind == Kind::flt && t.size == 8 && dtype == DType::f64) ||
                                             (t.kind == Kind::sint && t.size == 8 && dtype == DType::i64));
  if (native_copy) {
    if (n) std::memcpy(out.raw_data(), src, out.nbytes());
    return out;
  }
  auto value_at = [&](int64_t i, auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    const uint64_t bits = load_bits(src + i * t.size, t.size, t.big_endian);
    switch (t.kind) {
      case Kind::flt:
        return t.size == 4 ? static_cast<Out>(std::bit_cast<float>(static_cast<uint32_t>(bits)))
                           : static_cast<Out>(std::bit_cast<double>(bits));
      case Kind::sint: {
        const int shift = 64 - 8 * t.size;  // sign-extend from the element's width
        return static_cast<Out>(static_cast<int64_t>(bits << shift) >> shift);
      }
      case Kind::uint:
        if (std::is_same_v<Out, int64_t> && bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          f.malformed(base + static_cast<uint64_t>(i * t.size), "value ", bits, " does not fit in i64");
        return static_cast<Out>(bits);
      case Kind::boolean:
        return static_cast<Out>(bits != 0);
    }
    return Out{};
  };
  switch (dtype) {
    case DType::f32: {
      float* p = out.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = value_at(i, static_cast<float*>(nullptr));
      break;
    }
    case DType::f64: {
      double* p = out.data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value_at(i, static_cast<double*>(nullptr));
      break;
    }
    case DType::i64: {
      int64_t* p = out.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = value_at(i, static_cast<int64_t*>(nullptr));
      break;
    }
    case DType::bf16:
    case DType::f16:
      break;  // refused above, before the allocation
  }
  return out;
}

// ---- IDX ----------------------------------------------------------------------------------

struct Idx {
  uint8_t type = 0;
  ElemType elem{Kind::uint, 1, true};
  std::vector<int64_t> dims;
  uint64_t data_offset = 0;
  std::vector<uint8_t> data;
};

Idx load_idx(File& f) {
  Idx r;
  uint8_t magic[4];
  f.read(0, magic, 4, "the IDX magic number");
  if (magic[0] != 0 || magic[1] != 0)
    f.malformed(0, "not an IDX file: the magic number must start with two zero bytes, got ",
                hex(unsigned(magic[0]) << 8 | magic[1], 4));
  r.type = magic[2];
  switch (r.type) {
    case 0x08: r.elem = {Kind::uint, 1, true}; break;
    case 0x09: r.elem = {Kind::sint, 1, true}; break;
    case 0x0B: r.elem = {Kind::sint, 2, true}; break;
    case 0x0C: r.elem = {Kind::sint, 4, true}; break;
    case 0x0D: r.elem = {Kind::flt, 4, true}; break;
    case 0x0E: r.elem = {Kind::flt, 8, true}; break;
    default:
      f.malformed(2, "unknown IDX element type ", hex(r.type, 2),
                  " (0x08 ubyte, 0x09 sbyte, 0x0B short, 0x0C int, 0x0D float, 0x0E double)");
  }
  const int ndims = magic[3];
  if (ndims < 1) f.malformed(3, "an IDX file needs at least one dimension");
  if (ndims > kMaxDims) f.unsupported(3, ndims, " dimensions; tensors have at most ", kMaxDims);
  std::vector<uint8_t> sizes(static_cast<std::size_t>(4 * ndims));
  f.read(4, sizes.data(), sizes.size(), "the dimension sizes");
  for (int d = 0; d < ndims; ++d) r.dims.push_back(static_cast<int64_t>(load_bits(&sizes[4 * d], 4, true)));
  r.data_offset = 4 + sizes.size();
  const int64_t numel = checked_numel(r.dims, detail::concat("read_idx: '", f.path(), "'").c_str());
  const std::string what = detail::concat("the data (", detail::dims_str(r.dims), " elements of ", r.elem.size, " bytes)");
  const uint64_t bytes = f.require_elements(r.data_offset, numel, r.elem.size, what);
  r.data = f.read_new<std::vector<uint8_t>>(r.data_offset, bytes, what);
  const uint64_t end = r.data_offset + bytes;
  if (f.size() != end)
    f.malformed(end, f.size() - end, " bytes past the end of the data the header describes (", detail::dims_str(r.dims),
                ")");
  return r;
}

// ---- NPY ----------------------------------------------------------------------------------

// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// Values are strings, True/False and tuples of integers: that is all this parser reads.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  bool has_descr = false, has_fortran = false, has_shape = false;
};

class HeaderParser {
 public:
  HeaderParser(const File& f, const std::string& text, uint64_t base) : f_(f), s_(text), base_(base) {}

  NpyHeader parse() {
    NpyHeader h;
    expect('{');
    for (;;) {
      if (peek() == '}') break;
      const uint64_t key_at = offset();
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          f_.unsupported(offset(), "only simple dtypes are read ('<f4' and the like), not structured ones");
        h.descr = string_literal();
        h.has_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        h.has_fortran = true;
      } else if (key == "shape") {
        h.shape = int_tuple();
        h.has_shape = true;
      } else {
        f_.malformed(key_at, "unexpected header key '", key, "' (a .npy header has descr, fortran_order, shape)");
      }
      if (peek() == ',') ++pos_;
    }
    ++pos_;
    if (!h.has_descr || !h.has_fortran || !h.has_shape)
      f_.malformed(base_, "the header lacks ", !h.has_descr ? "'descr'" : !h.has_fortran ? "'fortran_order'" : "'shape'");
    return h;
  }

 private:
  uint64_t offset() const { return base_ + pos_; }
  char peek() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
    if (pos_ >= s_.size()) f_.malformed(offset(), "the header ends inside its dict");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) f_.malformed(offset(), "expected '", c, "' in the header, found '", s_[pos_], "'");
    ++pos_;
  }
  std::string string_literal() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') f_.malformed(offset(), "expected a quoted string in the header");
    const std::size_t close = s_.find(quote, pos_ + 1);
    if (close == std::string::npos) f_.malformed(offset(), "unterminated string in the header");
    std::string v = s_.substr(pos_ + 1, close - pos_ - 1);
    pos_ = close + 1;
    return v;
  }
  bool boolean() {
    peek();
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    f_.malformed(offset(), "expected True or False in the header");
  }
  std::vector<int64_t> int_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    while (peek() != ')') {
      const uint64_t at = offset();
      int64_t v = 0;
      std::size_t digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        v = checked_add(checked_mul(v, 10, "read_npy: shape"), s_[pos_] - '0', "read_npy: shape");
        ++pos_;
        ++digits;
      }
      if (digits == 0) f_.malformed(at, "expected a non-negative integer in the shape");
      if (peek() == 'L') ++pos_;  // Python 2 longs
      dims.push_back(v);
      if (peek() == ',') ++pos_;
    }
    ++pos_;
    return dims;
  }

  const File& f_;
  const std::string& s_;
  uint64_t base_;
  std::size_t pos_ = 0;
};

}  // namespace

Tensor read_idx(const std::string& path, DType dtype) {
  File f("read_idx", path);
  const Idx idx = load_idx(f);
  return convert(f, idx.data_offset, idx.data.data(), idx.elem, Shape(idx.dims), dtype);
}

Tensor read_npy(const std::string& path, std::optional<DType> as) {
  File f("read_npy", path);
  uint8_t pre[8];
  f.read(0, pre, 8, "the .npy magic and version");
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) f.malformed(0, "not a .npy file: the magic string \\x93NUMPY is missing");
  const int major = pre[6];
  if (major < 1 || major > 3) f.unsupported(6, ".npy format version ", major, ".", int{pre[7]}, " (1.0 to 3.0 are read)");
  uint64_t header_len = 0, header_at = 0;
  if (major == 1) {
    uint8_t len[2];
    f.read(8, len, 2, "the header length");
    header_len = load_bits(len, 2, false);
    header_at = 10;
  } else {
    uint8_t len[4];
    f.read(8, len, 4, "the header length");
    header_len = load_bits(len, 4, false);
    header_at = 12;
  }
  const std::string text = f.read_new<std::string>(header_at, header_len, "the header");
  const NpyHeader h = HeaderParser(f, text, header_at).parse();
  if (h.fortran_order)
    f.unsupported(header_at, "fortran_order is True (a column-major array); save it in C order, e.g. "
                             "np.save(path, np.ascontiguousarray(a))");
  if (static_cast<int>(h.shape.size()) > kMaxDims)
    f.unsupported(header_at, "shape ", detail::dims_str(h.shape), " has more than ", kMaxDims, " dimensions");

  // descr: byte order ('<' little, '>' big, '|' not applicable, '=' native), kind, size.
  const std::string& d = h.descr;
  const bool shape_ok = d.size() == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=');
  ElemType elem{Kind::flt, 0, false};
  DType natural = DType::f32;
  if (shape_ok) {
    elem.size = d[2] - '0';
    elem.big_endian = d[0] == '>' || (d[0] == '=' && std::endian::native == std::endian::big);
    if (d[1] == 'f' && (elem.size == 4 || elem.size == 8)) {
      elem.kind = Kind::flt;
      natural = elem.size == 4 ? DType::f32 : DType::f64;
    } else if ((d[1] == 'i' || d[1] == 'u') && (elem.size == 1 || elem.size == 2 || elem.size == 4 || elem.size == 8)) {
      elem.kind = d[1] == 'i' ? Kind::sint : Kind::uint;
      natural = DType::i64;
    } else if (d[1] == 'b' && elem.size == 1) {
      elem.kind = Kind::boolean;
      natural = DType::i64;
    } else {
      elem.size = 0;
    }
  }
  if (elem.size == 0)
    f.unsupported(header_at, "dtype '", d, "' (read: f4, f8, i1-i8, u1-u8, b1, little or big endian)");

  const uint64_t data_at = header_at + header_len;
  const int64_t numel = checked_numel(h.shape, detail::concat("read_npy: '", path, "'").c_str());
  const std::string what = detail::concat("the data (", detail::dims_str(h.shape), " of '", d, "')");
  const uint64_t bytes = f.require_elements(data_at, numel, elem.size, what);
  const std::vector<uint8_t> data = f.read_new<std::vector<uint8_t>>(data_at, bytes, what);
  const uint64_t end = data_at + bytes;
  if (f.size() != end)
    f.malformed(end, f.size() - end, " bytes past the end of the data the header describes (", detail::dims_str(h.shape),
                " of '", d, "')");
  return convert(f, data_at, data.data(), elem, Shape(h.shape), as.value_or(natural));
}

// ---- datasets -----------------------------------------------------------------------------

MnistDataset::MnistDataset(const std::string& images_path, const std::string& labels_path) {
  File fi("MnistDataset", images_path), fl("MnistDataset", labels_path);
  Idx images = load_idx(fi);
  Idx labels = load_idx(fl);
  const auto magic = [](const Idx& idx) { return hex(unsigned(idx.type) << 8 | unsigned(idx.dims.size()), 8); };
  if (images.type != 0x08 || images.dims.size() != 3)
    fi.malformed(0, "expected the image magic 0x00000803 (ubyte, 3 dims), got ", magic(images));
  if (labels.type != 0x08 || labels.dims.size() != 1)
    fl.malformed(0, "expected the label magic 0x00000801 (ubyte, 1 dim), got ", magic(labels));
  if (images.dims[0] != labels.dims[0])
    fl.malformed(4, "holds ", labels.dims[0], " labels, but '", images_path, "' holds ", images.dims[0], " images");
  count_ = images.dims[0];
  rows_ = images.dims[1];
  cols_ = images.dims[2];
  images_ = std::move(images.data);
  labels_ = std::move(labels.data);
}

Example MnistDataset::get(int64_t i) const {
  TG_CHECK_AS(ShapeError, i >= 0 && i < count_, "MnistDataset::get: index ", i, " out of range [0, ", count_, ")");
  Tensor x = Tensor::empty({1, rows_, cols_});
  float* p = x.data<float>();
  const uint8_t* src = images_.data() + i * rows_ * cols_;
  for (int64_t k = 0; k < rows_ * cols_; ++k) p[k] = static_cast<float>(src[k]) / 255.0f;
  return {x, from_vector(std::vector<int64_t>{labels_[static_cast<std::size_t>(i)]}, Shape{})};
}

Cifar10Dataset::Cifar10Dataset(const std::vector<std::string>& paths) {
  constexpr int64_t pixels = kRecordBytes - 1;
  for (const std::string& path : paths) {
    File f("Cifar10Dataset", path);
    const uint64_t records = f.size() / kRecordBytes;
    const uint64_t whole = records * kRecordBytes;
    if (whole != f.size())
      TG_FAIL_AS(IOError, "Cifar10Dataset: '", path, "' is truncated: record ", records, " starts at byte offset ", whole,
                 " and needs ", kRecordBytes, " bytes (1 label + 3072 image), but the file ends at byte ", f.size());
    if (records == 0) f.malformed(0, "the file holds no records");
    const std::vector<uint8_t> bytes = f.read_new<std::vector<uint8_t>>(0, f.size(), "the records");
    const std::size_t base = images_.size();
    images_.resize(base + records * pixels);
    for (uint64_t r = 0; r < records; ++r) {
      const uint8_t* rec = bytes.data() + r * kRecordBytes;
      if (rec[0] > 9)
        f.malformed(r * kRecordBytes, "record ", r, " has label ", int{rec[0]}, "; CIFAR-10 labels are 0-9");
      labels_.push_back(rec[0]);
      std::memcpy(images_.data() + base + r * pixels, rec + 1, pixels);
    }
  }
  TG_CHECK(!labels_.empty(), "Cifar10Dataset: no files given");
}

Example Cifar10Dataset::get(int64_t i) const {
  TG_CHECK_AS(ShapeError, i >= 0 && i < size(), "Cifar10Dataset::get: index ", i, " out of range [0, ", size(), ")");
  constexpr int64_t pixels = kRecordBytes - 1;
  Tensor x = Tensor::empty({3, 32, 32});
  float* p = x.data<float>();
  const uint8_t* src = images_.data() + i * pixels;
  for (int64_t k = 0; k < pixels; ++k) p[k] = static_cast<float>(src[k]) / 255.0f;
  return {x, from_vector(std::vector<int64_t>{labels_[static_cast<std::size_t>(i)]}, Shape{})};
}

}  // namespace tg::data
