#!/usr/bin/env bash
# A rank that throws, hangs or dies must end the whole job with a non-zero status and a
# clear message within a bounded time (never hang): failure_probe under mpirun, 2 ranks.
#   check_failures.sh MPIRUN PROBE [--gpu]
set -uo pipefail
mpirun=$1 probe=$2 gpu=${3:-}
limit=60   # the job must end well within this (the hang case times out after 3 s)
status=0
run_case() {  # mode, then the texts its output must contain
  local mode=$1; shift
  local out start rc elapsed
  start=$(date +%s)
  out=$(TG_DIST_TIMEOUT=3 timeout $limit $mpirun --allow-run-as-root --oversubscribe -np 2 \
          -x TG_DIST_TIMEOUT -x NCCL_NVLS_ENABLE=0 "$probe" "$mode" $gpu 2>&1)
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  local ok=1
  if [ $rc = 124 ] || [ $rc = 137 ]; then echo "FAIL $mode: still running after $limit s (hang)"; ok=0; fi
  if [ $rc = 0 ]; then echo "FAIL $mode: the job exited 0"; ok=0; fi
  for text in "$@"; do
    if ! grep -qF -- "$text" <<< "$out"; then echo "FAIL $mode: output lacks '$text'"; ok=0; fi
  done
  if grep -qF "no failure was detected" <<< "$out"; then echo "FAIL $mode: a rank went on"; ok=0; fi
  if [ $ok = 1 ]; then
    echo "ok   $mode: exit $rc after $elapsed s"
  else
    status=1
    echo "----- output of $mode -----"; echo "$out" | tail -40; echo "-----"
  fi
}
run_case throw "rank 1 of 2 is terminating" "planted failure on rank 1"
run_case hang "timed out after 3" "all_reduce"
run_case die "exited"
exit $status
