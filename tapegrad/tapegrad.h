// The umbrella header: everything a program using tapegrad needs.
#pragma once
#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
