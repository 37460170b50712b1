#include "llmc/parallel/comm_stage.h"

#include <algorithm>

CommStage::CommStage(Ops& ops, Comm* comm, bool host_staging) : ops_(ops), comm_(comm) {
    const bool on_device = comm && comm->on_device();
    LLMC_ASSERT(!(on_device && ops.host_memory()), "a device communicator over a host backend");
    LLMC_ASSERT(!(on_device && host_staging), "host staging on a device communicator");
    direct_ = on_device || (ops.host_memory() && !host_staging);
}

CommStage::~CommStage() {
    for (Tensor& t : scratch_)
        if (t.ptr) ops_.release(t.ptr);
    for (Tensor& t : pool_) ops_.release(t.ptr);
}

Tensor CommStage::scratch(int i, size_t n) {
    Tensor& s = scratch_[i];
    if (s.n < n) {
        if (s.ptr) ops_.release(s.ptr);
        s = Tensor(ops_.alloc(n * sizeof(float)), n, DType::F32);
    }
    return s.slice(0, n);
}

void CommStage::run(Tensor in, Tensor out, const std::function<void(const float*, float*)>& f) {
    const bool in_place = in.ptr == out.ptr;
    if (direct_ && in.dtype == DType::F32 && out.dtype == DType::F32) {
        f(in.f32(), out.f32());
        return;
    }
    if (direct_) {  // fp32 copies in backend memory
        Tensor a = scratch(0, in.n), b = in_place ? a : scratch(1, out.n);
        ops_.copy(a, in);
        f(a.f32(), b.f32());
        ops_.copy(out, b);
        return;
    }
    std::vector<float>& a = host_[0];
    std::vector<float>& b = in_place ? host_[0] : host_[1];
    a.resize(in.n);
    b.resize(out.n);
    ops_.to_host_f32(a.data(), in);
    f(a.data(), b.data());
    ops_.from_host_f32(out, b.data());
}

void CommStage::run_host(float* x, size_t n, const std::function<void(float*)>& f) {
    if (!comm_ || !comm_->on_device()) {
        f(x);
        return;
    }
    Tensor s = scratch(0, n);
    ops_.from_host_bytes(s.ptr, x, n * sizeof(float));
    f(s.f32());
    ops_.to_host_bytes(x, s.ptr, n * sizeof(float));
}

void CommStage::run_host(const float* in, size_t n_in, float* out, size_t n_out,
                         const std::function<void(const float*, float*)>& f) {
    if (!comm_ || !comm_->on_device()) {
        f(in, out);
        return;
    }
    Tensor a = scratch(0, n_in), b = scratch(1, n_out);
    if (n_in) ops_.from_host_bytes(a.ptr, in, n_in * sizeof(float));
    f(a.f32(), b.f32());
    if (n_out) ops_.to_host_bytes(out, b.ptr, n_out * sizeof(float));
}

void CommStage::all_reduce_host(float* x, size_t n, size_t piece) {
    LLMC_ASSERT(comm_ && piece > 0, "all_reduce_host: needs a communicator and pieces of at least one float");
    if (comm_->size() == 1) return;
    for (size_t b = 0; b < n; b += piece) {
        const size_t k = std::min(piece, n - b);
        run_host(x + b, k, [&](float* y) { comm_->all_reduce(y, k, ReduceOp::Sum); });
    }
}

std::vector<float> CommStage::gather_host(const std::vector<float>& x, int from, size_t piece) {
    LLMC_ASSERT(comm_ && piece > 0, "gather_host: needs a communicator and pieces of at least one float");
    const int me = comm_->rank();
    std::vector<float> out(me == 0 ? x.size() : 0);
    if (from == 0) {
        if (me == 0) out = x;
        return out;
    }
    std::vector<size_t> c(size_t(comm_->size()), 0);
    for (size_t b = 0; b < x.size(); b += piece) {
        const size_t n = std::min(piece, x.size() - b);
        c[size_t(from)] = n;
        run_host(x.data() + b, me == from ? n : 0, me == 0 ? out.data() + b : nullptr, me == 0 ? n : 0,
                 [&](const float* in, float* o) { comm_->gather(in, o, c, 0); });
    }
    return out;
}

size_t CommStage::words(Tensor t) const {
    return direct_ ? (t.bytes() + sizeof(float) - 1) / sizeof(float) : t.n;
}

CommStage::Message CommStage::take_message(Tensor like) {
    Message m;
    if (!direct_) {
        m.host.resize(like.n);
        return m;
    }
    // the smallest pooled buffer that holds it; else a new one, in place of the largest pooled
    // one (too small), so that the pool holds at most as many buffers as were ever in use at once
    // (a pipeline's sampling passes grow by a token each)
    const size_t w = words(like);
    size_t best = pool_.size(), largest = pool_.size();
    for (size_t i = 0; i < pool_.size(); i++) {
        if (pool_[i].n >= w && (best == pool_.size() || pool_[i].n < pool_[best].n)) best = i;
        if (largest == pool_.size() || pool_[i].n > pool_[largest].n) largest = i;
    }
    if (best == pool_.size() && largest < pool_.size()) {
        ops_.release(pool_[largest].ptr);
        pool_.erase(pool_.begin() + long(largest));
    }
    if (best < pool_.size()) {
        m.dev = pool_[best];
        pool_.erase(pool_.begin() + long(best));
        return m;
    }
    m.dev = Tensor(ops_.alloc(w * sizeof(float)), w, DType::F32);
    return m;
}

void CommStage::reserve(Tensor like) {
    if (!direct_ || like.n == 0) return;
    const size_t w = words(like);
    pool_.push_back(Tensor(ops_.alloc(w * sizeof(float)), w, DType::F32));
}

void CommStage::release_message(Message&& m) {
    if (m.dev.ptr) pool_.push_back(m.dev);
    m = Message();
}

void CommStage::pack(Message& m, Tensor src) {
    if (m.dev.ptr) ops_.copy(Tensor(m.dev.ptr, src.n, src.dtype), src);
    else ops_.to_host_f32(m.host.data(), src);
}

void CommStage::unpack(Tensor dst, Message& m) {
    if (m.dev.ptr) ops_.copy(dst, Tensor(m.dev.ptr, dst.n, dst.dtype));
    else ops_.from_host_f32(dst, m.host.data());
}
