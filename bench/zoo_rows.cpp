#include "zoo_rows.h"

#include <cmath>
#include <sstream>

namespace zoo {
namespace {

tg::Tensor apply(const LayerSpec& s, const tg::Tensor& x, const std::vector<tg::Tensor>& p) {
  const tg::Tensor b = p.size() > 1 ? p[1] : tg::Tensor();
  switch (s.kind) {
    case Kind::conv2d: return tg::conv2d(x, p[0], b, s.conv);
    case Kind::conv3d: return tg::conv3d(x, p[0], b, s.conv);
    case Kind::group_norm: return tg::group_norm(x, p[0], p[1], s.groups);
    case Kind::linear: return tg::linear(x, p[0], b);
  }
  TG_CHECK(false, "zoo: unknown kind");
  return {};
}

// The builders follow the notation: N, C -> K, spatial size, kernel, stride, padding.
LayerSpec conv2d(std::string name, int64_t N, int64_t C, int64_t K, int64_t HW, int64_t k, int64_t stride, int64_t pad,
                 int64_t dilation = 1, bool bias = false, bool nhwc = false) {
  LayerSpec s;
  s.name = std::move(name);
  s.x = nhwc ? tg::Shape{N, HW, HW, C} : tg::Shape{N, C, HW, HW};
  s.w = {K, C, k, k};
  s.bias = bias;
  s.conv = {.stride = {stride}, .padding = {pad}, .dilation = {dilation},
            .layout = nhwc ? tg::Layout::NHWC : tg::Layout::NCHW};
  return s;
}

LayerSpec conv3d(std::string name, int64_t N, int64_t C, int64_t K, int64_t S, int64_t stride, bool bias = false) {
  LayerSpec s;
  s.name = std::move(name);
  s.kind = Kind::conv3d;
  s.x = {N, C, S, S, S};
  s.w = {K, C, 3, 3, 3};
  s.bias = bias;
  s.conv = {.stride = {stride}, .padding = {1}};
  return s;
}

LayerSpec group_norm(std::string name, tg::Shape x, int64_t groups) {
  LayerSpec s;
  s.name = std::move(name);
  s.kind = Kind::group_norm;
  s.x = x;
  s.w = {x[1]};
  s.bias = true;
  s.groups = groups;
  return s;
}

LayerSpec linear(std::string name, int64_t M, int64_t in, int64_t out, bool bias = false) {
  LayerSpec s;
  s.name = std::move(name);
  s.kind = Kind::linear;
  s.x = {M, in};
  s.w = {out, in};
  s.bias = bias;
  return s;
}

std::string json_dims(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::conv2d: return "conv2d";
    case Kind::conv3d: return "conv3d";
    case Kind::group_norm: return "group_norm";
    case Kind::linear: return "linear";
  }
  return "?";
}

// Issue 22's list. Where it names no bias, there is none.
std::vector<LayerSpec> layer_specs() {
  return {
      conv2d("c2d_3x3_s1_96_64", 16, 96, 96, 64, 3, 1, 1),
      conv2d("c2d_3x3_s1_192_32", 16, 192, 192, 32, 3, 1, 1),
      conv2d("c2d_3x3_s1_384_16", 16, 384, 384, 16, 3, 1, 1),
      conv2d("c2d_3x3_s1_512_8", 32, 512, 512, 8, 3, 1, 1),
      conv2d("c2d_3x3_s2_96to192_64", 16, 96, 192, 64, 3, 2, 1),
      conv2d("c2d_3x3_s2_192to384_32", 16, 192, 384, 32, 3, 2, 1),
      conv2d("c2d_7x7_s2_3to64_224_bias", 16, 3, 64, 224, 7, 2, 3, 1, true),
      conv2d("c2d_5x5_s1_32to64_64", 16, 32, 64, 64, 5, 1, 2),
      conv2d("c2d_3x3_d2_128_64", 8, 128, 128, 64, 3, 1, 2, 2),
      conv2d("c2d_1x1_384to96_32", 16, 384, 96, 32, 1, 1, 0),
      conv2d("c2d_1x1_96to384_32", 16, 96, 384, 32, 1, 1, 0),
      conv2d("c2d_1x1_1024to256_14", 32, 1024, 256, 14, 1, 1, 0),
      conv2d("c2d_1x1_s2_192to384_32", 16, 192, 384, 32, 1, 2, 0),
      conv2d("c2d_3x3_s1_192_32_nhwc", 16, 192, 192, 32, 3, 1, 1, 1, false, true),
      conv2d("c2d_1x1_384to96_32_nhwc", 16, 384, 96, 32, 1, 1, 0, 1, false, true),
      conv3d("c3d_3x3x3_64_32", 2, 64, 64, 32, 1),
      conv3d("c3d_3x3x3_128_16", 2, 128, 128, 16, 1),
      conv3d("c3d_3x3x3_s2_64to128_32", 2, 64, 128, 32, 2),
      conv3d("c3d_3x3x3_1to32_64_bias", 2, 1, 32, 64, 1, true),
      group_norm("gn_16x192x32x32_g32", {16, 192, 32, 32}, 32),
      group_norm("gn_2x64x32x32x32_g8", {2, 64, 32, 32, 32}, 8),
      linear("lin_8192x768to3072_bias", 8192, 768, 3072, true),
      linear("lin_8192x3072to768", 8192, 3072, 768),
      linear("lin_4096x4096to4096", 4096, 4096, 4096),
      linear("lin_64x4096to4096", 64, 4096, 4096),
      linear("lin_1x11008to4096_gemv", 1, 11008, 4096),
  };
}

std::string LayerSpec::shape() const {
  std::ostringstream os;
  if (kind == Kind::conv2d || kind == Kind::conv3d) {
    const tg::ConvShape cs = tg::make_conv_shape("zoo", x, w, conv);
    os << (kind == Kind::conv2d ? "Conv2d " : "Conv3d ");
    for (int64_t d = 2; d < w.rank(); ++d) os << (d > 2 ? "x" : "") << w[d];
    os << " s" << conv.stride[0] << " p" << conv.padding[0];
    if (conv.dilation[0] != 1) os << " d" << conv.dilation[0];
    if (bias) os << " +bias";
    if (conv.layout == tg::Layout::NHWC) os << " NHWC";
    os << ", x " << x << " -> " << cs.y_shape();
  } else if (kind == Kind::group_norm) {
    os << "GroupNorm " << groups << " groups, x " << x;
  } else {
    os << "Linear" << (bias ? " +bias" : "") << (x[0] == 1 ? " (GEMV)" : "") << ", x " << x << " -> "
       << tg::Shape{x[0], w[0]};
  }
  return os.str();
}

std::string LayerSpec::json() const {
  std::ostringstream os;
  os << "{\"x\": " << json_dims(x.dims()) << ", \"w\": " << json_dims(w.dims())
     << ", \"bias\": " << (bias ? "true" : "false");
  if (kind == Kind::conv2d || kind == Kind::conv3d)
    os << ", \"stride\": " << json_dims(conv.stride) << ", \"padding\": " << json_dims(conv.padding)
       << ", \"dilation\": " << json_dims(conv.dilation) << ", \"layout\": \""
       << (conv.layout == tg::Layout::NHWC ? "nhwc" : "nchw") << "\"";
  if (kind == Kind::group_norm) os << ", \"groups\": " << groups << ", \"eps\": 1e-05";
  os << "}";
  return os.str();
}

std::vector<int64_t> check_rows(int64_t batch, int64_t per_end) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < batch; ++r)
    if (r < per_end || r >= batch - per_end) rows.push_back(r);
  return rows;
}

std::vector<double> read_rows(const tg::Tensor& t_in, const std::vector<int64_t>& rows) {
  tg::Tensor t = t_in;
  if (t.dtype() != tg::DType::f32) {
    tg::NoGradGuard no_grad;
    t = t_in.to(tg::DType::f32);  // exact from bf16
  }
  const int64_t per = t.numel() / t.size(0);
  std::vector<double> out;
  out.reserve(rows.size() * static_cast<size_t>(per));
  for (int64_t r : rows)
    for (float v : ex::read_range(t, r * per, per)) out.push_back(v);
  return out;
}

tg::Tensor rows_f64(const tg::Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<int64_t> dims = t.shape().dims();
  dims[0] = static_cast<int64_t>(rows.size());
  return tg::from_vector(read_rows(t, rows), tg::Shape(dims));
}

tg::Tensor keep_rows(const tg::Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<float> mask(static_cast<size_t>(t.size(0)), 0.f);
  for (int64_t r : rows) mask[static_cast<size_t>(r)] = 1.f;
  std::vector<int64_t> dims(static_cast<size_t>(t.dim()), 1);
  dims[0] = t.size(0);
  return tg::mul(t, tg::from_vector(mask, tg::Shape(dims), {.device = t.device()}));
}

tg::Tensor f64_leaf(const tg::Tensor& t) {
  tg::Tensor c = t.detach().cpu().to(tg::DType::f64).detach();
  c.requires_grad_(true);
  return c;
}

LayerRow::LayerRow(const LayerSpec& s, tg::Device d) : spec(s) {
  const tg::TensorOptions o{.device = d};
  x = tg::randn(s.x, o);
  if (s.kind == Kind::group_norm) {
    // Not PyTorch's gamma = 1, beta = 0: the check should see each applied.
    params = {tg::uniform(s.w, 0.5, 1.5, o), tg::uniform(s.w, -0.5, 0.5, o)};
  } else {
    // PyTorch's default bound: outputs of order one for standard normal inputs.
    const double bound = 1.0 / std::sqrt(double(s.w.numel() / s.w[0]));
    params.push_back(tg::uniform(s.w, -bound, bound, o));
    if (s.bias) params.push_back(tg::uniform({s.w[0]}, -bound, bound, o));
  }
  for (tg::Tensor& p : params) p.requires_grad_(true);
  dy = tg::randn(forward().shape(), o);
  // Linear rows are cheap in f64: more of them (each dW element then sums 16 rows).
  rows_ = check_rows(s.x[0], s.kind == Kind::linear ? 8 : 1);
}

tg::Tensor LayerRow::forward() const {
  if (!bf16) return apply(spec, x, params);
  tg::Autocast ac(tg::DType::bf16);
  return apply(spec, x, params);
}

const tg::Tensor& LayerRow::seed_for(const tg::Tensor& y) {
  if (y.dtype() == dy.dtype()) return dy;
  if (!dy_bf16_.defined() || dy_bf16_.dtype() != y.dtype()) {
    tg::NoGradGuard no_grad;
    dy_bf16_ = dy.to(y.dtype());
  }
  return dy_bf16_;
}

void LayerRow::zero_grads() const {
  for (const tg::Tensor& p : params) p.zero_grad();
  x.zero_grad();
}

LayerRow::Reference LayerRow::reference() const {
  tg::Tensor xr = rows_f64(x, rows_);
  xr.requires_grad_(true);
  std::vector<tg::Tensor> pr;
  for (const tg::Tensor& p : params) pr.push_back(f64_leaf(p));
  Reference r;
  {
    tg::Tape tape;
    tg::Tensor y = apply(spec, xr, pr);
    tape.backward(y, rows_f64(dy, rows_));
    r.y = y.to_vector<double>();
  }
  r.dx = xr.grad().to_vector<double>();
  for (const tg::Tensor& p : pr) r.dparams.push_back(p.grad().to_vector<double>());
  return r;
}

Checks LayerRow::check() {
  if (!ref_) ref_ = reference();
  const Reference& r = *ref_;
  const tg::Tensor seed = keep_rows(dy, rows_);
  x.requires_grad_(true);
  zero_grads();
  Checks c;
  {
    tg::Tape tape;
    tg::Tensor y = forward();
    tg::Tensor y_seed = seed;
    if (y.dtype() != seed.dtype()) {
      tg::NoGradGuard no_grad;
      y_seed = seed.to(y.dtype());
    }
    tape.backward(y, y_seed);
    c.forward.push_back({"y", ex::compare(read_rows(y, rows_), r.y)});
  }
  c.backward.push_back({"dx", ex::compare(read_rows(x.grad(), rows_), r.dx)});
  const char* names[2] = {"weight grad", "bias grad"};
  if (spec.kind == Kind::group_norm) names[0] = "gamma grad", names[1] = "beta grad";
  for (size_t i = 0; i < params.size(); ++i)
    c.backward.push_back({names[i], ex::compare(params[i].grad().to_vector<double>(), r.dparams[i])});
  zero_grads();
  x.requires_grad_(false);
  return c;
}

}  // namespace zoo
