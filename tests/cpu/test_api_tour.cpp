// The README's API tour, compiled and run: every code block of the tour is a region of
// this file between "// tour:begin NAME" and "// tour:end", and the last test checks that
// README.md holds each region verbatim (indentation removed). Change a snippet here and
// the README must follow, or this test fails; so the README's code cannot rot.
// On a machine with a GPU the snippets run there (`dev`), else on the CPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "data/dataloader.h"
#include "tapegrad/tapegrad.h"

namespace {

const tg::Device dev = tg::cuda_available() ? tg::Device::cuda() : tg::Device::cpu();

TEST(ApiTour, Tensors) {
  using namespace tg;
  // tour:begin tensors
  Tensor a = zeros({2, 3});                                       // f32 on the CPU
  Tensor b = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor c = randn({2, 3}, {.dtype = DType::f64});                // seeded: manual_seed(n)
  Tensor i = arange(6, {.dtype = DType::i64}).reshape({3, 2});    // reshape is a view
  EXPECT_EQ(b.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.dtype(), DType::f32);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));

  Tensor t = b.permute({1, 0});                // a copy, (3, 2)
  Tensor d = (b * 2.0 + a).to(DType::f64);     // ops broadcast; to(dtype) converts
  EXPECT_EQ(sum(d).item(), 42.0);              // item(): the value of a one-element tensor
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));

  Tensor g = b.to(dev);                        // dev: Device::cuda() or Device::cpu()
  EXPECT_EQ(g.device(), dev);
  EXPECT_EQ(g.to_vector<float>(), b.to_vector<float>());   // to_vector copies to the host
  // tour:end
  EXPECT_EQ(c.dtype(), DType::f64);
}

TEST(ApiTour, Tape) {
  using namespace tg;
  // tour:begin tape
  Tensor w = from_vector(std::vector<float>{1, -2, 3}, {3}).requires_grad_();   // a leaf
  Tensor x = from_vector(std::vector<float>{4, 5, 6}, {3});
  {
    Tape tape;                       // records ops on this thread while alive
    Tensor y = sum(w * x);           // y = w . x
    tape.backward(y);                // dy/dw = x, into w.grad()
  }                                  // the tape and what it saved are freed here
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 5, 6}));

  {
    Tape tape;                       // a leaf's grad accumulates across backward calls
    tape.backward(sum(w * x));
  }
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{8, 10, 12}));
  w.zero_grad();                     // drops it (grad() is then undefined)
  EXPECT_FALSE(w.grad().defined());

  Tensor z = w * x;                  // no tape alive: nothing is recorded
  EXPECT_FALSE(z.requires_grad());
  {
    Tape tape;
    NoGradGuard no_grad;             // pauses recording in its scope
    EXPECT_FALSE((w * x).requires_grad());
  }
  // tour:end
}

std::shared_ptr<tg::nn::Sequential> tour_model() {
  using namespace tg;
  // tour:begin modules
  manual_seed(0);                    // parameters are initialized as PyTorch does, seeded
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2d>(
      nn::Conv2dOptions{.in_channels = 3, .out_channels = 8, .kernel_size = 3, .padding = 1}));
  net->add(std::make_shared<nn::GroupNorm>(nn::GroupNormOptions{.num_groups = 2, .num_channels = 8}));
  net->add(std::make_shared<nn::ReLU>());
  net->add(std::make_shared<nn::MeanPool>());      // (N, 8, H, W) -> (N, 8)
  net->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 8, .out_features = 10}));
  // tour:end
  return net;
}

TEST(ApiTour, ModulesOptimizersCheckpoints) {
  using namespace tg;
  auto net = tour_model();
  // tour:begin modules-use
  Tensor logits = (*net)(randn({4, 3, 16, 16}));
  EXPECT_EQ(logits.shape(), (Shape{4, 10}));
  EXPECT_EQ(net->parameters().size(), 6u);          // weight and bias of 0, 1 and 4
  EXPECT_EQ(net->named_parameters()[0].first, "0.weight");   // PyTorch's state_dict names
  net->eval();                                      // train()/eval() set is_training()
  EXPECT_FALSE(net->is_training());
  net->train();
  net->to(dev);                                     // moves the data inside the same tensors
  // tour:end

  // tour:begin optimizers
  nn::Adam opt(net->parameters(), {.lr = 1e-2});    // or nn::SGD(params, {.lr = 0.1, .momentum = 0.9})
  Tensor x = randn({4, 3, 16, 16}, {.device = dev});
  Tensor labels = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}, {.dtype = DType::i64, .device = dev});
  for (int step = 0; step < 3; ++step) {
    Tape tape;
    Tensor loss = cross_entropy((*net)(x), labels);
    tape.backward(loss);
    opt.step();                                     // updates the parameters in place
    opt.zero_grad();
  }
  opt.set_lr(opt.lr() * 0.5);                       // a schedule sets it between steps
  EXPECT_EQ(opt.step_count(), 3);
  // tour:end

  const std::string dir = (std::filesystem::temp_directory_path() / "tg_api_tour").string();
  std::filesystem::create_directories(dir);
  // tour:begin checkpoints
  save(*net, opt, dir + "/ckpt.safetensors");       // parameters, buffers, optimizer state
  auto again = tour_model();
  again->to(dev);
  nn::Adam opt2(again->parameters(), {.lr = 1e-2});
  load(*again, opt2, dir + "/ckpt.safetensors");    // resumes bit for bit, lr included
  EXPECT_EQ(opt2.lr(), opt.lr());

  nn::Conv2d conv({.in_channels = 3, .out_channels = 8, .kernel_size = 3, .padding = 1});
  load(conv, dir + "/ckpt.safetensors", {.prefix = "0."});     // "0.weight" -> "weight"
  LoadResult r = load(conv, dir + "/ckpt.safetensors", {.strict = false});
  EXPECT_EQ(r.missing.size(), 2u);                  // weight, bias: the file has 0.weight ...
  EXPECT_EQ(r.unexpected.size(), 6u);               // its six model keys (optim.* is skipped)
  // tour:end
  EXPECT_EQ(conv.parameters()[0].to_vector<float>(), net->parameters()[0].to_vector<float>());
  std::filesystem::remove_all(dir);
}

TEST(ApiTour, MixedPrecision) {
  using namespace tg;
  manual_seed(7);
  // tour:begin mixed-precision
  nn::Linear fc({.in_features = 8, .out_features = 4});   // f32 parameters, on the CPU
  nn::SGD sgd(fc.parameters(), {.lr = 0.1});
  nn::GradScaler scaler;                                   // loss scaling (needed with f16)
  Tensor inputs = randn({16, 8}), targets = randn({16, 4});
  Tape tape;
  Tensor out, loss;
  {
    Autocast ac(DType::bf16);          // matrix ops in bf16; norms, softmax, losses in f32
    out = fc(inputs);                  // bf16: an f32 product of bf16 operands, rounded once
    loss = mse_loss(out, targets);     // f32
  }
  tape.backward(scaler.scale(loss));   // after the scope, as in PyTorch
  scaler.step(sgd);                    // skipped if a gradient is infinite or NaN
  scaler.update();
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_EQ(fc.weight.grad().dtype(), DType::f32);   // gradients reach the f32 parameters
  // tour:end
  EXPECT_EQ(loss.dtype(), DType::f32);
}

TEST(ApiTour, Errors) {
  using namespace tg;
  // tour:begin errors
  try {
    matmul(randn({2, 3}), randn({4, 5}));
    FAIL() << "no exception";
  } catch (const ShapeError& e) {                   // a subclass of tg::Error
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);   // shapes in the message
  }
  EXPECT_THROW(randn({2}) + randn({2}, {.dtype = DType::f64}), DTypeError);
  EXPECT_THROW(nn::SGD(std::vector<Tensor>{randn({2})}, {}), Error);   // lr 0 trains nothing: refused
  EXPECT_THROW(load(*std::make_shared<nn::ReLU>(), "/no/such/file.safetensors"), IOError);
  // tour:end
}

TEST(ApiTour, Timing) {
  using namespace tg;
  // tour:begin timing
  Tensor x = randn({8, 16, 32, 32}, {.device = dev}), w = randn({32, 16, 3, 3}, {.device = dev});
  GpuTimer timer(dev);               // CUDA events on tapegrad's stream; on the CPU a clock
  timer.start();
  Tensor y = conv2d(x, w);
  timer.stop();
  double ms = timer.elapsed_ms();    // waits for the stop event only
  synchronize(dev);                  // waits for everything queued on the device
  // tour:end
  EXPECT_GE(ms, 0.0);
  EXPECT_EQ(y.shape(), (Shape{8, 32, 30, 30}));
}

TEST(ApiTour, Data) {
  using namespace tg;
  // tour:begin data
  auto dataset = std::make_shared<data::TensorDataset>(randn({100, 4}), randn({100, 1}));
  data::DataLoader loader(dataset, {.batch_size = 32, .shuffle = true, .seed = 1,
                                    .drop_last = true, .num_workers = 2, .device = dev});
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (data::Batch& batch : loader) {              // each range-for is a new epoch
      EXPECT_EQ(batch.input.shape(), (Shape{32, 4}));
      EXPECT_EQ(batch.target.device(), dev);
    }
  }
  // tour:end
  EXPECT_EQ(loader.epoch(), 2);
}

// ---- the README holds every region verbatim ---------------------------------------------

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// name -> the region's lines with their common indentation removed.
std::map<std::string, std::string> tour_regions(const std::string& source) {
  std::map<std::string, std::string> regions;
  std::istringstream in(source);
  std::string line, name;
  std::vector<std::string> lines;
  const std::string begin = "// tour:" "begin ", end = "// tour:" "end";  // split: not a marker itself
  while (std::getline(in, line)) {
    const auto at = line.find(begin);
    if (at != std::string::npos) {
      name = line.substr(at + begin.size());
      lines.clear();
    } else if (line.find(end) != std::string::npos && !name.empty()) {
      std::size_t indent = std::string::npos;
      for (const auto& l : lines)
        if (l.find_first_not_of(' ') != std::string::npos) indent = std::min(indent, l.find_first_not_of(' '));
      std::string text;
      for (const auto& l : lines) text += (l.size() > indent ? l.substr(indent) : std::string()) + "\n";
      regions[name] = text;
      name.clear();
    } else if (!name.empty()) {
      lines.push_back(line);
    }
  }
  return regions;
}

TEST(ApiTour, ReadmeHoldsEverySnippet) {
  const std::filesystem::path self = __FILE__;  // the build passes absolute source paths
  const auto root = self.parent_path().parent_path().parent_path();
  ASSERT_TRUE(std::filesystem::exists(root / "README.md")) << "no README.md beside " << self;
  const std::string readme = read_text(root / "README.md");
  const auto regions = tour_regions(read_text(self));
  EXPECT_EQ(regions.size(), 10u);
  for (const auto& [name, text] : regions)
    EXPECT_NE(readme.find("```cpp\n" + text + "```\n"), std::string::npos)
        << "README.md lacks the tour snippet '" << name << "' as a code block:\n" << text;
}

}  // namespace
