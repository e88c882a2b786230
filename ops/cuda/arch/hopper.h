// What the Hopper-only (sm_90a) kernels ask of a device before they run: whether it can run
// wgmma code from this build, and its multiprocessor count. Both are cached per device.
#pragma once

namespace tg::cuda {

// True for a compute capability 9.0 GPU (H100 / H200) when this build's device code carries the
// sm_90a instructions (wgmma); false for other GPUs and for builds without sm_90a code.
bool device_runs_wgmma(int dev);

// Streaming multiprocessors of device dev.
int sm_count(int dev);

}  // namespace tg::cuda
