// tg_zoo: times ordinary layer shapes and one whole model on the GPU (issue 22's list, in
// bench/zoo_rows.cpp and bench/zoo_model.h), so that speed away from the four tuned
// workloads is measured. Per row and precision (FP32, TF32), after a check against
// tapegrad's f64 CPU backend on a slice of the batch (a row that fails it is reported and
// not timed), CUDA events on tapegrad's stream time:
//   layer rows: forward; fwd+bwd (forward recorded on a tape, then tape.backward with a
//               fixed seed gradient: the input gradient and every parameter gradient)
//   model row:  forward; step (forward, cross entropy, backward, SGD, zero_grad)
//
//   tg_zoo                                   # every row, FP32 and TF32
//   tg_zoo --rows 'c2d_1x1|lin_' --precision tf32 --quick
//   tg_zoo --json > zoo.json                 # bench/compare_zoo.py runs this and reads it
//   tg_zoo --list                            # the rows and their shapes; needs no GPU
//   tg_zoo --rows nhwc --back-to-back 20     # diagnosis: 20 calls between the events, so the
//                                            # GPU's own time shows when the host is faster;
//                                            # the log adds the host's time per call
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>

#include "common/args.h"
#include "ops/cuda/policy.h"
#include "common/example.h"
#include "gpu_timer.h"
#include "json_out.h"
#include "zoo_model.h"
#include "zoo_rows.h"

namespace {

struct Result {
  std::string name, kind, shape, spec, precision, pass;
  bool ok = false;
  double check_err = 0;  // worst relative L2 error of the pass's checks
  std::string failed;    // why, when !ok
  bench::Timing timing;
};

struct Options {
  int warmup = 3, repeats = 20, idle_ms = 0;
  int back_to_back = 1;      // calls per timed repeat; times are per call
  double host_ms_last = 0;   // host time per call of the last timed repeat
  cudaStream_t stream = nullptr;
  std::ostream* log = nullptr;
};

// A timed pass: what it runs between the events, and whether it is judged on the backward
// checks as well as the forward ones.
struct PassDef {
  std::string name;
  bool backward = false;
  std::function<void(bench::EventPair&)> run;
  int calls = 1;  // calls between the events (--back-to-back): times are divided by it
};

Result row_base(std::string name, std::string kind, std::string shape, std::string spec, std::string precision) {
  Result r;
  r.name = std::move(name), r.kind = std::move(kind), r.shape = std::move(shape), r.spec = std::move(spec);
  r.precision = std::move(precision);
  return r;
}

void judge(const zoo::Comparisons& checks, double tol, Result& r) {
  for (const auto& [what, c] : checks) {
    r.check_err = std::max(r.check_err, c.rel_error);  // infinite where a value was not finite
    if (c.ok(tol)) continue;
    char err[32];
    std::snprintf(err, sizeof err, "%.2e", c.rel_error);
    r.failed += what + " (rel error " + err + " > " + bench::json_number(tol) + ") ";
  }
}

// One row at the current precision: the check, then each pass that passed it. Errors
// (an unsupported shape, out of memory) fail the row, not the program.
void run_row(Result base, double tol_forward, double tol_backward, const std::function<zoo::Checks()>& check,
             const std::vector<PassDef>& passes, const Options& o, std::vector<Result>& out) {
  zoo::Checks checks;
  std::string error;
  try {
    checks = check();
  } catch (const std::exception& e) {
    error = std::string("check threw: ") + e.what();
  }
  for (const PassDef& p : passes) {
    Result r = base;
    r.pass = p.name;
    r.failed = error;
    if (error.empty()) {
      judge(checks.forward, tol_forward, r);
      if (p.backward) judge(checks.backward, tol_backward, r);
    }
    r.ok = r.failed.empty();
    if (r.ok) {
      try {
        r.timing = bench::measure(o.stream, o.warmup, o.repeats, p.run, o.idle_ms);
        r.timing.median_ms /= p.calls;
        r.timing.min_ms /= p.calls;
        for (double& ms : r.timing.in_order_ms) ms /= p.calls;
      } catch (const std::exception& e) {
        r.ok = false;
        r.failed = std::string("timing threw: ") + e.what();
      }
    }
    char line[256];
    if (r.ok && p.calls > 1)
      std::snprintf(line, sizeof line, "  %-5s %-8s check %9.2e  %10.3f ms per call of %d back to back, host %.3f ms\n",
                    r.precision.c_str(), r.pass.c_str(), r.check_err, r.timing.median_ms, p.calls, o.host_ms_last);
    else if (r.ok)
      std::snprintf(line, sizeof line, "  %-5s %-8s check %9.2e  %10.3f ms\n", r.precision.c_str(), r.pass.c_str(),
                    r.check_err, r.timing.median_ms);
    else
      std::snprintf(line, sizeof line, "  %-5s %-8s FAILED, not timed: ", r.precision.c_str(), r.pass.c_str());
    *o.log << line << (r.ok ? "" : r.failed + "\n") << std::flush;
    out.push_back(r);
  }
}

std::string to_json(const std::string& gpu, const Options& o, const std::string& tolerances,
                    const std::string& model_files, const std::vector<Result>& rows) {
  using bench::json_number, bench::json_string;
  std::ostringstream os;
  os.precision(6);
  os << "{\"gpu\": " << json_string(gpu) << ", \"repeats\": " << o.repeats << ", \"warmup\": " << o.warmup
     << ", \"idle_ms\": " << o.idle_ms << ",\n \"tolerances\": " << tolerances << ",\n \"model_files\": " << model_files
     << ",\n \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Result& r = rows[i];
    os << (i ? ",\n  " : "\n  ") << "{\"name\": " << json_string(r.name) << ", \"kind\": " << json_string(r.kind)
       << ", \"shape\": " << json_string(r.shape) << ", \"spec\": " << r.spec << ", \"precision\": "
       << json_string(r.precision) << ", \"pass\": " << json_string(r.pass) << ", \"ok\": " << (r.ok ? "true" : "false")
       << ", \"check_err\": " << json_number(r.check_err);
    if (r.ok)
      os << ", \"ms\": " << r.timing.median_ms << ", \"min_ms\": " << r.timing.min_ms;
    else
      os << ", \"failed\": " << json_string(r.failed);
    os << "}";
  }
  os << "\n]}\n";
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    ex::Args args(argc, argv, {"quick", "json", "list"});
    const std::regex filter(args.get("rows", "."));
    const auto precisions = args.get_list("precision", {"fp32", "tf32"});
    const bool quick = args.has("quick"), json = args.has("json"), list = args.has("list");
    Options o;
    o.repeats = static_cast<int>(args.get_int("repeats", quick ? 5 : 20));
    o.warmup = static_cast<int>(args.get_int("warmup", quick ? 1 : 3));
    o.idle_ms = static_cast<int>(args.get_int("idle-ms", 0));  // bench/gpu_timer.h says why
    o.back_to_back = static_cast<int>(args.get_int("back-to-back", 1));
    TG_CHECK(o.back_to_back >= 1, "--back-to-back: at least 1; got ", o.back_to_back);
    // Relative L2 limits. Layer rows: the issue's. The model's output compounds ~20 layers'
    // rounding: the examples' end-to-end limits (ex::tolerance); its gradients also cross
    // ReLU kinks (zoo_model.h, ModelRow::check): a limit that catches wrong kernels only.
    const double tol_layer[2] = {args.get_double("tol-fp32", 1e-5), args.get_double("tol-tf32", 1e-3)};
    // bf16 (Autocast): each operand rounded to bf16 (2^-9 relative) makes a product's error up to
    // 2^-8, random in sign, so a sum's relative error is of order 2^-9; the output's rounding
    // adds 2^-9; the gradients pass two roundings. 1e-2 holds all that and catches a wrong kernel.
    const double tol_bf16 = args.get_double("tol-bf16", 1e-2);
    // The model under Autocast(bf16): about twenty layers each rounding its operands and output
    // to bf16 (~3e-3 each, adding in quadrature where GroupNorm renormalises: ~1.5e-2 on the
    // logits); its gradients also cross ReLU kinks (ModelRow::check), where bf16 flips far more
    // branches than TF32: limits that catch wrong kernels (errors of order one), not rounding.
    const double tol_model_bf16 = args.get_double("model-tol-bf16", 5e-2);
    const double tol_grads_bf16 = args.get_double("model-grad-tol-bf16", 2.5e-1);
    const double tol_model[2] = {args.get_double("model-tol-fp32", ex::tolerance(tg::Precision::FP32)),
                                 args.get_double("model-tol-tf32", ex::tolerance(tg::Precision::TF32))};
    const double tol_grads[2] = {args.get_double("model-grad-tol-fp32", 1e-2),
                                 args.get_double("model-grad-tol-tf32", 1e-1)};
    const int64_t model_batch = args.get_int("model-batch", 64);
    const std::string prefix =
        args.get("model-files", (std::filesystem::temp_directory_path() / "tg_zoo_resnet18gn").string());
    const tg::Device device = tg::parse_device(args.get("device", "cuda"));
    // auto: the dispatchers' own order; engine: the implicit-GEMM engine wherever it serves
    // (measures it on shapes a specialised kernel would take).
    const std::string policy = args.get("policy", "auto");
    TG_CHECK(policy == "auto" || policy == "engine", "--policy: auto or engine; got ", policy);
    tg::cuda::KernelPolicy kernels;
    if (policy == "engine") kernels.conv = kernels.gemm = tg::cuda::KernelPath::Engine;
    kernels.engine.tile = static_cast<int>(args.get_int("engine-tile", 0));     // 0, 128, 64 or 16
    kernels.engine.splits = static_cast<int>(args.get_int("engine-splits", 0));  // 0: the engine's choice
    kernels.engine.arch = static_cast<int>(args.get_int("engine-arch", 0));      // 0, 80 (mma.sync) or 90
    kernels.engine.blocks_per_sm = static_cast<int>(args.get_int("engine-blocks-per-sm", 0));  // 0, 1 or 2 (TMA kernel)
    kernels.engine.wgrad_columns = static_cast<int>(args.get_int("engine-wgrad-columns", 0));  // 0, 1 or -1
    kernels.engine.wgrad_shifted = static_cast<int>(args.get_int("engine-wgrad-shifted", 0));  // 0, 1 or -1
    kernels.engine.tma_store = static_cast<int>(args.get_int("engine-tma-store", 0));  // 0 or -1
    kernels.engine.fp32_tma = static_cast<int>(args.get_int("engine-fp32-tma", 0));    // 0 or -1
    kernels.engine.tma_quads = static_cast<int>(args.get_int("engine-tma-quads", 0));  // 0, 1 or -1
    tg::cuda::set_kernel_policy(kernels);
    args.finish("[--rows REGEX] [--precision fp32,tf32,bf16] [--quick] [--repeats N] [--warmup N] [--idle-ms N] [--json] "
                "[--list] [--back-to-back N] [--tol-fp32 X] [--tol-tf32 X] [--tol-bf16 X] [--model-tol-fp32 X] "
                "[--model-tol-tf32 X] [--model-tol-bf16 X] [--model-grad-tol-bf16 X] "
                "[--model-grad-tol-fp32 X] [--model-grad-tol-tf32 X] [--model-batch N] [--model-files PREFIX] "
                "[--device cuda[:N]] [--policy auto|engine] [--engine-tile 0|128|64|16] [--engine-splits N] [--engine-arch 0|80|90] "
                "[--engine-blocks-per-sm 0|1|2] [--engine-wgrad-columns 0|1|-1] [--engine-wgrad-shifted 0|1|-1] "
                "[--engine-tma-store 0|-1] "
                "[--engine-fp32-tma 0|-1] [--engine-tma-quads 0|1|-1]");
    for (const auto& p : precisions)
      TG_CHECK(p == "fp32" || p == "tf32" || p == "bf16", "--precision: fp32, tf32 and/or bf16; got ", p);
    const std::string model_name = "resnet18gn_64x64_b" + std::to_string(model_batch);

    std::vector<zoo::LayerSpec> specs;
    for (const zoo::LayerSpec& s : zoo::layer_specs())
      if (std::regex_search(s.name, filter)) specs.push_back(s);
    const bool with_model = std::regex_search(model_name, filter);
    if (list) {
      for (const zoo::LayerSpec& s : specs) std::cout << s.name << "  " << s.shape() << "\n";
      if (with_model) std::cout << model_name << "  ResNet-18-style GroupNorm model, batch " << model_batch << "\n";
      return 0;
    }
    TG_CHECK(device.is_cuda() && tg::cuda_available(), "tg_zoo needs a GPU");
    cudaDeviceProp prop{};
    TG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
    o.stream = tg::cuda::stream(device.index);
    // Progress goes to stderr so that --json leaves stdout to the JSON object.
    o.log = json ? &std::cerr : &std::cout;
    *o.log << prop.name << ": median of " << o.repeats << " repeats after " << o.warmup << " warm-up, " << o.idle_ms
           << " ms idle before each; limits fp32 " << tol_layer[0] << ", tf32 " << tol_layer[1] << " (model "
           << tol_model[0] << ", " << tol_model[1] << "; its gradients " << tol_grads[0] << ", " << tol_grads[1]
           << ")\n";

    std::vector<Result> results;
    for (const zoo::LayerSpec& spec : specs) {
      *o.log << spec.name << ": " << spec.shape() << "\n" << std::flush;
      std::unique_ptr<zoo::LayerRow> row;
      std::string setup_error;
      try {
        tg::manual_seed(1);
        row = std::make_unique<zoo::LayerRow>(spec, device);
      } catch (const std::exception& e) {
        setup_error = std::string("setup threw: ") + e.what();
      }
      // With --back-to-back N the events bracket N calls; the timing divides by N.
      const auto timed_calls = [&](bench::EventPair& e, const std::function<void()>& call) {
        const auto t0 = std::chrono::steady_clock::now();
        e.start();
        for (int i = 0; i < o.back_to_back; ++i) call();
        e.stop();
        o.host_ms_last = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                         o.back_to_back;
      };
      const std::vector<PassDef> passes{
          {"forward", false, [&](bench::EventPair& e) { timed_calls(e, [&] { tg::Tensor y = row->forward(); }); },
           o.back_to_back},
          {"fwd+bwd", true, [&](bench::EventPair& e) {
             row->x.requires_grad_(true);
             row->zero_grads();  // fresh gradients each time, as PyTorch's set_to_none
             timed_calls(e, [&] {
               tg::Tape tape;
               const tg::Tensor y = row->forward();
               tape.backward(y, row->seed_for(y));
             });
           },
           o.back_to_back}};
      for (const std::string& prec : precisions) {
        // bf16: mixed precision as PyTorch's autocast (the f32 ops left inside it at FP32).
        tg::set_precision(prec == "tf32" ? tg::Precision::TF32 : tg::Precision::FP32);
        if (row) row->bf16 = prec == "bf16";
        const Result base = row_base(spec.name, zoo::kind_name(spec.kind), spec.shape(), spec.json(), prec);
        auto check = [&] {
          if (!row) throw std::runtime_error(setup_error);
          return row->check();
        };
        const double tol = prec == "bf16" ? tol_bf16 : tol_layer[prec == "tf32"];
        run_row(base, tol, tol, check, passes, o, results);
      }
      row.reset();
      tg::synchronize(device);
    }

    std::string model_files = "null";
    if (with_model) {
      std::unique_ptr<zoo::ModelRow> m;
      std::string setup_error;
      try {
        tg::manual_seed(1);
        m = std::make_unique<zoo::ModelRow>(device, model_batch, prefix);
        model_files = "{\"weights\": " + bench::json_string(m->weights_path) + ", \"io\": " +
                      bench::json_string(m->io_path) + "}";
        *o.log << model_name << ": " << m->shape() << "\n" << std::flush;
      } catch (const std::exception& e) {
        setup_error = std::string("setup threw: ") + e.what();
      }
      for (const std::string& prec : precisions) {
        tg::set_precision(prec == "tf32" ? tg::Precision::TF32 : tg::Precision::FP32);
        if (m) m->bf16 = prec == "bf16";
        std::unique_ptr<tg::nn::SGD> sgd;
        auto check = [&] {
          if (!m) throw std::runtime_error(setup_error);
          m->restore_weights();  // the previous precision's timed steps moved them
          sgd = std::make_unique<tg::nn::SGD>(m->model.parameters(), tg::nn::SGDOptions{.lr = zoo::kLr});
          return m->check();
        };
        const std::vector<PassDef> passes{
            {"forward", false, [&](bench::EventPair& e) {
               e.start();
               tg::Tensor logits = m->logits();
               e.stop();
             }},
            {"step", true, [&](bench::EventPair& e) {
               e.start();
               {
                 tg::Tape tape;
                 tape.backward(m->loss());
               }
               sgd->step();
               sgd->zero_grad();
               e.stop();
             }}};
        const Result base = row_base(model_name, "model", m ? m->shape() : "", m ? m->json() : "null", prec);
        if (prec == "bf16") run_row(base, tol_model_bf16, tol_grads_bf16, check, passes, o, results);
        else run_row(base, tol_model[prec == "tf32"], tol_grads[prec == "tf32"], check, passes, o, results);
      }
    }

    bool all_ok = true;
    for (const Result& r : results) all_ok = all_ok && r.ok;
    if (json) {
      std::ostringstream tol;
      tol << "{\"fp32\": " << tol_layer[0] << ", \"tf32\": " << tol_layer[1] << ", \"bf16\": " << tol_bf16
          << ", \"model_fp32\": " << tol_model[0]
          << ", \"model_tf32\": " << tol_model[1] << ", \"model_bf16\": " << tol_model_bf16
          << ", \"model_grads_fp32\": " << tol_grads[0]
          << ", \"model_grads_tf32\": " << tol_grads[1] << ", \"model_grads_bf16\": " << tol_grads_bf16 << "}";
      std::cout << to_json(prop.name, o, tol.str(), model_files, results);
    }
    return all_ok ? 0 : 2;
  });
}
