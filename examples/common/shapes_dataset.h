// A synthetic 10-class image task generated in code, so that the CNN example needs no
// download: 16x16 single-channel images of a shape drawn at a random position (+-2 pixels),
// size and brightness, under Gaussian noise. The classes differ in local structure
// (orientation, crossings, corners, curvature, texture), which a small conv net with
// global average pooling can pick up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ex {

inline constexpr int kShapeClasses = 10;
inline constexpr int kShapeImageSize = 16;

// "horizontal bar", "vertical bar", "diagonal /", "diagonal \\", "plus", "x cross",
// "disk", "ring", "hollow square", "checkerboard".
const std::vector<std::string>& shape_class_names();

struct ShapesDataset {
  std::vector<float> images;    // (count, 1, 16, 16), row-major
  std::vector<int64_t> labels;  // (count), in [0, 10), balanced
  int64_t count = 0;
};

// `count` images, classes in turn; the same seed gives the same images.
ShapesDataset make_shapes_dataset(int64_t count, uint64_t seed, double noise = 0.3);

// One image as text (for the README, and a look at what the net sees); std::out_of_range
// unless 0 <= index < d.count.
std::string ascii_image(const ShapesDataset& d, int64_t index);

}  // namespace ex
