// Deterministic fuzzing of every op's argument validation: thousands of random (seeded)
// shapes and parameters per op, valid and invalid. Each case's validity and output shape
// come from an independent statement of the op's rules (below, next to each generator);
// an invalid case must raise tg::Error, a valid one must run and give the predicted shape,
// and nothing may crash (run it under scripts/sanitize-cpu). A share of the valid cases
// also runs backward, whose gradients must have their inputs' shapes. Sizes stay tiny.
#include <functional>
#include <random>
#include <sstream>

#include "common/test_util.h"

using namespace tg;
using namespace tg::test;

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  int64_t between(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }  // inclusive
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(gen_) < p; }
  template <class T> const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(between(0, v.size() - 1))]; }

 private:
  std::mt19937_64 gen_;
};

std::string str(const std::vector<int64_t>& v) { return Shape(v).str(); }

// What one case expects: valid with this output shape, or invalid.
struct Expect {
  bool valid = true;
  Shape shape;
  std::string why;  // for invalid cases: which rule is broken (for failure messages)
  void reject(const std::string& reason) {
    if (valid) why = reason;
    valid = false;
  }
};

struct Case {
  std::string desc;
  std::vector<Tensor> inputs;  // every tensor argument, some possibly undefined
  std::function<Tensor(const std::vector<Tensor>&)> run;
  Expect expect;
};

class Fuzzer {
 public:
  explicit Fuzzer(const char* op) : op_(op) {}

  void check(Case c, bool with_backward) {
    ++cases_;
    Tensor y;
    try {
      y = c.run(c.inputs);
    } catch (const Error& e) {
      if (c.expect.valid) fail(c, std::string("rejected a valid case: ") + e.what());
      else ++rejected_;
      return;
    }
    if (!c.expect.valid) return fail(c, "accepted an invalid case (" + c.expect.why + "), output " + describe(y));
    ++ran_;
    if (y.shape() != c.expect.shape)
      return fail(c, "output " + describe(y) + ", expected shape " + c.expect.shape.str());
    if (with_backward) backward(c);
  }

  void finish() {
    std::ostringstream os;
    for (const std::string& f : failures_) os << "\n  " << f;
    EXPECT_TRUE(failures_.empty()) << failure_count_ << " of " << cases_ << " " << op_ << " cases failed; first:"
                                   << os.str();
    // Both kinds must be well represented, or the fuzzer tests little.
    EXPECT_GT(ran_, cases_ / 10) << op_ << ": too few valid cases";
    EXPECT_GT(rejected_, cases_ / 10) << op_ << ": too few invalid cases";
    EXPECT_GT(backward_, 0) << op_ << ": no backward pass ran";
  }

 private:
  void backward(const Case& c) {
    std::vector<Tensor> leaves;
    for (const Tensor& t : c.inputs)
      leaves.push_back(t.defined() && is_floating(t.dtype()) ? t.detach().requires_grad_() : t);
    try {
      Tape tape;
      Tensor y = c.run(leaves);
      tape.backward(sum(y));
      ++backward_;
    } catch (const Error& e) {
      return fail(c, std::string("backward of a valid case failed: ") + e.what());
    }
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!leaves[i].defined() || !leaves[i].requires_grad() || !leaves[i].grad().defined()) continue;
      if (leaves[i].grad().shape() != leaves[i].shape())
        return fail(c, "gradient of input " + std::to_string(i) + " is " + describe(leaves[i].grad()));
    }
  }

  void fail(const Case& c, const std::string& what) {
    if (++failure_count_ <= 8) failures_.push_back(c.desc + ": " + what);
  }

  const char* op_;
  int cases_ = 0, ran_ = 0, rejected_ = 0, backward_ = 0, failure_count_ = 0;
  std::vector<std::string> failures_;
};

// A random tensor of this shape; dtype mostly `dt`, sometimes another (an invalid mix).
Tensor tensor_of(const std::vector<int64_t>& shape, DType dt) {
  if (dt == DType::i64) return zeros(Shape(shape), {.dtype = DType::i64});
  return uniform(Shape(shape), -1.0, 1.0, {.dtype = dt});
}

DType other_dtype(Rng& r, DType dt) {
  std::vector<DType> others;
  for (DType d : {DType::f32, DType::f64, DType::i64})
    if (d != dt) others.push_back(d);
  return r.pick(others);
}

// A per-dim parameter: usually 1 or `dims` values in range, sometimes a wrong count or value.
std::vector<int64_t> per_dim_param(Rng& r, int dims, int64_t lo, int64_t hi, int64_t bad) {
  size_t n = r.chance(0.05) ? static_cast<size_t>(r.pick(std::vector<int64_t>{0, dims == 2 ? 3 : 2}))
                            : (r.chance(0.5) ? 1u : static_cast<size_t>(dims));
  std::vector<int64_t> v(n);
  for (auto& x : v) x = r.chance(0.04) ? bad : r.between(lo, hi);
  return v;
}

// ---- convolution ------------------------------------------------------------------------
// Rules: x and w of rank dims+2, one floating dtype; bias undefined or (K) of that dtype;
// conv3d only channels-first; stride/padding/dilation hold 1 or `dims` values with
// stride >= 1, padding >= 0, dilation >= 1; x's channels (last dim when NHWC) equal w[1];
// every weight dim >= 1, every spatial input >= 1, and the dilated kernel d*(k-1)+1 fits
// the padded input; the batch may be empty. out = (in + 2p - d*(k-1) - 1) / s + 1.
Case conv_case(Rng& r, int dims) {
  Case c;
  Expect& e = c.expect;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const bool nhwc = r.chance(dims == 2 ? 0.35 : 0.05);
  const int64_t N = r.chance(0.05) ? 0 : r.between(1, 2), C = r.chance(0.03) ? 0 : r.between(1, 3);
  const int64_t K = r.between(1, 3);
  std::vector<int64_t> in(dims), kernel(dims);
  for (int d = 0; d < dims; ++d) {
    in[d] = r.chance(0.03) ? 0 : r.between(1, dims == 2 ? 7 : 5);
    kernel[d] = r.chance(0.03) ? 0 : r.between(1, 3);
  }
  ConvParams p{.stride = per_dim_param(r, dims, 1, 3, r.pick(std::vector<int64_t>{0, -1})),
               .padding = per_dim_param(r, dims, 0, 2, -1),
               .dilation = per_dim_param(r, dims, 1, 2, 0),
               .layout = nhwc ? Layout::NHWC : Layout::NCHW};
  std::vector<int64_t> xs = {N};
  if (!nhwc) xs.push_back(C);
  xs.insert(xs.end(), in.begin(), in.end());
  if (nhwc) xs.push_back(C);
  const int64_t wc = r.chance(0.05) ? C + 1 : C;
  std::vector<int64_t> ws = {K, wc};
  ws.insert(ws.end(), kernel.begin(), kernel.end());
  if (r.chance(0.04)) xs.pop_back();  // wrong ranks
  if (r.chance(0.04)) ws.push_back(1);
  const DType wdt = r.chance(0.04) ? other_dtype(r, dt) : dt;
  const DType xdt = r.chance(0.02) ? DType::i64 : dt;
  Tensor x = tensor_of(xs, xdt), w = tensor_of(ws, wdt), b;
  const int bias_kind = static_cast<int>(r.between(0, 9));  // 0-3 none, 4-7 right, 8 wrong size, 9 wrong dtype
  if (bias_kind >= 4 && bias_kind <= 7) b = tensor_of({K}, dt);
  if (bias_kind == 8) b = tensor_of({K + 1}, dt);
  if (bias_kind == 9) b = tensor_of({K}, other_dtype(r, dt));

  const size_t rank = static_cast<size_t>(dims) + 2;
  if (xs.size() != rank) e.reject("input rank");
  if (ws.size() != rank) e.reject("weight rank");
  if (xdt == DType::i64) e.reject("integer input");
  if (wdt != xdt) e.reject("dtypes differ");
  if (bias_kind >= 8) e.reject("bad bias");
  if (dims == 3 && nhwc) e.reject("NHWC conv3d");
  auto count_ok = [&](const std::vector<int64_t>& v) { return v.size() == 1 || v.size() == static_cast<size_t>(dims); };
  auto value = [&](const std::vector<int64_t>& v, int d) { return v.size() == 1 ? v[0] : v[static_cast<size_t>(d)]; };
  if (!count_ok(p.stride) || !count_ok(p.padding) || !count_ok(p.dilation)) e.reject("per-dim parameter count");
  for (auto v : p.stride) if (v < 1) e.reject("stride < 1");
  for (auto v : p.padding) if (v < 0) e.reject("padding < 0");
  for (auto v : p.dilation) if (v < 1) e.reject("dilation < 1");
  if (wc != C) e.reject("channels differ");
  if (C < 1) e.reject("no channels");
  for (int d = 0; d < dims; ++d) {
    if (kernel[d] < 1) e.reject("empty kernel");
    if (in[d] < 1) e.reject("empty spatial input");
  }
  if (e.valid) {
    std::vector<int64_t> out(dims);
    for (int d = 0; d < dims; ++d) {
      int64_t s = value(p.stride, d), pad = value(p.padding, d), dil = value(p.dilation, d);
      int64_t extent = dil * (kernel[d] - 1) + 1;
      if (extent > in[d] + 2 * pad) e.reject("kernel larger than the padded input");
      out[d] = (in[d] + 2 * pad - extent) / s + 1;
    }
    std::vector<int64_t> ys = {N};
    if (!nhwc) ys.push_back(K);
    ys.insert(ys.end(), out.begin(), out.end());
    if (nhwc) ys.push_back(K);
    e.shape = Shape(ys);
  }
  std::ostringstream os;
  os << (dims == 2 ? "conv2d" : "conv3d") << " x " << dtype_name(xdt) << str(xs) << " w " << dtype_name(wdt) << str(ws)
     << " b " << (b.defined() ? describe(b) : "none") << " stride " << str(p.stride) << " pad " << str(p.padding)
     << " dil " << str(p.dilation) << (nhwc ? " NHWC" : " NCHW");
  c.desc = os.str();
  c.inputs = {x, w, b};
  c.run = [dims, p](const std::vector<Tensor>& t) {
    return dims == 2 ? conv2d(t[0], t[1], t[2], p) : conv3d(t[0], t[1], t[2], p);
  };
  return c;
}

// ---- matrix products --------------------------------------------------------------------
// matmul: two 2-D matrices of one floating dtype with a[1] == b[0] -> (a[0], b[1]).
// linear: w 2-D (out, in); x (B, in) or (in); bias undefined or (out); one floating dtype
// -> (B, out) or (out). Empty sizes are fine.
Case matmul_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const int64_t M = r.between(0, 4), K = r.between(0, 4), N = r.between(0, 4);
  std::vector<int64_t> as = {M, K}, bs = {r.chance(0.2) ? K + 1 : K, N};
  if (r.chance(0.08)) as.push_back(2);
  if (r.chance(0.08)) bs.erase(bs.begin());
  const DType bdt = r.chance(0.08) ? other_dtype(r, dt) : dt;
  c.inputs = {tensor_of(as, dt), tensor_of(bs, bdt)};
  if (as.size() != 2 || bs.size() != 2) c.expect.reject("rank");
  else if (as[1] != bs[0]) c.expect.reject("inner dims");
  if (bdt != dt) c.expect.reject("dtype");
  if (c.expect.valid) c.expect.shape = Shape{M, N};
  c.desc = "matmul " + str(as) + " x " + dtype_name(bdt) + str(bs);
  c.run = [](const std::vector<Tensor>& t) { return matmul(t[0], t[1]); };
  return c;
}

Case linear_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const int64_t B = r.between(0, 4), in = r.between(1, 5), out = r.between(1, 4);
  std::vector<int64_t> xs = r.chance(0.25) ? std::vector<int64_t>{in} : std::vector<int64_t>{B, in};
  if (r.chance(0.1)) xs.back() += 1;
  if (r.chance(0.05)) xs.insert(xs.begin(), 2);  // rank 3 (or 2 from a vector, which stays valid)
  std::vector<int64_t> ws = {out, in};
  if (r.chance(0.05)) ws.push_back(1);
  const int bias_kind = static_cast<int>(r.between(0, 7));  // 0-2 none, 3-5 right, 6 wrong size, 7 wrong rank
  Tensor b;
  if (bias_kind >= 3 && bias_kind <= 5) b = tensor_of({out}, dt);
  if (bias_kind == 6) b = tensor_of({out + 1}, dt);
  if (bias_kind == 7) b = tensor_of({1, out}, dt);
  const DType wdt = r.chance(0.06) ? other_dtype(r, dt) : dt;
  c.inputs = {tensor_of(xs, dt), tensor_of(ws, wdt), b};
  Expect& e = c.expect;
  if (ws.size() != 2) e.reject("weight rank");
  if (xs.size() != 1 && xs.size() != 2) e.reject("input rank");
  if (xs.back() != ws[1]) e.reject("features differ");
  if (bias_kind >= 6) e.reject("bad bias");
  if (wdt != dt) e.reject("dtype");
  if (e.valid) e.shape = xs.size() == 1 ? Shape{out} : Shape{xs[0], out};
  c.desc = "linear x " + str(xs) + " w " + dtype_name(wdt) + str(ws) + " b " + (b.defined() ? describe(b) : "none");
  c.run = [](const std::vector<Tensor>& t) { return linear(t[0], t[1], t[2]); };
  return c;
}

// ---- group norm -------------------------------------------------------------------------
// x floating of rank >= 3 (N, C, *), groups > 0 dividing C > 0, eps >= 0, gamma and beta
// undefined or (C) of x's dtype, non-empty spatial extent; N may be 0. Output: x's shape.
Case group_norm_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const int64_t rank = r.chance(0.1) ? r.between(1, 2) : r.between(3, 5);
  std::vector<int64_t> xs;
  for (int64_t d = 0; d < rank; ++d) xs.push_back(d == 0 ? r.between(0, 2) : d == 1 ? r.between(0, 6) : r.between(1, 4));
  if (rank >= 3 && r.chance(0.04)) xs[2] = 0;
  const int64_t groups = r.chance(0.05) ? r.between(-1, 0) : r.between(1, 4);
  const double eps = r.chance(0.05) ? -1e-5 : r.chance(0.1) ? 0.0 : 1e-5;
  auto affine = [&](int kind, int64_t C) {
    if (kind == 1) return tensor_of({C}, dt);
    if (kind == 2) return tensor_of({C + 1}, dt);
    if (kind == 3) return tensor_of({C}, other_dtype(r, dt));
    return Tensor();
  };
  const int64_t C = rank >= 2 ? xs[1] : 0;
  const int gk = r.chance(0.08) ? static_cast<int>(r.between(2, 3)) : static_cast<int>(r.between(0, 1));
  const int bk = r.chance(0.08) ? static_cast<int>(r.between(2, 3)) : static_cast<int>(r.between(0, 1));
  Tensor gamma = affine(gk, C), beta = affine(bk, C);
  c.inputs = {tensor_of(xs, dt), gamma, beta};
  Expect& e = c.expect;
  if (rank < 3) e.reject("rank < 3");
  if (groups <= 0) e.reject("groups <= 0");
  if (C <= 0 || (groups > 0 && C % groups != 0)) e.reject("channels not divisible into groups");
  if (eps < 0) e.reject("negative eps");
  if (gk >= 2 || bk >= 2) e.reject("bad gamma/beta");
  int64_t hw = 1;
  for (int64_t d = 2; d < rank; ++d) hw *= xs[d];
  if (rank >= 3 && hw == 0) e.reject("empty spatial extent");
  e.shape = Shape(xs);
  c.desc = "group_norm x " + std::string(dtype_name(dt)) + str(xs) + " groups " + std::to_string(groups) + " eps " +
           std::to_string(eps) + " gamma " + (gamma.defined() ? describe(gamma) : "none") + " beta " +
           (beta.defined() ? describe(beta) : "none");
  c.run = [groups, eps](const std::vector<Tensor>& t) { return group_norm(t[0], t[1], t[2], groups, eps); };
  return c;
}

// ---- losses -----------------------------------------------------------------------------
// mse_loss: pred and target of one floating dtype and one non-empty shape -> [].
// cross_entropy: logits floating (N, classes) with N, classes > 0; targets i64 (N) with
// every value in [0, classes) -> [].
Case mse_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  std::vector<int64_t> ps;
  for (int64_t d = 0, rank = r.between(0, 3); d < rank; ++d) ps.push_back(r.chance(0.05) ? 0 : r.between(1, 4));
  std::vector<int64_t> ts = ps;
  if (r.chance(0.2)) {
    if (ts.empty() || r.chance(0.5)) ts.push_back(2);
    else ts.back() += 1;
  }
  const DType tdt = r.chance(0.06) ? other_dtype(r, dt) : dt;
  c.inputs = {tensor_of(ps, dt), tensor_of(ts, tdt)};
  if (ts != ps) c.expect.reject("shapes differ");
  if (Shape(ps).numel() == 0) c.expect.reject("empty");
  if (tdt != dt) c.expect.reject("dtype");
  c.expect.shape = Shape{};
  c.desc = "mse_loss " + str(ps) + " vs " + dtype_name(tdt) + str(ts);
  c.run = [](const std::vector<Tensor>& t) { return mse_loss(t[0], t[1]); };
  return c;
}

Case cross_entropy_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const int64_t N = r.chance(0.05) ? 0 : r.between(1, 4), classes = r.chance(0.05) ? 0 : r.between(1, 5);
  std::vector<int64_t> ls = {N, classes};
  if (r.chance(0.05)) ls.push_back(1);
  if (r.chance(0.03)) ls.erase(ls.begin());
  std::vector<int64_t> ts = {N};
  if (r.chance(0.06)) ts[0] += 1;
  if (r.chance(0.04)) ts.push_back(1);
  std::vector<int64_t> values(static_cast<size_t>(Shape(ts).numel()));
  bool out_of_range = false;
  for (auto& v : values) {
    v = r.chance(0.03) ? r.pick(std::vector<int64_t>{-1, classes}) : r.between(0, std::max<int64_t>(classes - 1, 0));
    out_of_range = out_of_range || v < 0 || v >= classes;
  }
  const bool float_targets = r.chance(0.04);
  Tensor targets = float_targets ? tensor_of(ts, DType::f32) : from_vector(values, Shape(ts));
  const DType ldt = r.chance(0.03) ? DType::i64 : dt;
  c.inputs = {tensor_of(ls, ldt), targets};
  Expect& e = c.expect;
  if (ldt == DType::i64) e.reject("integer logits");
  if (ls.size() != 2) e.reject("logits rank");
  if (float_targets) e.reject("float targets");
  if (ts.size() != 1 || (ls.size() >= 1 && ts[0] != ls[0])) e.reject("targets shape");
  if (ls.size() == 2 && (ls[0] == 0 || ls[1] == 0)) e.reject("empty logits");
  if (!float_targets && out_of_range) e.reject("target out of range");
  e.shape = Shape{};
  c.desc = "cross_entropy logits " + std::string(dtype_name(ldt)) + str(ls) + " targets " +
           (float_targets ? "f32" : "i64") + str(ts) + (out_of_range ? " (a target out of range)" : "");
  c.run = [](const std::vector<Tensor>& t) { return cross_entropy(t[0], t[1]); };
  return c;
}

// ---- elementwise ------------------------------------------------------------------------
// a and b of one floating dtype whose shapes broadcast (NumPy rules: align at the right;
// each pair of sizes equal or one of them 1) -> the broadcast shape.
Case binary_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  std::vector<int64_t> as, bs;
  const int64_t ra = r.between(0, 4), rb = r.between(0, 4);
  for (int64_t d = 0; d < ra; ++d) as.push_back(r.chance(0.04) ? 0 : r.between(1, 3));
  for (int64_t d = 0; d < rb; ++d) bs.push_back(r.chance(0.04) ? 0 : r.between(1, 3));
  if (r.chance(0.6)) {  // mostly broadcastable: copy a's trailing dims, some set to 1
    for (int64_t i = 1; i <= std::min(ra, rb); ++i) bs[rb - i] = r.chance(0.3) ? 1 : as[ra - i];
  }
  const DType bdt = r.chance(0.05) ? other_dtype(r, dt) : dt;
  c.inputs = {tensor_of(as, dt), tensor_of(bs, bdt)};
  const int op = static_cast<int>(r.between(0, 3));
  std::vector<int64_t> out(static_cast<size_t>(std::max(ra, rb)));
  for (int64_t i = 1; i <= static_cast<int64_t>(out.size()); ++i) {
    int64_t da = i <= ra ? as[ra - i] : 1, db = i <= rb ? bs[rb - i] : 1;
    if (da != db && da != 1 && db != 1) c.expect.reject("not broadcastable");
    out[out.size() - i] = da == 1 ? db : da;
  }
  if (bdt != dt) c.expect.reject("dtype");
  c.expect.shape = Shape(out);
  static const char* names[] = {"add", "sub", "mul", "div"};
  c.desc = std::string(names[op]) + " " + str(as) + " and " + dtype_name(bdt) + str(bs);
  c.run = [op](const std::vector<Tensor>& t) {
    switch (op) {
      case 0: return add(t[0], t[1]);
      case 1: return sub(t[0], t[1]);
      case 2: return mul(t[0], t[1]);
      default: return div(t[0], t[1]);
    }
  };
  return c;
}

// ---- reductions -------------------------------------------------------------------------
// sum/mean over dims: every dim in [-rank, rank), none twice (after wrapping negatives);
// mean also needs a non-empty reduction. keepdim leaves 1s. No dims: sum/mean of everything
// to [] (mean: non-empty input).
Case reduce_case(Rng& r) {
  Case c;
  const DType dt = r.chance(0.5) ? DType::f32 : DType::f64;
  const int64_t rank = r.between(0, 4);
  std::vector<int64_t> xs;
  for (int64_t d = 0; d < rank; ++d) xs.push_back(r.chance(0.05) ? 0 : r.between(1, 4));
  const bool is_mean = r.chance(0.5), all = r.chance(0.15), keepdim = r.chance(0.5);
  std::vector<int64_t> dims;
  for (int64_t i = 0, n = r.between(0, 3); i < n; ++i) dims.push_back(r.between(-rank - 1, rank));
  const DType xdt = r.chance(0.03) ? DType::i64 : dt;
  c.inputs = {tensor_of(xs, xdt)};
  Expect& e = c.expect;
  if (xdt == DType::i64) e.reject("integer input");
  if (all) {
    if (is_mean && Shape(xs).numel() == 0) e.reject("mean of an empty tensor");
    e.shape = Shape{};
  } else {
    std::vector<bool> red(static_cast<size_t>(rank), false);
    for (int64_t d : dims) {
      if (d < -rank || d >= rank) { e.reject("dim out of range"); continue; }
      int64_t k = d < 0 ? d + rank : d;
      if (red[k]) e.reject("dim twice");
      red[k] = true;
    }
    int64_t count = 1;
    std::vector<int64_t> out;
    for (int64_t d = 0; d < rank; ++d) {
      if (red[d]) count *= xs[d];
      if (!red[d]) out.push_back(xs[d]);
      else if (keepdim) out.push_back(1);
    }
    if (is_mean && count == 0) e.reject("mean over an empty dim");
    e.shape = Shape(out);
  }
  c.desc = std::string(is_mean ? "mean " : "sum ") + dtype_name(xdt) + str(xs) +
           (all ? " (all)" : " dims " + str(dims) + (keepdim ? " keepdim" : ""));
  c.run = [is_mean, all, dims, keepdim](const std::vector<Tensor>& t) {
    if (all) return is_mean ? mean(t[0]) : sum(t[0]);
    return is_mean ? mean(t[0], dims, keepdim) : sum(t[0], dims, keepdim);
  };
  return c;
}

// ---- shape ops --------------------------------------------------------------------------
// reshape: at most one -1 (inferred: the known sizes' product must be > 0 and divide
// numel), no other negative size, at most 6 dims, same element count.
// permute: one entry per dim, each in [-rank, rank), a permutation after wrapping.
Case reshape_case(Rng& r) {
  Case c;
  const int64_t rank = r.between(0, 4);
  std::vector<int64_t> xs;
  for (int64_t d = 0; d < rank; ++d) xs.push_back(r.chance(0.05) ? 0 : r.between(1, 4));
  const int64_t numel = Shape(xs).numel();
  std::vector<int64_t> target;
  const int64_t n = r.chance(0.03) ? 7 : r.between(0, 4);
  for (int64_t i = 0; i < n; ++i) target.push_back(r.pick(std::vector<int64_t>{-2, -1, -1, 0, 1, 1, 2, 2, 3, 4, 6, numel}));
  if (r.chance(0.3) && !target.empty()) {  // often make it fit: fold the rest into one slot
    int64_t known = 1;
    for (size_t i = 1; i < target.size(); ++i) known *= std::max<int64_t>(target[i], 1);
    for (size_t i = 1; i < target.size(); ++i) target[i] = std::max<int64_t>(target[i], 1);
    target[0] = known > 0 && numel % known == 0 ? numel / known : target[0];
  }
  c.inputs = {tensor_of(xs, DType::f64)};
  Expect& e = c.expect;
  int infer = -1, minus_ones = 0;
  int64_t known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1) {
      ++minus_ones;
      infer = static_cast<int>(i);
    } else if (target[i] < 0) {
      e.reject("negative size");
    } else {
      known *= target[i];
    }
  }
  std::vector<int64_t> out = target;
  if (minus_ones > 1) e.reject("two -1");
  if (e.valid && infer >= 0) {
    if (known == 0 || numel % known != 0) e.reject("cannot infer");
    else out[infer] = numel / known;
  }
  if (target.size() > static_cast<size_t>(kMaxDims)) e.reject("too many dims");
  if (e.valid && Shape(out).numel() != numel) e.reject("element count");
  e.shape = Shape(out);
  c.desc = "reshape " + str(xs) + " to " + str(target);
  c.run = [target](const std::vector<Tensor>& t) { return t[0].reshape(Shape(target)); };
  return c;
}

Case permute_case(Rng& r) {
  Case c;
  const int64_t rank = r.between(0, 5);
  std::vector<int64_t> xs;
  for (int64_t d = 0; d < rank; ++d) xs.push_back(r.chance(0.05) ? 0 : r.between(1, 3));
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[i] = i;
  for (int64_t i = rank - 1; i > 0; --i) std::swap(perm[i], perm[r.between(0, i)]);
  for (auto& p : perm)
    if (r.chance(0.2)) p -= rank;  // the negative spelling of the same dim
  if (r.chance(0.1)) perm.push_back(0);
  if (r.chance(0.1) && !perm.empty()) perm[r.between(0, perm.size() - 1)] = r.between(-rank - 1, rank);
  c.inputs = {tensor_of(xs, DType::f32)};
  Expect& e = c.expect;
  if (perm.size() != static_cast<size_t>(rank)) e.reject("wrong count");
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  std::vector<int64_t> out;
  for (int64_t p : perm) {
    if (p < -rank || p >= rank) { e.reject("dim out of range"); continue; }
    int64_t k = p < 0 ? p + rank : p;
    if (seen[k]) e.reject("dim twice");
    seen[k] = true;
    out.push_back(xs[k]);
  }
  e.shape = Shape(out);
  c.desc = "permute " + str(xs) + " by " + str(perm);
  c.run = [perm](const std::vector<Tensor>& t) { return t[0].permute(perm); };
  return c;
}

template <class Generate>
void fuzz(const char* op, uint64_t seed, int cases, Generate generate) {
  manual_seed(seed);
  Rng r(seed);
  Fuzzer f(op);
  for (int i = 0; i < cases; ++i) f.check(generate(r), r.chance(0.25));
  f.finish();
}

}  // namespace

TEST(FuzzValidation, Conv2d) { fuzz("conv2d", 1, 2500, [](Rng& r) { return conv_case(r, 2); }); }
TEST(FuzzValidation, Conv3d) { fuzz("conv3d", 2, 1500, [](Rng& r) { return conv_case(r, 3); }); }
TEST(FuzzValidation, Matmul) { fuzz("matmul", 3, 1500, matmul_case); }
TEST(FuzzValidation, Linear) { fuzz("linear", 4, 2000, linear_case); }
TEST(FuzzValidation, GroupNorm) { fuzz("group_norm", 5, 2000, group_norm_case); }
TEST(FuzzValidation, MseLoss) { fuzz("mse_loss", 6, 1500, mse_case); }
TEST(FuzzValidation, CrossEntropy) { fuzz("cross_entropy", 7, 2000, cross_entropy_case); }
TEST(FuzzValidation, BroadcastBinary) { fuzz("add/sub/mul/div", 8, 3000, binary_case); }
TEST(FuzzValidation, SumMean) { fuzz("sum/mean", 9, 3000, reduce_case); }
TEST(FuzzValidation, Reshape) { fuzz("reshape", 10, 2000, reshape_case); }
TEST(FuzzValidation, Permute) { fuzz("permute", 11, 2000, permute_case); }
