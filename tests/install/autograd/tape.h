// The consumer project's own autograd/tape.h: the same path as a tapegrad header on purpose. Were a
// tapegrad header to include "autograd/tape.h" by that path, it would get this file and fail to compile
// (it declares none of tapegrad's names).
#pragma once
#define CONSUMER_AUTOGRAD_TAPE_H 1
namespace consumer {
inline int autograd_tape_h_marker() { return 1; }
}  // namespace consumer
