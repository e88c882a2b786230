#include "nn/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
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
// Every param group's lr, comma-separated in group order. A schedule may have brought one
// to 0, which the single lr key (set_lr's rule) refuses: this key holds any finite lr >= 0.
const std::string kGroupLrsKey = "tapegrad.optimizer.param_group_lrs";
// Every param group's initial lr (Optimizer::initial_lr, the base of its schedules),
// comma-separated in group order; an empty field for a group that has none.
const std::string kGroupInitialLrsKey = "tapegrad.optimizer.param_group_initial_lrs";
// Every parameter's step_count(i), comma-separated in parameter order: SGD's state (as
// PyTorch's) has no step entries, so without this key its counts could not be restored.
const std::string kParamStepCountsKey = "tapegrad.optimizer.param_step_counts";

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

std::string comma_list(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += ',';
    out += fields[i];
  }
  return out;
}

// The comma-separated fields of a metadata value ("" is one empty field).
std::vector<std::string_view> split_commas(const std::string& text) {
  std::vector<std::string_view> out;
  for (size_t begin = 0;;) {
    const size_t end = std::min(text.find(',', begin), text.size());
    out.emplace_back(text.data() + begin, end - begin);
    if (end == text.size()) return out;
    begin = end + 1;
  }
}

// Metadata `key` (kGroupLrsKey, kGroupInitialLrsKey): one lr per param group, finite and
// >= 0; with `empty_allowed`, an empty field for a group that has none (nullopt).
std::vector<std::optional<double>> parse_group_lrs(const std::string& text, const std::string& key,
                                                   bool empty_allowed, size_t groups, const std::string& path) {
  std::vector<std::optional<double>> lrs;
  for (std::string_view field : split_commas(text)) {
    if (empty_allowed && field.empty()) {
      lrs.emplace_back();
      continue;
    }
    double v = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    TG_CHECK(ec == std::errc() && end == field.data() + field.size() && std::isfinite(v) && v >= 0, "tg::load: '",
             path, "': metadata ", key, " = \"", json_text(text), "\" is not a list of finite lrs >= 0",
             empty_allowed ? " (or empty fields)" : "");
    lrs.push_back(v);
  }
  TG_CHECK(lrs.size() == groups, "tg::load: '", path, "' holds the ", key == kGroupLrsKey ? "lrs" : "initial lrs",
           " of ", lrs.size(), " param groups but the optimizer has ", groups);
  return lrs;
}

// Metadata `key`: one integer per parameter (range checked by Optimizer::load_state).
std::vector<int64_t> parse_step_counts(const std::string& text, const std::string& key, const std::string& path) {
  std::vector<int64_t> counts;
  for (std::string_view field : split_commas(text)) {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    TG_CHECK(ec == std::errc() && end == field.data() + field.size(), "tg::load: '", path, "': metadata ", key,
             " = \"", json_text(text), "\" is not a list of integers");
    counts.push_back(v);
  }
  return counts;
}

bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// An entry of the state being loaded: a header entry of a file, or a tensor of a map.
struct Entry {
  const std::string* name;
  std::string dtype;  // the file's code: "F32", "BF16", ...
  Shape shape;
  const Tensor* value = nullptr;  // a map's tensor (files are read after matching)
  uint64_t header_offset = 0;     // a file's entry, for messages
};

// A module slot matched with the entry that fills it.
struct Match {
  Tensor* slot;
  const Entry* entry;
};

struct Plan {
  std::vector<Match> matches;
  LoadResult result;
};

std::string quoted_list(const std::vector<std::string>& names, size_t from) {
  constexpr size_t kMaxNamed = 20;
  std::string out;
  for (size_t i = from; i < names.size() && i < from + kMaxNamed; ++i) out += (i > from ? ", '" : "'") + names[i] + "'";
  if (names.size() > from + kMaxNamed) out += " and " + std::to_string(names.size() - from - kMaxNamed) + " more";
  return out;
}

// Matches the module's slots (parameters and buffers, as PyTorch's state_dict) with the
// entries and checks every match (shape always; dtype, converted only if the options allow)
// and, when strict, that nothing is missing or unexpected. Throws before anything changes.
// `where` names the source in messages ("'path'" or "the state map").
Plan plan_load(nn::Module& module, const std::vector<Entry>& entries, const LoadOptions& options,
               const std::string& where) {
  std::unordered_map<std::string_view, const Entry*> by_key;
  for (const Entry& e : entries)
    if (has_prefix(*e.name, options.prefix)) by_key.emplace(std::string_view(*e.name).substr(options.prefix.size()), &e);

  Plan plan;
  std::unordered_set<std::string_view> known;
  const Tensor* first_missing = nullptr;
  const auto slots = module.named_state_slots();  // `known` views its names
  for (const auto& [name, slot] : slots) {
    known.insert(name);
    auto it = by_key.find(name);
    if (it == by_key.end()) {
      if (!first_missing) first_missing = slot;
      plan.result.missing.push_back(name);
    } else {
      plan.matches.push_back({slot, it->second});
    }
  }
  const Entry* first_unexpected = nullptr;
  for (const Entry& e : entries) {
    if (!has_prefix(*e.name, options.prefix) || known.count(std::string_view(*e.name).substr(options.prefix.size())))
      continue;
    if (!first_unexpected) first_unexpected = &e;
    plan.result.unexpected.push_back(*e.name);
  }
  if (options.strict && first_missing) {
    const auto& missing = plan.result.missing;
    TG_FAIL("tg::load: ", where, " has no tensor '", options.prefix + missing[0], "' for the module's parameter ",
            describe(*first_missing), missing.size() > 1 ? " (also missing: " + quoted_list(missing, 1) + ")" : "",
            plan.result.unexpected.empty() ? ""
                                           : "; unexpected: " + quoted_list(plan.result.unexpected, 0),
            " (strict; pass .strict = false to load the rest)");
  }
  if (options.strict && first_unexpected) {
    const auto& unexpected = plan.result.unexpected;
    const std::string at = first_unexpected->value ? "" : " (header byte " + std::to_string(first_unexpected->header_offset) + ")";
    TG_FAIL("tg::load: ", where, " holds tensor '", *first_unexpected->name, "' ", first_unexpected->dtype,
            first_unexpected->shape, at, " that the module has no parameter for",
            unexpected.size() > 1 ? " (nor for " + quoted_list(unexpected, 1) + ")" : "",
            " (strict; pass .strict = false to ignore it)");
  }
  for (const Match& m : plan.matches) {
    const Entry& e = *m.entry;
    const std::string code = st::dtype_code(m.slot->dtype());
    TG_CHECK_AS(ShapeError, e.shape == m.slot->shape(), "tg::load: tensor '", *e.name, "' has shape ", e.shape, " in ",
                where, " but the module's parameter is ", describe(*m.slot));
    if (e.dtype == code) continue;
    const bool convertible = st::is_floating_code(e.dtype) && is_floating(m.slot->dtype());
    TG_CHECK_AS(DTypeError, options.convert_dtype && convertible, "tg::load: tensor '", *e.name, "' is ", e.dtype,
                " in ", where, " but the module's parameter is ", describe(*m.slot), " (", code, ")",
                convertible ? "; pass .convert_dtype = true to convert it" : "");
  }
  return plan;
}

// Copies the matched values (`values[i]` for plan.matches[i]: the file's, read onto the
// host, or the map's) into the parameters, in place (optimizers hold the handles),
// converted to their dtypes first so that nothing changes if a conversion fails.
void apply_plan(const Plan& plan, const std::vector<const Tensor*>& values) {
  NoGradGuard no_grad;
  std::vector<Tensor> converted;
  converted.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const Tensor& v = *values[i];
    const DType want = plan.matches[i].slot->dtype();
    converted.push_back(v.dtype() == want ? v : v.to(want));
  }
  for (size_t i = 0; i < values.size(); ++i) plan.matches[i].slot->copy_(converted[i]);
}

std::vector<Entry> file_entries(const st::Header& h, bool skip_optimizer) {
  std::vector<Entry> out;
  for (const st::TensorInfo& info : h.tensors) {
    if (skip_optimizer && has_prefix(info.name, kOptimPrefix)) continue;
    out.push_back({&info.name, info.dtype, Shape(info.shape), nullptr, info.header_offset});
  }
  return out;
}

// Reads the plan's tensors from the file (only those), onto the host.
st::NamedTensors read_plan(const Plan& plan, const std::string& path, const st::Header& h) {
  std::vector<std::string> names;
  for (const Match& m : plan.matches) names.push_back(*m.entry->name);
  return st::read_tensors(path, h, names, /*widen_half=*/true);  // plan_load checked their dtypes
}

void apply_plan(const Plan& plan, const st::NamedTensors& values) {
  std::vector<const Tensor*> ptrs;
  for (const auto& [name, t] : values) ptrs.push_back(&t);
  apply_plan(plan, ptrs);
}

template <class Map>
LoadResult load_map(nn::Module& module, const Map& state, const LoadOptions& options) {
  std::vector<Entry> entries;
  for (const auto& [name, t] : state) {
    TG_CHECK(t.defined(), "tg::load: the state map's tensor '", name, "' is undefined");
    entries.push_back({&name, st::dtype_code(t.dtype()), t.shape(), &t, 0});
  }
  Plan plan = plan_load(module, entries, options, "the state map");
  std::vector<const Tensor*> values;
  for (const Match& m : plan.matches) values.push_back(m.entry->value);
  apply_plan(plan, values);
  return plan.result;
}

}  // namespace

void save(const nn::Module& module, const std::string& path, const SaveOptions& options) {
  // Always model-only: SaveOptions::model_only changes nothing here.
  const st::FloatFormat floats = options.floats == FloatStorage::f16    ? st::FloatFormat::f16
                                 : options.floats == FloatStorage::bf16 ? st::FloatFormat::bf16
                                                                         : st::FloatFormat::as_is;
  st::save_file(st::NamedTensors(module.state_dict()), path, base_metadata(), floats);
}

LoadResult load(nn::Module& module, const std::string& path, const LoadOptions& options) {
  st::Header h = st::read_header(path);
  const bool has_optimizer = h.find_metadata(kKindKey) != nullptr;
  const std::vector<Entry> entries = file_entries(h, has_optimizer);
  Plan plan = plan_load(module, entries, options, "'" + path + "'");
  apply_plan(plan, read_plan(plan, path, h));
  return plan.result;
}

LoadResult load(nn::Module& module, const std::map<std::string, Tensor>& state, const LoadOptions& options) {
  return load_map(module, state, options);
}

LoadResult load(nn::Module& module, const std::unordered_map<std::string, Tensor>& state, const LoadOptions& options) {
  return load_map(module, state, options);
}

void save(const nn::Module& module, const nn::Optimizer& optimizer, const std::string& path,
          const SaveOptions& options) {
  if (options.model_only) return save(module, path, options);
  TG_CHECK(options.floats == FloatStorage::as_is, "tg::save: half-precision storage (SaveOptions::floats) is for "
           "model files; with optimizer state the moments would lose their precision (save with model_only, or "
           "without an optimizer)");
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
  // Group 0's lr as in files without groups (readers that predate them); omitted where a
  // schedule made it 0, which that key's rule refuses.
  if (optimizer.lr() > 0) meta.emplace_back(kLrKey, format_double(optimizer.lr()));
  std::vector<std::string> lrs, initial_lrs, counts;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    lrs.push_back(format_double(optimizer.lr(g)));
    const std::optional<double> initial = optimizer.initial_lr(g);
    initial_lrs.push_back(initial ? format_double(*initial) : "");
  }
  meta.emplace_back(kGroupLrsKey, comma_list(lrs));
  meta.emplace_back(kGroupInitialLrsKey, comma_list(initial_lrs));
  for (size_t i = 0; i < optimizer.params().size(); ++i) counts.push_back(std::to_string(optimizer.step_count(i)));
  if (!counts.empty()) meta.emplace_back(kParamStepCountsKey, comma_list(counts));
  st::save_file(tensors, path, meta);
}

void load(nn::Module& module, nn::Optimizer& optimizer, const std::string& path) {
  st::Header h = st::read_header(path);
  const std::string* kind = h.find_metadata(kKindKey);
  TG_CHECK(kind != nullptr, "tg::load: '", path, "' holds no optimizer state (saved with tg::save(module, path)?)");
  TG_CHECK(*kind == optimizer_kind(optimizer), "tg::load: '", path, "' holds ", *kind, " state but the optimizer is ",
           optimizer_kind(optimizer));
  const std::vector<Entry> entries = file_entries(h, true);
  const Plan plan = plan_load(module, entries, LoadOptions{}, "'" + path + "'");
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
  // The lrs: per group when the file has them (lrs >= 0, a schedule's), else the one lr of
  // files without groups, set on every group. A single lr present is checked either way.
  const std::string* group_lrs_text = h.find_metadata(kGroupLrsKey);
  const std::string* lr_text = group_lrs_text ? h.find_metadata(kLrKey) : &required_metadata(h, kLrKey, path);
  double lr = 0;
  if (lr_text) {
    auto [lend, lec] = std::from_chars(lr_text->data(), lr_text->data() + lr_text->size(), lr);
    TG_CHECK(lec == std::errc() && lend == lr_text->data() + lr_text->size(), "tg::load: '", path, "': metadata ",
             kLrKey, " = \"", json_text(*lr_text), "\" is not a number");
    try {
      optimizer.validate_lr(lr);
    } catch (const Error& e) {
      TG_FAIL("tg::load: '", path, "': metadata ", kLrKey, " = \"", json_text(*lr_text), "\": ", e.what());
    }
  }
  std::vector<double> group_lrs;
  if (group_lrs_text)
    for (const std::optional<double>& v :
         parse_group_lrs(*group_lrs_text, kGroupLrsKey, false, optimizer.num_param_groups(), path))
      group_lrs.push_back(*v);

  // The initial lrs (the base of schedules built after the load). Files without them
  // (written before the key existed) leave the optimizer's as they are.
  std::optional<std::vector<std::optional<double>>> initial_lrs;
  if (const std::string* text = h.find_metadata(kGroupInitialLrsKey))
    initial_lrs = parse_group_lrs(*text, kGroupInitialLrsKey, true, optimizer.num_param_groups(), path);
  // Per-parameter step counts, checked against the state by Optimizer::load_state. Files
  // without them (written before the key existed) leave the optimizer's fallback.
  std::optional<std::vector<int64_t>> step_counts;
  if (const std::string* text = h.find_metadata(kParamStepCountsKey))
    step_counts = parse_step_counts(*text, kParamStepCountsKey, path);

  // Everything checked: read, then hand the state to the optimizer, which checks its values
  // and changes nothing if it objects; then the step count and lr (already checked: these
  // cannot fail) and the parameters.
  st::NamedTensors values = read_plan(plan, path, h);
  st::NamedTensors state_values = st::read_tensors(path, h, file_names);
  std::vector<std::pair<std::string, Tensor>> state;
  for (size_t i = 0; i < state_values.size(); ++i) state.emplace_back(state_keys[i], state_values[i].second);
  try {
    optimizer.load_state(state, step_counts);
  } catch (const Error& e) {
    // The optimizer names state by parameter index ('3.exp_avg'): add the file's name.
    const std::string msg = e.what();
    std::string in_file;
    for (size_t i = 0; i < state_keys.size() && in_file.empty(); ++i)
      if (msg.find("'" + state_keys[i] + "'") != std::string::npos) in_file = " (tensor '" + file_names[i] + "')";
    TG_FAIL("tg::load: '", path, "': ", msg, in_file);
  }
  optimizer.set_step_count(steps);
  if (group_lrs.empty()) optimizer.set_lr(lr);
  for (size_t g = 0; g < group_lrs.size(); ++g) optimizer.set_scheduled_lr(g, group_lrs[g]);
  if (initial_lrs)
    for (size_t g = 0; g < initial_lrs->size(); ++g) optimizer.set_initial_lr(g, (*initial_lrs)[g]);
  apply_plan(plan, values);
}

}  // namespace tg
