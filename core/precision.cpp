#include "core/precision.h"

#include <atomic>

namespace tg {
namespace {
std::atomic<Precision> g_precision{Precision::FP32};
}
void set_precision(Precision p) { g_precision.store(p); }
Precision precision() { return g_precision.load(); }
}  // namespace tg
