// Experiment (not built by CMake): the three passes of first layers (1-4 input channels: RGB
// stems, one-channel volumes, a few more of the kind) on every dispatcher row that implements
// them, the few-tap FMA kernel (conv_few_channels.cu) among them for the forward, to set their
// routing rules: per problem, pass and precision each row's median ms (4 launches queued back to
// back), the default row, and MISS where another row is more than 10% faster. (A first layer's
// grad-input is computed only where the input needs a gradient; the zoo's fwd+bwd rows ask for it.)
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include "conv_rows.h"

using conv_rows::Problem;
using namespace tg;

int main() {
  const Layout NHWC = Layout::NHWC;
  const Problem problems[] = {
      {"7x7 s2 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}}},
      {"7x7 s2 3->64 @224 b16 nhwc", {16, 224, 224, 3}, {64, 3, 7, 7}, {.stride = {2}, .padding = {3}, .layout = NHWC}},
      {"3x3x3 1->32 @64^3 b2", {2, 1, 64, 64, 64}, {32, 1, 3, 3, 3}, {.padding = {1}}},
      {"3x3x3 4->32 @32^3 b2", {2, 4, 32, 32, 32}, {32, 4, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->64 @224 b16", {16, 3, 224, 224}, {64, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->32 @64 b64", {64, 3, 64, 64}, {32, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->64 @128 b16", {16, 3, 128, 128}, {64, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->64 @96 b16", {16, 3, 96, 96}, {64, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->32 @224 b16", {16, 3, 224, 224}, {32, 3, 3, 3}, {.padding = {1}}},
      {"3x3 3->16 @32 b32", {32, 3, 32, 32}, {16, 3, 3, 3}, {.padding = {1}}},
      {"3x3 1->16 @16 b8", {8, 1, 16, 16}, {16, 1, 3, 3}, {.padding = {1}}},
      {"3x3 4->128 @64 b16", {16, 4, 64, 64}, {128, 4, 3, 3}, {.padding = {1}}},
      {"3x3 3->64 @64 b16 nhwc", {16, 64, 64, 3}, {64, 3, 3, 3}, {.padding = {1}, .layout = NHWC}},
      {"3x3 s2 3->32 @128 b16", {16, 3, 128, 128}, {32, 3, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"5x5 1->32 @28 b64", {64, 1, 28, 28}, {32, 1, 5, 5}, {.padding = {2}}},
      {"3x3 8->64 @64 b16", {16, 8, 64, 64}, {64, 8, 3, 3}, {.padding = {1}}},
      {"3x3 16->64 @64 b16", {16, 16, 64, 64}, {64, 16, 3, 3}, {.padding = {1}}},
  };
  return conv_rows::time_problems(problems, conv_rows::kPasses, /*direct=*/false);
}
