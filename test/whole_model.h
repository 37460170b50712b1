// A one-process fp32 model over whole buffers, built as the trainer builds any model: the
// parameter layout first, the store from it, then the model on the store.
#pragma once
#include "llmc/model/model.h"
#include "llmc/model/param_store.h"

struct WholeModel {
    WholeModel(const ModelShape& s, Ops& ops, int B, int T)
        : layout(param_layout(s, ModelLayout(), 1)), store(ops, layout, DType::F32),
          model(s, ops, DType::F32, B, T, store) {}
    const ParamLayout layout;
    WholeStore store;
    Model model;
};
