#!/usr/bin/env bash
# Cheap checks (no build, a few seconds) of the README's two commands and install-deps:
#  - scripts/run-tests and scripts/run-examples use different build trees, each passes its
#    own TG_BUILD_* options, and the README and .gitignore know the examples' tree;
#  - run-tests' ctest step (its run_ctest function, sourced) fails on a tree without tests,
#    and on a tree with skipped tests prints "N cuda tests skipped: <why>" and still ends
#    with ctest's closing line;
#  - install-deps waits for a busy package lock (fake apt-get) and gives up after its timeout.
# Registered in CTest as check_scripts (label cpu).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tg-check-scripts.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# ---- build trees and options ------------------------------------------------------------
default_dir() { sed -n 's/^ *\(local \)\{0,1\}build=\${BUILD_DIR:-\([^} ]*\)}.*/\2/p' "$1" | head -1; }
tests_dir=$(default_dir "$root/scripts/run-tests")
examples_dir=$(default_dir "$root/scripts/run-examples")
if [ -n "$tests_dir" ] && [ -n "$examples_dir" ] && [ "$tests_dir" != "$examples_dir" ]; then
  pass "separate build trees: run-tests $tests_dir/, run-examples $examples_dir/"
else
  fail "run-tests ('$tests_dir') and run-examples ('$examples_dir') must default to different build dirs"
fi
[ "$tests_dir" = build ] && pass "run-tests builds into build/ (as CI expects)" || fail "run-tests should keep build/"
grep -q -- "-DTG_BUILD_TESTS=ON" "$root/scripts/run-tests" && pass "run-tests passes -DTG_BUILD_TESTS=ON" \
  || fail "run-tests does not pass -DTG_BUILD_TESTS=ON"
grep -q -- "--no-tests=error" "$root/scripts/run-tests" && pass "run-tests runs ctest with --no-tests=error" \
  || fail "run-tests does not run ctest with --no-tests=error"
grep -q -- "-DTG_BUILD_EXAMPLES=ON" "$root/scripts/run-examples" && pass "run-examples passes -DTG_BUILD_EXAMPLES=ON" \
  || fail "run-examples does not pass -DTG_BUILD_EXAMPLES=ON"
grep -q "$examples_dir/examples" "$root/README.md" && pass "README names $examples_dir/examples/" \
  || fail "README does not say the examples are built into $examples_dir/examples/"
if git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  git -C "$root" check-ignore -q "$examples_dir/x" && pass ".gitignore covers $examples_dir/" \
    || fail ".gitignore does not cover $examples_dir/"
fi
grep -q -- "DPkg::Lock::Timeout" "$root/scripts/install-deps" && pass "install-deps sets DPkg::Lock::Timeout" \
  || fail "install-deps does not set DPkg::Lock::Timeout"

# ---- run-tests' ctest step ----------------------------------------------------------------
# Sourcing defines the functions only (main runs when the script is executed); a run-tests
# without run_ctest would run whole when sourced: don't.
if ! grep -q "^run_ctest()" "$root/scripts/run-tests"; then
  fail "scripts/run-tests has no run_ctest function to check"
  echo "check_scripts: $failures check(s) failed" >&2
  exit 1
fi
# shellcheck source=../../scripts/run-tests
source "$root/scripts/run-tests"
set +e
mkdir -p "$work/empty"
out=$(run_ctest "$work/empty" 2>&1); rc=$?
[ $rc != 0 ] && pass "a ctest run over a tree without tests fails (exit $rc)" \
  || fail "a ctest run over a tree without tests exits 0: $out"

# A tree with passing, failing-free and skipped tests, without compiling anything: the
# tests print what a GTEST_SKIP'd test prints, and are labelled as tests/ labels them.
mkdir -p "$work/proj"
cat > "$work/proj/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(fake NONE)
enable_testing()
set(TG_CUDA ON CACHE BOOL "")
set(skip "printf 'x.cpp:1: Skipped\\nno usable CUDA device\\n[  SKIPPED ] T.t\\n'")
foreach(i 1 2 3)
  add_test(NAME Cuda.Skip${i} COMMAND sh -c "${skip}")
  set_tests_properties(Cuda.Skip${i} PROPERTIES LABELS cuda SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endforeach()
add_test(NAME Cuda.Wgmma COMMAND sh -c "printf 'x.cpp:2: Skipped\\nno wgmma path\\n[  SKIPPED ] T.w\\n'")
set_tests_properties(Cuda.Wgmma PROPERTIES LABELS cuda SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
add_test(NAME Cpu.Data COMMAND sh -c "printf 'x.cpp:3: Skipped\\nno PyTorch reference data\\n[  SKIPPED ] T.d\\n'")
set_tests_properties(Cpu.Data PROPERTIES LABELS cpu SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
add_test(NAME Cpu.Pass COMMAND true)
set_tests_properties(Cpu.Pass PROPERTIES LABELS cpu)
CMAKE
cmake -S "$work/proj" -B "$work/proj/build" > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
out=$(run_ctest "$work/proj/build" -j 2 2>&1); rc=$?
[ $rc = 0 ] && pass "run_ctest passes a tree whose tests pass or skip" || fail "run_ctest exit $rc: $out"
line=$(grep "cuda tests skipped" <<< "$out")
if [[ $line == "4 cuda tests skipped: "* && $line == *"3 no usable CUDA device (nvidia-smi: "* &&
      $line == *"1 no wgmma path"* ]]; then
  pass "skip summary: $line"
else
  fail "no or wrong cuda skip summary (got '$line'): $out"
fi
grep -q "^1 other tests skipped: no PyTorch reference data$" <<< "$out" && pass "other skips summarized" \
  || fail "other skips not summarized: $out"
last=$(tail -1 <<< "$out")
# ctest 3.x says "100% tests passed, 0 tests failed out of 6", ctest 4.x "100% tests passed out of 6".
[[ $last =~ ^100%\ tests\ passed(,\ 0\ tests\ failed)?\ out\ of\ 6$ ]] && pass "ctest's closing line comes last: $last" \
  || fail "the last line is not ctest's summary: '$last'"

# ---- install-deps and the package lock ----------------------------------------------------
# A PATH without cmake/ninja/g++ (so something is "missing"), a fake `id` (root) and a fake
# apt-get that reports a held lock for its first $TG_FAKE_LOCKED_CALLS calls.
bin=$work/bin
mkdir -p "$bin"
for tool in bash sh grep mktemp sleep cat rm head; do ln -s "$(command -v $tool)" "$bin/$tool"; done
printf '#!%s\necho 0\n' "$(command -v bash)" > "$bin/id"
cat > "$bin/apt-get" <<FAKE
#!$(command -v bash)
echo "\$*" >> "$work/apt-args"
n=\$(cat "$work/apt-calls" 2>/dev/null || echo 0); echo \$((n + 1)) > "$work/apt-calls"
if [ "\$n" -lt "\${TG_FAKE_LOCKED_CALLS:-0}" ]; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
FAKE
chmod +x "$bin/id" "$bin/apt-get"
rm -f "$work/apt-calls" "$work/apt-args"
out=$(PATH=$bin TG_FAKE_LOCKED_CALLS=2 TG_APT_LOCK_POLL=0.1 TG_APT_LOCK_TIMEOUT=30 \
      "$bin/bash" "$root/scripts/install-deps" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "waiting for the package lock" <<< "$out" && [ "$(cat "$work/apt-calls")" = 4 ]; then
  pass "install-deps waits for a busy lock (2 refused calls, then update + install)"
else
  fail "install-deps did not wait for the lock (exit $rc, $(cat "$work/apt-calls" 2>/dev/null) apt-get calls): $out"
fi
grep -q -- "-o DPkg::Lock::Timeout=30 install" "$work/apt-args" && pass "apt-get gets -o DPkg::Lock::Timeout" \
  || fail "apt-get was called without the lock timeout: $(cat "$work/apt-args")"
rm -f "$work/apt-calls"
out=$(PATH=$bin TG_FAKE_LOCKED_CALLS=1000 TG_APT_LOCK_POLL=0.1 TG_APT_LOCK_TIMEOUT=1 \
      "$bin/bash" "$root/scripts/install-deps" 2>&1); rc=$?
[ $rc != 0 ] && grep -q "gave up waiting for the package lock" <<< "$out" \
  && pass "install-deps gives up after TG_APT_LOCK_TIMEOUT (exit $rc)" \
  || fail "install-deps did not give up on a lock held forever (exit $rc): $out"

if [ $failures != 0 ]; then echo "check_scripts: $failures check(s) failed" >&2; exit 1; fi
echo "check_scripts: all checks passed"
