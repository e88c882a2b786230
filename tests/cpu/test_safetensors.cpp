// The safetensors reader and writer (core/safetensors.h): the layout, files from other writers,
// every kind of corrupt file, foreign dtypes, UTF-8 names, linear-time header parsing, and
// non-regular files refused without blocking.
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/checkpoint_util.h"
#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

// ---- safetensors format -----------------------------------------------------------------

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  manual_seed(3);
  st::NamedTensors in = {{"w", randn({3, 5})},
                         {"d", randn({2, 1, 4}, {.dtype = f64})},
                         {"i", from_vector(std::vector<int64_t>{7, -1, 1LL << 40}, {3})},
                         {"scalar", full({}, 2.5)},
                         {"empty", zeros({0, 3})},
                         {"we\"ird/name é", randn({2})}};
  st::save_file(in, dir.file("a.safetensors"), {{"format", "pt"}, {"note", "a \"quoted\"\nline"}});
  st::Metadata meta;
  st::NamedTensors out = st::load_file(dir.file("a.safetensors"), &meta);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_TRUE(bitwise_equal(out[i].second, in[i].second)) << in[i].first;
  }
  ASSERT_EQ(meta.size(), 2u);
  EXPECT_EQ(meta[1].second, "a \"quoted\"\nline");
}

TEST(Safetensors, LayoutFollowsTheSpec) {
  TempDir dir;
  Tensor a = from_vector(std::vector<float>{1.5f, -2.f}, {2});
  Tensor b = from_vector(std::vector<double>{3.25}, {1, 1});
  st::save_file({{"a", a}, {"b", b}}, dir.file("x.safetensors"));
  std::string bytes = read_bytes(dir.file("x.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "the data section starts 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 8 + 8);
  json::Value h = json::parse(bytes.substr(8, n));
  const json::Value* ea = h.find("a");
  ASSERT_TRUE(ea && ea->find("dtype") && ea->find("shape") && ea->find("data_offsets"));
  EXPECT_EQ(ea->find("dtype")->text, "F32");
  EXPECT_EQ(h.find("b")->find("dtype")->text, "F64");
  EXPECT_EQ(h.find("b")->find("data_offsets")->items[0].as_size("b"), 8);
  EXPECT_EQ(bytes.substr(8 + n, 8), float_bytes({1.5f, -2.f}));
}

// A file as another writer may lay it out: tensors out of order, whitespace, metadata last.
TEST(Safetensors, ReadsFilesFromOtherWriters) {
  TempDir dir;
  std::string header =
      "{ \"second\" : {\"shape\": [1], \"dtype\": \"F32\", \"data_offsets\": [8, 12]},\n"
      "  \"first\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "  \"__metadata__\": {\"format\": \"pt\"}}   ";
  write_bytes(dir.file("o.safetensors"), file_bytes(header, float_bytes({1, 2, 3})));
  st::Metadata meta;
  st::NamedTensors t = st::load_file(dir.file("o.safetensors"), &meta);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].first, "second");
  EXPECT_EQ(t[0].second.to_vector<float>(), std::vector<float>({3}));
  EXPECT_EQ(t[1].second.to_vector<float>(), std::vector<float>({1, 2}));
  ASSERT_EQ(meta.size(), 1u);
  EXPECT_EQ(meta[0].first, "format");
}

TEST(Safetensors, CorruptFilesNameTheTensorOrTheOffset) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  const std::string data = float_bytes({1, 2, 3});
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  // A JSON object of the given entries. Appended piece by piece: GCC 12 warns (-Wrestrict,
  // a known false positive) on long chains of `"{" + std::string + ...`.
  auto object = [](std::initializer_list<std::string> entries) {
    std::string json = "{";
    for (const std::string& e : entries) {
      if (json.size() > 1) json += ",";
      json += e;
    }
    return json + "}";
  };
  const std::string good = object({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[1]", 8, 12)});
  write_bytes(p, file_bytes(good, data));
  EXPECT_EQ(st::load_file(p).size(), 2u);  // the baseline is valid

  write_bytes(p, "abc");
  TG_EXPECT_ERROR(st::read_header(p), "fewer than the 8-byte header length", "byte 0");
  write_bytes(p, file_bytes(good, data).substr(0, 20));
  TG_EXPECT_ERROR(st::read_header(p), "header length", "runs past the end");
  std::string huge = file_bytes(good, data);
  huge[7] = '\x7f';
  write_bytes(p, huge);
  TG_EXPECT_ERROR(st::read_header(p), "exceeds the format's limit");
  write_bytes(p, file_bytes(good, data.substr(0, 10)));  // truncated data
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'b'", "run past the end", "truncated");
  write_bytes(p, file_bytes(good, data + "xx"));  // trailing bytes
  TG_EXPECT_ERROR(st::read_header(p), "2 more bytes");
  std::string broken = good;
  broken[30] = '}';
  write_bytes(p, file_bytes(broken, data));
  TG_EXPECT_ERROR(st::read_header(p), "corrupt header", "at byte 38");
  write_bytes(p, file_bytes("[1,2]", data));
  TG_EXPECT_ERROR(st::read_header(p), "must start with '{'");
  write_bytes(p, file_bytes(object({entry("a", "F33", "[2]", 0, 8), entry("b", "F32", "[1]", 8, 12)}), data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "unknown dtype \"F33\"", "at byte");
  write_bytes(p, file_bytes(object({entry("a", "F32", "[3]", 0, 8), entry("b", "F32", "[1]", 8, 12)}), data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "needs 12 bytes", "hold 8");
  write_bytes(p, file_bytes(object({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[1]", 4, 8)}), data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'b'", "overlap");
  write_bytes(p, file_bytes(object({entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 8, 12)}), data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'b'", "gap");
  write_bytes(p, file_bytes(object({entry("a", "F32", "[2]", 8, 0)}), data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "begin > end");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "lacks \"data_offsets\"");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12],\"x\":1}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "unknown field \"x\"");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[-3],\"data_offsets\":[0,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "shape of tensor 'a'", "non-negative");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "more than 2^64");
  write_bytes(p, file_bytes("{\"__metadata__\":{\"k\":1}," + entry("a", "F32", "[3]", 0, 12) + "}", data));
  TG_EXPECT_ERROR(st::read_header(p), "metadata \"k\"", "must be a string");
  // Nesting is refused where the schema has none (the JSON layer's own limit is tested above).
  write_bytes(p, file_bytes("{\"__metadata__\":" + std::string(5000, '[') + "}", data));
  TG_EXPECT_ERROR(st::read_header(p), "__metadata__", "must be an object of strings");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":" + std::string(5000, '[') + "}", data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "shape", "must hold numbers");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "data_offsets", "[begin, end]");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "corrupt header", "duplicate key \"a\"", "at byte 63");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[" + std::string(65, '1') +
                            "],\"data_offsets\":[0,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "shape of tensor 'a'",
                  "does not fit in int64 (the largest is 9223372036854775807)");
  // Offsets past int64 (2^63, 2^64 - 1, 30 digits) are past the end of any file: said so,
  // with the tensor's name and the data section's size.
  const std::vector<std::string> past_int64 = {"9223372036854775808", "18446744073709551615", std::string(30, '9')};
  for (const std::string& big : past_int64) {
    const std::string offsets = "[" + big + "," + big + "]";
    write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":" + offsets + "}}", data));
    const std::string named = "tensor 'a': data_offsets value " + big.substr(0, 19);
    TG_EXPECT_ERROR(st::read_header(p), named.c_str(), "past the end of the data section (12 bytes");
  }
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3.0],\"data_offsets\":[0,12]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "shape of tensor 'a'", "non-negative integer, found 3.0");
  write_bytes(p, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,1.2e1]}}", data));
  TG_EXPECT_ERROR(st::read_header(p), "data_offsets of tensor 'a'", "non-negative integer, found 1.2e1");
  std::string many_dims = "[1";
  for (int i = 0; i < 64; ++i) many_dims += ",1";
  write_bytes(p, file_bytes(object({entry("a", "F32", many_dims + "]", 0, 4)}), data.substr(0, 4)));
  TG_EXPECT_ERROR(st::read_header(p), "tensor 'a'", "more than 64 dims");
  TG_EXPECT_ERROR(st::read_header(dir.file("missing.safetensors")), "cannot open", "missing.safetensors");
}

TEST(Safetensors, ForeignDtypesParseButDoNotLoad) {
  TempDir dir;
  const std::string p = dir.file("i32.safetensors");
  write_bytes(p, file_bytes("{\"h\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"));
  st::Header h = st::read_header(p);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, "I32");
  TG_EXPECT_ERROR(st::load_file(p), "tensor 'h'", "I32", "cannot hold");
  // BF16 is a tapegrad dtype now: the entry loads as it is stored.
  const std::string q = dir.file("bf16.safetensors");
  write_bytes(q, file_bytes("{\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", "abcd"));
  const st::NamedTensors t = st::load_file(q);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].second.dtype(), DType::bf16);
  EXPECT_EQ(std::string(static_cast<const char*>(t[0].second.raw_data()), 4), "abcd");
}

TEST(Safetensors, SaveRejectsBadInput) {
  TempDir dir;
  TG_EXPECT_ERROR(st::save_file({{"a", ones({1})}, {"a", ones({2})}}, dir.file("x")), "two tensors are named 'a'");
  TG_EXPECT_ERROR(st::save_file({{"__metadata__", ones({1})}}, dir.file("x")), "reserved");
  TG_EXPECT_ERROR(st::save_file({{"u", Tensor()}}, dir.file("x")), "'u' is undefined");
  EXPECT_TRUE(dir.entries().empty()) << "nothing is created when the input is rejected";
}

TEST(Safetensors, NamesMustBeUtf8) {
  TempDir dir;
  const std::string p = dir.file("u.safetensors");
  TG_EXPECT_ERROR(st::save_file({{"ok", ones({1})}, {"bad\xff", ones({1})}}, p), "tensor name", "not valid UTF-8",
                  "byte 3");
  TG_EXPECT_ERROR(st::save_file({{"w\xc0\x80", ones({1})}}, p), "not valid UTF-8");  // overlong
  TG_EXPECT_ERROR(st::save_file({{"w", ones({1})}}, p, {{"k", "\xed\xa0\x80"}}), "metadata value", "not valid UTF-8");
  TG_EXPECT_ERROR(st::save_file({{"w", ones({1})}}, p, {{"\xfe", "v"}}), "metadata key", "not valid UTF-8");
  EXPECT_TRUE(dir.entries().empty()) << "nothing is created when a name is rejected";
  // Such a file written by another writer is refused on load, naming the problem.
  write_bytes(p, file_bytes("{\"bad\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                            float_bytes({1})));
  TG_EXPECT_ERROR(st::read_header(p), "corrupt header", "not valid UTF-8", "at byte 13");
  auto m = small_cnn(1);
  TG_EXPECT_ERROR(load(*m, p), "not valid UTF-8");
  // Any valid UTF-8 goes through, escapes and all.
  const std::string name = "\xe5\x90\x8d\xe5\x89\x8d/\xf0\x9f\x98\x80 \"q\"\t";
  st::save_file({{name, ones({2})}}, p, {{"\xc3\xa9", "\xe2\x82\xac"}});
  st::Metadata meta;
  EXPECT_EQ(st::load_file(p, &meta)[0].first, name);
  EXPECT_EQ(meta[0].second, "\xe2\x82\xac");
}

// This thread's CPU time: what the parse costs, not how many other processes share the
// machine (ctest -j, parallel builds).
double thread_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Linear-time header parsing: 100k entries (7.9 MB of header) in well under a second. Hash
// lookups for duplicates and Header::find; the previous parser's linear scans took over a minute
// at this size.
TEST(Safetensors, HundredThousandKeyHeaderIsFast) {
  TempDir dir;
  const std::string p = dir.file("many.safetensors");
  constexpr int kKeys = 100000;
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (int i = 0; i < kKeys; ++i)
    header += ",\"layer." + std::to_string(i) + ".weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  const std::string dup = header + ",\"layer.0.weight\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
  header += "}";
  write_bytes(p, file_bytes(header, std::string(4 * kKeys, '\0')));

  const auto w0 = std::chrono::steady_clock::now();
  const double t0 = thread_seconds();
  st::Header h = st::read_header(p);
  int found = 0;
  for (int i = 0; i < kKeys; ++i) found += h.find("layer." + std::to_string(i) + ".weight") != nullptr;
  const double seconds = thread_seconds() - t0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  EXPECT_EQ(h.tensors.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(found, kKeys);
  EXPECT_EQ(h.find("layer.100000.weight"), nullptr);
  std::cout << "[ note ] read_header + " << kKeys << " finds of a " << header.size() << "-byte header: " << seconds
            << " s of CPU (" << wall << " s wall)\n";
  EXPECT_LT(seconds, 1.0);

  write_bytes(p, file_bytes(dup, std::string(4 * kKeys, '\0')));
  const double t1 = thread_seconds();
  TG_EXPECT_ERROR(st::read_header(p), "duplicate key \"layer.0.weight\"");
  EXPECT_LT(thread_seconds() - t1, 1.0);
}

TEST(Safetensors, FindFollowsReindex) {
  TempDir dir;
  const std::string p = dir.file("a.safetensors");
  st::save_file({{"a", ones({1})}, {"b", ones({2})}}, p);
  st::Header h = st::read_header(p);
  ASSERT_NE(h.find("b"), nullptr);
  EXPECT_EQ(h.find("b")->end, 12u);
  h.tensors[1].name = "c";
  h.reindex();
  EXPECT_EQ(h.find("b"), nullptr);
  ASSERT_NE(h.find("c"), nullptr);
  st::Header by_hand;  // never indexed: found by a scan
  by_hand.tensors.push_back({.name = "x", .dtype = "F32", .shape = {1}, .begin = 0, .end = 4, .header_offset = 0});
  EXPECT_NE(by_hand.find("x"), nullptr);
}

// A FIFO would block open() until a writer comes: refused before opening. Run in a child
// with a deadline, so that a regression fails instead of hanging the suite.
TEST(Safetensors, NonRegularFilesAreRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto model = small_cnn(1);
  const int rc = run_in_child(
      [&] {
        bool ok = throws_error([&] { st::read_header(fifo); }, {"pipe.safetensors", "a FIFO", "not a regular file"});
        ok = ok && throws_error([&] { st::load_file(fifo); }, {"a FIFO"});
        ok = ok && throws_error([&] { load(*model, fifo); }, {"a FIFO"});
        return ok ? 0 : 1;
      },
      20);
  EXPECT_NE(rc, kChildTimedOut) << "the loader blocked on a FIFO";
  EXPECT_EQ(rc, 0) << "the FIFO was not refused with a clear error";
  TG_EXPECT_ERROR(st::read_header(dir.file("")), "a directory", "not a regular file");
  if (std::filesystem::exists("/dev/null"))
    TG_EXPECT_ERROR(st::read_header("/dev/null"), "a character device", "not a regular file");
  // A symbolic link to a regular file is fine (stat follows it).
  st::save_file({{"a", ones({1})}}, dir.file("real.safetensors"));
  std::filesystem::create_symlink(dir.file("real.safetensors"), dir.file("link.safetensors"));
  EXPECT_EQ(st::load_file(dir.file("link.safetensors")).size(), 1u);
}
