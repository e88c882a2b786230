// The consumer project's own core/error.h: the same path as a tapegrad header on purpose. Were a
// tapegrad header to include "core/error.h" by that path, it would get this file and fail to compile
// (it declares none of tapegrad's names).
#pragma once
#define CONSUMER_CORE_ERROR_H 1
namespace consumer {
inline int core_error_h_marker() { return 1; }
}  // namespace consumer
