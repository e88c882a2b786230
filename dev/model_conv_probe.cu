// Experiment (not built by CMake): the dispatcher's rows on the convolutions of the zoo's
// ResNet-18-style model (bench/zoo: x [64, 3, 64, 64], width 64, examples/common/resnet.h), whose
// TF32 training step is issue 23's last missed model target (0.86 of PyTorch's). For each layer
// shape, pass and precision: every row that implements it (the direct kernels left out: none of
// these is tiny), timed with 4 launches queued back to back, the default row and MISS where
// another is more than 10% faster. Multiply by the layer counts below for the step's share.
//
// Layers (count per step): conv1 3 -> 64 3x3 at 64x64 (1); layer1 64 -> 64 3x3 at 64x64 (4);
// layer2 64 -> 128 3x3 s2 (1), 128 -> 128 3x3 at 32x32 (3), 1x1 s2 downsample 64 -> 128 (1);
// layer3 the same at 256 channels, 16x16; layer4 at 512 channels, 8x8.
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include "conv_rows.h"

using conv_rows::Problem;
using namespace tg;

int main() {
  const ConvParams p1{.padding = {1}}, s2{.stride = {2}, .padding = {1}}, down{.stride = {2}};
  const Problem problems[] = {
      {"conv1 3->64 @64 (x1)", {64, 3, 64, 64}, {64, 3, 3, 3}, p1},
      {"layer1 64->64 @64 (x4)", {64, 64, 64, 64}, {64, 64, 3, 3}, p1},
      {"layer2 64->128 s2 @64 (x1)", {64, 64, 64, 64}, {128, 64, 3, 3}, s2},
      {"layer2 128->128 @32 (x3)", {64, 128, 32, 32}, {128, 128, 3, 3}, p1},
      {"layer2 down 64->128 1x1 s2 (x1)", {64, 64, 64, 64}, {128, 64, 1, 1}, down},
      {"layer3 128->256 s2 @32 (x1)", {64, 128, 32, 32}, {256, 128, 3, 3}, s2},
      {"layer3 256->256 @16 (x3)", {64, 256, 16, 16}, {256, 256, 3, 3}, p1},
      {"layer3 down 128->256 1x1 s2 (x1)", {64, 128, 32, 32}, {256, 128, 1, 1}, down},
      {"layer4 256->512 s2 @16 (x1)", {64, 256, 16, 16}, {512, 256, 3, 3}, s2},
      {"layer4 512->512 @8 (x3)", {64, 512, 8, 8}, {512, 512, 3, 3}, p1},
      {"layer4 down 256->512 1x1 s2 (x1)", {64, 256, 16, 16}, {512, 256, 1, 1}, down},
  };
  return conv_rows::time_problems(problems, conv_rows::kPasses, /*direct=*/false);
}
