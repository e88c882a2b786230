// A tour of the tape, for people learning how reverse-mode autograd works.
//
// We compute, for a 2x3 input x and two 3-vectors w and b (broadcast over x's rows):
//
//     z1   = x * w          (elementwise, w repeated for each row)
//     z    = z1 + b
//     y    = relu(z)
//     y2   = y * y
//     loss = mean(y2)       (6 elements)
//
// While a tg::Tape is alive, every op whose input requires grad appends an entry: the op's
// name, its inputs and outputs, and what it saved for its backward. Tape::on_record shows
// each entry as it is made. tape.backward(loss) then walks the entries in reverse, and
// Tape::on_gradient shows each gradient as it is produced. Beside each one we print the
// value derived by hand (below, and recomputed with plain loops in hand_gradients()):
//
//   d loss / d y2  = 1/6                         (mean over 6 elements)
//   d loss / d y   = 2 y / 6 = y / 3             (y*y uses y twice: mul hands y/6 to
//                                                 each of its inputs, the tape adds them)
//   d loss / d z   = y/3 where z > 0, else 0     (relu passes the gradient or blocks it)
//   d loss / d z1  = d loss / d z                (add passes it through)
//   d loss / d b   = sum over rows of d loss/dz  (b was broadcast over the rows, so its
//                                                 gradient sums what each row received)
//   d loss / d x   = d loss/dz1 * w
//   d loss / d w   = sum over rows of (d loss/dz1 * x)
//
// Finally tg::gradcheck compares the tape's gradients with central finite differences.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/example.h"
#include "tapegrad/tapegrad.h"

namespace {

constexpr int kRows = 2, kCols = 3;
const std::vector<double> kX = {1.0, -2.0, 0.5,   // two of the six z's come out negative,
                                3.0, 0.5, -1.0};  // so relu has something to block
const std::vector<double> kW = {0.5, -1.0, 2.0};
const std::vector<double> kB = {0.1, 0.2, -0.5};

std::string values(const std::vector<double>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", v[i] + 0.0);  // + 0.0 prints -0 as 0
    s += buf;
  }
  return s + "]";
}

std::string shapes(const std::vector<tg::Tensor>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + (ts[i].defined() ? ts[i].shape().str() : "-");
  return s.empty() ? "nothing" : s;
}

// The gradients derived by hand in the comment above, with plain loops.
// Keyed by (tape entry index, input index), the order the tape records in.
std::map<std::pair<size_t, size_t>, std::vector<double>> hand_gradients() {
  const int n = kRows * kCols;
  std::vector<double> z(n), y(n), d_y2(n, 1.0 / n), half_d_y(n), d_z(n), d_b(kCols, 0), d_x(n), d_w(kCols, 0);
  for (int i = 0; i < n; ++i) {
    z[i] = kX[i] * kW[i % kCols] + kB[i % kCols];
    y[i] = z[i] > 0 ? z[i] : 0;
    half_d_y[i] = y[i] / n;  // what mul(y, y) gives each of its two inputs: 1/6 * (the other factor)
    d_z[i] = z[i] > 0 ? 2 * half_d_y[i] : 0;
    d_b[i % kCols] += d_z[i];
    d_x[i] = d_z[i] * kW[i % kCols];
    d_w[i % kCols] += d_z[i] * kX[i];
  }
  // Entries: 0 mul(x, w), 1 add(z1, b), 2 relu(z), 3 mul(y, y), 4 mean(y2).
  return {{{4, 0}, d_y2}, {{3, 0}, half_d_y}, {{3, 1}, half_d_y}, {{2, 0}, d_z},
          {{1, 0}, d_z},  {{1, 1}, d_b},      {{0, 0}, d_x},      {{0, 1}, d_w}};
}

tg::Tensor model(const tg::Tensor& x, const tg::Tensor& w, const tg::Tensor& b) {
  tg::Tensor y = tg::relu(x * w + b);
  return tg::mean(y * y);
}

}  // namespace

int main(int argc, char** argv) {
  return ex::guarded_main([&] {
    // No options; parsed anyway so that --help answers and a typo is not silently ignored.
    ex::Args args(argc, argv, {});
    args.finish("(no options)\n  prints each tape entry as it is recorded and each gradient as backward makes it,\n"
                "  beside the value derived by hand, then runs tg::gradcheck");
    // f64 throughout, so that gradcheck's finite differences are meaningful.
    tg::Tensor x = tg::from_vector(kX, {kRows, kCols}).requires_grad_();
    tg::Tensor w = tg::from_vector(kW, {kCols}).requires_grad_();
    tg::Tensor b = tg::from_vector(kB, {kCols}).requires_grad_();
    auto hand = hand_gradients();

    double worst = 0;  // largest |tape - hand| difference
    {
      tg::Tape tape;  // records while it is alive: ends with this block
      tape.on_record = [&](const tg::TapeEntry& e) {
        std::printf("record #%zu %-6s inputs %-22s -> outputs %-8s saved %s\n", tape.entries().size() - 1,
                    e.op.c_str(), shapes(e.inputs).c_str(), shapes(e.outputs).c_str(), shapes(e.saved).c_str());
      };
      tape.on_gradient = [&](const tg::TapeEntry& e, size_t input, const tg::Tensor& g) {
        const size_t entry = static_cast<size_t>(&e - tape.entries().data());
        std::vector<double> got = g.to_vector<double>();
        const auto& want = hand.at({entry, input});
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
        std::printf("gradient for input %zu of #%zu %s\n    tape %s\n    hand %s\n", input, entry, e.op.c_str(),
                    values(got).c_str(), values(want).c_str());
      };

      std::printf("== forward: y = relu(x * w + b), loss = mean(y * y)\n");
      tg::Tensor loss = model(x, w, b);
      std::printf("loss = %.6f\n\n== backward (the tape in reverse)\n", loss.item());
      tape.backward(loss);

      std::printf("\n== leaf gradients (accumulated into .grad())\n");
      std::printf("x.grad %s\nw.grad %s\nb.grad %s\n", values(x.grad().to_vector<double>()).c_str(),
                  values(w.grad().to_vector<double>()).c_str(), values(b.grad().to_vector<double>()).c_str());
      std::printf("largest |tape - hand| difference: %.3g\n", worst);
    }

    std::printf("\n== gradcheck (central differences in f64)\n");
    auto fn = [](const std::vector<tg::Tensor>& in) { return model(in[0], in[1], in[2]); };
    tg::GradcheckResult r = tg::gradcheck(fn, {x, w, b});
    std::printf("gradcheck: %s (max abs error %.3g)%s%s\n", r.ok ? "passed" : "FAILED", r.max_abs_error,
                r.ok ? "" : ": ", r.message.c_str());
    return r.ok && worst < 1e-12 ? 0 : 1;
  });
}
