// GPU fills, casts, copies and the same-shape sum that the core itself needs (factories, to(),
// to_vector, gradient accumulation), for every dtype, the half types included.
// Declared for every build; defined in tensor_kernels.cu when TG_CUDA is on.
#pragma once
#include <cstddef>

#include "random.h"
#include "tensor.h"

namespace tg::cuda {

void fill(const Tensor& t, double value);
void fill_uniform(const Tensor& t, RandomDraw draw, double low, double high);
void fill_normal(const Tensor& t, RandomDraw draw, double mean, double stddev);
void cast(const Tensor& out, const Tensor& x);  // out = x converted; same numel, any two dtypes (as cpu::cast)
void add(const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b; one shape, dtype and device
// Copies bytes between any two devices, ordered on the framework's streams; returns once
// the host side may be reused or read.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

}  // namespace tg::cuda
