#include "common/reference.h"

#include <cmath>
#include <mutex>

#include "core/error.h"

namespace ex {
namespace {

using Pos = std::array<int64_t, 3>;

Pos unflatten(int64_t pos, const Pos& size) {
  return {pos / (size[1] * size[2]), (pos / size[2]) % size[1], pos % size[2]};
}
int64_t flatten(const Pos& p, const Pos& size) { return (p[0] * size[1] + p[1]) * size[2] + p[2]; }

int64_t pick(const std::vector<int64_t>& v, int d, const char* what) {
  TG_CHECK(v.size() == 1 || v.size() >= static_cast<size_t>(d + 1), "ConvGeometry: ", what,
           " needs one value or one per spatial dim");
  return v.size() == 1 ? v[0] : v[static_cast<size_t>(d)];
}

// The input position that kernel offset r of output position o reads, or false if padding.
bool input_position(const ConvGeometry& g, const Pos& o, const Pos& r, Pos& i) {
  for (int d = 0; d < 3; ++d) {
    i[d] = o[d] * g.stride[d] - g.pad[d] + r[d] * g.dilation[d];
    if (i[d] < 0 || i[d] >= g.in[d]) return false;
  }
  return true;
}

// The output position whose kernel offset r reads input position i, or false if none.
bool output_position(const ConvGeometry& g, const Pos& i, const Pos& r, Pos& o) {
  for (int d = 0; d < 3; ++d) {
    int64_t t = i[d] + g.pad[d] - r[d] * g.dilation[d];
    if (t < 0 || t % g.stride[d] != 0) return false;
    o[d] = t / g.stride[d];
    if (o[d] >= g.out[d]) return false;
  }
  return true;
}

// Kernel offsets unflattened once: the references loop over them billions of times.
std::vector<Pos> kernel_offsets(const ConvGeometry& g) {
  std::vector<Pos> r;
  for (int64_t j = 0; j < g.kernel_positions(); ++j) r.push_back(unflatten(j, g.kernel));
  return r;
}

int64_t w_index(const ConvGeometry& g, int64_t k, int64_t c, int64_t r) {
  return (k * g.C + c) * g.kernel_positions() + r;
}

// (n, channel, flat spatial position) of a flat index into x or y.
struct Decoded {
  int64_t n, ch, pos;
};
Decoded decode(const ConvGeometry& g, int64_t index, int64_t channels, int64_t positions) {
  if (g.channels_last)
    return {index / (channels * positions), index % channels, (index / channels) % positions};
  return {index / (channels * positions), (index / positions) % channels, index % positions};
}

}  // namespace

ConvGeometry ConvGeometry::make(const tg::Shape& x, const tg::Shape& w, const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& pad, const std::vector<int64_t>& dilation,
                                bool channels_last) {
  ConvGeometry g;
  g.spatial = static_cast<int>(x.rank()) - 2;
  TG_CHECK((g.spatial == 2 || g.spatial == 3) && w.rank() == x.rank(), "ConvGeometry: x ", x, " w ", w);
  TG_CHECK(!channels_last || g.spatial == 2, "ConvGeometry: channels-last is 2-D only");
  g.channels_last = channels_last;
  g.N = x[0];
  g.C = channels_last ? x[3] : x[1];
  g.K = w[0];
  TG_CHECK(w[1] == g.C, "ConvGeometry: weight ", w, " does not match input ", x);
  const int first = 3 - g.spatial;  // 2-D uses dims 1 and 2 of the 3 slots
  for (int d = 0; d < g.spatial; ++d) {
    int s = first + d;
    g.in[s] = channels_last ? x[1 + d] : x[2 + d];
    g.kernel[s] = w[2 + d];
    g.stride[s] = pick(stride, d, "stride");
    g.pad[s] = pick(pad, d, "padding");
    g.dilation[s] = pick(dilation, d, "dilation");
    g.out[s] = (g.in[s] + 2 * g.pad[s] - g.dilation[s] * (g.kernel[s] - 1) - 1) / g.stride[s] + 1;
  }
  return g;
}

tg::Shape ConvGeometry::y_shape() const {
  std::vector<int64_t> s{N};
  if (!channels_last) s.push_back(K);
  for (int d = 3 - spatial; d < 3; ++d) s.push_back(out[d]);
  if (channels_last) s.push_back(K);
  return tg::Shape(s);
}

int64_t ConvGeometry::x_index(int64_t n, int64_t c, int64_t pos) const {
  return channels_last ? (n * in_positions() + pos) * C + c : (n * C + c) * in_positions() + pos;
}
int64_t ConvGeometry::y_index(int64_t n, int64_t k, int64_t pos) const {
  return channels_last ? (n * out_positions() + pos) * K + k : (n * K + k) * out_positions() + pos;
}

std::vector<double> conv_forward_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& w,
                                     const std::vector<float>& b, const std::vector<int64_t>& y_indices) {
  std::vector<double> out(y_indices.size());
  const std::vector<Pos> offsets = kernel_offsets(g);
  parallel_for(static_cast<int64_t>(y_indices.size()), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      Decoded y = decode(g, y_indices[s], g.K, g.out_positions());
      Pos o = unflatten(y.pos, g.out), i;
      double acc = b.empty() ? 0.0 : b[static_cast<size_t>(y.ch)];
      for (int64_t c = 0; c < g.C; ++c)
        for (int64_t r = 0; r < g.kernel_positions(); ++r)
          if (input_position(g, o, offsets[r], i))
            acc += w[w_index(g, y.ch, c, r)] * x[g.x_index(y.n, c, flatten(i, g.in))];
      out[s] = acc;
    }
  });
  return out;
}

std::vector<double> conv_input_grad_ref(const ConvGeometry& g, const HostTensor& dy, const HostTensor& w,
                                        const std::vector<int64_t>& x_indices) {
  std::vector<double> out(x_indices.size());
  const std::vector<Pos> offsets = kernel_offsets(g);
  parallel_for(static_cast<int64_t>(x_indices.size()), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      Decoded x = decode(g, x_indices[s], g.C, g.in_positions());
      Pos i = unflatten(x.pos, g.in), o;
      double acc = 0;
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t r = 0; r < g.kernel_positions(); ++r)
          if (output_position(g, i, offsets[r], o))
            acc += w[w_index(g, k, x.ch, r)] * dy[g.y_index(x.n, k, flatten(o, g.out))];
      out[s] = acc;
    }
  });
  return out;
}

std::vector<double> conv_weight_grad_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& dy,
                                         const std::vector<int64_t>& w_indices) {
  std::vector<double> out(w_indices.size());
  parallel_for(static_cast<int64_t>(w_indices.size()), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const int64_t r = w_indices[s] % g.kernel_positions();
      const int64_t c = (w_indices[s] / g.kernel_positions()) % g.C;
      const int64_t k = w_indices[s] / (g.kernel_positions() * g.C);
      const Pos rp = unflatten(r, g.kernel);
      double acc = 0;
      Pos i;
      for (int64_t n = 0; n < g.N; ++n)
        for (int64_t p = 0; p < g.out_positions(); ++p)
          if (input_position(g, unflatten(p, g.out), rp, i))
            acc += dy[g.y_index(n, k, p)] * x[g.x_index(n, c, flatten(i, g.in))];
      out[s] = acc;
    }
  });
  return out;
}

std::vector<double> linear_forward_ref(const tg::Tensor& A, const std::vector<float>& w,
                                       const std::vector<int64_t>& rows) {
  const int64_t K = A.size(1);
  TG_CHECK(static_cast<int64_t>(w.size()) == K, "linear_forward_ref: w has ", w.size(), " values, A is ",
           tg::describe(A));
  std::vector<double> out;
  for (int64_t i : rows) {
    std::vector<float> row = read_range(A, i * K, K);
    double acc = 0;
    for (int64_t j = 0; j < K; ++j) acc += double(row[j]) * w[j];
    out.push_back(acc);
  }
  return out;
}

std::vector<double> linear_weight_grad_ref(const tg::Tensor& A, const std::vector<float>& dy,
                                           const std::vector<int64_t>& columns) {
  const int64_t M = A.size(0), K = A.size(1);
  std::vector<double> out;
  for (size_t s = 0; s < columns.size();) {
    size_t e = s + 1;  // a run of consecutive columns is read with one copy per row
    while (e < columns.size() && columns[e] == columns[e - 1] + 1) ++e;
    const int64_t width = static_cast<int64_t>(e - s);
    std::vector<double> acc(static_cast<size_t>(width), 0.0);
    for (int64_t i = 0; i < M; ++i) {
      std::vector<float> part = read_range(A, i * K + columns[s], width);
      for (int64_t j = 0; j < width; ++j) acc[j] += double(dy[i]) * part[j];
    }
    out.insert(out.end(), acc.begin(), acc.end());
    s = e;
  }
  return out;
}

ConvNormMeanReference conv_norm_mean_ref(const ConvGeometry& g, const HostTensor& x, const HostTensor& w,
                                         const std::vector<float>& b, const std::vector<float>& gamma,
                                         const std::vector<float>& beta, int64_t groups, double eps,
                                         const std::vector<float>* dy) {
  TG_CHECK(!g.channels_last && g.K % groups == 0, "conv_norm_mean_ref: bad geometry or groups");
  const int64_t P = g.out_positions(), R = g.kernel_positions(), per_group = g.K / groups;
  const double M = double(g.K) * P;  // elements averaged into y[n]
  const std::vector<Pos> offsets = kernel_offsets(g);
  ConvNormMeanReference ref;
  ref.z.assign(static_cast<size_t>(g.N * g.K * P), 0.0);
  ref.normalized.resize(ref.z.size());
  ref.y.assign(static_cast<size_t>(g.N), 0.0);
  if (dy) {
    ref.dx.assign(x.data.size(), 0.0);
    ref.dw.assign(w.data.size(), 0.0);
    ref.db.assign(static_cast<size_t>(g.K), 0.0);
    ref.dgamma.assign(static_cast<size_t>(g.K), 0.0);
    ref.dbeta.assign(static_cast<size_t>(g.K), 0.0);
  }
  std::mutex merge;
  // Samples are independent until the parameter gradients, which each worker sums privately.
  parallel_for(g.N, [&](int64_t begin, int64_t end) {
    std::vector<double> dw(ref.dw.size(), 0.0), db(ref.db.size(), 0.0), dgamma(db.size(), 0.0),
        dbeta(db.size(), 0.0), xhat(static_cast<size_t>(g.K * P)), dz(xhat.size());
    std::vector<double> inv_std(static_cast<size_t>(groups));
    Pos i;
    for (int64_t n = begin; n < end; ++n) {
      double* z = &ref.z[static_cast<size_t>(n * g.K * P)];
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t p = 0; p < P; ++p) {
          double acc = b.empty() ? 0.0 : b[k];
          Pos o = unflatten(p, g.out);
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t r = 0; r < R; ++r)
              if (input_position(g, o, offsets[r], i))
                acc += w[w_index(g, k, c, r)] * x[g.x_index(n, c, flatten(i, g.in))];
          z[k * P + p] = acc;
        }
      // Group statistics (biased variance, as GroupNorm uses), then the affine map.
      for (int64_t grp = 0; grp < groups; ++grp) {
        const double* zg = z + grp * per_group * P;
        const int64_t count = per_group * P;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < count; ++j) mean += zg[j];
        mean /= count;
        for (int64_t j = 0; j < count; ++j) var += (zg[j] - mean) * (zg[j] - mean);
        var /= count;
        inv_std[grp] = 1.0 / std::sqrt(var + eps);
        for (int64_t j = 0; j < count; ++j) xhat[grp * count + j] = (zg[j] - mean) * inv_std[grp];
      }
      double sum = 0;
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t p = 0; p < P; ++p) {
          double v = gamma[k] * xhat[k * P + p] + beta[k];
          ref.normalized[static_cast<size_t>((n * g.K + k) * P + p)] = v;
          sum += v;
        }
      ref.y[n] = sum / M;
      if (!dy) continue;

      // Backward: y[n] = mean(g) so every element of g gets dy[n] / M.
      const double dg = (*dy)[n] / M;
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t p = 0; p < P; ++p) {
          dgamma[k] += dg * xhat[k * P + p];
          dbeta[k] += dg;
        }
      // GroupNorm backward per group: dz = inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
      for (int64_t grp = 0; grp < groups; ++grp) {
        const int64_t count = per_group * P, first = grp * count;
        double mean_d = 0, mean_dx = 0;
        for (int64_t j = first; j < first + count; ++j) {
          double dxhat = dg * gamma[j / P];
          mean_d += dxhat;
          mean_dx += dxhat * xhat[j];
        }
        mean_d /= count;
        mean_dx /= count;
        for (int64_t j = first; j < first + count; ++j)
          dz[j] = inv_std[grp] * (dg * gamma[j / P] - mean_d - xhat[j] * mean_dx);
      }
      // Conv backward: bias, weight and input gradients of this sample.
      for (int64_t k = 0; k < g.K; ++k)
        for (int64_t p = 0; p < P; ++p) {
          const double d = dz[k * P + p];
          db[k] += d;
          Pos o = unflatten(p, g.out);
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t r = 0; r < R; ++r)
              if (input_position(g, o, offsets[r], i)) {
                const int64_t xi = g.x_index(n, c, flatten(i, g.in));
                dw[w_index(g, k, c, r)] += d * x[xi];
                ref.dx[xi] += d * w[w_index(g, k, c, r)];  // sample n belongs to this worker only
              }
        }
    }
    if (!dy) return;
    std::lock_guard<std::mutex> lock(merge);
    for (size_t j = 0; j < dw.size(); ++j) ref.dw[j] += dw[j];
    for (size_t k = 0; k < db.size(); ++k) {
      ref.db[k] += db[k];
      ref.dgamma[k] += dgamma[k];
      ref.dbeta[k] += dbeta[k];
    }
  });
  return ref;
}

std::vector<double> gather(const std::vector<double>& all, const std::vector<int64_t>& indices) {
  std::vector<double> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(all[static_cast<size_t>(i)]);
  return out;
}

}  // namespace ex
