// The engine's planning: tile shape and kernel per problem, the reduction split, the
// fixed-order reduction of split partial sums, the gathers' geometry and the output maps.
// Design note: docs/kernels/gemm.md.
#include <algorithm>

#include "core/cuda_context.h"
#include "ops/cuda/arch/hopper.h"
#include "ops/cuda/conv_dims32.h"
#include "ops/cuda/gemm/planning.h"

namespace tg::cuda::engine {
namespace {

// Partial sums of a split reduction: at most this many floats of workspace.
constexpr int64_t kMaxPartialFloats = int64_t{1} << 26;
constexpr int kMaxSplits = 64;
constexpr int kMinKTilesPerSplit = 8;

int32_t ceil_div32(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// The tile whose last wave wastes least: an SM holds one BigTile block or three SmallTile
// blocks (shared memory), and a SmallTile block does a quarter of the work at a lower rate
// (more shared-memory reads per product), taken as 3/4 of BigTile's.
TileShape big_or_small(int64_t M, int64_t N, int sms) {
  const int64_t big = int64_t(ceil_div32(M, 128)) * ceil_div32(N, 128);
  const int64_t small = int64_t(ceil_div32(M, 64)) * ceil_div32(N, 64);
  const double big_time = double((big + sms - 1) / sms) * 4.0;
  const double small_time = double((small + 3 * sms - 1) / (3 * sms)) * 3.0 / 0.75;
  return big_time <= small_time ? TileShape::Big : TileShape::Small;
}

// out(m, n) = sum over splits of partials[s][m][n] (+ bias), in split order.
__global__ void reduce_partials_kernel(const float* __restrict__ partials, int32_t splits, OutputMap out) {
  const int64_t total = int64_t(out.M) * out.N;
  TG_GRID_STRIDE(i, total) {
    float sum = 0.f;
    for (int32_t s = 0; s < splits; ++s) sum += partials[s * total + i];
    out.store(static_cast<int32_t>(i / out.N), static_cast<int32_t>(i % out.N), sum);
  }
}

// out[b][col][row] = in[b][row][col] for row < rows, 0 for rows <= row < padded_rows: 32 x 32
// tiles through shared memory, reads and writes both coalesced.
// T: float, or uint16_t (bf16 bit patterns).
template <class T>
__global__ void transpose_kernel(T* __restrict__ out, const T* __restrict__ in, int32_t rows, int32_t padded_rows,
                                 int64_t cols, int64_t batches) {
  __shared__ T tile[32][33];
  const int64_t c0 = int64_t(blockIdx.x) * 32;
  const int32_t r0 = int32_t(blockIdx.y) * 32;
  for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
      const int32_t r = r0 + j;
      const int64_t c = c0 + threadIdx.x;
      tile[j][threadIdx.x] = r < rows && c < cols ? in[(b * rows + r) * cols + c] : T(0);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
      const int64_t c = c0 + j;
      const int32_t r = r0 + threadIdx.x;
      if (c < cols && r < padded_rows) out[(b * cols + c) * padded_rows + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

}  // namespace

namespace {
template <class T>
void transpose_any(T* out, const T* in, int64_t batches, int64_t rows, int64_t cols, int64_t padded_rows,
                   cudaStream_t stream) {
  TG_CHECK(rows <= padded_rows && padded_rows < (int64_t(1) << 31) && (padded_rows + 31) / 32 <= 65535,
           "implicit-GEMM engine: cannot transpose ", rows, " x ", cols, " (", padded_rows, " rows)");
  if (batches == 0 || cols == 0 || padded_rows == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((padded_rows + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>(batches, 65535)));
  transpose_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(out, in, int32_t(rows), int32_t(padded_rows), cols, batches);
  TG_LAUNCH_CHECK();
}
}  // namespace

void transpose_into(float* out, const float* in, int64_t batches, int64_t rows, int64_t cols, int64_t padded_rows,
                    cudaStream_t stream) {
  transpose_any(out, in, batches, rows, cols, padded_rows, stream);
}
void transpose_into(uint16_t* out, const uint16_t* in, int64_t batches, int64_t rows, int64_t cols,
                    int64_t padded_rows, cudaStream_t stream) {
  transpose_any(out, in, batches, rows, cols, padded_rows, stream);
}

Plan make_plan(int64_t M, int64_t N, int64_t red, int dev, const EnginePolicy& policy, bool narrow_ok,
               Precision precision, bool gather) {
  const int sms = sm_count(dev);
  Plan plan;
  plan.tma_store = policy.tma_store >= 0;
  if (policy.tile == 16 && narrow_ok) plan.shape = TileShape::Narrow;
  else if (policy.tile == 128 || policy.tile == 256) plan.shape = TileShape::Big;  // 256: engine_gemm widens
  else if (policy.tile == 64) plan.shape = TileShape::Small;
  else if (N <= 16 && narrow_ok) plan.shape = TileShape::Narrow;  // few columns: 16 wide, not 64
  else plan.shape = big_or_small(M, N, sms);
  const int tile_m = plan.shape == TileShape::Small ? 64 : 128;
  const int tile_n = plan.shape == TileShape::Big ? 128 : plan.shape == TileShape::Small ? 64 : 16;
  // Hopper: BigTile plans run on the wgmma kernel, except TF32 plain matrices. There mma.sync
  // fits two blocks per SM (the wgmma kernel one) and measured faster: one block's epilogue and
  // pipeline fill hide behind the other's products. policy.arch forces either kernel.
  plan.sm90 = plan.shape == TileShape::Big && device_runs_wgmma(dev) && policy.arch != 80 &&
              (policy.arch == 90 || precision == Precision::FP32 || gather);
  plan.tiles_m = ceil_div32(M, tile_m);
  plan.tiles_n = ceil_div32(N, tile_n);
  const int64_t tiles = int64_t(plan.tiles_m) * plan.tiles_n;
  TG_CHECK(tiles <= kIndexLimit, "implicit-GEMM engine: ", M, " x ", N, " output needs too many tiles");
  const int32_t k_tiles = std::max<int32_t>(1, ceil_div32(red, kBK));
  int64_t splits = 1;
  if (policy.splits > 0) {
    splits = policy.splits;
  } else if (tiles < sms) {
    // Fill about two blocks per SM, each split keeping a real share of the reduction.
    splits = std::min<int64_t>((2 * sms + tiles - 1) / tiles, k_tiles / kMinKTilesPerSplit);
  }
  splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, kMaxPartialFloats / std::max<int64_t>(1, M * N)));
  plan.k_tiles_per_split = ceil_div32(k_tiles, splits);
  plan.splits = ceil_div32(k_tiles, plan.k_tiles_per_split);  // no empty split
  return plan;
}

bool wide_tma_tile_pays(const Plan& plan128, int64_t N, int64_t red, const EnginePolicy& policy, int dev) {
  constexpr int64_t kWideTileMinReduction = 2048;
  const int64_t sms = sm_count(dev), tiles128 = int64_t(plan128.tiles_m) * plan128.tiles_n;
  const int64_t tiles256 = int64_t(plan128.tiles_m) * ((N + 255) / 256);
  return N > 128 && plan128.splits == 1 && red >= kWideTileMinReduction && policy.blocks_per_sm != 2 &&
         tiles128 >= sms && 2 * ((tiles256 + sms - 1) / sms) <= (tiles128 + sms - 1) / sms;
}

int tma_blocks_per_sm(int cols, int64_t tiles, int sms, const EnginePolicy& policy) {
  if (cols == 64) return 2;
  if (cols != 128) return 1;
  if (policy.blocks_per_sm == 1 || policy.blocks_per_sm == 2) return policy.blocks_per_sm;
  return tiles >= 2 * int64_t(sms) ? 2 : 1;
}

// A block of the TMA kernel streams its reduction at about this rate when alone on an SM (half
// when two share one); splitting the reduction s ways makes s times the blocks at 1/s
// of the work each, plus one pass over s partial outputs. The split taken is the one whose
// waves plus reduction pass are estimated shortest: splits that only add a partial wave lose
// (a 96-tile forward on 132 SMs stays unsplit), splits that fill idle SMs win.
// FP32 (split TF32): 64- or 128-wide tiles, one block per SM, three products per step.
Plan make_tma_plan(int64_t M, int64_t N, int64_t red, int cols, int dev, const EnginePolicy& policy,
                   Precision precision, bool bf16) {
  constexpr double kSmFlopsPerSecond = 2.2e12, kBytesPerSecond = 3.0e12;
  const bool split = !bf16 && precision == Precision::FP32;
  TG_CHECK(!split || cols == 128 || cols == 64, "implicit-GEMM engine: FP32 on the TMA kernel takes 64- or 128-wide "
           "tiles, not ", cols);
  const int sms = sm_count(dev);
  Plan plan;
  plan.shape = TileShape::Big;
  plan.sm90 = true;
  plan.tma_store = policy.tma_store >= 0;
  plan.tma_cols = cols;
  plan.tiles_m = ceil_div32(M, 128);
  plan.tiles_n = ceil_div32(N, cols);
  const int64_t tiles = int64_t(plan.tiles_m) * plan.tiles_n;
  TG_CHECK(tiles <= kIndexLimit, "implicit-GEMM engine: ", M, " x ", N, " output needs too many tiles");
  plan.tma_split = split;
  plan.tma_blocks_per_sm = split ? 1 : tma_blocks_per_sm(cols, tiles, sms, policy);
  const int blocks_per_sm = plan.tma_blocks_per_sm;
  const int32_t k_tiles = std::max<int32_t>(1, ceil_div32(red, bf16 ? 2 * kBK : kBK));
  int64_t splits = 1;
  if (policy.splits > 0) {
    splits = policy.splits;
  } else {
    const int64_t slots = int64_t(sms) * blocks_per_sm;
    const double products = split ? 3.0 : bf16 ? 0.5 : 1.0;
    const double block_seconds = products * 2.0 * 128 * cols * double(red) / (kSmFlopsPerSecond / blocks_per_sm);
    double best = 0;
    for (int64_t s = 1; s <= std::min<int64_t>(kMaxSplits, std::max(1, k_tiles / kMinKTilesPerSplit)); ++s) {
      const double waves = double((tiles * s + slots - 1) / slots);
      const double reduce = s > 1 ? double(s + 1) * double(M) * double(N) * 4.0 / kBytesPerSecond : 0.0;
      const double t = waves * block_seconds / double(s) + reduce;
      if (s == 1 || t < 0.97 * best) {  // a split must win clearly: its estimate is rough
        best = t;
        splits = s;
      }
    }
  }
  splits = std::clamp<int64_t>(splits, 1, kMaxSplits);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, kMaxPartialFloats / std::max<int64_t>(1, M * N)));
  plan.k_tiles_per_split = ceil_div32(k_tiles, splits);
  plan.splits = ceil_div32(k_tiles, plan.k_tiles_per_split);  // no empty split
  return plan;
}

void run_plan(const Plan& plan, MainloopArgs args, const Device& device, const LaunchFn& launch) {
  const int dev = device.index;
  cudaStream_t st = stream(dev);
  Tensor partials;
  if (plan.splits > 1) {
    partials = Tensor::empty({int64_t(plan.splits) * args.M * args.N}, {.dtype = DType::f32, .device = device});
    args.partials = partials.data<float>();
  }
  args.k_tiles_per_split = plan.k_tiles_per_split;
  args.tiles_n = plan.tiles_n;
  launch(args, st);
  if (plan.splits > 1) {
    reduce_partials_kernel<<<grid_for(int64_t(args.M) * args.N, kThreads), kThreads, 0, st>>>(
        args.partials, plan.splits, args.out);
    TG_LAUNCH_CHECK();
  }
}

ConvGeometry geometry(const ConvShape& s) {
  ConvGeometry g{};
  g.N = int32_t(s.N);
  g.C = int32_t(s.C);
  g.K = int32_t(s.K);
  const ConvDims32 d = conv_dims32(s);
  std::copy_n(d.in, 3, g.in);
  std::copy_n(d.out, 3, g.out);
  std::copy_n(d.kernel, 3, g.kernel);
  std::copy_n(d.stride, 3, g.stride);
  std::copy_n(d.pad, 3, g.pad);
  std::copy_n(d.dil, 3, g.dil);
  g.in_volume = s.in_volume();
  g.out_volume = s.out_volume();
  g.div_out_w = FastDivmod(uint32_t(s.out[2]));
  g.div_out_h = FastDivmod(uint32_t(s.out[1]));
  g.div_out_volume = FastDivmod(uint32_t(s.out_volume()));
  g.div_in_w = FastDivmod(uint32_t(s.in[2]));
  g.div_in_h = FastDivmod(uint32_t(s.in[1]));
  g.div_in_volume = FastDivmod(uint32_t(s.in_volume()));
  g.div_kernel_w = FastDivmod(uint32_t(s.kernel[2]));
  g.div_kernel_h = FastDivmod(uint32_t(s.kernel[1]));
  g.div_kernel_volume = FastDivmod(uint32_t(s.kernel_volume()));
  g.div_C = FastDivmod(uint32_t(s.C));
  g.div_K = FastDivmod(uint32_t(s.K));
  return g;
}

OutputMap output_map(float* data, const float* bias, int64_t M, int64_t N) {
  OutputMap out{};
  out.data = data;
  out.bias = bias;
  out.M = int32_t(M);
  out.N = int32_t(N);
  out.mode = OutputMap::kPlain;
  out.kvol = 1;
  return out;
}

Tensor widened(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), {.dtype = DType::f32, .device = t.device()});
  cast(out, t);
  return out;
}

OutputMap output_map(const Tensor& out, const float* bias, int64_t M, int64_t N) {
  TG_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::bf16, "engine output: f32 or bf16, got ",
           describe(out));
  if (out.dtype() == DType::f32) return output_map(out.data<float>(), bias, M, N);
  OutputMap map = output_map(nullptr, bias, M, N);
  map.data_bf16 = static_cast<uint16_t*>(out.raw_data());
  return map;
}

Im2colGeometry im2col_geometry(const ConvShape& s, int64_t channels) {
  Im2colGeometry g{};
  g.dims = s.in[0] == 1 && s.kernel[0] == 1 && s.out[0] == 1 ? 2 : 3;
  g.N = s.N;
  g.C = channels;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = s.in[d];
    g.kernel[d] = s.kernel[d];
    g.stride[d] = s.stride[d];
    g.pad[d] = s.pad[d];
    g.pad_hi[d] = s.pad[d];
    g.dilation[d] = s.dilation[d];
  }
  return g;
}

MainloopArgs conv_forward_args(const Tensor& y, const float* bias, const ConvShape& s, int64_t red) {
  const int64_t M = s.N * s.out_volume();
  MainloopArgs args{};
  args.M = int32_t(M);
  args.N = int32_t(s.K);
  args.red = int32_t(red);
  args.out = output_map(y, bias, M, s.K);
  if (!s.channels_last()) {
    args.out.mode = OutputMap::kChannelsFirst;
    args.out.div = FastDivmod(uint32_t(s.out_volume()));
  }
  return args;
}

PhaseGeometry phase_geometry(const DimPhase (&dims)[3]) {
  PhaseGeometry ph{};
  for (int d = 0; d < 3; ++d) {
    ph.first[d] = dims[d].first;
    ph.count[d] = dims[d].count;
    ph.taps[d] = dims[d].taps;
    ph.base[d] = dims[d].base;
    ph.out_step[d] = dims[d].out_step;
  }
  ph.tap_volume = ph.taps[0] * ph.taps[1] * ph.taps[2];
  // Empty phases are skipped before use; their divisors only need to be valid.
  ph.div_count_w = FastDivmod(uint32_t(std::max(1, ph.count[2])));
  ph.div_count_h = FastDivmod(uint32_t(std::max(1, ph.count[1])));
  ph.div_count_volume = FastDivmod(uint32_t(std::max(1, ph.count[0] * ph.count[1] * ph.count[2])));
  ph.div_taps_w = FastDivmod(uint32_t(std::max(1, ph.taps[2])));
  ph.div_taps_h = FastDivmod(uint32_t(std::max(1, ph.taps[1])));
  return ph;
}

OutputMap phase_output_map(const Tensor& dx, const ConvShape& s, const PhaseGeometry& ph) {
  const int64_t rows = s.N * int64_t(ph.count[0]) * ph.count[1] * ph.count[2];
  OutputMap out = output_map(dx, nullptr, rows, s.C);
  out.mode = OutputMap::kPhase;
  auto& po = out.phase;
  po.div_count_volume = ph.div_count_volume;
  po.div_count_w = ph.div_count_w;
  po.div_count_h = ph.div_count_h;
  for (int d = 0; d < 3; ++d) {
    po.first[d] = ph.first[d];
    po.stride[d] = int32_t(s.stride[d]);
    po.in[d] = int32_t(s.in[d]);
  }
  po.in_volume = s.in_volume();
  po.channels_last = s.channels_last();
  return out;
}

}  // namespace tg::cuda::engine
