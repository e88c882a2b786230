// A program that fails on purpose, for tests/dist/check_failures.sh: one rank misbehaves
// while the others enter a collective; the job must end, with a clear message, in bounded
// time instead of hanging.
//
//   failure_probe throw [--gpu]   rank 1 throws before the collective (uncaught)
//   failure_probe hang  [--gpu]   rank 1 sleeps through it (the others time out)
//   failure_probe die   [--gpu]   rank 1 exits at once without a word (std::_Exit)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "dist/process_group.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: failure_probe throw|hang|die [--gpu]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const bool gpu = argc > 2 && std::strcmp(argv[2], "--gpu") == 0;
  tg::dist::ProcessGroup pg({.use_gpu = gpu});
  tg::Tensor t = tg::ones({1 << 16}, {.device = pg.device()});
  pg.all_reduce(t);  // everyone is up and connected
  if (pg.rank() == 1) {
    if (mode == "throw") throw std::runtime_error("planted failure on rank 1");
    if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(120));
    if (mode == "die") std::_Exit(3);
  }
  pg.all_reduce(t);        // the others wait here for rank 1
  (void)t.to_vector<float>();  // on the GPU: the host waits for the (aborted) collective
  pg.all_reduce(t);        // after an abort: throws DistError at once
  std::printf("rank %d: no failure was detected\n", pg.rank());
  return 0;
}
