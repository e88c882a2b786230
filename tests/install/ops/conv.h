// The consumer project's own ops/conv.h: the same path as a tapegrad header on purpose. Were a
// tapegrad header to include "ops/conv.h" by that path, it would get this file and fail to compile
// (it declares none of tapegrad's names).
#pragma once
#define CONSUMER_OPS_CONV_H 1
namespace consumer {
inline int ops_conv_h_marker() { return 1; }
}  // namespace consumer
