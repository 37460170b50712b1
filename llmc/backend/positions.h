// Global positions of a block of a sequence's rows. Context parallelism (llmc/parallel/context_parallel.h)
// gives a rank two chunks of each sequence, so a rank's rows are two runs of consecutive
// positions: rows [0, split) sit at start0 + i, rows [split, n) at start1 + (i - split). The
// default is one run from position 0 (a whole sequence). Host and device code.
#pragma once
#include <climits>

#ifdef __CUDACC__
#define LLMC_HD __host__ __device__
#else
#define LLMC_HD
#endif

struct SeqPositions {
    int start0 = 0, start1 = 0, split = INT_MAX;
    LLMC_HD int at(int i) const { return i < split ? start0 + i : start1 + (i - split); }
};
