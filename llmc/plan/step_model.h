// The planner's step-time model: what one optimizer step of a layout costs on a cluster you may
// not have, split into compute, exposed communication and the pipeline bubble. A table of devices
// (dense peak FLOP/s per precision, HBM bandwidth, memory) and of their links (NVLink inside a
// node, InfiniBand between nodes: bandwidth and latency), chosen by plan.gpu and
// plan.gpus_per_node; the plan.* keys override any entry. The same cost model balances pipeline
// stages (parallel.pp_layers "auto") and ranks layouts (--plan=search).
//
// The model, and what it assumes (dev/bench/PLANNER.md holds it against published numbers):
// - Compute: the model's FLOPs (6 x parameters + 12 x layers x d_model x seq per token, llmc/run/mfu.h)
//   plus what recomputation runs again, at plan.efficiency x the dense peak of the precision;
//   the embedding and the head's loss pass are HBM-bound (bytes / HBM bandwidth). With MoE the
//   parameters a token runs through: top_k of each MoE layer's experts.
// - Tensor parallelism: per layer and micro-batch two ring all-reduces of the activations in
//   forward and two in backward (with sequence parallelism an all-gather and a reduce-scatter
//   each: the same bytes), not overlapped with compute (the trainer's), or with plan.tp_overlap
//   hidden behind the layers' GEMMs where they last longer (Megatron's --tp-comm-overlap).
//   Context parallelism's K/V ring and expert parallelism's all-to-all (each MoE layer's k rows
//   per token to their experts' owners and back, forward and backward) count with it: exposed.
// - Pipeline: each stage sends its output forward and receives the gradient back, per
//   micro-batch and chunk (one message each way, not overlapped); the bubble of gpipe and 1f1b
//   is the sum of the other stages' times per micro-batch (= (p-1) x t when balanced), of the
//   interleaved schedule that over the chunks per rank (v).
// - Data parallelism (llmc/train/data_parallel.h), over the rank with the most parameters (E/ep of the
//   experts under expert parallelism): ZeRO 0
//   all-reduces and ZeRO-1 reduce-scatters the gradients during the last micro-batch's backward
//   (what outlasts that backward is exposed); ZeRO-2 reduce-scatters each layer's gradient in
//   every micro-batch's backward (likewise); ZeRO 1-2 all-gather the updated parameters behind
//   the next step's first forward (Megatron's --overlap-param-gather); ZeRO-3 gathers every unit
//   in forward and again in backward and reduce-scatters its gradient, per micro-batch,
//   overlapped with that micro-batch's compute. Each collective (bucket, unit) pays the ring's
//   latency. This is the overlap of a communication stream (Megatron's --overlap-grad-reduce);
//   the trainer's own collectives are blocking today, so for this trainer the dp term is a
//   lower bound. Local SGD (parallel.local_sgd) has no gradient collective: its sync, an
//   all-reduce of the fp32 weights (ZeRO-1: reduce-scatter and all-gather, the same ring time)
//   after every H-th update, is exposed and counted as 1/H of it per step; the outer step's
//   host work and the weights' copies to and from the host are not modelled, and the update
//   covers the whole replica (the inner optimizer is not sharded). PowerSGD
//   (parallel.grad_compression, ZeRO-0 over dp only) sends the plain all-reduce's bytes over its
//   compression ratio (powersgd_ratio) in two all-reduces after the backward, exposed; the
//   factors' host arithmetic and the gradients' copies are not modelled.
// - Placement: ranks are numbered tp fastest, then cp, dp, pp (llmc/parallel/process_grid.h); a group
//   whose ranks lie within one node of plan.gpus_per_node uses NVLink; one spanning nodes with k
//   members per node moves min(NVLink, k x InfiniBand per GPU) per member (a ring crosses each
//   node once per channel, and NCCL runs a channel per NIC, one NIC per GPU).
// - The optimizer's update is HBM-bound: reading and writing the rank's optimizer state,
//   parameters and gradients once. train.offload_optimizer (the update on the host, streamed over
//   PCIe) is not modelled: its step time is this one's. Nor is train.offload_activations: a layer's
//   input crosses PCIe once each way per micro-batch (d_model x tokens, a few MB), beside that
//   layer's compute, which outlasts it on any layer worth offloading.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/config.h"
#include "llmc/model/param_table.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/core/tensor.h"

// One device kind of the table, after the plan.* overrides.
struct DeviceSpec {
    std::string name;         // plan.gpu's value: "h100", ...
    double peak_flops = 0;    // dense FLOP/s of the run's precision (plan.peak_tflops)
    double efficiency = 0;    // achieved fraction of the peak while computing (plan.efficiency)
    double hbm_bytes_s = 0;   // HBM bandwidth (plan.hbm_gb_s)
    double mem_bytes = 0;     // memory per GPU (plan.gpu_mem_gib)
    double nvlink_bytes_s = 0, nvlink_latency_s = 0;  // per GPU, one direction (plan.nvlink_gb_s, ...)
    double ib_bytes_s = 0, ib_latency_s = 0;          // per GPU, one direction (plan.ib_gb_s, ...)
    int gpus_per_node = 8;
};

// The names plan.gpu accepts, in the table's order.
std::vector<std::string> plan_gpu_names();
// plan.gpu's table entry for the run's precision ("fp32", "bf16", "fp8"), plan.* overrides applied.
DeviceSpec plan_device(const Config& cfg);

// One optimizer step's estimated time, in seconds.
struct StepTime {
    double compute = 0;    // the slowest pipeline rank's compute over all micro-batches
    double tp_comm = 0;    // exposed collectives inside the layers: tensor-parallel, cp's ring, ep's all-to-all
    double pp_comm = 0;    // exposed pipeline sends and receives (on that rank)
    double dp_comm = 0;    // exposed data-parallel (ZeRO) communication
    double bubble = 0;     // the pipeline's fill and drain
    double optimizer = 0;  // the update
    double total = 0;
    double tokens_per_s = 0;
    double mfu = 0;                     // model FLOPs per step / (total x world x peak)
    std::vector<double> rank_seconds;   // per pipeline rank: seconds per micro-batch (all chunks)
    double exposed_comm() const { return tp_comm + pp_comm + dp_comm; }
};

// The cost of one virtual pipeline stage holding `layers` layers, per micro-batch (forward and
// backward, with recomputation and tensor-parallel communication), in seconds.
struct Cost {
    double compute = 0, tp_comm = 0;
    double total() const { return compute + tp_comm; }
};
struct StageCost {
    Cost layer;      // one transformer layer
    Cost embedding;  // the first stage's extra
    Cost head;       // the last stage's extra: vocabulary GEMM and loss
    // A virtual stage (of `stages`) holding `layers` layers.
    Cost stage(int vs, int stages, int layers) const {
        Cost c{layers * layer.compute, layers * layer.tp_comm};
        if (vs == 0) c.compute += embedding.compute, c.tp_comm += embedding.tp_comm;
        if (vs == stages - 1) c.compute += head.compute, c.tp_comm += head.tp_comm;
        return c;
    }
};
StageCost stage_cost(const Config& cfg, const ModelShape& shape, const DeviceSpec& dev, int tp, int cp = 1, int ep = 1);

// The step time of cfg's layout on grid.world devices of plan_device(cfg).
StepTime estimate_step(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype);
// PowerSGD's compression ratio for the whole model (tp = pp = 1) at parallel.powersgd_rank: the plain
// all-reduce's floats over the floats it sends (llmc/train/powersgd.h)
double powersgd_ratio(const ModelShape& shape, const ParallelConfig& pc);
nlohmann::json step_json(const StepTime& t);

// parallel.pp_layers "auto": layers per virtual stage (pp x pp_virtual of them) minimising the
// most expensive stage under stage_cost, the embedding counted on the first and the head on the
// last. Deterministic; every stage gets at least one layer.
std::vector<int> balance_pp_layers(const Config& cfg, const ModelShape& shape);

// Ring collectives over n ranks of `bytes` (the whole buffer) on a link: seconds.
double ring_all_reduce_s(double bytes, int n, double bytes_s, double latency_s);
double ring_gather_s(double bytes, int n, double bytes_s, double latency_s);  // all-gather or reduce-scatter
