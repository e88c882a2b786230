// main() for the test programs that run under mpirun (tests/CMakeLists.txt launches them
// with -np 2 and -np 3): one process group for the whole program, every rank runs every
// test in the same order (the collectives must match), rank 0 prints the usual report and
// the other ranks print only their failures, prefixed with their rank.
//
//   mpirun -np 2 test_dist_collectives          # CPU tensors, MPI
//   mpirun -np 2 test_dist_collectives --gpu    # CUDA tensors, NCCL, one GPU per rank
//
// With --gpu, a machine with fewer GPUs than ranks (or a build without NCCL) skips the whole
// program with exit code 77 (ctest's SKIP_RETURN_CODE), decided the same way on every rank.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <string>
#include <vector>

#include "common/expect_message.h"
#include "core/device.h"
#include "dist/process_group.h"

namespace tg::test {

inline dist::ProcessGroup* g_group = nullptr;
inline dist::ProcessGroup& group() { return *g_group; }
// Where the tests put their tensors: the rank's GPU with --gpu, else the CPU.
inline Device test_device() { return g_group->device(); }

// Runs fn, expects exception E whose message contains every part.
template <class E, class Fn>
void expect_message(Fn fn, const std::vector<std::string>& parts) {
  const std::string msg = message_of<E>(fn);
  for (const std::string& p : parts) EXPECT_TRUE(contains(msg, p)) << "'" << p << "' not in: " << msg;
}

// Prints failed assertions of a rank other than 0, with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

inline int run_dist_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool gpu = false;
  for (int i = 1; i < argc; ++i) gpu = gpu || std::strcmp(argv[i], "--gpu") == 0;
  const char* np = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (gpu && (!dist::nccl_built() || (np && cuda_device_count() < std::atoi(np)))) {
    std::printf("skipped: --gpu needs NCCL and one GPU per rank (%d GPUs, %s ranks)\n", cuda_device_count(),
                np ? np : "?");
    return 77;
  }
  dist::ProcessGroup pg({.timeout_s = 120, .use_gpu = gpu});
  g_group = &pg;
  if (pg.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(pg.rank()));
  }
  if (pg.rank() == 0)
    std::printf("process group: %d ranks, device %s, NCCL %s\n", pg.size(), pg.device().str().c_str(),
                pg.has_nccl() ? "yes" : "no");
  const int rc = RUN_ALL_TESTS();
  // Every rank reports the job's result: a failure on any rank fails all.
  const bool all_passed = pg.all_true(rc == 0);
  g_group = nullptr;
  return all_passed ? 0 : 1;
}

}  // namespace tg::test

#define TG_DIST_TEST_MAIN() \
  int main(int argc, char** argv) { return ::tg::test::run_dist_tests(argc, argv); }
