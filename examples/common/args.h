// Command-line parsing for the examples and the benchmark: `--name value` options and
// `--flag` switches. Every option a program reads is declared by reading it, so that
// finish() can reject anything misspelled instead of silently ignoring it. The parser does
// not know which names take values until they are read, so an unknown `--name` never
// swallows a following `--option` as its value, and a missing value is reported when the
// option is read ("needs a value") rather than for names nobody reads ("unknown option").
// A value that starts with "--" is written `--name=--value`. An empty value (`--name=`,
// `--name ""`) counts as a missing one, and a switch given a value (`--small=0`) is an error:
// either would otherwise be read as something the user did not ask for.
//
// Numbers are read whole and checked where they are read: the typed accessors below throw
// "--name expects <kind>, got '<text>'" for anything outside their range, so that a bad
// count never reaches a division, an allocation or a narrowing cast.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ex {

class Args {
 public:
  // The default upper bound of a count: it fits an int, and products of a few counts (images
  // x pixels) still fit an int64_t.
  static constexpr int64_t kMaxCount = std::numeric_limits<int32_t>::max();

  // `switches` lists the options that take no value (e.g. "small", "json").
  Args(int argc, char** argv, std::set<std::string> switches);

  bool has(const std::string& name);  // a switch, or an option that was given
  std::string get(const std::string& name, const std::string& fallback);
  // Any integer that fits in int64_t.
  int64_t get_int(const std::string& name, int64_t fallback);
  // An integer in [min, max].
  int64_t get_int_in(const std::string& name, int64_t fallback, int64_t min, int64_t max);
  // Counts (epochs, batch sizes, dataset sizes, widths): at least 1, or at least 0, and at
  // most `max`, by default kMaxCount.
  int64_t get_positive_int(const std::string& name, int64_t fallback, int64_t max = kMaxCount);
  int64_t get_nonnegative_int(const std::string& name, int64_t fallback, int64_t max = kMaxCount);
  // A seed: any non-negative int64_t, used as a uint64_t.
  uint64_t get_seed(const std::string& name, uint64_t fallback);
  // Any finite number (no nan or inf).
  double get_double(const std::string& name, double fallback);
  // A finite number > 0 (learning rates).
  double get_positive_double(const std::string& name, double fallback);
  // A finite number in [0, 1] (required accuracies).
  double get_fraction(const std::string& name, double fallback);
  // Comma-separated list: "--workloads A,B" -> {"A", "B"}.
  std::vector<std::string> get_list(const std::string& name, const std::vector<std::string>& fallback);

  // Prints `usage` and exits with status 0 on --help; throws "unknown option --x" for
  // options nobody read.
  void finish(const std::string& usage);

 private:
  std::string program_;
  std::set<std::string> switches_;
  std::map<std::string, std::string> values_;
  std::set<std::string> missing_value_;  // given without a value (last, or before another --option)
  std::set<std::string> read_;
};

std::vector<std::string> split(const std::string& s, char sep);

}  // namespace ex
