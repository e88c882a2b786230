#include "nn/checkpoint.h"

#include <charconv>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "autograd/tape.h"
#include "core/json.h"
#include "core/safetensors.h"

namespace tg {
namespace {

namespace st = safetensors;

const std::string kOptimPrefix = "optim.";
const std::string kKindKey = "tapegrad.optimizer";
const std::string kStepCountKey = "tapegrad.optimizer.step_count";
const std::string kLrKey = "tapegrad.optimizer.lr";

std::string optimizer_kind(const nn::Optimizer& o) { return o.name(); }

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
             " is not a parameter of the module");
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

// Metadata text for an error message (it may be anything a file holds).
std::string json_text(const std::string& s) { return json::printable(s, 80); }

bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// The module's slots (parameters and buffers, as PyTorch's state_dict), each checked
// against the file's entry: present, same dtype, same shape;
// and no tensor in the file that is neither a parameter nor (when `skip_optimizer`) optimizer state.
std::vector<std::pair<std::string, Tensor*>> check_module_entries(nn::Module& module, const st::Header& h,
                                                                  const std::string& path, bool skip_optimizer) {
  auto slots = module.named_state_slots();  // parameters and buffers
  for (const auto& [name, slot] : slots) {
    const st::TensorInfo* info = h.find(name);
    TG_CHECK(info != nullptr, "tg::load: '", path, "' has no tensor '", name, "' for the module's parameter ",
             describe(*slot));
    TG_CHECK(info->dtype == st::dtype_code(slot->dtype()), "tg::load: tensor '", name, "' is ", info->dtype, " in '",
             path, "' but the module's parameter is ", describe(*slot), " (", st::dtype_code(slot->dtype()), ")");
    TG_CHECK(Shape(info->shape) == slot->shape(), "tg::load: tensor '", name, "' has shape ", Shape(info->shape),
             " in '", path, "' but the module's parameter is ", describe(*slot));
  }
  std::unordered_set<std::string> known;
  for (const auto& [name, slot] : slots) known.insert(name);
  for (const st::TensorInfo& info : h.tensors) {
    if (skip_optimizer && has_prefix(info.name, kOptimPrefix)) continue;
    TG_CHECK(known.count(info.name), "tg::load: '", path, "' holds tensor '", info.name, "' ", info.dtype,
             Shape(info.shape),
             " (header byte ", info.header_offset, ") that the module has no parameter for");
  }
  return slots;
}

// Copies validated host tensors into the parameters, in place (optimizers hold the handles).
void copy_into_slots(const std::vector<std::pair<std::string, Tensor*>>& slots, const st::NamedTensors& values) {
  NoGradGuard no_grad;
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [vname, v] : values) by_name.emplace(vname, &v);
  for (const auto& [name, slot] : slots) {
    auto it = by_name.find(name);
    if (it != by_name.end()) slot->copy_(*it->second);
  }
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor*>>& slots) {
  std::vector<std::string> out;
  for (const auto& [name, slot] : slots) out.push_back(name);
  return out;
}

}  // namespace

void save(const nn::Module& module, const std::string& path) {
  st::save_file(st::NamedTensors(module.state_dict()), path, base_metadata());
}

void load(nn::Module& module, const std::string& path) {
  st::Header h = st::read_header(path);
  const bool has_optimizer = h.find_metadata(kKindKey) != nullptr;
  auto slots = check_module_entries(module, h, path, has_optimizer);
  st::NamedTensors values = st::read_tensors(path, h, names_of(slots));
  copy_into_slots(slots, values);
}

void save(const nn::Module& module, const nn::Optimizer& optimizer, const std::string& path) {
  st::NamedTensors tensors = module.state_dict();
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

  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < names.size(); ++i) index_of.emplace(names[i], i);

  // Optimizer entries: "optim.<parameter name>.<buffer>"; names hold dots, buffers don't.
  // Their kinds and shapes are checked here, their values by Optimizer::load_state.
  std::vector<std::string> file_names, state_keys;
  for (const st::TensorInfo& info : h.tensors) {
    if (!has_prefix(info.name, kOptimPrefix)) continue;
    const std::string rest = info.name.substr(kOptimPrefix.size());
    const size_t dot = rest.rfind('.');
    TG_CHECK(dot != std::string::npos && dot > 0, "tg::load: tensor '", info.name, "' in '", path,
             "' is not 'optim.<parameter>.<state>'");
    const std::string param = rest.substr(0, dot), field = rest.substr(dot + 1);
    auto found = index_of.find(param);
    const size_t index = found == index_of.end() ? names.size() : found->second;
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
  const std::unordered_set<std::string> in_file(state_keys.begin(), state_keys.end());
  for (const auto& [key, value] : optimizer.state()) {
    size_t index = std::stoul(key.substr(0, key.find('.')));
    TG_CHECK(in_file.count(key), "tg::load: the optimizer already holds state '", key.substr(key.find('.') + 1),
             "' for '", names[index], "' that '", path, "' lacks; load into a freshly built optimizer");
  }
  // The optimizer's step count and lr, checked by the optimizer's own rules (those of its
  // constructor, set_lr and set_step_count) before anything changes.
  const std::string& steps_text = required_metadata(h, kStepCountKey, path);
  int64_t steps = -1;
  auto [send, sec] = std::from_chars(steps_text.data(), steps_text.data() + steps_text.size(), steps);
  TG_CHECK(sec == std::errc() && send == steps_text.data() + steps_text.size(), "tg::load: '", path, "': metadata ",
           kStepCountKey, " = \"", json_text(steps_text), "\" is not an integer");
  nn::Optimizer::check_step_count("tg::load: '" + path + "': metadata " + kStepCountKey, steps);
  const std::string& lr_text = required_metadata(h, kLrKey, path);
  double lr = 0;
  auto [lend, lec] = std::from_chars(lr_text.data(), lr_text.data() + lr_text.size(), lr);
  TG_CHECK(lec == std::errc() && lend == lr_text.data() + lr_text.size(), "tg::load: '", path, "': metadata ", kLrKey,
           " = \"", json_text(lr_text), "\" is not a number");
  try {
    optimizer.validate_lr(lr);
  } catch (const Error& e) {
    TG_FAIL("tg::load: '", path, "': metadata ", kLrKey, " = \"", json_text(lr_text), "\": ", e.what());
  }

  // Everything checked: read, then hand the state to the optimizer, which checks its values
  // and changes nothing if it objects; then the step count and lr (already checked: these
  // cannot fail) and the parameters.
  st::NamedTensors values = st::read_tensors(path, h, names_of(slots));
  st::NamedTensors state_values = st::read_tensors(path, h, file_names);
  std::vector<std::pair<std::string, Tensor>> state;
  for (size_t i = 0; i < state_values.size(); ++i) state.emplace_back(state_keys[i], state_values[i].second);
  try {
    optimizer.load_state(state);
  } catch (const Error& e) {
    // The optimizer names state by parameter index ('3.exp_avg'): add the file's name.
    const std::string msg = e.what();
    std::string in_file;
    for (size_t i = 0; i < state_keys.size() && in_file.empty(); ++i)
      if (msg.find("'" + state_keys[i] + "'") != std::string::npos) in_file = " (tensor '" + file_names[i] + "')";
    TG_FAIL("tg::load: '", path, "': ", msg, in_file);
  }
  optimizer.set_step_count(steps);
  optimizer.set_lr(lr);
  copy_into_slots(slots, values);
}

}  // namespace tg
