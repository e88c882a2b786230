// The rule every CUDA dispatcher table picks its row by (ops/cuda/variant_table.h), on a toy
// table whose problems are integers: the first row that prefers a problem wins; KernelPath::Engine
// skips specialised rows; KernelPath::Direct takes the last; a forced row runs where it can
// implement the problem and is an UnsupportedError (naming the op, the row and the problem)
// where it cannot; an unknown name is an UnsupportedError too. Pure host code: runs without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include "common/test_util.h"
#include "ops/cuda/variant_table.h"

using namespace tg;
using tg::cuda::KernelPath;

namespace {

struct Toy {
  int n;
};
struct NoOperands {};
using Row = cuda::KernelVariant<Toy, NoOperands>;

// "small": specialised, serves n <= 10, preferred for n <= 5; "even": serves and prefers even n;
// "any": serves everything (the table's last row).
bool small_can(const Toy& t, const NoOperands&) { return t.n <= 10; }
bool small_prefers(const Toy& t, const NoOperands&) { return t.n <= 5; }
bool even(const Toy& t, const NoOperands&) { return t.n % 2 == 0; }
bool always(const Toy&, const NoOperands&) { return true; }
void nothing(const Toy&, const NoOperands&) {}

constexpr std::array<Row, 3> kRows{{
    {"small", "test", true, small_can, small_prefers, nothing},
    {"even", "test", false, even, even, nothing},
    {"any", "test", false, always, always, nothing},
}};

std::string pick(int n, std::string_view forced = {}, KernelPath path = KernelPath::Auto) {
  int described = 0;
  const Row& r = cuda::choose_variant(std::span<const Row>(kRows), forced, path, Toy{n}, NoOperands{}, "toy_op", "toy",
                                      [&] { return ++described, std::string("n ") + std::to_string(n); });
  EXPECT_EQ(described, 0) << "the problem is described only for an error";
  return std::string(r.name);
}

}  // namespace

TEST(VariantTable, DefaultOrderTakesTheFirstRowThatPrefersTheProblem) {
  EXPECT_EQ(pick(4), "small");
  EXPECT_EQ(pick(8), "even");  // small can implement 8 but does not prefer it
  EXPECT_EQ(pick(7), "any");
  EXPECT_EQ(pick(13), "any");
}

TEST(VariantTable, PathsSkipSpecialisedRowsOrTakeTheLast) {
  EXPECT_EQ(pick(4, {}, KernelPath::Engine), "even");
  EXPECT_EQ(pick(3, {}, KernelPath::Engine), "any");
  EXPECT_EQ(pick(4, {}, KernelPath::Direct), "any");
}

TEST(VariantTable, AForcedRowRunsWhereItCanAndIsAnErrorWhereItCannot) {
  EXPECT_EQ(pick(8, "small"), "small");  // implementable though not preferred
  EXPECT_EQ(pick(8, "small", KernelPath::Direct), "small");  // the name wins over the path
  EXPECT_THROW(pick(11, "small"), UnsupportedError);
  TG_EXPECT_ERROR(pick(11, "small"), "toy_op", "forces the 'small' kernels", "(n 11)");
  EXPECT_THROW(pick(3, "even"), UnsupportedError);
  TG_EXPECT_ERROR(pick(4, "tiled"), "toy_op: no toy kernels named 'tiled'");
}
