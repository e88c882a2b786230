// data/ readers: the IDX, CIFAR-10 and .npy readers on small files written here byte by byte
// (so a reader bug cannot be mirrored by a writer bug), and their errors on truncated and
// corrupted files (type, file name, byte offset). The DataLoader: test_data_loader.cpp.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/expect_message.h"
#include "data/dataset.h"
#include "data/readers.h"

namespace fs = std::filesystem;
using tg::Tensor;
using namespace tg::data;
using tg::test::contains;
using tg::test::message_of;

namespace {

using Bytes = std::vector<uint8_t>;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("tg_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const Bytes& bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

 private:
  fs::path path_;
};

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}
template <class T>
void put_le(Bytes& b, T v) {  // the test machines are little endian, as .npy's '<'
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b.insert(b.end(), raw, raw + sizeof(T));
}

// An IDX file: magic 0 0 type ndims, big-endian sizes, then `data` as given.
Bytes idx_file(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes b{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// A .npy file with this header dict, padded as numpy pads it, then `data`.
Bytes npy_file(const std::string& dict, const Bytes& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes b{0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  if (major == 1)
    put_le<uint16_t>(b, static_cast<uint16_t>(header.size()));
  else
    put_le<uint32_t>(b, static_cast<uint32_t>(header.size()));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}


// ---- IDX / MNIST ------------------------------------------------------------------------

TEST(data_idx, MnistImagesAndLabels) {
  TempDir dir;
  Bytes pixels(3 * 2 * 3);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 15);
  const auto images = dir.write("images", idx_file(0x08, {3, 2, 3}, pixels));
  const auto labels = dir.write("labels", idx_file(0x08, {3}, {7, 0, 9}));
  MnistDataset mnist(images, labels);
  ASSERT_EQ(mnist.size(), 3);
  EXPECT_EQ(mnist.rows(), 2);
  EXPECT_EQ(mnist.cols(), 3);
  Example e = mnist.get(2);
  EXPECT_EQ(e.input.shape(), (tg::Shape{1, 2, 3}));
  EXPECT_EQ(e.target.dtype(), tg::DType::i64);
  EXPECT_EQ(e.target.dim(), 0);
  EXPECT_EQ(e.target.item(), 9);
  const auto v = e.input.to_vector<float>();
  for (int k = 0; k < 6; ++k) EXPECT_FLOAT_EQ(v[static_cast<std::size_t>(k)], float((12 + k) * 15) / 255.0f);

  Tensor l = tg::data::read_idx(labels, tg::DType::i64);
  EXPECT_EQ(l.to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));
  Tensor im = tg::data::read_idx(images);
  EXPECT_EQ(im.shape(), (tg::Shape{3, 2, 3}));
  EXPECT_EQ(im.to_vector<float>()[5], 75.0f);  // raw values: read_idx does not scale
}

TEST(data_idx, SignedIntAndFloatTypesAreBigEndian) {
  TempDir dir;
  Bytes ints;
  for (int32_t v : {1, -2, 70000, -70000}) put_be32(ints, static_cast<uint32_t>(v));
  Tensor t = read_idx(dir.write("ints", idx_file(0x0C, {2, 2}, ints)), tg::DType::i64);
  EXPECT_EQ(t.shape(), (tg::Shape{2, 2}));
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 70000, -70000}));

  Bytes floats;
  for (float f : {1.5f, -0.25f}) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put_be32(floats, bits);
  }
  Tensor g = read_idx(dir.write("floats", idx_file(0x0D, {2}, floats)));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1.5f, -0.25f}));
  // Floats are not silently truncated into integers.
  message_of<tg::DTypeError>([&] { read_idx(dir.write("floats2", idx_file(0x0D, {2}, floats)), tg::DType::i64); });
}

TEST(data_idx, TruncatedDataNamesFileAndOffset) {
  TempDir dir;
  const auto path = dir.write("short-images", idx_file(0x08, {2, 28, 28}, Bytes(1000)));
  const std::string msg = message_of<tg::IOError>([&] { read_idx(path); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "truncated")) << msg;
  EXPECT_TRUE(contains(msg, "needs 1568 bytes at byte offset 16")) << msg;
  EXPECT_TRUE(contains(msg, "ends at byte 1016")) << msg;
}

TEST(data_idx, TruncatedHeader) {
  TempDir dir;
  Bytes b = idx_file(0x08, {5, 4, 4}, {});
  b.resize(9);  // cut inside the second size
  const auto path = dir.write("cut", b);
  const std::string msg = message_of<tg::IOError>([&] { read_idx(path); });
  EXPECT_TRUE(contains(msg, path) && contains(msg, "at byte offset 4") && contains(msg, "ends at byte 9")) << msg;
  const std::string empty = message_of<tg::IOError>([&] { read_idx(dir.write("empty", {})); });
  EXPECT_TRUE(contains(empty, "at byte offset 0")) << empty;
}

// The peak resident memory grown while fn runs, in MiB (ru_maxrss is in KiB on Linux).
// The claims below are >= 1 GiB, so reading one into memory first shows up plainly.
template <class Fn>
long peak_growth_mib(Fn fn) {
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  fn();
  getrusage(RUSAGE_SELF, &after);
  return (after.ru_maxrss - before.ru_maxrss) / 1024;
}

// A small file whose header claims gigabytes is an IOError naming the sizes, raised before
// the claimed size is allocated: no std::bad_alloc, no gigabytes resident.
TEST(data_idx, HugeClaimedSizeFailsBeforeAllocating) {
  TempDir dir;
  const auto gib = dir.write("gib", idx_file(0x08, {32768, 32768}, {}));  // 1 GiB of ubyte
  std::string msg;
  const long grown = peak_growth_mib([&] { msg = message_of<tg::IOError>([&] { read_idx(gib); }); });
  EXPECT_LT(grown, 64) << "MiB resident while refusing a 1 GiB claim";
  EXPECT_TRUE(contains(msg, gib) && contains(msg, "truncated") && contains(msg, "[32768, 32768]") &&
              contains(msg, "needs 1073741824 bytes at byte offset 12") && contains(msg, "ends at byte 12"))
      << msg;
  // 2^62 bytes: more than any allocator gives.
  const auto huge = dir.write("huge", idx_file(0x08, {0x80000000u, 0x80000000u}, {}));
  msg = message_of<tg::IOError>([&] { read_idx(huge); });
  EXPECT_TRUE(contains(msg, "needs 4611686018427387904 bytes")) << msg;
  // 2^62 doubles: a byte count past 2^64, refused without wrapping.
  const auto wraps = dir.write("wraps", idx_file(0x0E, {0x80000000u, 0x80000000u}, {}));
  msg = message_of<tg::IOError>([&] { read_idx(wraps); });
  EXPECT_TRUE(contains(msg, "needs 4611686018427387904 x 8 bytes")) << msg;
}

TEST(data_idx, CorruptedFilesAreFormatErrors) {
  TempDir dir;
  // A format error is a plain tg::Error, not an IOError: the file was read fine.
  auto format_error = [](auto fn) {
    try {
      fn();
    } catch (const tg::IOError& e) {
      ADD_FAILURE() << "IOError for a malformed file: " << e.what();
    } catch (const tg::Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no exception";
    return std::string();
  };
  const auto bad_magic = dir.write("bad_magic", Bytes{0x08, 0x03, 0, 1, 0, 0, 0, 0});
  std::string msg = format_error([&] { read_idx(bad_magic); });
  EXPECT_TRUE(contains(msg, bad_magic) && contains(msg, "byte offset 0") && contains(msg, "0x0803")) << msg;
  msg = format_error([&] { read_idx(dir.write("bad_type", idx_file(0x07, {1}, {0}))); });
  EXPECT_TRUE(contains(msg, "byte offset 2") && contains(msg, "0x07")) << msg;
  msg = format_error([&] { read_idx(dir.write("trailing", idx_file(0x08, {2}, {1, 2, 3}))); });
  EXPECT_TRUE(contains(msg, "byte offset 10") && contains(msg, "1 bytes past the end")) << msg;

  // MNIST wants the exact magics: a label file is not an image file, and counts must match.
  const auto images = dir.write("images", idx_file(0x08, {2, 2, 2}, Bytes(8)));
  const auto labels = dir.write("labels", idx_file(0x08, {2}, {1, 2}));
  msg = format_error([&] { MnistDataset(labels, labels); });
  EXPECT_TRUE(contains(msg, "0x00000803") && contains(msg, "0x00000801")) << msg;
  msg = format_error([&] { MnistDataset(images, images); });
  EXPECT_TRUE(contains(msg, "0x00000801") && contains(msg, "0x00000803")) << msg;
  const auto three = dir.write("three", idx_file(0x08, {3}, {1, 2, 3}));
  msg = format_error([&] { MnistDataset(images, three); });
  EXPECT_TRUE(contains(msg, "3 labels") && contains(msg, "2 images")) << msg;
}

// ---- CIFAR-10 ---------------------------------------------------------------------------

Bytes cifar_records(int n, int first_label) {
  Bytes b;
  for (int r = 0; r < n; ++r) {
    b.push_back(static_cast<uint8_t>((first_label + r) % 10));
    for (int k = 0; k < 3072; ++k) b.push_back(static_cast<uint8_t>((k * 7 + r * 31) % 256));
  }
  return b;
}

TEST(data_cifar, RecordsFromSeveralFiles) {
  TempDir dir;
  Cifar10Dataset ds({dir.write("a.bin", cifar_records(2, 3)), dir.write("b.bin", cifar_records(3, 8))});
  ASSERT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.label(0), 3);
  EXPECT_EQ(ds.label(2), 8);
  EXPECT_EQ(ds.label(4), 0);
  Example e = ds.get(3);  // record 1 of b.bin
  EXPECT_EQ(e.input.shape(), (tg::Shape{3, 32, 32}));
  EXPECT_EQ(e.target.item(), 9);
  const auto v = e.input.to_vector<float>();
  // Channel c, row y, column x is image byte c*1024 + y*32 + x.
  for (int k : {0, 1, 1023, 1024 + 32 * 5 + 7, 3071})
    EXPECT_FLOAT_EQ(v[static_cast<std::size_t>(k)], float((k * 7 + 31) % 256) / 255.0f) << k;
}

TEST(data_cifar, TruncatedAndCorrupted) {
  TempDir dir;
  Bytes cut = cifar_records(3, 0);
  cut.resize(2 * 3073 + 100);
  const auto path = dir.write("cut.bin", cut);
  std::string msg = message_of<tg::IOError>([&] { Cifar10Dataset({path}); });
  EXPECT_TRUE(contains(msg, path) && contains(msg, "record 2 starts at byte offset 6146") &&
              contains(msg, "ends at byte 6246"))
      << msg;

  Bytes bad = cifar_records(3, 0);
  bad[3073] = 10;  // record 1's label
  const auto bad_path = dir.write("bad.bin", bad);
  try {
    Cifar10Dataset ds({bad_path});
    ADD_FAILURE() << "no exception";
  } catch (const tg::IOError& e) {
    ADD_FAILURE() << "IOError for a bad label: " << e.what();
  } catch (const tg::Error& e) {
    msg = e.what();
    EXPECT_TRUE(contains(msg, bad_path) && contains(msg, "byte offset 3073") && contains(msg, "label 10")) << msg;
  }
  message_of<tg::IOError>([&] { Cifar10Dataset({(fs::path(path).parent_path() / "missing.bin").string()}); });
}

// ---- NPY --------------------------------------------------------------------------------

TEST(data_npy, DtypesShapesAndVersions) {
  TempDir dir;
  Bytes f4;
  for (float v : {1.f, 2.5f, -3.f, 4.f, 5.f, 6.25f}) put_le(f4, v);
  Tensor a = read_npy(dir.write("a.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f4)));
  EXPECT_EQ(a.dtype(), tg::DType::f32);
  EXPECT_EQ(a.shape(), (tg::Shape{2, 3}));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.f, 2.5f, -3.f, 4.f, 5.f, 6.25f}));

  Bytes f8;
  for (double v : {0.1, -1e300, 3.0}) put_le(f8, v);
  Tensor b = read_npy(dir.write("b.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", f8, 2)));
  EXPECT_EQ(b.dtype(), tg::DType::f64);
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{0.1, -1e300, 3.0}));

  Bytes i8;
  for (int64_t v : {int64_t{-5}, int64_t{1} << 40, int64_t{0}, int64_t{7}}) put_le(i8, v);
  Tensor c = read_npy(dir.write("c.npy", npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }", i8)));
  EXPECT_EQ(c.dtype(), tg::DType::i64);
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{-5, int64_t{1} << 40, 0, 7}));

  const auto u1 = dir.write("u1.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", {0, 1, 200, 255}));
  EXPECT_EQ(read_npy(u1).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 200, 255}));
  EXPECT_EQ(read_npy(u1, tg::DType::f32).to_vector<float>(), (std::vector<float>{0, 1, 200, 255}));

  Bytes i4;
  for (int32_t v : {-1, 2}) put_le(i4, v);
  EXPECT_EQ(read_npy(dir.write("i4.npy", npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", i4)))
                .to_vector<int64_t>(),
            (std::vector<int64_t>{-1, 2}));

  // Big-endian and a 0-d array; keys in another order, double quotes.
  Bytes be{0x3F, 0xC0, 0x00, 0x00};  // 1.5f
  Tensor s = read_npy(dir.write("s.npy", npy_file("{\"shape\": (), \"fortran_order\": False, \"descr\": \">f4\"}", be)));
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 1.5);
  // A row of a (rows, features) array feeds a TensorDataset.
  TensorDataset ds(a, c.reshape({2, 2}));
  EXPECT_EQ(ds.get(1).input.to_vector<float>(), (std::vector<float>{4.f, 5.f, 6.25f}));
}

TEST(data_npy, HugeClaimedSizesFailBeforeAllocating) {
  TempDir dir;
  const auto shape = dir.write(
      "shape.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", {}));
  std::string msg = message_of<tg::IOError>([&] { read_npy(shape); });
  EXPECT_TRUE(contains(msg, shape) && contains(msg, "needs 8000000000000 bytes at byte offset 128")) << msg;
  const auto wraps = dir.write(
      "wraps.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", {}));
  msg = message_of<tg::IOError>([&] { read_npy(wraps); });
  EXPECT_TRUE(contains(msg, "4611686018427387904 x 8 bytes")) << msg;

  // A 12-byte version 2.0 file whose header length says 4 GiB.
  Bytes v2{0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
  put_le<uint32_t>(v2, 0xFFFFFFFFu);
  const auto header = dir.write("header.npy", v2);
  const long grown = peak_growth_mib([&] { msg = message_of<tg::IOError>([&] { read_npy(header); }); });
  EXPECT_LT(grown, 64) << "MiB resident while refusing a 4 GiB header";
  EXPECT_TRUE(contains(msg, "the header needs 4294967295 bytes at byte offset 12") && contains(msg, "ends at byte 12"))
      << msg;
}

TEST(data_npy, Errors) {
  TempDir dir;
  Bytes f4(24);
  const auto fortran =
      dir.write("fortran.npy", npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f4));
  std::string msg = message_of<tg::UnsupportedError>([&] { read_npy(fortran); });
  EXPECT_TRUE(contains(msg, fortran) && contains(msg, "fortran_order")) << msg;

  Bytes cut = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f4);
  cut.resize(cut.size() - 5);  // magic and header 128 bytes, then 19 of 24 data bytes
  const auto cut_path = dir.write("cut.npy", cut);
  msg = message_of<tg::IOError>([&] { read_npy(cut_path); });
  EXPECT_TRUE(contains(msg, cut_path) && contains(msg, "needs 24 bytes at byte offset 128") &&
              contains(msg, "ends at byte 147"))
      << msg;

  msg = message_of<tg::UnsupportedError>(
      [&] { read_npy(dir.write("c8.npy", npy_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", Bytes(8)))); });
  EXPECT_TRUE(contains(msg, "'<c8'")) << msg;

  auto plain_error = [](auto fn) {
    try {
      fn();
    } catch (const tg::IOError& e) {
      ADD_FAILURE() << "IOError for a malformed file: " << e.what();
    } catch (const tg::UnsupportedError& e) {
      ADD_FAILURE() << "UnsupportedError for a malformed file: " << e.what();
    } catch (const tg::Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no exception";
    return std::string();
  };
  Bytes not_npy = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", Bytes(4));
  not_npy[1] = 'X';
  msg = plain_error([&] { read_npy(dir.write("magic.npy", not_npy)); });
  EXPECT_TRUE(contains(msg, "byte offset 0") && contains(msg, "NUMPY")) << msg;
  // The header's dict is cut short: 'shape' has no closing parenthesis; the offset points
  // into the header (which starts at byte 10).
  msg = plain_error(
      [&] { read_npy(dir.write("hdr.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x", {}))); });
  EXPECT_TRUE(contains(msg, "byte offset 64")) << msg;
  msg = plain_error(
      [&] { read_npy(dir.write("nokey.npy", npy_file("{'descr': '<f4', 'shape': (1,), }", Bytes(4)))); });
  EXPECT_TRUE(contains(msg, "fortran_order")) << msg;
  msg = plain_error(
      [&] { read_npy(dir.write("extra.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", Bytes(8)))); });
  EXPECT_TRUE(contains(msg, "byte offset 132") && contains(msg, "4 bytes past the end")) << msg;
  message_of<tg::DTypeError>([&] {
    read_npy(dir.write("f4i.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", Bytes(4))),
             tg::DType::i64);
  });
}

}  // namespace
