// Experiment (not built by CMake): the dispatcher's rows on tiny convolutions, where a training
// step is a string of small launches (issue 28's graphed step: the cnn example at batch 8 spends
// 55% of its device time in conv2d's backward, 54 us per call on an H200). For each problem,
// pass and precision: every row that implements it, the direct FFMA kernels among them (the
// ordinary-shape sweep, conv_routing_probe.cu, leaves them out), timed with 4 launches queued
// back to back (the GPU's own time, as in a replayed graph), the default row and MISS where
// another is more than 10% faster.
//
// Shapes: the cnn example's two convolutions (1 -> 16 3x3 at 16x16; 16 -> 32 3x3 stride 2) at
// batch 8 and 32, and a few more of the kind (8x8 and 32x32 images, 3 to 64 channels).
//
// Built against the library and run by `scripts/gpu-check --probes`.
#include "conv_rows.h"

using conv_rows::Problem;
using namespace tg;

int main() {
  const Problem problems[] = {
      {"cnn conv1 b8: 1->16 3x3 @16", {8, 1, 16, 16}, {16, 1, 3, 3}, {.padding = {1}}},
      {"cnn conv2 b8: 16->32 3x3 s2 @16", {8, 16, 16, 16}, {32, 16, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"cnn conv1 b32: 1->16 3x3 @16", {32, 1, 16, 16}, {16, 1, 3, 3}, {.padding = {1}}},
      {"cnn conv2 b32: 16->32 3x3 s2 @16", {32, 16, 16, 16}, {32, 16, 3, 3}, {.stride = {2}, .padding = {1}}},
      {"b8: 16->16 3x3 @8", {8, 16, 8, 8}, {16, 16, 3, 3}, {.padding = {1}}},
      {"b8: 32->32 3x3 @8", {8, 32, 8, 8}, {32, 32, 3, 3}, {.padding = {1}}},
      {"b32: 3->16 3x3 @32", {32, 3, 32, 32}, {16, 3, 3, 3}, {.padding = {1}}},
      {"b16: 64->64 3x3 @8", {16, 64, 8, 8}, {64, 64, 3, 3}, {.padding = {1}}},
  };
  return conv_rows::time_problems(problems, conv_rows::kPasses, /*direct=*/true);
}
