// tg_bench: times workloads A-D on the GPU -- forward, backward (A, B, D: input and parameter
// gradients; C: parameter gradients, and input too in a backward_dx row) and a whole training
// step (forward + MSE + backward + SGD, no input gradient) -- at FP32 and TF32, and for the
// convolution workloads (A, B) also under tg::Autocast(bf16) ("bf16": BF16 products, f32
// master weights, TF32 elsewhere), each row only after a correctness check of that same
// configuration against sampled f64
// references (a row whose check fails is reported and not timed). Achieved TFLOP/s and GB/s
// are printed beside the machine's ceilings, measured at start: device-to-device copy
// bandwidth and cuBLAS FP32 / TF32 GEMM rates. Workload C runs as the fused layer
// nn::Conv3dGroupNormMean (one op); its checks compare with the f64 unfused definition.
//
//   tg_bench                                  # everything: A, B (NCHW and NHWC), C, D
//   tg_bench --workloads A,D --precision fp32 --quick
//   tg_bench --workloads A --precision bf16     # Autocast rows: checked within 1e-2 (bf16 operands)
//   tg_bench --json > rows.json               # one JSON object (bench/compare_torch.py reads it)
//   tg_bench --workloads B --passes backward --repeats 30 --verbose   # checks and every repeat's time
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "ceilings.h"
#include "common/args.h"
#include "common/example.h"
#include "gpu_timer.h"
#include "json_out.h"
#include "workloads.h"

namespace {

using bench::Pass;
using bench::json_number;
using bench::json_string;

struct Row {
  std::string workload, layout, pass, precision, description;
  bool x_grad = false;  // x required grad (the row includes the input gradient)
  bool ok = false;
  double check_error = 0;  // worst relative error of the row's checks
  std::string failed;      // what failed, when !ok
  bench::Timing timing;
  bench::Cost cost;
};

// f64 mean((y - t)^2) over every element, read from the device in 64 MiB chunks.
double streamed_mse(const tg::Tensor& y, const tg::Tensor& t) {
  const int64_t n = y.numel(), chunk = int64_t(16) << 20;
  double sum = 0;
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t count = std::min(chunk, n - first);
    std::vector<float> a = ex::read_range(y, first, count), b = ex::read_range(t, first, count);
    for (int64_t i = 0; i < count; ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  }
  return sum / double(n);
}

// The checks read f32 values: a bf16 output (Autocast's) is widened first.
tg::Tensor as_f32(const tg::Tensor& t) { return t.dtype() == tg::DType::f32 ? t : t.to(tg::DType::f32); }

// The upstream gradient in the output's dtype (bf16 under Autocast), made before any timing.
tg::Tensor seed_for(const bench::Workload& w, bool autocast) {
  return autocast ? w.dy.to(tg::DType::bf16) : w.dy;
}

// Relative error allowed in a row's checks. bf16 rows: x, w and dy are rounded to bf16 (2^-9
// relative each) and so is each output; summed over hundreds to millions of random-sign
// products those roundings stay near 2^-9 relative (~2e-3), so 1e-2 holds with margin while a
// wrong tap, channel or tile misses by far more.
double row_tolerance(bool autocast) { return autocast ? 1e-2 : ex::tolerance(tg::precision()); }

void zero_grads(bench::Workload& w) {
  for (const tg::Tensor& p : w.parameters()) p.zero_grad();
  w.x.zero_grad();
}

// The correctness check of one (workload, precision, pass), run exactly as it will be timed.
std::vector<bench::NamedCheck> check(bench::Workload& w, Pass pass, bool autocast) {
  const tg::Autocast scope(tg::DType::bf16, autocast);
  if (pass == Pass::forward) return w.check_forward(as_f32(w.forward(w.x)));
  if (pass == Pass::backward || pass == Pass::backward_dx) {
    const bool dx = w.input_grad(pass);
    const tg::Tensor seed = seed_for(w, autocast);
    w.x.requires_grad_(dx);
    {
      tg::Tape tape;
      tape.backward(w.forward(w.x), seed);
    }
    auto checks = w.check_backward(dx ? w.x.grad() : tg::Tensor());
    zero_grads(w);
    w.x.requires_grad_(false);
    return checks;
  }
  // A training step: the output, the loss, and the SGD update on sampled parameter elements.
  std::vector<bench::NamedCheck> checks;
  tg::Tensor y, loss;
  {
    tg::Tape tape;
    y = w.forward(w.x);
    loss = tg::mse_loss(y, w.target);
    tape.backward(loss);
  }
  y = as_f32(y);
  checks = w.check_forward(y);
  checks.push_back({"loss", ex::compare({as_f32(loss).item()}, {streamed_mse(y, w.target)})});
  y = tg::Tensor();
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<double>> before, grads;
  double ww = 0, gg = 0;
  for (const tg::Tensor& p : w.parameters()) {
    idx.push_back(ex::sample_indices(p.numel(), 64, 21));
    before.push_back(ex::read_elements(p, idx.back()));
    grads.push_back(ex::read_elements(p.grad(), idx.back()));
    for (size_t i = 0; i < idx.back().size(); ++i) {
      ww += before.back()[i] * before.back()[i];
      gg += grads.back()[i] * grads.back()[i];
    }
  }
  // A learning rate that moves the weights by ~10%, so the update stands well above rounding.
  const double lr = gg > 0 ? 0.1 * std::sqrt(ww / gg) : 1.0;
  tg::nn::SGD sgd(w.parameters(), {.lr = lr});
  sgd.step();
  std::vector<double> got, want;
  std::vector<tg::Tensor> params = w.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<double> after = ex::read_elements(params[k], idx[k]);
    for (size_t i = 0; i < after.size(); ++i) {
      got.push_back(after[i] - before[k][i]);
      want.push_back(-lr * grads[k][i]);
    }
  }
  checks.push_back({"SGD update", ex::compare(got, want)});
  sgd.zero_grad();
  w.parameters_changed();
  return checks;
}

bench::Timing time_pass(bench::Workload& w, Pass pass, bool autocast, int warmup, int repeats, int idle_ms) {
  cudaStream_t stream = tg::cuda::stream(w.x.device().index);
  const tg::Autocast scope(tg::DType::bf16, autocast);
  if (pass == Pass::forward)
    return bench::measure(stream, warmup, repeats, [&](bench::EventPair& e) {
      e.start();
      tg::Tensor y = w.forward(w.x);
      e.stop();
    }, idle_ms);
  if (pass == Pass::backward || pass == Pass::backward_dx) {
    const tg::Tensor seed = seed_for(w, autocast);
    w.x.requires_grad_(w.input_grad(pass));
    auto t = bench::measure(stream, warmup, repeats, [&](bench::EventPair& e) {
      zero_grads(w);  // fresh gradients each time, as PyTorch's set_to_none: no accumulation
      tg::Tape tape;
      tg::Tensor y = w.forward(w.x);  // recorded, not timed
      e.start();
      tape.backward(y, seed);
      e.stop();
    }, idle_ms);
    zero_grads(w);
    w.x.requires_grad_(false);
    return t;
  }
  // Tiny steps: the timing runs many of them and must not drive the weights anywhere odd.
  tg::nn::SGD sgd(w.parameters(), {.lr = 1e-7});
  auto t = bench::measure(stream, warmup, repeats, [&](bench::EventPair& e) {
    e.start();
    {
      tg::Tape tape;
      tape.backward(tg::mse_loss(w.forward(w.x), w.target));
    }
    sgd.step();
    sgd.zero_grad();
    e.stop();
  }, idle_ms);
  w.parameters_changed();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"quick", "json", "small", "check-only", "verbose"});
    const auto workloads = args.get_list("workloads", {"A", "B", "C", "D"});
    const std::string layout_arg = args.get("layout", "both");
    const auto precisions = args.get_list("precision", {"fp32", "tf32"});
    // backward_dx makes a row only where backward leaves out dx (C).
    const auto pass_names = args.get_list("passes", {"forward", "backward", "backward_dx", "step"});
    const bool quick = args.has("quick"), json = args.has("json");
    const int repeats = static_cast<int>(args.get_int("repeats", quick ? 5 : 20));
    const int warmup = static_cast<int>(args.get_int("warmup", quick ? 1 : 3));
    // --idle-ms N: N ms of idle GPU before each timed repeat (gpu_timer.h says why).
    const int idle_ms = static_cast<int>(args.get_int("idle-ms", 0));
    // --small runs the examples' small shapes; --check-only skips the timing, and with
    // --device cpu tests the benchmark's own checks on a machine without a GPU.
    const bool small = args.has("small"), check_only = args.has("check-only"), verbose = args.has("verbose");
    const tg::Device device = tg::parse_device(args.get("device", "cuda"));
    args.finish("[--workloads A,B,C,D] [--layout nchw|nhwc|both] [--precision fp32,tf32,bf16] "
                "[--passes forward,backward,backward_dx,step] [--quick] [--repeats N] [--warmup N] [--idle-ms N] "
                "[--json] [--small] [--check-only] [--device cuda|cpu] [--verbose]");
    TG_CHECK(check_only || (device.is_cuda() && tg::cuda_available()), "tg_bench needs a GPU (or --check-only)");
    TG_CHECK(layout_arg == "nchw" || layout_arg == "nhwc" || layout_arg == "both", "--layout: nchw, nhwc or both");
    std::vector<Pass> passes;
    for (const auto& p : pass_names) {
      bool known = false;
      for (Pass candidate : {Pass::forward, Pass::backward, Pass::backward_dx, Pass::step})
        if (p == bench::pass_name(candidate)) {
          passes.push_back(candidate);
          known = true;
        }
      TG_CHECK(known, "--passes: forward, backward, backward_dx, step; got ", p);
    }
    for (const auto& p : precisions)
      TG_CHECK(p == "fp32" || p == "tf32" || p == "bf16", "--precision: fp32, tf32 and/or bf16; got ", p);

    // Progress goes to stderr so that --json leaves stdout to the JSON object.
    std::ostream& log = json ? std::cerr : std::cout;
    bench::Ceilings ceil;
    if (!check_only) ceil = bench::measure_ceilings(device.index, repeats);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s: copy %.0f GB/s, FP32 GEMM %.1f TFLOP/s, TF32 GEMM %.1f TFLOP/s (cuBLAS 8192^3); "
                  "median of %d repeats after %d warm-up, %d ms idle before each\n",
                  ceil.gpu.c_str(), ceil.copy_gbps, ceil.fp32_tflops, ceil.tf32_tflops, repeats, warmup, idle_ms);
    if (check_only) std::snprintf(line, sizeof line, "checks only, on %s: nothing is timed\n", device.str().c_str());
    log << line;
    std::snprintf(line, sizeof line, "%-3s %-5s %-11s %-5s %10s %10s %9s %6s %9s %6s\n", "wl", "lay", "pass", "prec",
                  "check err", "ms", "TFLOP/s", "%peak", "GB/s", "%copy");
    log << line << std::flush;

    std::vector<Row> rows;
    for (const std::string& id : workloads) {
      std::vector<std::string> layouts{"nchw"};
      if (id == "B") layouts = layout_arg == "both" ? std::vector<std::string>{"nchw", "nhwc"}
                                                    : std::vector<std::string>{layout_arg};
      for (const std::string& layout : layouts) {
        tg::manual_seed(1);
        auto w = bench::make_workload(id, layout, device, small);
        for (const std::string& prec : precisions) {
          const bool autocast = prec == "bf16";
          if (autocast && !w->autocast_rows()) continue;
          tg::set_precision(prec == "fp32" ? tg::Precision::FP32 : tg::Precision::TF32);
          const double tol = row_tolerance(autocast);
          for (Pass pass : passes) {
            if (!w->has_pass(pass)) continue;
            Row r;
            r.workload = w->name;
            r.layout = w->layout;
            r.pass = bench::pass_name(pass);
            r.precision = prec;
            r.description = w->description;
            r.x_grad = w->input_grad(pass);
            r.cost = w->cost(pass);
            r.ok = true;
            for (const auto& c : check(*w, pass, autocast)) {
              if (verbose)
                log << "    check " << c.what << ": rel error " << c.result.rel_error << " over " << c.result.count
                    << " elements\n";
              r.check_error = std::max(r.check_error, c.result.rel_error);
              if (!c.result.ok(tol)) {
                r.ok = false;
                r.failed += c.what + " (rel error " + std::to_string(c.result.rel_error) + ") ";
              }
            }
            if (r.ok && check_only) {
              std::snprintf(line, sizeof line, "%-3s %-5s %-11s %-5s %10.2e  (check only)\n", r.workload.c_str(),
                            r.layout.c_str(), r.pass.c_str(), r.precision.c_str(), r.check_error);
            } else if (r.ok) {
              r.timing = time_pass(*w, pass, autocast, warmup, repeats, idle_ms);
              // bf16 rows against the TF32 ceiling too (no BF16 GEMM ceiling is measured).
              const double s = r.timing.median_ms * 1e-3, peak = prec == "fp32" ? ceil.fp32_tflops : ceil.tf32_tflops;
              const double tflops = r.cost.flops / s / 1e12, gbps = r.cost.bytes / s / 1e9;
              std::snprintf(line, sizeof line, "%-3s %-5s %-11s %-5s %10.2e %10.3f %9.2f %5.0f%% %9.0f %5.0f%%\n",
                            r.workload.c_str(), r.layout.c_str(), r.pass.c_str(), r.precision.c_str(), r.check_error,
                            r.timing.median_ms, tflops, 100 * tflops / peak, gbps, 100 * gbps / ceil.copy_gbps);
            } else {
              std::snprintf(line, sizeof line, "%-3s %-5s %-11s %-5s CHECK FAILED, not timed: %s\n", r.workload.c_str(),
                            r.layout.c_str(), r.pass.c_str(), r.precision.c_str(), r.failed.c_str());
            }
            log << line << std::flush;
            if (verbose && r.ok && !check_only) {
              // Repeats drift within one process (bench/journal/notes_conv1x1.md, round 4): show them.
              log << "    repeats in order (ms):";
              for (double ms : r.timing.in_order_ms) log << ' ' << ms;
              log << '\n';
            }
            rows.push_back(r);
          }
        }
        w.reset();  // frees its tensors (up to ~25 GB for B) before the next workload
        tg::synchronize(device);
      }
    }

    bool all_ok = true;
    for (const Row& r : rows) all_ok = all_ok && r.ok;
    if (json) {
      std::ostringstream os;
      os.precision(6);
      os << "{\"gpu\": " << json_string(ceil.gpu) << ", \"repeats\": " << repeats << ", \"warmup\": " << warmup << ", \"idle_ms\": " << idle_ms
         << ",\n \"ceilings\": {\"copy_gbps\": " << ceil.copy_gbps << ", \"fp32_tflops\": " << ceil.fp32_tflops
         << ", \"tf32_tflops\": " << ceil.tf32_tflops << "},\n \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        const double s = r.timing.median_ms * 1e-3;
        os << (i ? ",\n  " : "\n  ") << "{\"workload\": " << json_string(r.workload) << ", \"layout\": "
           << json_string(r.layout) << ", \"pass\": " << json_string(r.pass) << ", \"precision\": "
           << json_string(r.precision) << ", \"x_grad\": " << (r.x_grad ? "true" : "false")
           << ", \"description\": " << json_string(r.description)
           << ", \"ok\": " << (r.ok ? "true" : "false") << ", \"check_rel_error\": " << json_number(r.check_error);
        if (r.ok && !check_only)
          os << ", \"ms\": " << r.timing.median_ms << ", \"min_ms\": " << r.timing.min_ms
             << ", \"flops\": " << r.cost.flops << ", \"bytes\": " << r.cost.bytes
             << ", \"tflops\": " << r.cost.flops / s / 1e12 << ", \"gbps\": " << r.cost.bytes / s / 1e9;
        else if (!r.ok)
          os << ", \"failed\": " << json_string(r.failed);
        os << "}";
      }
      os << "\n]}\n";
      std::cout << os.str();
    }
    return all_ok ? 0 : 2;
  });
}
