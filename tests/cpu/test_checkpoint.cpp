// Checkpoints: the safetensors reader and writer (layout, JSON header, every kind of corrupt
// file), tg::save / tg::load of modules and optimizer state (PyTorch names, strict and
// all-or-nothing loading, atomic saves), and bit-identical resumption of training.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file laid out by hand: 8-byte little-endian length, header, data.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string float_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct Snapshot {
  std::vector<Tensor> values;
  std::vector<uint64_t> versions;
};
Snapshot snapshot(const nn::Module& m) {
  Snapshot s;
  for (const Tensor& p : m.parameters()) {
    s.values.push_back(p.clone());
    s.versions.push_back(p.version());
  }
  return s;
}
// Nothing was written: same values and no in-place write at all (versions unchanged).
void expect_unchanged(const nn::Module& m, const Snapshot& s) {
  auto params = m.parameters();
  ASSERT_EQ(params.size(), s.values.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(params[i], s.values[i])) << "parameter " << i << " changed";
    EXPECT_EQ(params[i].version(), s.versions[i]) << "parameter " << i << " was written";
  }
}

void expect_same_parameters(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(bitwise_equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

struct Batch {
  Tensor x, y;
};
Batch make_batch(uint64_t seed) {
  manual_seed(seed);
  Tensor x = randn({4, 3, 7, 9});
  Tensor y = from_vector(std::vector<int64_t>{0, 3, 4, 1}, {4});
  return {x, y};
}

std::vector<double> train(nn::Module& model, nn::Optimizer& opt, const Batch& b, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    Tape tape;
    Tensor loss = cross_entropy(model(b.x), b.y);
    losses.push_back(loss.item());
    tape.backward(loss);
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

// ---- child processes: kills, blocking opens, dropped privileges ---------------------------

constexpr int kChildTimedOut = -1000;

// Runs `body` in a forked child and returns its exit status (-signal if killed, or
// kChildTimedOut when it ran past `timeout_s` and was killed). The child never returns into
// the test framework; gtest assertions there would be lost, so bodies return codes.
int run_in_child(const std::function<int()>& body, double timeout_s = 30) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 98;
    try {
      rc = body();
    } catch (...) {
      rc = 99;
    }
    ::_exit(rc);
  }
  if (pid < 0) return -2000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return kChildTimedOut;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Whether `f` throws tg::Error with every fragment in its message (for child bodies).
bool throws_error(const std::function<void()>& f, std::initializer_list<const char*> fragments) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* frag : fragments)
      if (msg.find(frag) == std::string::npos) return false;
    return true;
  }
  return false;
}

// Root ignores file permissions: tests of permission failures run their body as `nobody`
// in a child (a no-op for other users), so that they test the failure rather than skip.
struct Nobody {
  uid_t uid = 65534;
  gid_t gid = 65534;
  Nobody() {  // looked up before any fork
    if (const passwd* pw = ::getpwnam("nobody")) uid = pw->pw_uid, gid = pw->pw_gid;
  }
  bool become() const {
    if (::geteuid() != 0) return true;
    ::setgroups(0, nullptr);  // may be denied in a user namespace; the uid is what matters
    return ::setgid(gid) == 0 && ::setuid(uid) == 0 && ::geteuid() == uid;
  }
};

std::vector<std::string> temporaries(const TempDir& dir) {
  std::vector<std::string> out;
  for (const std::string& e : dir.entries())
    if (e.find(".tmp.") != std::string::npos) out.push_back(e);
  return out;
}

}  // namespace

// ---- JSON -------------------------------------------------------------------------------

TEST(Json, ParsesValuesAndEscapes) {
  json::Value v = json::parse(R"( {"a": [1, -2.5e3, true, false, null], "b\"\\\/\n": "\u00e9\ud83d\ude00", "c": {}} )");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members.size(), 3u);
  const json::Value* a = v.find("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->items.size(), 5u);
  EXPECT_EQ(a->items[0].as_size("x"), 1);
  EXPECT_EQ(a->items[1].text, "-2.5e3");
  EXPECT_TRUE(a->items[2].boolean);
  EXPECT_EQ(a->items[4].kind, json::Value::Kind::null);
  EXPECT_EQ(v.members[1].first, "b\"\\/\n");
  EXPECT_EQ(v.members[1].second.text, "\xc3\xa9\xf0\x9f\x98\x80");  // é and an emoji, in UTF-8
  EXPECT_EQ(json::parse(json::quote("tab\there \"q\" \x01")).text, "tab\there \"q\" \x01");
}

TEST(Json, ErrorsNameTheByteOffset) {
  TG_EXPECT_ERROR(json::parse("{\"a\": [1, 2}"), "json", "at byte 11");
  TG_EXPECT_ERROR(json::parse("{\"a\": 1, \"a\": 2}"), "duplicate key \"a\"", "at byte 9");
  TG_EXPECT_ERROR(json::parse("{\"a\": tru}"), "invalid literal", "at byte 9");
  TG_EXPECT_ERROR(json::parse("{\"a\": \"x"), "missing closing quote");
  TG_EXPECT_ERROR(json::parse("{} x"), "expected end of input", "at byte 3");
  TG_EXPECT_ERROR(json::parse("[01]"), "at byte 2");
  TG_EXPECT_ERROR(json::parse("\"\\ud800\""), "surrogate");
  TG_EXPECT_ERROR(json::parse("[1,]", 100), "at byte 103");  // offsets of a slice of a file
}

TEST(Json, DeepNestingIsAnErrorNotACrash) {
  std::string deep(100000, '[');
  TG_EXPECT_ERROR(json::parse(deep), "nesting deeper");
}

TEST(Json, SizesMustBeNonNegativeIntegersIn64Bits) {
  EXPECT_EQ(json::parse("9223372036854775807").as_size("n"), INT64_MAX);
  TG_EXPECT_ERROR(json::parse("9223372036854775808").as_size("n"), "does not fit");
  TG_EXPECT_ERROR(json::parse("-1").as_size("n"), "non-negative integer");
  TG_EXPECT_ERROR(json::parse("1.0").as_size("n"), "non-negative integer");
  TG_EXPECT_ERROR(json::parse("\"1\"").as_size("n"), "must be a number");
}

TEST(Json, DuplicateKeysAreFoundInEveryObject) {
  TG_EXPECT_ERROR(json::parse(R"({"a": {"b": 1, "c": 2, "b": 3}})"), "duplicate key \"b\"", "at byte 23");
  // The same key in two objects is no duplicate; an escaped spelling of a key is one.
  EXPECT_EQ(json::parse(R"({"a": {"b": 1}, "c": {"b": 2}})").members.size(), 2u);
  TG_EXPECT_ERROR(json::parse(R"({"ab": 1, "\u0061b": 2})"), "duplicate key \"ab\"", "at byte 10");
}

TEST(Json, StringsMustBeUtf8) {
  TG_EXPECT_ERROR(json::parse("{\"\xff\": 1}"), "not valid UTF-8", "at byte 2");
  TG_EXPECT_ERROR(json::parse("[\"ok\", \"\xed\xa0\x80\"]"), "not valid UTF-8");  // an encoded surrogate
  size_t bad = 99;
  EXPECT_TRUE(json::valid_utf8("plain \xc3\xa9 \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(json::valid_utf8("ab\xc0\x80", &bad));  // overlong NUL
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(json::valid_utf8("\xed\xa0\x80"));          // surrogate U+D800
  EXPECT_FALSE(json::valid_utf8("\xf4\x90\x80\x80"));      // past U+10FFFF
  EXPECT_FALSE(json::valid_utf8("x\xe2\x82", &bad));       // truncated
  EXPECT_EQ(bad, 1u);
  EXPECT_FALSE(json::valid_utf8("\x80"));                  // a lone continuation byte
}

TEST(Json, NumbersAreExactIntegersOrRefused) {
  TG_EXPECT_ERROR(json::parse("-0").as_size("n"), "non-negative integer, found -0");
  TG_EXPECT_ERROR(json::parse("1e3").as_size("n"), "non-negative integer, found 1e3");
  TG_EXPECT_ERROR(json::parse("18446744073709551616").as_size("n"), "does not fit");  // 2^64
  TG_EXPECT_ERROR(json::parse(std::string(400, '9')).as_size("n"), "json");           // past a double
  TG_EXPECT_ERROR(json::parse("[1e400]"), "json", "at byte");
  // Offsets of values in any position, after escapes and whitespace.
  json::Value v = json::parse(R"({"k\"\\": [ 12 , "s\\\"" , -0 ], "t": true})", 100);
  EXPECT_EQ(v.offset, 100u);
  const json::Value& a = v.members[0].second;
  ASSERT_EQ(a.items.size(), 3u);
  EXPECT_EQ(a.items[0].offset, 112u);
  EXPECT_EQ(a.items[1].offset, 117u);
  EXPECT_EQ(a.items[2].text, "-0");
  EXPECT_EQ(a.items[2].offset, 127u);
  EXPECT_EQ(v.members[1].second.offset, 138u);
}

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
  TG_EXPECT_ERROR(st::read_header(p), "shape of tensor 'a'", "does not fit in 64 bits");
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
  const std::string p = dir.file("bf16.safetensors");
  write_bytes(p, file_bytes("{\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", "abcd"));
  st::Header h = st::read_header(p);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, "BF16");
  TG_EXPECT_ERROR(st::load_file(p), "tensor 'h'", "BF16");
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

// ---- atomic saves -----------------------------------------------------------------------

TEST(Checkpoint, FailedSaveKeepsThePreviousFile) {
  TempDir dir;
  const std::string p = dir.file("model.safetensors");
  auto a = small_cnn(1);
  save(*a, p);
  const std::string before = read_bytes(p);
  auto b = small_cnn(2);
  // Fail at the start, inside the header, at the data's first byte, in the middle of it.
  for (int64_t after : {0, 5, 100, 300, 600}) {
    st::testing::fail_next_write_after(after);
    TG_EXPECT_ERROR(save(*b, p), "simulated failure", "model.safetensors");
    EXPECT_EQ(read_bytes(p), before) << "failure after " << after << " bytes";
    EXPECT_EQ(dir.entries(), std::vector<std::string>({"model.safetensors"})) << "a temporary file was left behind";
  }
  // The next save (no fault armed) goes through and replaces the file.
  save(*b, p);
  EXPECT_NE(read_bytes(p), before);
  auto c = small_cnn(3);
  load(*c, p);
  expect_same_parameters(*b, *c);
}

TEST(Checkpoint, SaveIntoAMissingDirectoryFails) {
  TempDir dir;
  auto a = small_cnn(1);
  TG_EXPECT_ERROR(save(*a, dir.file("no/such/dir/m.safetensors")), "cannot create", "no/such/dir");
}

// Run as `nobody` when the suite runs as root (root would write anyway) rather than skipped.
TEST(Checkpoint, SaveIntoAReadOnlyDirectoryFailsAndKeepsTheFile) {
  TempDir dir;
  const Nobody nobody;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string ro = dir.file("ro"), p = dir.file("ro/m.safetensors");
  std::filesystem::create_directories(ro);
  save(*a, p);
  const std::string before = read_bytes(p);
  ASSERT_EQ(::chmod(dir.file("").c_str(), 0755), 0);  // `nobody` may enter the test directory
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  const int rc = run_in_child([&] {
    if (!nobody.become()) return 3;
    if (::access(ro.c_str(), W_OK) == 0) return 4;  // permissions would not stop the write
    return throws_error([&] { save(*b, p); }, {"cannot create", "is the directory writable", "Permission denied"})
               ? 0
               : 1;
  });
  ::chmod(ro.c_str(), 0755);
  if (rc == 3) GTEST_SKIP() << "root here cannot become nobody (setuid refused): permissions cannot be tested";
  EXPECT_EQ(rc, 0) << "4: the directory was writable, 1: no error or another one";
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_TRUE(temporaries(dir).empty());
}

TEST(Checkpoint, UnreadableFileFailsAndChangesNothing) {
  TempDir dir;
  const Nobody nobody;
  auto a = small_cnn(1), b = small_cnn(2);
  const std::string p = dir.file("m.safetensors");
  save(*a, p);
  ASSERT_EQ(::chmod(dir.file("").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(p.c_str(), 0000), 0);
  const Snapshot s = snapshot(*b);
  const int rc = run_in_child([&] {
    if (!nobody.become()) return 3;
    bool ok = throws_error([&] { load(*b, p); }, {"cannot open", "m.safetensors", "Permission denied"});
    // What the parent compares is its own copy: check the child's module here.
    auto params = b->parameters();
    for (size_t i = 0; i < params.size(); ++i) ok = ok && bitwise_equal(params[i], s.values[i]);
    return ok ? 0 : 1;
  });
  if (rc == 3) GTEST_SKIP() << "root here cannot become nobody (setuid refused): permissions cannot be tested";
  EXPECT_EQ(rc, 0) << "1: no error or another one, or the module changed";
}

bool tmpfile_supported(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// A real process killed (SIGKILL) in the middle of saves: with O_TMPFILE it leaves nothing;
// with named temporaries (forced, as on file systems without O_TMPFILE) it leaves one,
// which the next save of the same file removes. The previous file stays loadable throughout.
TEST(Checkpoint, KilledSaveLeavesNoTemporaryBehind) {
  for (const bool use_tmpfile : {false, true}) {
    SCOPED_TRACE(use_tmpfile ? "O_TMPFILE" : "named temporaries");
    TempDir dir;
    if (use_tmpfile && !tmpfile_supported(dir.file(""))) {
      std::cout << "[ note ] this file system has no O_TMPFILE: only named temporaries tested\n";
      continue;
    }
    const std::string p = dir.file("big.safetensors");
    const Tensor big = full({4 << 20}, 1.5);  // 16 MB: a save takes a while (write + fsync)
    st::save_file({{"w", big}}, p);
    int left = 0, clean = 0;
    for (int attempt = 0; attempt < 30 && left + clean < 4; ++attempt) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        st::testing::set_use_tmpfile(use_tmpfile);
        try {
          for (;;) st::save_file({{"w", big}}, p);
        } catch (...) {
        }
        ::_exit(1);
      }
      ASSERT_GT(pid, 0);
      // Kill it while a save is writing: once its temporary shows (named), or after a while.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      if (use_tmpfile) std::this_thread::sleep_for(std::chrono::milliseconds(30 + 7 * attempt));
      while (!use_tmpfile && temporaries(dir).empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      ::kill(pid, SIGKILL);
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);  // reaped: its pid is gone
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child stopped saving by itself";
      (temporaries(dir).empty() ? clean : left) += 1;
      EXPECT_EQ(st::load_file(p)[0].second.numel(), 4 << 20) << "the checkpoint was damaged";
      // The next save here removes what the dead process left.
      st::save_file({{"w", big}}, p);
      EXPECT_TRUE(temporaries(dir).empty()) << "left behind: " << ::testing::PrintToString(temporaries(dir));
    }
    if (use_tmpfile) EXPECT_GT(clean, 0) << "every kill left a named temporary despite O_TMPFILE";
    else EXPECT_GT(left, 0) << "no kill caught a save mid-write: the clean-up was not exercised";
    EXPECT_EQ(dir.entries(), std::vector<std::string>({"big.safetensors"}));
  }
}

// What the clean-up removes: temporaries of the same file whose process is gone, nothing else.
TEST(Checkpoint, SaveRemovesOnlyStaleTemporariesOfItsFile) {
  TempDir dir;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string d = std::to_string(dead), self = std::to_string(::getpid());
  const std::vector<std::string> kept = {
      "m.safetensors.tmp." + self + ".7",   // this process: maybe another thread's save
      "m.safetensors.tmp.1.0",              // pid 1 is alive
      "other.safetensors.tmp." + d + ".0",  // another file's
      "m.safetensors.tmp." + d + ".x",      // not the pattern
      "m.safetensors.tmp." + d,             // not the pattern
      "xm.safetensors.tmp." + d + ".0"};    // another file's
  for (const std::string& name : kept) write_bytes(dir.file(name), "junk");
  write_bytes(dir.file("m.safetensors.tmp." + d + ".0"), "junk");
  write_bytes(dir.file("m.safetensors.tmp." + d + ".12"), "junk");
  st::save_file({{"a", ones({1})}}, dir.file("m.safetensors"));
  std::vector<std::string> expected = kept;
  expected.push_back("m.safetensors");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dir.entries(), expected);
}

// ---- module checkpoints -----------------------------------------------------------------

TEST(Checkpoint, UsesPyTorchStateDictNames) {
  TempDir dir;
  auto m = small_cnn(1);
  save(*m, dir.file("m.safetensors"));
  st::Header h = st::read_header(dir.file("m.safetensors"));
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  EXPECT_EQ(names, std::vector<std::string>({"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(h.find("0.weight")->shape, std::vector<int64_t>({6, 3, 3, 3}));
  EXPECT_EQ(h.find("0.weight")->dtype, "F32");
  ASSERT_NE(h.find_metadata("format"), nullptr);
  EXPECT_EQ(*h.find_metadata("format"), "pt");
}

TEST(Checkpoint, LoadRestoresParametersInPlace) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  save(*a, dir.file("m.safetensors"));
  std::vector<Tensor> handles = b->parameters();
  load(*b, dir.file("m.safetensors"));
  expect_same_parameters(*a, *b);
  auto after = b->parameters();
  for (size_t i = 0; i < handles.size(); ++i) {
    EXPECT_TRUE(handles[i].same(after[i])) << "load must write into the existing tensors";
    EXPECT_TRUE(after[i].requires_grad() && after[i].is_leaf());
  }
  Batch batch = make_batch(5);
  EXPECT_TRUE(bitwise_equal((*a)(batch.x), (*b)(batch.x)));
}

TEST(Checkpoint, DoubleModelsSaveF64) {
  TempDir dir;
  auto a = small_cnn(1), b = small_cnn(2);
  a->to(f64);
  b->to(f64);
  save(*a, dir.file("m.safetensors"));
  EXPECT_EQ(st::read_header(dir.file("m.safetensors")).find("4.bias")->dtype, "F64");
  load(*b, dir.file("m.safetensors"));
  expect_same_parameters(*a, *b);
  auto c = small_cnn(3);  // f32: the dtype is checked, never converted silently
  Snapshot s = snapshot(*c);
  TG_EXPECT_ERROR(load(*c, dir.file("m.safetensors")), "tensor '0.weight' is F64", "f32[6, 3, 3, 3]");
  expect_unchanged(*c, s);
}

// Each bad file is valid except for its last tensor: a loader that copied as it went would
// have changed the first parameters before failing.
TEST(Checkpoint, BadFilesFailAndLeaveTheModuleUnchanged) {
  TempDir dir;
  auto ref = small_cnn(1);
  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  const std::string p = dir.file("bad.safetensors");
  st::NamedTensors good = ref->named_parameters();

  st::NamedTensors missing(good.begin(), good.end() - 1);
  st::save_file(missing, p);
  TG_EXPECT_ERROR(load(*target, p), "has no tensor '4.bias'", "f32[5]");
  expect_unchanged(*target, s);

  st::NamedTensors extra = good;
  extra.emplace_back("5.weight", ones({2}));
  st::save_file(extra, p);
  TG_EXPECT_ERROR(load(*target, p), "holds tensor '5.weight' F32[2]", "no parameter");
  expect_unchanged(*target, s);

  st::NamedTensors misshaped = good;
  misshaped.back().second = ones({6});
  st::save_file(misshaped, p);
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias' has shape [6]", "f32[5]");
  expect_unchanged(*target, s);

  st::NamedTensors wrong_dtype = good;
  wrong_dtype.back().second = ones({5}, {.dtype = f64});
  st::save_file(wrong_dtype, p);
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias' is F64", "f32[5]");
  expect_unchanged(*target, s);

  save(*ref, p);
  std::string bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 3));
  TG_EXPECT_ERROR(load(*target, p), "tensor '4.bias'", "truncated");
  expect_unchanged(*target, s);

  bytes[20] = '\x01';  // a control character inside the JSON header
  write_bytes(p, bytes);
  TG_EXPECT_ERROR(load(*target, p), "corrupt header", "at byte 20");
  expect_unchanged(*target, s);
}

// ---- optimizer state and resumption -----------------------------------------------------

// Train 3 steps, save, train 3 more (losses L). A fresh model and optimizer loaded from the
// checkpoint must produce exactly L: every bit of parameters and state was restored.
template <class MakeOptimizer>
void expect_bit_identical_resume(MakeOptimizer make_optimizer) {
  TempDir dir;
  const std::string p = dir.file("ckpt.safetensors");
  Batch batch = make_batch(11);
  auto model = small_cnn(1);
  auto opt = make_optimizer(model->parameters());
  train(*model, *opt, batch, 3);
  save(*model, *opt, p);
  std::vector<double> expected = train(*model, *opt, batch, 3);

  auto fresh = small_cnn(99);  // different weights: the checkpoint must overwrite all of them
  auto fresh_opt = make_optimizer(fresh->parameters());
  fresh_opt->set_lr(123.0);    // restored from the checkpoint too
  load(*fresh, *fresh_opt, p);
  EXPECT_EQ(fresh_opt->step_count(), 3);
  EXPECT_EQ(fresh_opt->lr(), opt->lr());
  std::vector<double> resumed = train(*fresh, *fresh_opt, batch, 3);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 3;
  expect_same_parameters(*model, *fresh);
  EXPECT_EQ(fresh_opt->step_count(), 6);
}

TEST(Checkpoint, AdamResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.01, .weight_decay = 1e-3});
  });
}

TEST(Checkpoint, AdamWResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.01});
  });
}

TEST(Checkpoint, SgdMomentumResumesBitIdentically) {
  expect_bit_identical_resume([](std::vector<Tensor> p) {
    return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
  });
}

TEST(Checkpoint, OptimizerStateIsNamedAfterParameters) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  train(*model, opt, make_batch(1), 2);
  save(*model, opt, dir.file("c.safetensors"));
  st::Header h = st::read_header(dir.file("c.safetensors"));
  ASSERT_NE(h.find("optim.0.weight.exp_avg"), nullptr);
  ASSERT_NE(h.find("optim.4.bias.exp_avg_sq"), nullptr);
  const st::TensorInfo* step = h.find("optim.1.weight.step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, "F64");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer"), "Adam");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer.step_count"), "2");
  EXPECT_EQ(*h.find_metadata("tapegrad.optimizer.lr"), "0.01");
  // A module-only load of a training checkpoint ignores the optimizer state.
  auto other = small_cnn(2);
  load(*other, dir.file("c.safetensors"));
  expect_same_parameters(*model, *other);
}

TEST(Checkpoint, OptimizerMismatchesFailAndChangeNothing) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam adam(model->parameters(), {.lr = 0.01});
  train(*model, adam, make_batch(1), 2);
  const std::string p = dir.file("c.safetensors");
  save(*model, adam, p);

  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  nn::SGD sgd(target->parameters(), {.lr = 0.1, .momentum = 0.9});
  TG_EXPECT_ERROR(load(*target, sgd, p), "holds Adam state but the optimizer is SGD");
  expect_unchanged(*target, s);
  nn::AdamW adamw(target->parameters());
  TG_EXPECT_ERROR(load(*target, adamw, p), "holds Adam state but the optimizer is AdamW");

  // An optimizer over parameters of another module cannot be named.
  auto stranger = small_cnn(3);
  nn::Adam foreign(stranger->parameters());
  TG_EXPECT_ERROR(load(*target, foreign, p), "optimizer parameter 0", "is not a parameter of the module");
  TG_EXPECT_ERROR(save(*target, foreign, p), "optimizer parameter 0", "is not a parameter of the module");

  // A weights-only file has no optimizer state to restore.
  save(*model, dir.file("w.safetensors"));
  nn::Adam fresh(target->parameters());
  TG_EXPECT_ERROR(load(*target, fresh, dir.file("w.safetensors")), "holds no optimizer state");

  // A mis-shaped state tensor is caught before anything is written.
  st::NamedTensors all = st::load_file(p);
  st::Metadata meta;
  st::load_file(p, &meta);
  for (auto& [name, t] : all)
    if (name == "optim.4.bias.exp_avg") t = zeros({4});
  st::save_file(all, p, meta);
  TG_EXPECT_ERROR(load(*target, fresh, p), "optim.4.bias.exp_avg", "f32[5]");
  expect_unchanged(*target, s);
  EXPECT_TRUE(fresh.state().empty());
  // State for a parameter the optimizer does not have.
  for (auto& [name, t] : all)
    if (name == "optim.4.bias.exp_avg") t = zeros({5});
  all.emplace_back("optim.9.weight.exp_avg", zeros({5}));
  st::save_file(all, p, meta);
  TG_EXPECT_ERROR(load(*target, fresh, p), "'optim.9.weight.exp_avg'", "not a parameter of this optimizer");
  expect_unchanged(*target, s);
}

TEST(Checkpoint, StaleOptimizerStateIsRefused) {
  TempDir dir;
  auto model = small_cnn(1);
  nn::Adam opt(model->parameters(), {.lr = 0.01});
  save(*model, opt, dir.file("c.safetensors"));  // before any step: no state at all
  train(*model, opt, make_batch(1), 1);
  const Snapshot s = snapshot(*model);
  TG_EXPECT_ERROR(load(*model, opt, dir.file("c.safetensors")), "already holds state", "freshly built");
  expect_unchanged(*model, s);
}

// A checkpoint whose optimizer values are corrupt (each would turn the weights into NaN at
// the next step, or is undefined to convert) is refused before anything changes: module,
// optimizer state, step count and lr.
TEST(Checkpoint, CorruptOptimizerValuesAreRefusedBeforeAnyChange) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors"), p = dir.file("bad.safetensors");
  auto model = small_cnn(1);
  nn::Adam adam(model->parameters(), {.lr = 0.01});
  train(*model, adam, make_batch(1), 2);
  save(*model, adam, good);
  st::Metadata meta;
  const st::NamedTensors all = st::load_file(good, &meta);
  const double nan = std::nan(""), inf = INFINITY;

  // Rewrites the good checkpoint with tensor `name` replaced, or metadata `key` set.
  auto with_tensor = [&](const std::string& name, Tensor value) {
    st::NamedTensors t = all;
    for (auto& [n, v] : t)
      if (n == name) v = value;
    st::save_file(t, p, meta);
  };
  auto with_meta = [&](const std::string& key, const std::string& value) {
    st::Metadata m = meta;
    for (auto& [k, v] : m)
      if (k == key) v = value;
    st::save_file(all, p, m);
  };
  auto expect_refused = [&](std::initializer_list<const char*> fragments, const std::string& what) {
    SCOPED_TRACE(what);
    auto target = small_cnn(2);
    const Snapshot s = snapshot(*target);
    nn::Adam fresh(target->parameters(), {.lr = 0.5});
    try {
      load(*target, fresh, p);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    expect_unchanged(*target, s);
    EXPECT_TRUE(fresh.state().empty());
    EXPECT_EQ(fresh.step_count(), 0);
    EXPECT_EQ(fresh.lr(), 0.5);
  };

  const std::string step = "optim.0.weight.step";
  for (double v : {nan, inf, -1.0, 2.5, 9007199254740994.0 /* 2^53 + 2 */}) {
    with_tensor(step, full({}, v, {.dtype = f64}));
    expect_refused({step.c_str(), "step count", "[0, 2^53]"}, "step " + std::to_string(v));
  }
  with_tensor(step, full({}, -3.0, {.dtype = f32}));
  expect_refused({step.c_str(), "step count"}, "f32 step");
  with_tensor(step, from_vector(std::vector<int64_t>{(int64_t{1} << 53) + 1}, {}));
  expect_refused({step.c_str(), "9007199254740993"}, "i64 step past 2^53");

  Tensor sq;
  for (const auto& [n, v] : all)
    if (n == "optim.0.weight.exp_avg_sq") sq = v.clone();
  Tensor neg = sq.clone();
  neg.data<float>()[5] = -1e-3f;
  with_tensor("optim.0.weight.exp_avg_sq", neg);
  expect_refused({"exp_avg_sq", "-0.001", "element 5", ">= 0"}, "negative exp_avg_sq");
  Tensor inf_sq = sq.clone();
  inf_sq.data<float>()[0] = inf;
  with_tensor("optim.0.weight.exp_avg_sq", inf_sq);
  expect_refused({"exp_avg_sq", "inf", "element 0"}, "infinite exp_avg_sq");
  Tensor nan_avg = sq.clone();
  nan_avg.data<float>()[7] = nan;
  with_tensor("optim.0.weight.exp_avg", nan_avg);
  expect_refused({"exp_avg", "nan", "must be finite"}, "NaN exp_avg");

  // The lr follows the optimizer's own rule (that of its constructor and set_lr).
  for (const char* lr : {"0", "-0.1", "inf", "nan", "-inf"}) {
    with_meta("tapegrad.optimizer.lr", lr);
    expect_refused({"tapegrad.optimizer.lr", "Adam", "invalid learning rate"}, std::string("lr ") + lr);
  }
  for (const char* lr : {"1e400", "0.1x", ""}) {
    with_meta("tapegrad.optimizer.lr", lr);
    expect_refused({"tapegrad.optimizer.lr", "not a number"}, std::string("lr ") + lr);
  }
  for (const char* steps : {"-1", "9007199254740993", "1.5", "1e3"}) {
    with_meta("tapegrad.optimizer.step_count", steps);
    expect_refused({"tapegrad.optimizer.step_count"}, std::string("step_count ") + steps);
  }

  // A partial state (a buffer without the step count) would restart bias correction.
  st::NamedTensors partial;
  for (const auto& [n, v] : all)
    if (n != step) partial.emplace_back(n, v);
  st::save_file(partial, p, meta);
  expect_refused({"lacks '0.step'"}, "missing step");

  // The good file still loads, and the edges of the ranges are accepted.
  with_tensor(step, from_vector(std::vector<int64_t>{int64_t{1} << 53}, {}));
  auto target = small_cnn(2);
  nn::Adam fresh(target->parameters());
  load(*target, fresh, p);
  EXPECT_EQ(fresh.step_count(0), int64_t{1} << 53);
  EXPECT_EQ(fresh.lr(), 0.01);
}

// SGD's momentum buffer: finite values only.
TEST(Checkpoint, NonFiniteMomentumIsRefused) {
  TempDir dir;
  const std::string p = dir.file("sgd.safetensors");
  auto model = small_cnn(1);
  nn::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  train(*model, sgd, make_batch(1), 1);
  save(*model, sgd, p);
  st::Metadata meta;
  st::NamedTensors all = st::load_file(p, &meta);
  for (auto& [n, v] : all)
    if (n == "optim.4.bias.momentum_buffer") v = full(v.shape(), -INFINITY);
  st::save_file(all, p, meta);
  auto target = small_cnn(2);
  const Snapshot s = snapshot(*target);
  nn::SGD fresh(target->parameters(), {.lr = 0.1, .momentum = 0.9});
  TG_EXPECT_ERROR(load(*target, fresh, p), "optim.4.bias.momentum_buffer", "-inf", "must be finite");
  expect_unchanged(*target, s);
  EXPECT_TRUE(fresh.state().empty());
}
