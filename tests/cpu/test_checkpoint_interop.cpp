// Checkpoint interop: tg::load's options (strict = false, prefix, convert_dtype), loading
// from tensors in memory, F16 / BF16 decoding, model-only saves PyTorch's strict
// load_state_dict accepts, and files written by PyTorch (tests/data/make_interop.py,
// checked in: tests/data/interop_*.safetensors).
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <unordered_map>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;
using Names = std::vector<std::string>;

namespace {

std::string data_file(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / name).string();
}

// The checked-in file, which must exist (a missing one is a failure, not a skip).
std::string interop_file(const std::string& name) {
  const std::string p = data_file(name);
  EXPECT_TRUE(std::filesystem::is_regular_file(p))
      << p << " is missing; regenerate with: python3 tests/data/make_interop.py --out tests/data";
  return p;
}

// tapegrad's version of make_interop.py's mlp(): Sequential(Linear(4, 3), ReLU, Linear(3, 2)).
std::shared_ptr<nn::Sequential> mlp(uint64_t seed = 1) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 3}));
  m->add(std::make_shared<nn::ReLU>());
  m->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 3, .out_features = 2}));
  return m;
}

// make_interop.py's Net: buffer "scale", modules "backbone" (the MLP) and "head".
struct Net : nn::Module {
  Tensor scale = zeros({2});
  std::shared_ptr<nn::Sequential> backbone = mlp(2);
  std::shared_ptr<nn::Linear> head =
      std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 2, .out_features = 1});
  Net() {
    register_buffer("scale", &scale);
    register_module("backbone", backbone);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override { return (*head)((*backbone)(x)); }
};

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<uint32_t> f32_bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float v : t.to_vector<float>()) out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

struct Snapshot {
  std::vector<Tensor> values;
  std::vector<uint64_t> versions;
};
Snapshot snapshot(const nn::Module& m) {
  Snapshot s;
  for (const auto& [name, t] : m.state_dict()) {
    s.values.push_back(t.clone());
    s.versions.push_back(t.version());
  }
  return s;
}
void expect_unchanged(const nn::Module& m, const Snapshot& s) {
  auto now = m.state_dict();
  ASSERT_EQ(now.size(), s.values.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(now[i].second, s.values[i])) << now[i].first << " changed";
    EXPECT_EQ(now[i].second.version(), s.versions[i]) << now[i].first << " was written";
  }
}

void expect_same_state(const nn::Module& a, const nn::Module& b) {
  auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(bitwise_equal(sa[i].second, sb[i].second)) << sa[i].first;
}

// Reference decoders written from the formats' definitions (not bit manipulation).
double f16_reference(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  if (exponent == 0x1f) v = mantissa ? std::nan("") : INFINITY;
  return sign ? -v : v;
}
double bf16_reference(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 7) & 0xff, mantissa = h & 0x7f;
  double v = exponent == 0 ? std::ldexp(mantissa, -133) : std::ldexp(128 + mantissa, exponent - 134);
  if (exponent == 0xff) v = mantissa ? std::nan("") : INFINITY;
  return sign ? -v : v;
}

}  // namespace

// ---- F16 / BF16 -------------------------------------------------------------------------

TEST(HalfDecoding, EveryBitPatternMatchesTheFormatsDefinition) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = st::decode_f16(b), g = st::decode_bf16(b);
    const double rf = f16_reference(b), rg = bf16_reference(b);
    if (std::isnan(rf)) {
      EXPECT_TRUE(std::isnan(f) && std::signbit(f) == bool(h >> 15)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(f), rf) << "f16 " << std::hex << h;
      EXPECT_EQ(std::signbit(f), bool(h >> 15)) << "f16 " << std::hex << h;  // -0 stays -0
    }
    if (std::isnan(rg)) {
      EXPECT_TRUE(std::isnan(g) && std::signbit(g) == bool(h >> 15)) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(g), rg) << "bf16 " << std::hex << h;
      EXPECT_EQ(std::signbit(g), bool(h >> 15)) << "bf16 " << std::hex << h;
    }
  }
  // NaN payloads move into the f32 payload's high bits: quiet stays quiet, signalling stays signalling.
  EXPECT_EQ(std::bit_cast<uint32_t>(st::decode_f16(0x7e00)), 0x7fc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(st::decode_f16(0xfd01)), 0xffa02000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(st::decode_bf16(0xffc1)), 0xffc10000u);
}

// make_interop.py's F16_BITS / BF16_BITS, and the f32 bits each stands for.
TEST(InteropFiles, PyTorchHalfTensorsDecodeToKnownBits) {
  const std::string p = interop_file("interop_dtypes.safetensors");
  st::Header h = st::read_header(p);
  ASSERT_NE(h.find("f16"), nullptr);
  EXPECT_EQ(h.find("f16")->dtype, "F16");  // the header keeps the file's dtype
  EXPECT_EQ(h.find("bf16")->dtype, "BF16");
  std::map<std::string, Tensor> kept;  // not widened: the tensors keep the file's dtype and bits
  for (auto& [name, value] : st::load_file(p)) kept.emplace(name, value);
  EXPECT_EQ(kept["f16"].dtype(), DType::f16);
  EXPECT_EQ(kept["bf16"].dtype(), DType::bf16);
  std::map<std::string, Tensor> t;
  for (auto& [name, value] : st::load_file(p, nullptr, /*widen_half=*/true)) t.emplace(name, value);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t["f16"].dtype(), f32);
  EXPECT_EQ(t["bf16"].dtype(), f32);
  const std::vector<uint32_t> f16_expected = {0x00000000, 0x80000000, 0x33800000, 0x387fc000, 0xb8000000, 0x38800000,
                                              0x3f800000, 0xc0000000, 0x477fe000, 0x7f800000, 0xff800000, 0x7fc00000};
  const std::vector<uint32_t> bf16_expected = {0x00000000, 0x80000000, 0x00010000, 0x007f0000, 0x80400000, 0x00800000,
                                               0x3f800000, 0xc0000000, 0x7f7f0000, 0x7f800000, 0xff800000, 0xffc10000};
  EXPECT_EQ(f32_bits(t["f16"]), f16_expected);
  EXPECT_EQ(f32_bits(t["bf16"]), bf16_expected);
  EXPECT_EQ(f32_bits(kept["f16"]), f16_expected);  // to_vector<float> widens them the same way
  EXPECT_EQ(f32_bits(kept["bf16"]), bf16_expected);
  EXPECT_EQ(t["f16"].to_vector<float>()[2], std::ldexp(1.0f, -24));   // smallest f16 subnormal
  EXPECT_EQ(t["bf16"].to_vector<float>()[2], std::ldexp(1.0f, -133)); // smallest bf16 subnormal
  // And PyTorch's own conversion (.float()) agrees, NaNs up to their payload (torch
  // canonicalizes them).
  for (const char* name : {"f16", "bf16"}) {
    auto ours = t[name].to_vector<float>(), torchs = t[std::string(name) + ".as_f32"].to_vector<float>();
    ASSERT_EQ(ours.size(), torchs.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      if (std::isnan(torchs[i]))
        EXPECT_TRUE(std::isnan(ours[i]) && std::signbit(ours[i]) == std::signbit(torchs[i])) << name << " " << i;
      else
        EXPECT_EQ(std::bit_cast<uint32_t>(ours[i]), std::bit_cast<uint32_t>(torchs[i])) << name << " " << i;
    }
  }
  EXPECT_EQ(t["f32"].to_vector<float>(), std::vector<float>({0.1f, -1e-45f, 3.4028235e38f, INFINITY}));
  EXPECT_EQ(t["f64"].to_vector<double>(), std::vector<double>({0.1, -5e-324, 1e300, 1.0 / 3}));
}

TEST(InteropFiles, HalfFilesNeedConvertDtypeAndThenMatchTheF32File) {
  auto ref = mlp(1);
  EXPECT_TRUE(load(*ref, interop_file("interop_mlp_f32.safetensors")).missing.empty());
  for (const char* file : {"interop_mlp_f16.safetensors", "interop_mlp_bf16.safetensors"}) {
    const std::string code = std::string(file).find("bf16") != std::string::npos ? "BF16" : "F16";
    auto m = mlp(2);
    const Snapshot s = snapshot(*m);
    try {
      load(*m, interop_file(file));
      ADD_FAILURE() << "a " << code << " file loaded into f32 parameters without convert_dtype";
    } catch (const DTypeError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("tensor '0.weight' is " + code), std::string::npos) << msg;
      EXPECT_NE(msg.find("the module's parameter is f32[3, 4] on cpu (F32)"), std::string::npos) << msg;
      EXPECT_NE(msg.find(".convert_dtype = true"), std::string::npos) << msg;
    }
    expect_unchanged(*m, s);
    LoadResult r = load(*m, interop_file(file), {.convert_dtype = true});
    EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
    expect_same_state(*ref, *m);  // the values are exact in all three dtypes
  }
  // An f64 model: f16 -> f64 and f32 -> f64 are exact too.
  auto m64 = mlp(3), ref64 = mlp(4);
  m64->to(f64);
  ref64->to(f64);
  load(*m64, interop_file("interop_mlp_f16.safetensors"), {.convert_dtype = true});
  load(*ref64, interop_file("interop_mlp_f32.safetensors"), {.convert_dtype = true});
  expect_same_state(*ref64, *m64);
  EXPECT_EQ(m64->state_dict()[0].second.to_vector<double>(),
            [&] { auto v = ref->state_dict()[0].second.to_vector<float>(); return std::vector<double>(v.begin(), v.end()); }());
}

TEST(InteropFiles, PrefixLoadsTheBackboneOfAPyTorchModel) {
  const std::string p = interop_file("interop_net_bf16.safetensors");
  auto ref = mlp(1);
  load(*ref, interop_file("interop_mlp_f32.safetensors"));

  // The whole model: buffer and both submodules, strictly.
  Net net;
  LoadResult all = load(net, p, {.convert_dtype = true});
  EXPECT_TRUE(all.missing.empty() && all.unexpected.empty());
  EXPECT_EQ(net.scale.to_vector<float>(), std::vector<float>({0.5f, -4.0f}));
  expect_same_state(*ref, *net.backbone);

  // The backbone alone, from the "backbone." keys; "head.*" and "scale" are not considered.
  auto backbone = mlp(5);
  LoadResult r = load(*backbone, p, {.prefix = "backbone.", .convert_dtype = true});
  EXPECT_EQ(r.missing, Names{});
  EXPECT_EQ(r.unexpected, Names{});
  expect_same_state(*ref, *backbone);

  // Without the prefix nothing matches: strict fails naming the keys, changing nothing ...
  auto other = mlp(6);
  const Snapshot s = snapshot(*other);
  TG_EXPECT_ERROR(load(*other, p, {.convert_dtype = true}), "has no tensor '0.weight'",
                  "also missing: '0.bias', '2.weight', '2.bias'", "unexpected: 'backbone.0.bias'", "'scale'",
                  ".strict = false");
  expect_unchanged(*other, s);
  // ... and non-strict reports them all: missing by the module's names, unexpected by the file's.
  LoadResult none = load(*other, p, {.strict = false, .convert_dtype = true});
  EXPECT_EQ(none.missing, Names({"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(none.unexpected, Names({"backbone.0.bias", "backbone.0.weight", "backbone.2.bias", "backbone.2.weight",
                                    "head.bias", "head.weight", "scale"}));  // the file's order
  expect_unchanged(*other, s);
}

// ---- strict = false, prefix, conversion (files written here) ------------------------------

TEST(LoadOptions, NonStrictLoadsWhatMatchesAndReportsTheRest) {
  TempDir dir;
  const std::string p = dir.file("partial.safetensors");
  auto src = mlp(1);
  st::NamedTensors tensors;
  for (auto& [name, t] : src->state_dict())
    if (name != "2.bias") tensors.emplace_back(name, t);
  tensors.emplace_back("extra.w", ones({2}));
  st::save_file(tensors, p);

  auto m = mlp(2);
  const Snapshot s = snapshot(*m);
  TG_EXPECT_ERROR(load(*m, p), "has no tensor '2.bias'", "f32[2]", "unexpected: 'extra.w'");
  expect_unchanged(*m, s);
  const Tensor bias_before = s.values[3];
  LoadResult r = load(*m, p, {.strict = false});
  EXPECT_EQ(r.missing, Names{"2.bias"});
  EXPECT_EQ(r.unexpected, Names{"extra.w"});
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(bitwise_equal(m->state_dict()[i].second, src->state_dict()[i].second)) << i;
  EXPECT_TRUE(bitwise_equal(m->state_dict()[3].second, bias_before)) << "a missing tensor is left as it was";

  // Only unexpected: strict names it (and the others), non-strict loads everything.
  tensors.emplace_back("2.bias", src->state_dict()[3].second);
  tensors.emplace_back("extra.v", ones({1}));
  st::save_file(tensors, p);
  auto m2 = mlp(3);
  TG_EXPECT_ERROR(load(*m2, p), "holds tensor 'extra.w' F32[2] (header byte", "nor for 'extra.v'");
  LoadResult r2 = load(*m2, p, {.strict = false});
  EXPECT_EQ(r2.missing, Names{});
  EXPECT_EQ(r2.unexpected, Names({"extra.w", "extra.v"}));
  expect_same_state(*src, *m2);
}

TEST(LoadOptions, ShapeMismatchFailsEvenWhenNotStrict) {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : mlp(1)->state_dict()) state.emplace(name, t.clone());
  state["2.bias"] = ones({3});
  auto m = mlp(2);
  const Snapshot s = snapshot(*m);
  try {
    load(*m, state, {.strict = false, .convert_dtype = true});
    ADD_FAILURE() << "a mis-shaped tensor loaded";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '2.bias' has shape [3] in the state map"), std::string::npos)
        << e.what();
  }
  expect_unchanged(*m, s);
}

TEST(LoadOptions, PrefixIgnoresOtherKeysButReportsItsOwn) {
  TempDir dir;
  const std::string p = dir.file("prefixed.safetensors");
  auto src = mlp(1);
  st::NamedTensors tensors;
  for (auto& [name, t] : src->state_dict()) tensors.emplace_back("enc." + name, t);
  tensors.emplace_back("enc.extra", ones({1}));
  tensors.emplace_back("dec.0.weight", ones({3, 4}));  // another prefix: not considered
  tensors.emplace_back("encoder.x", ones({1}));        // a longer word, not "enc."
  st::save_file(tensors, p);

  auto m = mlp(2);
  TG_EXPECT_ERROR(load(*m, p, {.prefix = "enc."}), "holds tensor 'enc.extra'");
  LoadResult r = load(*m, p, {.strict = false, .prefix = "enc."});
  EXPECT_EQ(r.missing, Names{});
  EXPECT_EQ(r.unexpected, Names{"enc.extra"});
  expect_same_state(*src, *m);
  // A key missing under the prefix is named with it.
  auto m2 = mlp(3);
  TG_EXPECT_ERROR(load(*m2, p, {.prefix = "dec."}), "has no tensor 'dec.0.bias'");
}

TEST(LoadOptions, ConvertDtypeRoundsAndNeverConvertsIntegers) {
  auto m = mlp(1);  // f32
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : m->state_dict()) state.emplace(name, full(t.shape(), 0.1, {.dtype = f64}));
  state["2.bias"] = from_vector(std::vector<double>{1e300, -1.0 / 3}, {2});
  const Snapshot s = snapshot(*m);
  TG_EXPECT_ERROR(load(*m, state), "tensor '0.weight' is F64 in the state map", "f32[3, 4] on cpu (F32)",
                  ".convert_dtype = true");
  expect_unchanged(*m, s);
  load(*m, state, {.convert_dtype = true});
  for (float v : m->state_dict()[0].second.to_vector<float>()) EXPECT_EQ(v, 0.1f);  // round to nearest
  EXPECT_EQ(m->state_dict()[3].second.to_vector<float>(), std::vector<float>({INFINITY, static_cast<float>(-1.0 / 3)}));

  // i64 never converts, with or without the option (and the message offers no option).
  state["2.bias"] = from_vector(std::vector<int64_t>{1, 2}, {2});
  const Snapshot s2 = snapshot(*m);
  try {
    load(*m, state, {.convert_dtype = true});
    ADD_FAILURE() << "an I64 tensor loaded into a float parameter";
  } catch (const DTypeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor '2.bias' is I64"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("convert_dtype"), std::string::npos) << msg;
  }
  expect_unchanged(*m, s2);
}

// ---- in-memory state ----------------------------------------------------------------------

TEST(LoadOptions, LoadsFromMapsWithTheFileRules) {
  auto src = mlp(1);
  std::map<std::string, Tensor> ordered;
  std::unordered_map<std::string, Tensor> hashed;
  for (auto& [name, t] : src->state_dict()) {
    ordered.emplace(name, t.clone());
    hashed.emplace("model." + name, t.clone());
  }
  auto a = mlp(2);
  std::vector<Tensor> handles = a->parameters();
  LoadResult r = load(*a, ordered);
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
  expect_same_state(*src, *a);
  for (size_t i = 0; i < handles.size(); ++i) EXPECT_TRUE(handles[i].same(a->parameters()[i])) << "in place";
  // The map's tensors are copied, not shared.
  ordered.begin()->second.fill_(7.0);
  expect_same_state(*src, *a);

  auto b = mlp(3);
  EXPECT_TRUE(load(*b, hashed, {.prefix = "model."}).missing.empty());
  expect_same_state(*src, *b);

  // Missing and unexpected, as from a file; the map's order for unexpected.
  ordered.erase("0.bias");
  ordered.emplace("z", ones({1}));
  ordered.emplace("a", ones({1}));
  auto c = mlp(4);
  const Snapshot s = snapshot(*c);
  TG_EXPECT_ERROR(load(*c, ordered), "the state map has no tensor '0.bias'", "unexpected: 'a', 'z'");
  expect_unchanged(*c, s);
  LoadResult rc = load(*c, ordered, {.strict = false});
  EXPECT_EQ(rc.missing, Names{"0.bias"});
  EXPECT_EQ(rc.unexpected, Names({"a", "z"}));

  std::map<std::string, Tensor> undefined{{"0.weight", Tensor()}};
  TG_EXPECT_ERROR(load(*c, undefined, {.strict = false}), "'0.weight' is undefined");
}

// ---- model-only saves -----------------------------------------------------------------------

// What PyTorch's load_state_dict(strict=True) needs of a file read by safetensors.torch's
// load_file: exactly the module's state_dict keys with its shapes, dtypes torch knows, and
// a file that follows the format (offsets tiling the data in order, string metadata).
void expect_pytorch_state_dict_file(const std::string& path, const nn::Module& m) {
  st::Header h = st::read_header(path);
  auto sd = m.state_dict();
  ASSERT_EQ(h.tensors.size(), sd.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < sd.size(); ++i) {
    const st::TensorInfo& t = h.tensors[i];
    EXPECT_EQ(t.name, sd[i].first);
    EXPECT_EQ(t.dtype, st::dtype_code(sd[i].second.dtype()));
    EXPECT_EQ(Shape(t.shape), sd[i].second.shape());
    EXPECT_EQ(t.begin, offset) << t.name;
    EXPECT_EQ(t.end - t.begin, sd[i].second.nbytes()) << t.name;
    offset = t.end;
  }
  EXPECT_EQ(h.data_start + offset, h.file_size);
  EXPECT_EQ(h.data_start % 8, 0u);  // data aligned, as the reference writer does
  for (const auto& [key, value] : h.metadata) EXPECT_FALSE(key.starts_with("tapegrad.optimizer")) << key;
}

TEST(SaveOptions, ModelOnlyDropsOptimizerStateForPyTorch) {
  TempDir dir;
  auto m = mlp(1);
  nn::Adam opt(m->parameters(), {.lr = 1e-2});
  {
    Tape tape;
    Tensor loss = sum((*m)(ones({5, 4})));
    tape.backward(loss);
    opt.step();
  }
  const std::string full = dir.file("full.safetensors"), model_only = dir.file("model_only.safetensors"),
                    plain = dir.file("plain.safetensors");
  save(*m, opt, full);
  save(*m, opt, model_only, {.model_only = true});
  save(*m, plain);
  save(*m, dir.file("plain_opt.safetensors"), {.model_only = true});  // accepted, no effect

  // The full checkpoint holds optim.* keys (PyTorch's strict load refuses those).
  st::Header hf = st::read_header(full);
  EXPECT_NE(hf.find("optim.0.weight.exp_avg"), nullptr);
  EXPECT_NE(hf.find_metadata("tapegrad.optimizer"), nullptr);
  expect_pytorch_state_dict_file(model_only, *m);
  expect_pytorch_state_dict_file(plain, *m);
  EXPECT_EQ(read_file_bytes(model_only), read_file_bytes(plain));
  EXPECT_EQ(read_file_bytes(dir.file("plain_opt.safetensors")), read_file_bytes(plain));

  // Both load back into tapegrad, strictly.
  auto back = mlp(2);
  load(*back, model_only);
  expect_same_state(*m, *back);

  // A buffered, nested model too.
  Net net;
  const std::string net_file = dir.file("net.safetensors");
  save(net, net_file);
  expect_pytorch_state_dict_file(net_file, net);

  // With TG_INTEROP_ROUNDTRIP_DIR set, leave the files for
  // `python3 tests/data/make_interop.py --check-roundtrip DIR` (PyTorch's strict load; the
  // half-precision results it also checks come from test_half_ops).
  if (const char* out = std::getenv("TG_INTEROP_ROUNDTRIP_DIR")) {
    std::filesystem::create_directories(out);
    save(*m, opt, std::string(out) + "/tg_mlp_model_only.safetensors", {.model_only = true});
    save(*m, opt, std::string(out) + "/tg_mlp_with_optimizer.safetensors");
    save(net, std::string(out) + "/tg_net.safetensors");
  }
}
