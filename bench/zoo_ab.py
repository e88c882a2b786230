#!/usr/bin/env python3
"""A/B of tapegrad against itself on the zoo: two sets of `tg_zoo --json` outputs, side A and
side B (e.g. a kernel policy flag off and on), run alternately in one session on one GPU.

    for i in 1 2; do
      tg_zoo --json > a_$i.json
      tg_zoo --json --engine-tma-store -1 > b_$i.json
    done
    bench/zoo_ab.py a_1.json a_2.json -- b_1.json b_2.json

Per row and pass, the fastest median over each side's runs; prints B/A per row and the
geometric mean of B/A over the layer rows per precision (the model rows are printed, not
averaged). Rows that failed their correctness check on either side are listed, not compared.
"""
import json
import math
import sys


def load(paths):
    best, failed = {}, []
    for path in paths:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                key = (row["name"], row["precision"], row["pass"])
                if not row.get("ok"):
                    failed.append((path, key, row.get("failed", "")))
                    continue
                best[key] = min(best.get(key, math.inf), row["ms"])
    return best, failed


def main(argv):
    if "--" not in argv:
        sys.exit("usage: zoo_ab.py A.json [A.json ...] -- B.json [B.json ...]")
    cut = argv.index("--")
    (a, failed_a), (b, failed_b) = load(argv[:cut]), load(argv[cut + 1:])
    for path, key, why in failed_a + failed_b:
        print(f"FAILED in {path}: {' '.join(key)}: {why}")
    logs = {}
    for key in sorted(a.keys() & b.keys()):
        ratio = b[key] / a[key]
        name, precision, pass_name = key
        print(f"{name:44s} {precision:5s} {pass_name:8s} A {a[key]:8.4f} B {b[key]:8.4f} B/A {ratio:.3f}")
        if pass_name in ("forward", "fwd+bwd") and not name.startswith("resnet"):
            logs.setdefault(precision, []).append(math.log(ratio))
    for precision, values in sorted(logs.items()):
        print(f"geomean B/A {precision}: {math.exp(sum(values) / len(values)):.4f} over {len(values)} layer rows")
    return 1 if failed_a or failed_b else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
