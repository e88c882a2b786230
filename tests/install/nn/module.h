// The consumer project's own nn/module.h: the same path as a tapegrad header on purpose. Were a
// tapegrad header to include "nn/module.h" by that path, it would get this file and fail to compile
// (it declares none of tapegrad's names).
#pragma once
#define CONSUMER_NN_MODULE_H 1
namespace consumer {
inline int nn_module_h_marker() { return 1; }
}  // namespace consumer
