// cuemu stand-in for <cuda_runtime.h>: the execution model and the runtime API (test/cuemu/cuemu.h).
#pragma once
#include "test/cuemu/cuemu.h"
