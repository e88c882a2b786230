// Checkpoints: the safetensors reader and writer (layout, JSON header, every kind of corrupt
// file), tg::save / tg::load of modules and optimizer state (PyTorch names, strict and
// all-or-nothing loading, atomic saves), and bit-identical resumption of training.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

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
  TG_EXPECT_ERROR(json::parse("{\"a\": tru}"), "expected a value", "at byte 6");
  TG_EXPECT_ERROR(json::parse("{\"a\": \"x"), "unterminated string");
  TG_EXPECT_ERROR(json::parse("{} x"), "after the end", "at byte 3");
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
  write_bytes(p, file_bytes("{\"__metadata__\":" + std::string(5000, '[') + "}", data));
  TG_EXPECT_ERROR(st::read_header(p), "nesting deeper");
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

TEST(Checkpoint, SaveIntoAReadOnlyDirectoryFailsAndKeepsTheFile) {
  TempDir dir;
  auto a = small_cnn(1);
  const std::string p = dir.file("ro/m.safetensors");
  std::filesystem::create_directories(dir.file("ro"));
  save(*a, p);
  const std::string before = read_bytes(p);
  ::chmod(dir.file("ro").c_str(), 0555);
  if (::access(dir.file("ro").c_str(), W_OK) == 0) {
    ::chmod(dir.file("ro").c_str(), 0755);
    GTEST_SKIP() << "running as root: permissions do not stop writes (the fault hook test covers this)";
  }
  auto b = small_cnn(2);
  TG_EXPECT_ERROR(save(*b, p), "cannot create", "is the directory writable");
  ::chmod(dir.file("ro").c_str(), 0755);
  EXPECT_EQ(read_bytes(p), before);
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
