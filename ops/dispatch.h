// Device dispatch: every op calls the kernel of the same name in tg::cpu or tg::cuda.
// In a build without CUDA a GPU tensor cannot exist, but the message stays clear anyway.
#pragma once
#include "../core/error.h"

#if TG_CUDA
#define TG_DISPATCH(device, call)   \
  do {                              \
    if ((device).is_cpu()) {        \
      ::tg::cpu::call;              \
    } else {                        \
      ::tg::cuda::call;             \
    }                               \
  } while (0)
#else
#define TG_DISPATCH(device, call)                                              \
  do {                                                                         \
    if ((device).is_cpu()) {                                                   \
      ::tg::cpu::call;                                                         \
    } else {                                                                   \
      TG_FAIL(#call, ": tapegrad was built without CUDA");                     \
    }                                                                          \
  } while (0)
#endif
