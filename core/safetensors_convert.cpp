// Half precision for safetensors files: F16 (IEEE binary16) and BF16 (bfloat16) entries are
// read as f16 / bf16 tensors, or widened to f32 (f32 holds every value of both exactly), and
// f32 / f64 tensors are rounded to them when a file is written with FloatFormat::f16 / bf16.
// The conversions themselves are core/half.h's.
#include "core/half.h"
#include "core/safetensors.h"

namespace tg::safetensors {

bool is_half_code(const std::string& code) { return code == "F16" || code == "BF16"; }

bool is_floating_code(const std::string& code) {
  return code == "F64" || code == "F32" || is_half_code(code);
}

void decode_half(const std::string& code, const unsigned char* bytes, float* out, size_t n) {
  const bool bf16 = code == "BF16";
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    out[i] = bf16 ? decode_bf16(h) : decode_f16(h);
  }
}

}  // namespace tg::safetensors
