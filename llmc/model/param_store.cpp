#include "llmc/model/param_store.h"

WholeStore::WholeStore(Ops& ops, const ParamLayout& layout, DType dtype, bool with_grads) : ops_(ops), layout_(layout) {
    const size_t n = layout.padded_params;
    params = Tensor(ops.alloc(n * dtype_size(dtype)), n, dtype);
    if (with_grads) grads = Tensor(ops.alloc(n * dtype_size(dtype)), n, dtype);
}

WholeStore::~WholeStore() {
    ops_.release(grads.ptr);
    ops_.release(params.ptr);
}

Tensor WholeStore::unit_of(const Tensor& buf, int unit) const {
    const ParamUnit& u = layout_.units[size_t(unit)];
    return buf.slice(u.begin, u.numel());
}

void WholeStore::load_params(const float* mem) { ops_.from_host_f32(params, mem); }

Tensor WholeStore::acquire_grads(int unit) {
    LLMC_ASSERT(grads.ptr, "WholeStore: built without gradients");
    return unit_of(grads, unit);
}

void WholeStore::zero_grads() {
    LLMC_ASSERT(grads.ptr, "WholeStore: built without gradients");
    ops_.zero(grads);
}
