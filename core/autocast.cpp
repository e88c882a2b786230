#include "core/autocast.h"

#include "core/error.h"

namespace tg {
namespace {

thread_local bool t_enabled = false;
thread_local DType t_dtype = DType::bf16;

}  // namespace

Autocast::Autocast(DType dtype, bool enabled) : previous_enabled_(t_enabled), previous_dtype_(t_dtype) {
  TG_CHECK_AS(DTypeError, !enabled || is_half(dtype), "Autocast: the scope's type must be bf16 or f16, got ",
              dtype_name(dtype));
  t_enabled = enabled;
  if (enabled) t_dtype = dtype;
}

Autocast::~Autocast() {
  t_enabled = previous_enabled_;
  t_dtype = previous_dtype_;
}

bool autocast_enabled() { return t_enabled; }
DType autocast_dtype() { return t_dtype; }

}  // namespace tg
