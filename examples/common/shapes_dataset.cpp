#include "common/shapes_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace ex {

const std::vector<std::string>& shape_class_names() {
  static const std::vector<std::string> names = {"horizontal bar", "vertical bar", "diagonal /", "diagonal \\",
                                                 "plus", "x cross", "disk", "ring", "hollow square",
                                                 "checkerboard"};
  return names;
}

namespace {

// Whether the point (u, v), relative to the shape's center (v grows downwards), is inked.
// `size` is a per-image random scale in [0, 1].
bool inked(int label, double u, double v, double size) {
  const double half_len = 4.0 + 2.0 * size;  // bars: 8..12 pixels long
  const double s2 = std::sqrt(2.0);
  auto bar = [&](double along, double across, double len) { return std::abs(across) <= 1.0 && std::abs(along) <= len; };
  switch (label) {
    case 0: return bar(u, v, half_len);
    case 1: return bar(v, u, half_len);
    case 2: return bar((u - v) / s2, (u + v) / s2, half_len);  // along y = -x in image coordinates: "/"
    case 3: return bar((u + v) / s2, (u - v) / s2, half_len);  // "\"
    case 4: return bar(u, v, half_len - 1) || bar(v, u, half_len - 1);
    case 5: return bar((u - v) / s2, (u + v) / s2, half_len - 1) || bar((u + v) / s2, (u - v) / s2, half_len - 1);
    case 6: return u * u + v * v <= std::pow(3.0 + 1.5 * size, 2);
    case 7: return std::abs(std::sqrt(u * u + v * v) - (4.0 + 1.5 * size)) <= 0.8;
    case 8: {
      const double s = 3.5 + 1.5 * size, m = std::max(std::abs(u), std::abs(v));
      return m <= s && m >= s - 1.0;
    }
    default: {  // 2x2-pixel checks inside a square
      if (std::max(std::abs(u), std::abs(v)) > 4.0 + size) return false;
      const int a = static_cast<int>(std::floor((u + 16) / 2)), b = static_cast<int>(std::floor((v + 16) / 2));
      return (a + b) % 2 == 0;
    }
  }
}

}  // namespace

ShapesDataset make_shapes_dataset(int64_t count, uint64_t seed, double noise) {
  if (count < 0) throw std::invalid_argument("make_shapes_dataset: count " + std::to_string(count) + " < 0");
  constexpr int S = kShapeImageSize;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0), jitter(-2.0, 2.0);
  std::normal_distribution<double> gauss(0.0, noise);
  ShapesDataset d;
  d.count = count;
  d.images.resize(static_cast<size_t>(count * S * S));
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int label = static_cast<int>(i % kShapeClasses);
    const double cx = S / 2.0 + jitter(rng), cy = S / 2.0 + jitter(rng);
    const double size = unit(rng), brightness = 0.7 + 0.6 * unit(rng);
    float* img = &d.images[static_cast<size_t>(i * S * S)];
    for (int y = 0; y < S; ++y)
      for (int x = 0; x < S; ++x) {
        const double u = x + 0.5 - cx, v = y + 0.5 - cy;
        img[y * S + x] = static_cast<float>((inked(label, u, v, size) ? brightness : 0.0) + gauss(rng));
      }
    d.labels[static_cast<size_t>(i)] = label;
  }
  return d;
}

std::string ascii_image(const ShapesDataset& d, int64_t index) {
  if (index < 0 || index >= d.count)
    throw std::out_of_range("ascii_image: image " + std::to_string(index) + " of " + std::to_string(d.count));
  constexpr int S = kShapeImageSize;
  const char* ramp = " .:-=+*#%@";
  std::string out;
  for (int y = 0; y < S; ++y) {
    for (int x = 0; x < S; ++x) {
      double v = d.images[static_cast<size_t>(index * S * S + y * S + x)];
      int level = static_cast<int>(std::clamp(v, 0.0, 0.999) * 10);
      out += ramp[level];
      out += ramp[level];
    }
    out += '\n';
  }
  return out;
}

}  // namespace ex
