// All-reduce bandwidth: tapegrad's ProcessGroup::all_reduce against NCCL called directly
// (the same communicator setup, no framework around it), on the same buffer sizes in one
// run. Launch one process per GPU:
//
//   mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 build/bench/tg_allreduce [--mib 256]
//
// Bus bandwidth as nccl-tests defines it: bytes / time * 2 (n - 1) / n. Rank 0 prints one
// JSON line per size: {"mib":..., "ranks":..., "tapegrad_ms":..., "nccl_ms":...,
// "tapegrad_busbw_gbs":..., "nccl_busbw_gbs":...}. Each figure is the median of 20 timed
// iterations (after 5 warm-ups) of a loop of 5 all-reduces, timed with CUDA events on the
// stream each side enqueues on; the result of the first is checked against the closed form.
#include <cuda_runtime.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "dist/process_group.h"

namespace {

#define NCCL_OK(call)                                                                 \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #call, ncclGetErrorString(r_));        \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `reps` iterations of `fn` (5 calls each) on `stream`; returns the median ms per call.
template <class Fn>
double time_calls(cudaStream_t stream, Fn fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int it = 0; it < 25; ++it) {
    cudaEventRecord(a, stream);
    for (int k = 0; k < 5; ++k) fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (it >= 5) ms.push_back(t / 5.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes_mib = {1, 16, 64, 256};
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--mib") == 0) sizes_mib = {std::atof(argv[i + 1])};
  // verify_collectives off: the shape check is a host-side MPI exchange per call, which
  // would time MPI's latency rather than the all-reduce.
  tg::dist::ProcessGroup pg({.verify_collectives = false});
  if (!pg.has_nccl()) {
    std::fprintf(stderr, "tg_allreduce: needs NCCL and a GPU per rank\n");
    return 1;
  }
  const int n = pg.size(), me = pg.rank(), dev = pg.device().index;
  // NCCL directly: its own communicator over the same ranks.
  ncclUniqueId id;
  if (me == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, n, id, me));
  cudaStream_t raw_stream;
  cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking);
  const cudaStream_t tg_stream = tg::cuda::stream(dev);

  for (double mib : sizes_mib) {
    const int64_t count = static_cast<int64_t>(mib * 1024 * 1024 / 4);
    tg::Tensor t = tg::full({count}, 1.0 + me, {.device = pg.device()});
    pg.all_reduce(t);
    const float want = n * (n + 1) / 2.0f;
    const std::vector<float> got = t.to_vector<float>();
    if (got.front() != want || got.back() != want) {
      std::fprintf(stderr, "tg_allreduce: wrong result %g (want %g)\n", got.front(), want);
      return 1;
    }
    // The tapegrad side: the public call as a user makes it (events, ordering, checks).
    tg::dist::ProcessGroup* g = &pg;
    const double tg_ms = time_calls(tg_stream, [&] { g->all_reduce(t, tg::dist::ReduceOp::sum); });
    float* raw = t.data<float>();
    const double nccl_ms = time_calls(raw_stream, [&] {
      NCCL_OK(ncclAllReduce(raw, raw, static_cast<size_t>(count), ncclFloat32, ncclSum, comm, raw_stream));
    });
    const double bytes = count * 4.0, factor = 2.0 * (n - 1) / n;
    if (me == 0)
      std::printf("{\"mib\": %g, \"ranks\": %d, \"tapegrad_ms\": %.4f, \"nccl_ms\": %.4f, "
                  "\"tapegrad_busbw_gbs\": %.1f, \"nccl_busbw_gbs\": %.1f}\n",
                  mib, n, tg_ms, nccl_ms, bytes / tg_ms / 1e6 * factor, bytes / nccl_ms / 1e6 * factor);
    std::fflush(stdout);
  }
  ncclCommDestroy(comm);
  cudaStreamDestroy(raw_stream);
  return 0;
}
