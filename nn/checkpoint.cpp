#include "nn/checkpoint.h"

#include <charconv>
#include <cmath>

#include "autograd/tape.h"
#include "core/safetensors.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"

namespace tg {
namespace {

namespace st = safetensors;

const std::string kOptimPrefix = "optim.";
const std::string kKindKey = "tapegrad.optimizer";
const std::string kStepCountKey = "tapegrad.optimizer.step_count";
const std::string kLrKey = "tapegrad.optimizer.lr";

std::string optimizer_kind(const nn::Optimizer& o) {
  // AdamW derives from Adam: ask for the most derived first.
  if (dynamic_cast<const nn::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const nn::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const nn::SGD*>(&o)) return "SGD";
  return "Optimizer";
}

// The module's name of each optimizer parameter (found by tensor identity).
std::vector<std::string> optimizer_param_names(const nn::Module& module, const nn::Optimizer& opt, const char* op) {
  auto named = module.named_parameters();
  std::vector<std::string> names;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    const std::string* found = nullptr;
    for (const auto& [name, t] : named)
      if (t.same(p)) found = &name;
    TG_CHECK(found != nullptr, op, ": optimizer parameter ", i, " ", describe(p),
             " is not a parameter of the module (an optimizer built before module.to() holds the old tensors)");
    names.push_back(*found);
  }
  return names;
}

st::Metadata base_metadata() { return {{"format", "pt"}, {"tapegrad.format_version", "1"}}; }

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back exactly
  return std::string(buf, end);
}

const std::string& required_metadata(const st::Header& h, const std::string& key, const std::string& path) {
  const std::string* v = h.find_metadata(key);
  TG_CHECK(v != nullptr, "tg::load: '", path, "' holds optimizer state but no metadata \"", key, "\"");
  return *v;
}

bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// The module's slots, each checked against the file's entry: present, same dtype, same shape;
// and no tensor in the file that is neither a parameter nor (when `skip_optimizer`) optimizer state.
std::vector<std::pair<std::string, Tensor*>> check_module_entries(nn::Module& module, const st::Header& h,
                                                                  const std::string& path, bool skip_optimizer) {
  auto slots = module.named_parameter_slots();
  for (const auto& [name, slot] : slots) {
    const st::TensorInfo* info = h.find(name);
    TG_CHECK(info != nullptr, "tg::load: '", path, "' has no tensor '", name, "' for the module's parameter ",
             describe(*slot));
    TG_CHECK(info->dtype == st::dtype_code(slot->dtype()), "tg::load: tensor '", name, "' is ", info->dtype, " in '",
             path, "' but the module's parameter is ", describe(*slot), " (", st::dtype_code(slot->dtype()), ")");
    TG_CHECK(Shape(info->shape) == slot->shape(), "tg::load: tensor '", name, "' has shape ", Shape(info->shape),
             " in '", path, "' but the module's parameter is ", describe(*slot));
  }
  for (const st::TensorInfo& info : h.tensors) {
    if (skip_optimizer && has_prefix(info.name, kOptimPrefix)) continue;
    bool known = false;
    for (const auto& [name, slot] : slots) known = known || name == info.name;
    TG_CHECK(known, "tg::load: '", path, "' holds tensor '", info.name, "' ", info.dtype, Shape(info.shape),
             " (header byte ", info.header_offset, ") that the module has no parameter for");
  }
  return slots;
}

// Copies validated host tensors into the parameters, in place (optimizers hold the handles).
void copy_into_slots(const std::vector<std::pair<std::string, Tensor*>>& slots, const st::NamedTensors& values) {
  NoGradGuard no_grad;
  for (const auto& [name, slot] : slots) {
    for (const auto& [vname, v] : values)
      if (vname == name) slot->copy_(v);
  }
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor*>>& slots) {
  std::vector<std::string> out;
  for (const auto& [name, slot] : slots) out.push_back(name);
  return out;
}

}  // namespace

void save(const nn::Module& module, const std::string& path) {
  st::save_file(st::NamedTensors(module.named_parameters()), path, base_metadata());
}

void load(nn::Module& module, const std::string& path) {
  st::Header h = st::read_header(path);
  const bool has_optimizer = h.find_metadata(kKindKey) != nullptr;
  auto slots = check_module_entries(module, h, path, has_optimizer);
  st::NamedTensors values = st::read_tensors(path, h, names_of(slots));
  copy_into_slots(slots, values);
}

void save(const nn::Module& module, const nn::Optimizer& optimizer, const std::string& path) {
  st::NamedTensors tensors = module.named_parameters();
  for (const auto& [name, t] : tensors)
    TG_CHECK(!has_prefix(name, kOptimPrefix), "tg::save: parameter '", name, "' starts with '", kOptimPrefix,
             "', the prefix of optimizer state; rename the submodule to save it with an optimizer");
  std::vector<std::string> names = optimizer_param_names(module, optimizer, "tg::save");
  // Optimizer::state() keys are "<parameter index>.<buffer>"; the file names the parameter.
  for (auto& [key, value] : optimizer.state()) {
    size_t dot = key.find('.');
    size_t index = std::stoul(key.substr(0, dot));
    tensors.emplace_back(kOptimPrefix + names.at(index) + key.substr(dot), value);
  }
  st::Metadata meta = base_metadata();
  meta.emplace_back(kKindKey, optimizer_kind(optimizer));
  meta.emplace_back(kStepCountKey, std::to_string(optimizer.step_count()));
  meta.emplace_back(kLrKey, format_double(optimizer.lr()));
  st::save_file(tensors, path, meta);
}

void load(nn::Module& module, nn::Optimizer& optimizer, const std::string& path) {
  st::Header h = st::read_header(path);
  const std::string* kind = h.find_metadata(kKindKey);
  TG_CHECK(kind != nullptr, "tg::load: '", path, "' holds no optimizer state (saved with tg::save(module, path)?)");
  TG_CHECK(*kind == optimizer_kind(optimizer), "tg::load: '", path, "' holds ", *kind, " state but the optimizer is ",
           optimizer_kind(optimizer));
  auto slots = check_module_entries(module, h, path, true);
  std::vector<std::string> names = optimizer_param_names(module, optimizer, "tg::load");

  // Optimizer entries: "optim.<parameter name>.<buffer>"; names hold dots, buffers don't.
  std::vector<std::string> file_names, state_keys;
  for (const st::TensorInfo& info : h.tensors) {
    if (!has_prefix(info.name, kOptimPrefix)) continue;
    const std::string rest = info.name.substr(kOptimPrefix.size());
    const size_t dot = rest.rfind('.');
    TG_CHECK(dot != std::string::npos && dot > 0, "tg::load: tensor '", info.name, "' in '", path,
             "' is not 'optim.<parameter>.<state>'");
    const std::string param = rest.substr(0, dot), field = rest.substr(dot + 1);
    size_t index = names.size();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == param) index = i;
    TG_CHECK(index < names.size(), "tg::load: tensor '", info.name, "' in '", path, "' is optimizer state for '",
             param, "', which is not a parameter of this optimizer");
    const Tensor& p = optimizer.params()[index];
    if (field == "step") {
      TG_CHECK((info.dtype == "F64" || info.dtype == "F32" || info.dtype == "I64") && Shape(info.shape).numel() == 1,
               "tg::load: tensor '", info.name, "' in '", path, "' should be one step count, got ", info.dtype,
               Shape(info.shape));
    } else {
      TG_CHECK(info.dtype == st::dtype_code(p.dtype()) && Shape(info.shape) == p.shape(), "tg::load: tensor '",
               info.name, "' is ", info.dtype, Shape(info.shape), " in '", path, "' but its parameter '", param,
               "' is ", describe(p));
    }
    file_names.push_back(info.name);
    state_keys.push_back(std::to_string(index) + "." + field);
  }
  for (const auto& [key, value] : optimizer.state()) {
    bool present = false;
    for (const std::string& k : state_keys) present = present || k == key;
    size_t index = std::stoul(key.substr(0, key.find('.')));
    TG_CHECK(present, "tg::load: the optimizer already holds state '", key.substr(key.find('.') + 1), "' for '",
             names[index], "' that '", path, "' lacks; load into a freshly built optimizer");
  }
  const std::string& steps_text = required_metadata(h, kStepCountKey, path);
  int64_t steps = -1;
  auto [send, sec] = std::from_chars(steps_text.data(), steps_text.data() + steps_text.size(), steps);
  TG_CHECK(sec == std::errc() && send == steps_text.data() + steps_text.size() && steps >= 0, "tg::load: '", path,
           "': metadata ", kStepCountKey, " = \"", steps_text, "\" is not a step count");
  const std::string& lr_text = required_metadata(h, kLrKey, path);
  double lr = -1;
  auto [lend, lec] = std::from_chars(lr_text.data(), lr_text.data() + lr_text.size(), lr);
  TG_CHECK(lec == std::errc() && lend == lr_text.data() + lr_text.size() && std::isfinite(lr) && lr >= 0,
           "tg::load: '", path, "': metadata ", kLrKey, " = \"", lr_text, "\" is not a learning rate");

  // Everything checked: read, then hand the state to the optimizer (which validates it
  // again and changes nothing if it objects), then commit the parameters.
  st::NamedTensors values = st::read_tensors(path, h, names_of(slots));
  st::NamedTensors state_values = st::read_tensors(path, h, file_names);
  std::vector<std::pair<std::string, Tensor>> state;
  for (size_t i = 0; i < state_values.size(); ++i) {
    Tensor v = state_values[i].second;
    if (state_keys[i].ends_with(".step") && v.dtype() != DType::f64) v = v.to(DType::f64);
    state.emplace_back(state_keys[i], v);
  }
  optimizer.load_state(state);
  optimizer.set_step_count(steps);
  optimizer.set_lr(lr);
  copy_into_slots(slots, values);
}

}  // namespace tg
