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
// Adam, "optim.0.weight.momentum_buffer" for SGD) and metadata "tapegrad.optimizer" (SGD, Adam, AdamW), "tapegrad.optimizer.step_count" and
// "tapegrad.optimizer.lr".
//
// Saving is atomic (temporary file, fsync, rename): a failed save leaves the previous file
// intact. A save killed outright (SIGKILL, power loss) cannot clean up after itself: where
// the file system supports O_TMPFILE its temporary is unnamed and vanishes with the
// process; elsewhere it stays as "<path>.tmp.<pid>.<n>" until the next save of the same
// path, which removes those whose process is gone (core/safetensors.h has the details).
// Names must be valid UTF-8 (the format requires it; files that break it are refused).
//
// Loading is strict and all-or-nothing: a missing, extra or mis-shaped tensor, a wrong
// dtype, a truncated or corrupt file, or a path that is not a regular file (a FIFO, a
// device: refused without blocking) raises tg::Error naming the tensor or the byte offset,
// and then nothing in the module (or optimizer) has changed. Values are copied into the
// existing parameter tensors, on their devices, so optimizers holding them stay valid.
#pragma once
#include <string>

#include "module.h"
#include "optim/optimizer.h"

namespace tg {

void save(const nn::Module& module, const std::string& path);
// Loads every parameter and buffer of `module`. Optimizer state in the file (a checkpoint written with
// an optimizer) is ignored; any other tensor the module lacks is an error.
void load(nn::Module& module, const std::string& path);

// The optimizer's parameters must all belong to `module` (they are named after them).
void save(const nn::Module& module, const nn::Optimizer& optimizer, const std::string& path);
// Restores the parameters, the optimizer's buffers and step counts, and its learning rate
// (as PyTorch's load_state_dict restores param_groups). The optimizer must be of the saved
// kind and should be fresh: state it already holds for a parameter the file has no state
// for is an error rather than silently kept. The file's values are checked as the
// optimizer's own setters check them, before anything changes: the lr by the rule of its
// constructor and set_lr (positive, finite), step counts integral in [0, 2^53], buffers
// finite and Adam's exp_avg_sq >= 0 (nn::Optimizer::load_state).
void load(nn::Module& module, nn::Optimizer& optimizer, const std::string& path);

}  // namespace tg
