// Seeded random fuzzing of the checkpoint loaders: valid files mutated byte-wise (bit flips,
// hostile bytes, splices, truncation, the header length) and structurally (numbers, dtypes,
// shapes with huge, zero and negative dims, offsets, names, nesting, optimizer values and
// metadata). Every input must load or raise tg::Error: anything else (a crash, another
// exception, a sanitizer report: scripts/sanitize-cpu runs this too) is a failure. A load
// that fails must leave the model and optimizer as they were.
//
// Each test runs for a bounded time (TG_FUZZ_SECONDS, default 2 s each) from a fixed seed
// (TG_FUZZ_SEED); every iteration draws from its own generator seeded by (seed, iteration),
// so a failure reported as "seed S iteration I" replays with TG_FUZZ_SEED=S TG_FUZZ_ITER=I.
// The failing input is also written next to the report.
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <typeinfo>

#include "common/fixtures.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "nn/checkpoint.h"

using namespace tg;
using namespace tg::test;
namespace st = tg::safetensors;

namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t bits() { return g_(); }
  size_t below(size_t n) { return n ? static_cast<size_t>(g_() % n) : 0; }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(g_) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::mt19937_64 g_;
};

uint64_t header_length(const std::string& f) {
  uint64_t n = 0;
  for (int i = 7; i >= 0 && f.size() >= 8; --i) n = (n << 8) | static_cast<unsigned char>(f[i]);
  return n;
}

void set_header_length(std::string& f, uint64_t n) {
  for (int i = 0; i < 8 && i < static_cast<int>(f.size()); ++i) f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
}

const std::vector<std::string> kNumbers = {
    "0", "1", "2", "3", "4", "8", "-1", "-0", "00", "01", "1.0", "1e3", "1E+2", "0.5", "-2147483648",
    "2147483647", "2147483648", "2147483649", "4294967295", "4294967296", "4611686018427387904",
    "4611686018427387905", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "18446744073709551615", "18446744073709551616", "99999999999999999999999999999", "1e400", "-1e400", "1e-400"};
const std::vector<std::string> kDtypes = {"F32", "F64", "I64", "BF16", "F16", "I32", "U8", "BOOL", "F8_E4M3",
                                          "C64", "U64", "", "f32", "F320", "\\u0046\\u0033\\u0032", "\xff"};
const std::vector<std::string> kFragments = {
    "[", "]", "{", "}", "\"", ",", ":", "\\", "\\u", "\\ud800", "\\udc00\\ud800", "\\u0000", "null", "true",
    "[[[[[[[[[[", "{\"a\":{\"b\":{\"c\":", "\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x01", "\n",
    " ", "\"__metadata__\":", "\"dtype\":", "\"shape\":", "\"data_offsets\":", "\"x\":1,", "1e", "-", "."};

// One structural or byte-level change to a valid file `f`; `kind` picks one (-1: any).
constexpr int kKinds = 12, kDataValues = 11;
std::string mutate(std::string f, Rng& r, int kind = -1) {
  if (f.size() < 8) return f + std::string(r.below(16), static_cast<char>(r.bits()));  // truncated earlier
  const size_t hlen = std::min<uint64_t>(header_length(f), f.size() - 8);
  std::string header = f.substr(8, hlen), data = f.substr(8 + hlen);
  bool fix_length = r.coin(0.85);  // most mutations should reach the JSON parser
  auto replace_numbers = [&](const std::vector<std::string>& with) {
    // Replace a random run of digits in the header.
    for (int tries = 0; tries < 8; ++tries) {
      size_t i = r.below(header.size());
      if (!std::isdigit(static_cast<unsigned char>(header[i]))) continue;
      size_t b = i, e = i;
      while (b > 0 && std::isdigit(static_cast<unsigned char>(header[b - 1]))) --b;
      while (e < header.size() && std::isdigit(static_cast<unsigned char>(header[e]))) ++e;
      header.replace(b, e - b, r.pick(with));
      return;
    }
  };
  auto replace_after = [&](const std::string& key, const std::string& value_end, const std::string& with) {
    std::vector<size_t> at;
    for (size_t p = header.find(key); p != std::string::npos; p = header.find(key, p + 1)) at.push_back(p);
    if (at.empty()) return;
    const size_t b = r.pick(at) + key.size(), e = header.find(value_end, b);
    if (e != std::string::npos) header.replace(b, e + value_end.size() - b, with);
  };
  switch (kind >= 0 ? kind : static_cast<int>(r.below(kKinds))) {
    case 0:  // bit flips in the header
      for (int k = 1 + static_cast<int>(r.below(8)); k > 0 && !header.empty(); --k)
        header[r.below(header.size())] ^= static_cast<char>(1u << r.below(8));
      break;
    case 1:  // hostile bytes anywhere (the length field and the data included)
      for (int k = 1 + static_cast<int>(r.below(4)); k > 0; --k) {
        const std::string frag = r.pick(kFragments);
        f = f.substr(0, 8) + header + data;
        f[r.below(f.size())] = frag[0];
      }
      return f;
    case 2: {  // the header length field
      std::vector<uint64_t> lengths = {0, 1, 7, hlen - 1, hlen + 1, hlen + 8, f.size() - 8, f.size() - 7,
                                       100'000'000, 100'000'001, UINT64_MAX, uint64_t{1} << 63, r.bits()};
      set_header_length(f, r.pick(lengths));
      return f;
    }
    case 3:  // truncated, or extended
      if (r.coin()) return f.substr(0, r.below(f.size() + 1));
      return f + std::string(1 + r.below(64), static_cast<char>(r.bits()));
    case 4: replace_numbers(kNumbers); break;
    case 5: replace_after("\"dtype\":\"", "\"", r.pick(kDtypes) + "\""); break;
    case 6: {  // a shape: huge, zero, negative and many dims
      std::string shape = "[";
      const size_t dims = r.coin(0.05) ? 60 + r.below(20) : r.below(8);
      for (size_t d = 0; d < dims; ++d) shape += (d ? "," : "") + r.pick(kNumbers);
      replace_after("\"shape\":", "]", shape + "]");
      break;
    }
    case 7: {  // offsets: plausible, swapped, overlapping, huge
      const std::string a = std::to_string(r.below(data.size() + 2)), b = std::to_string(r.below(data.size() + 2));
      const std::vector<std::string> offsets = {"[" + a + "," + b + "]", "[" + r.pick(kNumbers) + "," + b + "]",
                                                "[0]", "[0,0,0]", "[]", "[" + a + "," + r.pick(kNumbers) + "]",
                                                "{}", "\"0,4\""};
      replace_after("\"data_offsets\":", "]", r.pick(offsets));
      break;
    }
    case 8: {  // splice: a random region of the header deleted or duplicated
      const size_t b = r.below(header.size() + 1), n = r.below(std::min<size_t>(64, header.size() - b + 1));
      if (r.coin()) header.erase(b, n);
      else header.insert(r.below(header.size() + 1), header.substr(b, n));
      break;
    }
    case 9:  // a JSON fragment inserted
      header.insert(r.below(header.size() + 1), r.pick(kFragments));
      break;
    case 10: {  // a tensor name: duplicated, reserved, escaped, not UTF-8
      const std::vector<std::string> names = {"__metadata__", "", "a", "\\u0000", "\\ud83d\\ude00", "\xff\xfe",
                                              "\xc3\xa9", "optim.0.weight.step", "0.weight"};
      const size_t q = header.find('"', 1 + r.below(header.size()));
      if (q != std::string::npos) {
        const size_t e = header.find('"', q + 1);
        if (e != std::string::npos) header.replace(q + 1, e - q - 1, r.pick(names));
      }
      break;
    }
    default:  // kDataValues: data bytes: NaN, inf, negatives and huge values where numbers are read
      for (int k = 1 + static_cast<int>(r.below(4)); k > 0 && data.size() >= 8; --k) {
        const double values[] = {std::nan(""), INFINITY, -INFINITY, -1.0, -1e-30, 0.5, 9007199254740993.0, 1e300};
        const float fvalues[] = {std::nanf(""), INFINITY, -INFINITY, -1.0f, -1e-30f, 0.5f, 3e38f};
        const size_t at = r.below(data.size() / 4) * 4;
        if (r.coin() && at + 8 <= data.size()) std::memcpy(&data[at], &values[r.below(8)], 8);
        else std::memcpy(&data[at], &fvalues[r.below(7)], 4);
      }
      fix_length = false;
      break;
  }
  std::string out = f.substr(0, 8) + header + data;
  if (fix_length) set_header_length(out, header.size());
  return out;
}

// Runs `check` on mutated copies of `seeds` for the time budget; `check` returns a
// description of a broken invariant, or "" if the input was handled.
// `data_bias`: the share of inputs whose only mutations are of data values (their header
// stays valid, so they reach the checks of values rather than of the format).
void fuzz(const std::string& name, const std::vector<std::string>& seeds, double data_bias,
          const std::function<std::string(const std::string& path)>& check) {
  TempDir dir;
  const std::string path = dir.file("fuzz.safetensors");
  const uint64_t seed = env_u64("TG_FUZZ_SEED", 20251127);
  const double seconds = static_cast<double>(env_u64("TG_FUZZ_SECONDS", 2));
  const uint64_t only = env_u64("TG_FUZZ_ITER", UINT64_MAX);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t iterations = 0, loaded = 0;
  for (uint64_t it = only == UINT64_MAX ? 0 : only; it < 2'000'000; ++it) {
    if (only == UINT64_MAX && std::chrono::steady_clock::now() > deadline) break;
    Rng r(seed * 0x9E3779B97F4A7C15ull + it);
    std::string input = r.pick(seeds);
    const int kind = r.coin(data_bias) ? kDataValues : -1;
    for (int m = 1 + static_cast<int>(r.below(3)); m > 0; --m) input = mutate(input, r, kind);
    write_bytes(path, input);
    std::string problem;
    try {
      problem = check(path);
      loaded += problem.empty();
    } catch (const Error&) {
      // the expected way to refuse an input
    } catch (const std::exception& e) {
      problem = std::string("threw ") + typeid(e).name() + " (not tg::Error): " + e.what();
    } catch (...) {
      problem = "threw something that is not a std::exception";
    }
    ++iterations;
    if (!problem.empty()) {
      const std::string kept = std::filesystem::temp_directory_path() /
                               (name + "_failure_" + std::to_string(seed) + "_" + std::to_string(it) + ".bin");
      write_bytes(kept, input);
      FAIL() << name << ": seed " << seed << " iteration " << it << ": " << problem << " (input kept in " << kept
             << "; replay with TG_FUZZ_SEED=" << seed << " TG_FUZZ_ITER=" << it << ")";
    }
    if (only != UINT64_MAX) break;
  }
  std::cout << "[ note ] " << name << ": " << iterations << " inputs, " << loaded << " loaded, the rest refused\n";
  EXPECT_GT(iterations, 0u);
}

}  // namespace

// The format layer: read_header and load_file on mutated files of every layout the writer
// and other writers produce.
TEST(SafetensorsFuzz, LoaderRefusesOrLoadsEveryInput) {
  TempDir dir;
  std::vector<std::string> seeds;
  auto add = [&](const st::NamedTensors& t, const st::Metadata& m) {
    st::save_file(t, dir.file("seed.safetensors"), m);
    seeds.push_back(read_bytes(dir.file("seed.safetensors")));
  };
  manual_seed(1);
  add({{"w", randn({3, 4})}, {"b", randn({4}, {.dtype = f64})}}, {{"format", "pt"}});
  add({{"i", from_vector(std::vector<int64_t>{1, -2, 3}, {3})}, {"s", full({}, 2.0)}, {"e", zeros({0, 5})}}, {});
  add({{"\xc3\xa9t\xc3\xa9", ones({2, 1, 2})}}, {{"k", "v"}, {"note", "\"quoted\"\n"}});
  // Another writer's layout: a foreign dtype, fields in another order, whitespace.
  std::string h =
      "{ \"h\" : {\"shape\": [2], \"data_offsets\": [0, 4], \"dtype\": \"BF16\"},\n"
      "  \"f\": {\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[4,8]}, \"__metadata__\": {} }  ";
  std::string f(8, '\0');
  set_header_length(f, h.size());
  seeds.push_back(f + h + "abcd" + std::string("\0\0\x80\x3f", 4));

  fuzz("safetensors_loader", seeds, 0.05, [](const std::string& path) -> std::string {
    const st::Header h = st::read_header(path);
    // What read_header promised: byte ranges that match the shapes and tile the data.
    uint64_t total = 0;
    for (const st::TensorInfo& t : h.tensors) {
      if (h.find(t.name) != &t) return "Header::find('" + t.name + "') does not find its entry";
      total += t.end - t.begin;
    }
    if (h.data_start + total != h.file_size) return "the tensors do not tile the data section";
    st::Metadata meta;
    const st::NamedTensors loaded = st::load_file(path, &meta);
    if (loaded.size() != h.tensors.size()) return "load_file returned another number of tensors";
    for (size_t i = 0; i < loaded.size(); ++i)
      if (loaded[i].second.nbytes() != h.tensors[i].end - h.tensors[i].begin) return "a tensor of another size";
    return "";
  });
}

// The checkpoint layer: tg::load of a model and its Adam state from mutated training
// checkpoints (values, step counts, lr and names included). All or nothing: a refused file
// leaves the model's values and versions, and the optimizer's state, step count and lr.
TEST(SafetensorsFuzz, CheckpointLoadIsAllOrNothing) {
  TempDir dir;
  std::vector<std::string> seeds;
  {
    auto model = small_cnn(1);
    nn::Adam adam(model->parameters(), {.lr = 0.01});
    manual_seed(2);
    Tensor x = randn({2, 3, 5, 5});
    for (int s = 0; s < 2; ++s) {
      Tape tape;
      Tensor loss = mean((*model)(x));
      tape.backward(loss);
      adam.step();
      adam.zero_grad();
    }
    save(*model, adam, dir.file("seed.safetensors"));
    seeds.push_back(read_bytes(dir.file("seed.safetensors")));
    save(*model, dir.file("seed.safetensors"));  // weights only
    seeds.push_back(read_bytes(dir.file("seed.safetensors")));
  }
  // The valid training checkpoint is the most fruitful seed: weigh it up.
  for (int k = 0; k < 8; ++k) seeds.push_back(seeds[0]);
  // Metadata values a file may hold instead of the writer's.
  for (const char* key : {"\"tapegrad.optimizer.lr\":\"", "\"tapegrad.optimizer.step_count\":\""}) {
    for (const char* value : {"0", "-1", "inf", "nan", "1e400", "9007199254740993", "2.5", "", "0x10"}) {
      std::string f = seeds[0];
      const size_t hlen = header_length(f);
      std::string header = f.substr(8, hlen);
      const size_t b = header.find(key);
      if (b == std::string::npos) continue;
      const size_t vb = b + std::strlen(key), ve = header.find('"', vb);
      header.replace(vb, ve - vb, value);
      std::string out(8, '\0');
      set_header_length(out, header.size());
      seeds.push_back(out + header + f.substr(8 + hlen));
    }
  }

  fuzz("checkpoint_loader", seeds, 0.4, [&](const std::string& path) -> std::string {
    auto target = small_cnn(3);
    nn::Adam adam(target->parameters(), {.lr = 0.5});
    std::vector<Tensor> before;
    std::vector<uint64_t> versions;
    for (const Tensor& p : target->parameters()) before.push_back(p.clone()), versions.push_back(p.version());
    try {
      load(*target, adam, path);
    } catch (const Error&) {
      auto params = target->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        if (!bitwise_equal(params[i], before[i]) || params[i].version() != versions[i])
          return "a refused load changed parameter " + std::to_string(i);
      if (!adam.state().empty() || adam.step_count() != 0 || adam.lr() != 0.5)
        return "a refused load changed the optimizer";
      throw;
    }
    // Loaded: whatever it holds must be usable without turning the weights into NaN.
    for (const auto& [key, v] : adam.state())
      for (double x : v.to_vector<double>())
        if (!std::isfinite(x) || (key.ends_with("exp_avg_sq") && x < 0)) return "loaded a bad value in " + key;
    return "";
  });
}
