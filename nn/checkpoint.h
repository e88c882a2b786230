// Checkpoints in the safetensors format, with PyTorch's state_dict names, so that
//
//   torch:    safetensors.torch.save_file(model.state_dict(), "m.safetensors")
//   tapegrad: tg::load(model, "m.safetensors")      (and tg::save back, for torch's load_file)
//
// work both ways for models built with the same structure (same module names).
//
//   tg::save(model, "ckpt.safetensors");              // the parameters and buffers
//   tg::save(model, optimizer, "ckpt.safetensors");   // + optimizer state: training resumes
//   tg::load(model, optimizer, "ckpt.safetensors");   //   bit-identically after this
//
// File contents: one tensor per parameter and buffer (Module::state_dict(): "0.weight",
// "conv.bias", "bn.running_mean", ...) in its dtype; with an optimizer also
// "optim.<parameter name>.<buffer>" ("optim.0.weight.exp_avg", "optim.0.weight.step" for
// Adam, "optim.0.weight.momentum_buffer" for SGD) and metadata "tapegrad.optimizer" (SGD, Adam, AdamW), "tapegrad.optimizer.step_count",
// "tapegrad.optimizer.lr" (param group 0's, omitted when a schedule made it 0),
// "tapegrad.optimizer.param_group_lrs" (every group's lr, comma-separated),
// "tapegrad.optimizer.param_group_initial_lrs" (every group's Optimizer::initial_lr, the
// base of its lr schedules, comma-separated, empty where unset; a file without the key
// leaves the optimizer's initial lrs as they were) and
// "tapegrad.optimizer.param_step_counts" (every parameter's step_count(i), comma-separated:
// SGD's state, as PyTorch's, has no step entries; a file without the key, written before
// it existed, loads with a count of 1 for each parameter with a momentum buffer).
//
// Saving is atomic (temporary file, fsync, rename): a failed save leaves the previous file
// intact. A save killed outright (SIGKILL, power loss) cannot clean up after itself: where
// the file system supports O_TMPFILE its temporary is unnamed and vanishes with the
// process; elsewhere it stays as "<path>.tmp.<pid>.<n>" until the next save of the same
// path, which removes those whose process is gone (core/safetensors.h has the details).
// Names must be valid UTF-8 (the format requires it; files that break it are refused).
//
// Loading is all-or-nothing: a missing, extra or mis-shaped tensor, a wrong dtype, a
// truncated or corrupt file, or a path that is not a regular file (a FIFO, a device:
// refused without blocking) raises tg::Error naming the tensor or the byte offset, and then
// nothing in the module (or optimizer) has changed. Values are copied into the existing
// parameter tensors, on their devices, so optimizers holding them stay valid.
//
// LoadOptions, as PyTorch's load_state_dict(strict=...) and more:
//
//   auto r = tg::load(model, "m.safetensors", {.strict = false, .prefix = "backbone.", .convert_dtype = true});
//   r.missing      // the module's state_dict names the file had no tensor for (left as they were)
//   r.unexpected   // the file's keys (prefix included) the module has no parameter or buffer for
//
// - strict (default true): any missing or unexpected key is an error naming them; with
//   false they are only reported. A shape mismatch is an error either way (as in PyTorch).
// - prefix: only keys starting with it are considered, the prefix stripped before matching
//   ("backbone.0.weight" fills the module's "0.weight"); the others are ignored, not
//   unexpected. The file's "optim.*" entries of a checkpoint saved with an optimizer are
//   ignored too (they are not the model's).
// - convert_dtype (default false): a tensor stored as F64, F32, F16 or BF16 loads into a
//   floating parameter of another dtype, converted (rounded to nearest; beyond f32's range
//   an f64 becomes +-inf, as in PyTorch). Without it any dtype mismatch is a tg::DTypeError
//   naming the key and both dtypes. Integer tensors are never converted. F16 and BF16 are
//   read exactly (parameters are never bf16 / f16, tapegrad's storage-only dtypes: they
//   always need convert_dtype).
//
// SaveOptions::model_only writes only the module's state_dict (no "optim.*" entries, no
// optimizer metadata): a file PyTorch's strict load_state_dict accepts, key for key, with
// the module's dtypes and shapes. tg::save(module, path) always writes such a file; the
// option matters for tg::save(module, optimizer, path, {.model_only = true}).
#pragma once
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "module.h"
#include "optim/optimizer.h"

namespace tg {

struct LoadOptions {
  bool strict = true;
  std::string prefix = {};
  bool convert_dtype = false;
};

// What a load did not match (PyTorch's missing_keys / unexpected_keys). Both are empty
// after a strict load. `missing`: in the module's state_dict order; `unexpected`: in the
// file's header order (a map's order for the in-memory loads).
struct LoadResult {
  std::vector<std::string> missing, unexpected;
};

// floats: half stores every floating parameter and buffer as F16 or BF16 (rounded to nearest
// even, once), as PyTorch's model.half() / model.bfloat16() state dicts, for inference files
// at half the size; tg::load reads them back with convert_dtype. Model files only: a file
// with optimizer state refuses it (the moments would lose their precision).
enum class FloatStorage { as_is, f16, bf16 };

struct SaveOptions {
  bool model_only = false;
  FloatStorage floats = FloatStorage::as_is;
};

void save(const nn::Module& module, const std::string& path, const SaveOptions& options = {});
// Loads the parameters and buffers of `module` (options above). Optimizer state in the
// file (a checkpoint written with an optimizer) is ignored.
LoadResult load(nn::Module& module, const std::string& path, const LoadOptions& options = {});
// The same from tensors already in memory (any devices; f32, f64 or i64), with the same
// rules; the file version reads the file and then matches as this one does. Errors name
// "the state map" where the file version names the path.
LoadResult load(nn::Module& module, const std::map<std::string, Tensor>& state, const LoadOptions& options = {});
LoadResult load(nn::Module& module, const std::unordered_map<std::string, Tensor>& state,
                const LoadOptions& options = {});

// The optimizer's parameters must all belong to `module` (they are named after them).
// With {.model_only = true} the optimizer is not saved: the file is tg::save(module, path)'s.
void save(const nn::Module& module, const nn::Optimizer& optimizer, const std::string& path,
          const SaveOptions& options = {});
// Restores the parameters (strictly: the options above do not apply), the optimizer's
// buffers and step counts, its initial lrs, and its learning rates, one per param group
// (as PyTorch's load_state_dict restores param_groups; the optimizer must have as many
// groups; a file without per-group lrs sets its one lr on every group). The optimizer must be of the saved
// kind and should be fresh: state it already holds for a parameter the file has no state
// for is an error rather than silently kept. The file's values are checked as the
// optimizer's own setters check them, before anything changes: the lr by the rule of its
// constructor and set_lr (positive, finite; a group's lr by set_scheduled_lr's, >= 0), step counts integral in [0, 2^53], buffers
// finite and Adam's exp_avg_sq >= 0 (nn::Optimizer::load_state).
void load(nn::Module& module, nn::Optimizer& optimizer, const std::string& path);

}  // namespace tg
