#include "nn/optim/optimizer.h"

#include <charconv>
#include <cmath>
#include <map>

#include "autograd/tape.h"
#include "core/cuda_graph.h"
#include "core/profiler.h"

namespace tg::nn {

Optimizer::Optimizer(std::vector<Tensor> params) { add_group_params(std::move(params)); }

void Optimizer::add_group_params(std::vector<Tensor> params) {
  const size_t first = params_.size();
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& p = params[k];
    const size_t i = first + k;  // the index it will have: messages name it as state keys do
    TG_CHECK(p.defined(), "Optimizer: parameter ", i, " is an undefined tensor");
    TG_CHECK(is_floating(p.dtype()), "Optimizer: parameter ", i, " ", describe(p), " is not floating point");
    TG_CHECK(p.is_leaf(), "Optimizer: parameter ", i, " ", describe(p),
             " is not a leaf (it was computed by an op on a tape); optimize the leaf it came from");
    for (size_t j = 0; j < first; ++j)
      TG_CHECK(!params_[j].same(p), "Optimizer: parameter ", i, " is the same tensor as parameter ", j,
               " (of param group ", group_of_[j], "); a parameter belongs to one group");
    for (size_t j = 0; j < k; ++j)
      TG_CHECK(!params[j].same(p), "Optimizer: parameter ", i, " is the same tensor as parameter ", first + j);
  }
  // Checked: the rest cannot fail but for memory.
  const size_t group = group_begin_.size();
  group_begin_.push_back(first);
  group_of_.resize(first + params.size(), group);
  initial_lrs_.emplace_back();
  state_.resize(first + params.size());
  for (Tensor& p : params) params_.push_back(std::move(p));
}

void Optimizer::check_group(const char* op, size_t group) const {
  TG_CHECK(group < group_begin_.size(), name(), "::", op, ": param group ", group, " out of range (",
           group_begin_.size(), " groups)");
}

size_t Optimizer::param_group_begin(size_t group) const {
  check_group("param_group_begin", group);
  return group_begin_[group];
}

size_t Optimizer::param_group_end(size_t group) const {
  check_group("param_group_end", group);
  return group + 1 < group_begin_.size() ? group_begin_[group + 1] : params_.size();
}

size_t Optimizer::param_group_of(size_t param_index) const {
  TG_CHECK(param_index < group_of_.size(), name(), "::param_group_of: parameter index ", param_index,
           " out of range (", group_of_.size(), " parameters)");
  return group_of_[param_index];
}

std::string Optimizer::group_name(size_t group) const {
  return group == 0 ? std::string(name()) : std::string(name()) + " param group " + std::to_string(group);
}

double Optimizer::lr(size_t group) const {
  check_group("lr", group);
  return group_lr(group);
}

double Optimizer::weight_decay(size_t group) const {
  check_group("weight_decay", group);
  return group_weight_decay(group);
}

void Optimizer::set_lr(double lr) {
  validate_lr(lr);
  for (size_t g = 0; g < num_param_groups(); ++g) store_group_lr(g, lr);
}

void Optimizer::set_lr(size_t group, double lr) {
  check_group("set_lr", group);
  check_lr(group_name(group).c_str(), lr);
  store_group_lr(group, lr);
}

void Optimizer::validate_scheduled_lr(size_t group, double lr) const {
  check_group("validate_scheduled_lr", group);
  TG_CHECK(std::isfinite(lr) && lr >= 0, group_name(group), ": invalid scheduled learning rate ", lr,
           " (it must be finite and >= 0)");
}

void Optimizer::set_scheduled_lr(size_t group, double lr) {
  validate_scheduled_lr(group, lr);
  store_group_lr(group, lr);
}

std::optional<double> Optimizer::initial_lr(size_t group) const {
  check_group("initial_lr", group);
  return initial_lrs_[group];
}

void Optimizer::set_initial_lr(size_t group, std::optional<double> lr) {
  check_group("set_initial_lr", group);
  TG_CHECK(!lr || (std::isfinite(*lr) && *lr >= 0), group_name(group), ": invalid initial learning rate ", *lr,
           " (it must be finite and >= 0)");
  initial_lrs_[group] = lr;
}

double Optimizer::momentum(size_t group) const {
  check_group("momentum", group);
  return group_momentum(group);
}

void Optimizer::validate_momentum(size_t group, double value) const {
  check_group("validate_momentum", group);
  check_group_momentum(group, value);
}

void Optimizer::set_momentum(size_t group, double value) {
  check_group("set_momentum", group);
  check_group_momentum(group, value);
  store_group_momentum(group, value);
}

double Optimizer::group_momentum(size_t) const { TG_FAIL(name(), " has no momentum or beta1"); }

void Optimizer::check_group_momentum(size_t, double) const { TG_FAIL(name(), " has no momentum or beta1"); }

void Optimizer::store_group_momentum(size_t, double) { TG_FAIL(name(), " has no momentum or beta1"); }

void Optimizer::check_lr(const char* optimizer, double lr) {
  TG_CHECK(std::isfinite(lr) && lr > 0, optimizer, ": invalid learning rate ", lr,
           " (it must be positive and finite", lr == 0 ? "; an lr of 0 would leave every parameter unchanged" : "",
           ")");
}

void Optimizer::check_range(const char* optimizer, const char* option, double value, double lo, double hi,
                            bool hi_open) {
  TG_CHECK(std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi), optimizer, ": invalid ",
           option, " ", value, " (it must be finite and in [", lo, ", ", hi, hi_open ? "))" : "])");
}

void Optimizer::check_non_negative(const char* optimizer, const char* option, double value) {
  TG_CHECK(std::isfinite(value) && value >= 0, optimizer, ": invalid ", option, " ", value,
           " (it must be finite and >= 0)");
}

int64_t Optimizer::step_count(size_t param_index) const {
  TG_CHECK(param_index < state_.size(), "Optimizer::step_count: parameter index ", param_index,
           " out of range (", state_.size(), " parameters)");
  return state_[param_index].steps;
}

void Optimizer::step() {
  NoGradGuard no_grad;  // an update is never part of a forward pass
  profile::PhaseGuard phase(profile::Phase::optimizer);
  // Validate every grad before touching any parameter: a bad one leaves the model unchanged.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(),
             "Optimizer::step: parameter ", i, " ", describe(p), " has a grad ", describe(g),
             " of another shape, dtype or device");
  }
  // Module::to moves a parameter's data inside the same tensor; the state made before the
  // move is still on the old device or in the old dtype: it follows the parameter here
  // (values kept, as PyTorch's load_state_dict casts state onto its parameter).
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    for (Tensor& b : state_[i].buffers) {
      if (!b.defined() || (b.device() == p.device() && b.dtype() == p.dtype())) continue;
      TG_CHECK(b.shape() == p.shape(), "Optimizer::step: the state of parameter ", i, " ", describe(b),
               " does not match the parameter ", describe(p), " (its shape changed)");
      b = b.to(p.dtype()).to(p.device());
    }
  }
  std::vector<size_t> updated;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    updated.push_back(i);
    ParamState& s = state_[i];
    ++s.steps;
    const size_t buffers = buffer_names(i).size();
    if (s.buffers.size() != buffers) s.buffers.resize(buffers);
    {
      // One update of one parameter, as the profiler sees it: the optimizer declares its
      // FLOPs per element; bytes = the parameter read and written, the grad read, each
      // state buffer read and written.
      profile::OpScope scope(name(), [&] {
        const double n = static_cast<double>(p.numel()), e = static_cast<double>(dtype_size(p.dtype()));
        return profile::OpInfo{{&p, &g}, n * update_flops_per_element(i), n * e * (3.0 + 2.0 * buffers)};
      });
      update(i, g, s);
    }
    p.bump_version();
  }
  ++steps_;
  if (!updated.empty() && params_[updated[0]].device().is_cuda() &&
      cuda::capturing(params_[updated[0]].device().index)) {
    // Under CUDA graph capture: the replays advance the counts this call just advanced (the
    // first replay runs this very step).
    cuda::on_replay(params_[updated[0]].device().index,
                    [this, updated, first = true]() mutable {
                      if (first) {
                        first = false;
                        return;
                      }
                      ++steps_;
                      for (size_t i : updated) {
                        ++state_[i].steps;
                        refresh_replay_scalars(i, state_[i]);
                      }
                    },
                    {});
  }
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.zero_grad();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < state_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.steps == 0) continue;
    const std::vector<std::string> names = buffer_names(i);
    std::string prefix = std::to_string(i) + ".";
    if (has_step_state())
      out.emplace_back(prefix + "step", full(Shape{}, static_cast<double>(s.steps), {.dtype = DType::f64}));
    for (size_t b = 0; b < s.buffers.size() && b < names.size(); ++b)
      if (s.buffers[b].defined()) out.emplace_back(prefix + names[b], s.buffers[b]);
  }
  return out;
}

void Optimizer::set_step_count(int64_t steps) {
  check_step_count("Optimizer::set_step_count", steps);
  steps_ = steps;
}

void Optimizer::check_step_count(const std::string& what, double steps) {
  TG_CHECK(std::isfinite(steps) && steps >= 0 && steps <= static_cast<double>(kMaxStepCount) &&
               steps == std::floor(steps),
           what, ": step count ", steps, " is not an integer in [0, 2^53]");
}

void Optimizer::check_step_count(const std::string& what, int64_t steps) {
  TG_CHECK(steps >= 0 && steps <= kMaxStepCount, what, ": step count ", steps, " is not an integer in [0, 2^53]");
}

namespace {

// The first element of p[0, n) that is not finite, or with `non_negative` is below 0:
// its index (-1 if none) and value.
template <class T>
std::pair<int64_t, double> first_bad(const T* p, int64_t n, bool non_negative) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]) || (non_negative && p[i] < 0)) return {i, static_cast<double>(p[i])};
  return {-1, 0.0};
}

}  // namespace

void Optimizer::merge_step_counts(const std::vector<int64_t>& counts, std::map<size_t, ParamState>& next) const {
  const char* op = "Optimizer::load_state";
  TG_CHECK(counts.size() == params_.size(), op, ": ", counts.size(), " step counts for the ", params_.size(),
           " parameters of this ", name());
  for (size_t i = 0; i < counts.size(); ++i) {
    check_step_count(std::string(op) + ": the step count of parameter " + std::to_string(i), counts[i]);
    const auto named = next.find(i);
    if (named == next.end()) {
      // No state saved: never updated, or (SGD) updated without a momentum buffer yet.
      TG_CHECK(!has_step_state() || counts[i] == 0, op, ": parameter ", i, " has step count ", counts[i],
               " but no state ('", i, ".step' and its buffers)");
      continue;
    }
    if (has_step_state())
      TG_CHECK(named->second.steps == counts[i], op, ": '", i, ".step' is ", named->second.steps,
               " but the step count of parameter ", i, " is ", counts[i]);
    else
      TG_CHECK(counts[i] > 0, op, ": parameter ", i, " has state but a step count of 0");
  }
  // Checked: every parameter's state is now the loaded one.
  for (size_t i = 0; i < counts.size(); ++i) {
    ParamState& s = next.try_emplace(i).first->second;
    s.steps = counts[i];
  }
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>& state,
                           const std::optional<std::vector<int64_t>>& step_counts) {
  const char* op = "Optimizer::load_state";
  // Phase 1 builds the new state of every parameter named, beside the live one: any check,
  // conversion or allocation that fails leaves the optimizer as it was.
  std::map<size_t, ParamState> next;
  std::map<size_t, std::vector<bool>> present;  // per parameter: [step, buffer 0, buffer 1, ...]
  for (const auto& [key, value] : state) {
    size_t dot = key.find('.');
    size_t index = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + (dot == std::string::npos ? 0 : dot), index);
    TG_CHECK(dot != std::string::npos && ec == std::errc() && end == key.data() + dot, op, ": key '", key,
             "' is not '<parameter index>.<name>'");
    TG_CHECK(index < params_.size(), op, ": key '", key, "' names parameter ", index, " but the optimizer has ",
             params_.size());
    TG_CHECK(value.defined(), op, ": '", key, "' is an undefined tensor");
    const std::vector<std::string> names = buffer_names(index);
    const std::string field = key.substr(dot + 1);
    int slot = -2;  // -1: the step count, b >= 0: buffer b
    if (field == "step" && has_step_state()) slot = -1;
    for (size_t b = 0; b < names.size(); ++b)
      if (names[b] == field) slot = static_cast<int>(b);
    TG_CHECK(slot >= -1, op, ": unknown state '", key, "' for this ", name());
    std::vector<bool>& seen = present.try_emplace(index, names.size() + 1, false).first->second;
    TG_CHECK(!seen[slot + 1], op, ": '", key, "' is given twice");
    seen[slot + 1] = true;
    ParamState& s = next.try_emplace(index, state_[index]).first->second;
    s.buffers.resize(names.size());
    NoGradGuard no_grad;
    if (slot == -1) {
      TG_CHECK(value.numel() == 1, op, ": '", key, "' should hold one value, got ", describe(value));
      const std::string what = std::string(op) + ": '" + key + "'";
      if (value.dtype() == DType::i64) {
        const int64_t steps = value.to_vector<int64_t>()[0];  // exact: no trip through double
        check_step_count(what, steps);
        s.steps = steps;
      } else {
        const double steps = value.item();
        check_step_count(what, steps);
        s.steps = static_cast<int64_t>(steps);
      }
      continue;
    }
    const Tensor& p = params_[index];
    TG_CHECK(value.shape() == p.shape(), op, ": '", key, "' ", describe(value), " does not match parameter ", index,
             " ", describe(p));
    // Checked in the parameter's dtype: an f64 value past f32's range becomes inf there.
    Tensor v = value.detach();
    if (v.dtype() != p.dtype()) v = v.to(p.dtype());
    const Tensor host = v.device().is_cpu() ? v : v.cpu();
    const bool non_negative = buffer_non_negative(static_cast<size_t>(slot));
    const auto [bad, bad_value] = host.dtype() == DType::f32
                                      ? first_bad(host.data<float>(), host.numel(), non_negative)
                                      : first_bad(host.data<double>(), host.numel(), non_negative);
    TG_CHECK(bad < 0, op, ": '", key, "' holds ", bad_value, " at element ", bad, " in ", dtype_name(p.dtype()), " (",
             field, non_negative ? " must be finite and >= 0)" : " must be finite)");
    if (v.device() != p.device()) v = v.to(p.device());
    // Always a private copy: the optimizer updates its buffers in place.
    s.buffers[slot] = v.impl()->storage == value.impl()->storage ? v.clone() : v;
    // A parameter with buffers but no step state has still been updated (SGD with momentum).
    if (!has_step_state() && s.steps == 0) s.steps = 1;
  }
  for (const auto& [index, seen] : present) {
    const std::vector<std::string> names = buffer_names(index);
    for (size_t k = 0; k < seen.size(); ++k) {
      if (k == 0 && !has_step_state()) continue;
      TG_CHECK(seen[k], op, ": the state of parameter ", index, " lacks '", index, ".",
               k == 0 ? std::string("step") : names[k - 1], "' (", name(),
               " needs the step count and every buffer of a parameter, or none)");
    }
  }
  if (step_counts) merge_step_counts(*step_counts, next);
  // Phase 2: commit (moves only, which cannot fail).
  for (auto& [index, s] : next) state_[index] = std::move(s);
}

}  // namespace tg::nn
