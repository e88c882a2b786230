// Command-line parsing for the examples and the benchmark: `--name value` options and
// `--flag` switches. Every option a program reads is declared by reading it, so that
// finish() can reject anything misspelled instead of silently ignoring it. The parser does
// not know which names take values until they are read, so an unknown `--name` never
// swallows a following `--option` as its value, and a missing value is reported when the
// option is read ("needs a value") rather than for names nobody reads ("unknown option").
// A value that starts with "--" is written `--name=--value`.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ex {

class Args {
 public:
  // `switches` lists the options that take no value (e.g. "small", "json").
  Args(int argc, char** argv, std::set<std::string> switches);

  bool has(const std::string& name);  // a switch, or an option that was given
  std::string get(const std::string& name, const std::string& fallback);
  int64_t get_int(const std::string& name, int64_t fallback);
  double get_double(const std::string& name, double fallback);
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
