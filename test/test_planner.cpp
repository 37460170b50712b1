// The planner's step-time model, pipeline balancing, layout search and its activation memory
// against Megatron's published formula (Korthikanti et al. 2022).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>

#include "llmc/train/layout.h"
#include "llmc/run/mfu.h"
#include "llmc/parallel/pipeline_schedule.h"
#include "llmc/plan/planner.h"
#include "test/test_data_files.h"
#include "test/user_error.h"

using nlohmann::json;

namespace {
// A config for a GPT-2-family shape on CUDA in bf16 (the plan of a GPU run).
Config gpt_config(int n_layer, int d_model, int n_head, int vocab, int seq, json extra = json::object()) {
    json j = {{"device", "cuda"},
              {"precision", "bf16"},
              {"model", {{"n_layer", n_layer}, {"d_model", d_model}, {"n_head", n_head}, {"vocab_size", vocab},
                         {"max_seq_len", seq}}},
              {"data", {{"train", "unused_*.bin"}}},
              {"train", {{"seq_len", seq}, {"micro_batch", 1}}}};
    j.merge_patch(extra);
    return config_from_json(j, false);
}

StepTime step_of(Config cfg) {
    const ModelShape shape = model_shape(cfg.model);
    resolve_pp_layers(cfg, shape);
    const ProcessGrid g = make_process_grid(cfg.parallel, plan_world(cfg), 0);
    return estimate_step(cfg, shape, g, DType::BF16);
}

}  // namespace

TEST_CASE("ring collectives cost 2(n-1)/n (all-reduce) and (n-1)/n (gather) of the bytes plus a latency per step",
          "[plan]") {
    CHECK(ring_all_reduce_s(1e9, 4, 1e9, 0) == Approx(1.5));
    CHECK(ring_gather_s(1e9, 4, 1e9, 0) == Approx(0.75));
    CHECK(ring_all_reduce_s(0, 8, 1e9, 1e-6) == Approx(14e-6));
    CHECK(ring_gather_s(0, 8, 1e9, 1e-6) == Approx(7e-6));
    CHECK(ring_all_reduce_s(1e9, 1, 1e9, 1e-6) == 0.0);
}

TEST_CASE("plan.gpu selects a device row; plan.* keys override it and bad values name the key", "[plan]") {
    const DeviceSpec h100 = plan_device(gpt_config(2, 64, 2, 512, 64));
    CHECK(h100.name == "h100");
    CHECK(h100.peak_flops == Approx(989.4e12));  // bf16 dense
    CHECK(h100.mem_bytes == Approx(81559.0 * (1 << 20)));
    CHECK(h100.nvlink_bytes_s == Approx(450e9));
    CHECK(h100.ib_bytes_s == Approx(50e9));
    const DeviceSpec a100 = plan_device(gpt_config(2, 64, 2, 512, 64, {{"plan", {{"gpu", "a100-40"}}}}));
    CHECK(a100.peak_flops == Approx(312e12));
    CHECK(a100.mem_bytes == Approx(40.0 * (1ull << 30)));
    const DeviceSpec over = plan_device(gpt_config(
        2, 64, 2, 512, 64,
        {{"plan", {{"peak_tflops", 100}, {"gpu_mem_gib", 24}, {"ib_gb_s", 12.5}, {"efficiency", 0.7}, {"gpus_per_node", 4}}}}));
    CHECK(over.peak_flops == Approx(100e12));
    CHECK(over.mem_bytes == Approx(24.0 * (1ull << 30)));
    CHECK(over.ib_bytes_s == Approx(12.5e9));
    CHECK(over.efficiency == Approx(0.7));
    CHECK(over.gpus_per_node == 4);
    // the A100 has no FP8: the plan asks for a peak
    CHECK_THAT(error_of([] { plan_device(gpt_config(2, 64, 2, 512, 64, {{"precision", "fp8"}, {"plan", {{"gpu", "a100-80"}}}})); }),
               Catch::Contains("plan.peak_tflops"));
    const auto bad = [](json plan) { return error_of([&] { gpt_config(2, 64, 2, 512, 64, {{"plan", plan}}); }); };
    CHECK_THAT(bad({{"gpu", "v100"}}), Catch::Contains("plan.gpu") && Catch::Contains("h100"));
    CHECK_THAT(bad({{"efficiency", 0}}), Catch::Contains("plan.efficiency"));
    CHECK_THAT(bad({{"efficiency", 1.5}}), Catch::Contains("plan.efficiency"));
    CHECK_THAT(bad({{"nvlink_gb_s", -1}}), Catch::Contains("plan.nvlink_gb_s"));
    CHECK_THAT(bad({{"ib_latency_us", "fast"}}), Catch::Contains("plan.ib_latency_us"));
    CHECK_THAT(bad({{"gpus_per_node", 0}}), Catch::Contains("plan.gpus_per_node"));
}

TEST_CASE("one GPU: the step is compute and the update; MFU is the efficiency less the non-model work", "[plan]") {
    // GPT-3 XL (1.3B): 24 layers, d_model 2048, sequence 2048
    Config cfg = gpt_config(24, 2048, 16, 50257, 2048, {{"train", {{"grad_accum", 8}}}});
    const StepTime t = step_of(cfg);
    CHECK(t.tp_comm == 0.0);
    CHECK(t.pp_comm == 0.0);
    CHECK(t.dp_comm == 0.0);
    CHECK(t.bubble == 0.0);
    CHECK(t.total == Approx(t.compute + t.optimizer));
    CHECK(t.mfu <= 0.5);
    CHECK(t.mfu > 0.45);  // the padded vocabulary, the loss pass and the update cost a little
    CHECK(t.tokens_per_s == Approx(8 * 2048 / t.total));
    // full recomputation runs the layers' forward again: about 4/3 of the compute
    cfg.train.recompute = "full";
    const StepTime full = step_of(cfg);
    CHECK(full.compute / t.compute == Approx(4.0 / 3.0).epsilon(0.02));
    cfg.train.recompute = "selective";
    const StepTime sel = step_of(cfg);
    CHECK(sel.compute > t.compute);
    CHECK(sel.compute < full.compute);
}

TEST_CASE("mixture of experts: compute counts top_k experts; ep holds E/ep of them and its all-to-all shows", "[plan]") {
    // GPT-2 124M on 2 GPUs (dp 2), 8 micro-batches of 1024 tokens; MoE: 4 experts as wide as the
    // dense MLP, top-1, so a token computes what it does in the dense model (plus a 768 x 4 router)
    const json dense = {{"train", {{"grad_accum", 8}}}, {"parallel", {{"dp", 2}}}};
    json moe = dense;
    moe["model"]["moe"] = {{"num_experts", 4}, {"top_k", 1}, {"expert_ffn_dim", 3072}, {"every", 1}};
    const auto step = [](const json& j) { return step_of(gpt_config(12, 768, 12, 50257, 1024, j)); };
    const StepTime d = step(dense), m1 = step(moe);
    CHECK(m1.compute / d.compute == Approx(1.0).epsilon(1e-3));
    CHECK(m1.tp_comm == 0.0);
    // ep 2: per layer and micro-batch 4 all-to-alls (dispatch, combine, and their gradients) of
    // half the 1024 rows of 768 bf16 values, over NVLink (450 GB/s, 1 us a message)
    json ep2 = moe;
    ep2["parallel"]["ep"] = 2;
    const StepTime m2 = step(ep2);
    const double a2a = 1024.0 * 768 * 2 / 2 / 450e9 + 1e-6;
    CHECK(m2.tp_comm == Approx(8 * 12 * 4 * a2a).epsilon(1e-9));
    CHECK(m2.compute == Approx(m1.compute));
    // a rank holds half the experts: the update reads and writes that much less state (ZeRO-0:
    // every parameter of the rank); 12 layers x 4 experts of fcw, fcb, fcprojw, fcprojb
    const double experts = 12.0 * 4 * (768.0 * 3072 * 2 + 3072 + 768);
    const double total = double(num_params_unpadded(model_shape(gpt_config(12, 768, 12, 50257, 1024, moe).model)));
    CHECK(m2.optimizer / m1.optimizer == Approx((total - experts / 2) / total).epsilon(1e-9));
    // MoE in every other layer: half the all-to-alls; full recompute dispatches and combines again
    ep2["model"]["moe"]["every"] = 2;
    CHECK(step(ep2).tp_comm == Approx(8 * 6 * 4 * a2a).epsilon(1e-9));
    ep2["model"]["moe"]["every"] = 1;
    ep2["train"]["recompute"] = "full";
    CHECK(step(ep2).tp_comm == Approx(8 * 12 * 6 * a2a).epsilon(1e-9));
}

TEST_CASE("context parallelism: each rank computes 1/cp of the tokens; the ring shows", "[plan]") {
    // the 1.3B shape on 2 GPUs: cp 2 against one GPU with the same global batch
    Config one = gpt_config(24, 2048, 16, 50257, 2048, {{"train", {{"grad_accum", 8}}}, {"parallel", {{"dp", 1}}}});
    Config two = gpt_config(24, 2048, 16, 50257, 2048,
                            {{"train", {{"grad_accum", 8}}}, {"parallel", {{"dp", 1}, {"cp", 2}}}});
    const StepTime a = step_of(one), b = step_of(two);
    CHECK(b.compute / a.compute == Approx(0.5));
    // the K/V blocks' ring: 3 (cp - 1) + 1 = 4 passes per layer and micro-batch of 1024 tokens x
    // 3 x 2048 bf16 values each over NVLink (450 GB/s, 1 us), 24 layers, 8 micro-batches
    const double block = 1024.0 * 3 * 2048 * 2;
    CHECK(b.tp_comm == Approx(8 * 24 * 4 * (block / 450e9 + 1e-6)).epsilon(1e-6));
    CHECK(b.tokens_per_s > a.tokens_per_s);
    CHECK(b.mfu < a.mfu);
    CHECK(b.mfu > 0.8 * a.mfu);
}

TEST_CASE("pipeline bubble: (p-1)/m of the work for gpipe and 1f1b, (p-1)/(v m) interleaved", "[plan]") {
    // 32 equal layers, a small vocabulary (the head is cheap), 4 stages, 8 micro-batches
    const json pipe = {{"parallel", {{"dp", 1}, {"pp", 4}}}, {"train", {{"grad_accum", 8}}}};
    Config cfg = gpt_config(32, 4096, 32, 512, 2048, pipe);
    const StepTime one = step_of(cfg);
    const double work = one.compute + one.tp_comm + one.pp_comm;
    CHECK(one.bubble / work == Approx(3.0 / 8.0).epsilon(0.05));
    cfg.parallel.pp_schedule = "gpipe";
    CHECK(step_of(cfg).bubble == Approx(one.bubble));
    cfg.parallel.pp_schedule = "interleaved";
    cfg.parallel.pp_virtual = 2;
    const StepTime two = step_of(cfg);
    CHECK(two.bubble / work == Approx(3.0 / 16.0).epsilon(0.05));
    CHECK(two.pp_comm > one.pp_comm);  // twice the boundaries
}

TEST_CASE("placement: a group within a node uses NVLink, one across nodes InfiniBand", "[plan]") {
    const json tiny_latency = {{"nvlink_latency_us", 1e-9}, {"ib_latency_us", 1e-9}, {"nvlink_gb_s", 400}, {"ib_gb_s", 40}};
    Config cfg = gpt_config(8, 4096, 32, 512, 2048,
                            {{"parallel", {{"dp", 1}, {"tp", 8}}}, {"train", {{"grad_accum", 2}}}, {"plan", tiny_latency}});
    const StepTime in_node = step_of(cfg);
    cfg.plan.gpus_per_node = 4;  // tp 8 spans two nodes, 4 members in each: 4 NICs carry the ring
    const StepTime across = step_of(cfg);
    CHECK(in_node.tp_comm > 0);
    CHECK(across.tp_comm / in_node.tp_comm == Approx(400.0 / (4 * 40)).epsilon(1e-6));
    CHECK(across.compute == Approx(in_node.compute));
    cfg.plan.gpus_per_node = 1;  // one GPU per node: one NIC
    CHECK(step_of(cfg).tp_comm / in_node.tp_comm == Approx(400.0 / 40).epsilon(1e-6));
    cfg.plan.gpus_per_node = 4;
    // sequence parallelism moves the same bytes (all-gather + reduce-scatter = all-reduce)
    cfg.parallel.sequence_parallel = true;
    CHECK(step_of(cfg).tp_comm == Approx(across.tp_comm));

    // data parallelism: dp 8 inside one node, then one GPU per node; short sequences leave little
    // compute to hide ZeRO-1's reduce-scatter and gather behind
    Config dp = gpt_config(8, 4096, 32, 512, 64, {{"parallel", {{"dp", 8}, {"zero", 1}}}, {"plan", tiny_latency}});
    const StepTime dp_in = step_of(dp);
    dp.plan.gpus_per_node = 1;
    const StepTime dp_across = step_of(dp);
    CHECK(dp_in.dp_comm > 0);
    CHECK(dp_across.dp_comm > 5 * dp_in.dp_comm);
    // long sequences: in the node the all-reduce hides behind the last backward
    Config hidden = gpt_config(8, 4096, 32, 512, 2048, {{"parallel", {{"dp", 8}}}, {"plan", tiny_latency}});
    CHECK(step_of(hidden).dp_comm == 0.0);
    hidden.plan.gpus_per_node = 1;
    CHECK(step_of(hidden).dp_comm > 0.0);
}

TEST_CASE("local SGD: no gradient all-reduce; the weights' fp32 all-reduce once per H steps, exposed", "[plan][local_sgd]") {
    // 8 layers x 4096 on dp 8, one GPU per node (InfiniBand, 40 GB/s), short sequences: plain DP's
    // bf16 gradient all-reduce mostly shows; local SGD's sync moves the fp32 weights after the update
    const json ib = {{"nvlink_latency_us", 1e-9}, {"ib_latency_us", 1e-9}, {"ib_gb_s", 40}, {"gpus_per_node", 1}};
    const auto cfg = [&](json parallel) {
        return gpt_config(8, 4096, 32, 512, 64, {{"parallel", parallel}, {"plan", ib}, {"train", {{"grad_accum", 2}}}});
    };
    const StepTime plain = step_of(cfg({{"dp", 8}}));
    const StepTime h1 = step_of(cfg({{"dp", 8}, {"local_sgd", {{"every", 1}}}}));
    const StepTime h4 = step_of(cfg({{"dp", 8}, {"local_sgd", {{"every", 4}}}}));
    const double n = double(num_params_unpadded(model_shape(cfg({{"dp", 8}}).model)));
    // the sync: a ring all-reduce of 4 bytes per parameter over 8 ranks (the rank's parameters
    // as the planner counts them: within a percent of the model's)
    CHECK(h1.dp_comm == Approx(2.0 * 7 / 8 * 4 * n / 40e9).epsilon(0.01));
    CHECK(h4.dp_comm == Approx(h1.dp_comm / 4).epsilon(1e-9));
    CHECK(plain.dp_comm > h4.dp_comm);
    CHECK(h4.compute == Approx(plain.compute));
    // ZeRO-1 shards only the outer state: the same sync time (reduce-scatter + all-gather), the
    // whole replica's update and memory
    const StepTime z1 = step_of(cfg({{"dp", 8}, {"zero", 1}, {"local_sgd", {{"every", 4}}}}));
    CHECK(z1.dp_comm == Approx(h4.dp_comm).epsilon(1e-9));
    CHECK(z1.optimizer == Approx(plain.optimizer).epsilon(1e-9));
    CHECK(step_of(cfg({{"dp", 8}, {"zero", 1}})).optimizer < plain.optimizer / 4);
    const Config zc = cfg({{"dp", 8}, {"zero", 1}, {"local_sgd", {{"every", 4}}}});
    const ProcessGrid g = make_process_grid(zc.parallel, plan_world(zc), 0);
    const ModelShape shape = model_shape(zc.model);
    CHECK(plan_rank_memory(zc, shape, g, DType::BF16, 0, 0).optimizer ==
          plan_rank_memory(cfg({{"dp", 8}}), shape, g, DType::BF16, 0, 0).optimizer);
}

TEST_CASE("PowerSGD: the all-reduce's bytes over the compression ratio, exposed", "[plan][powersgd]") {
    const json ib = {{"nvlink_latency_us", 1e-9}, {"ib_latency_us", 1e-9}, {"ib_gb_s", 40}, {"gpus_per_node", 1}};
    const auto cfg = [&](json parallel) {
        return gpt_config(8, 4096, 32, 512, 64, {{"parallel", parallel}, {"plan", ib}, {"train", {{"grad_accum", 2}}}});
    };
    const Config c4 = cfg({{"dp", 8}, {"grad_compression", "powersgd"}, {"powersgd_rank", 4}});
    const ModelShape s = model_shape(c4.model);
    // d_model 4096: the layers' matrices 4096 x 4096 (qkv 12288, fc 16384 rows), wte 512 x 4096, wpe 64 x
    // 4096; at rank 4 the model's floats over wte and wpe's factors, every layer's and the vectors
    const double d = 4096, L = 8, r = 4, V = 512, T = 64;
    const double factors = r * ((V + d) + (T + d) + L * ((3 * d + d) + (d + d) + (4 * d + d) + (d + 4 * d)));
    const double vectors = L * (2 * d + 3 * d + d + 2 * d + 4 * d + d) + 2 * d;  // ln1, qkvb, projb, ln2, fcb, fcprojb; lnf
    const double all = double(num_params(s));
    const double ratio = powersgd_ratio(s, c4.parallel);
    CHECK(ratio == Approx(all / (factors + vectors)).epsilon(0.01));
    CHECK(ratio > 100);
    // the plain all-reduce is exposed past the backward's window; PowerSGD's after it entirely
    const StepTime plain = step_of(cfg({{"dp", 8}}));
    const StepTime p4 = step_of(c4);
    const double n = double(num_params_unpadded(s));
    CHECK(p4.dp_comm == Approx(2.0 * 7 / 8 * 4 * n / ratio / 40e9).epsilon(0.02));
    CHECK(p4.dp_comm < plain.dp_comm / 10);
    CHECK(p4.compute == Approx(plain.compute));
    // full rank: the plain all-reduce's bytes (fp32), exposed
    const Config full = cfg({{"dp", 8}, {"grad_compression", "powersgd"}, {"powersgd_rank", 4096}});
    CHECK(powersgd_ratio(s, full.parallel) == 1.0);
    CHECK(step_of(full).dp_comm == Approx(2.0 * 7 / 8 * 4 * n / 40e9).epsilon(0.02));
}

TEST_CASE("pp_layers auto: a heavy head gives the last stage fewer layers; a light one splits evenly", "[plan]") {
    // a 256k vocabulary on d_model 1024: the head costs several layers
    Config heavy = gpt_config(24, 1024, 16, 262144, 2048,
                              {{"parallel", {{"dp", 1}, {"pp", 4}, {"pp_layers", "auto"}}}, {"train", {{"grad_accum", 8}}}});
    CHECK(heavy.parallel.pp_layers_auto);
    CHECK(heavy.resolved["parallel"]["pp_layers"] == "auto");
    const ModelShape hs = model_shape(heavy.model);
    const std::vector<int> split = balance_pp_layers(heavy, hs);
    REQUIRE(split.size() == 4);
    CHECK(split[0] + split[1] + split[2] + split[3] == 24);
    CHECK(split[3] < split[1]);
    CHECK(split[3] >= 1);
    // it beats the even split: the slowest stage is faster
    const StageCost c = stage_cost(heavy, hs, plan_device(heavy), 1);
    const auto slowest = [&](const std::vector<int>& n) {
        double most = 0;
        for (int s = 0; s < 4; s++) most = std::max(most, c.stage(s, 4, n[size_t(s)]).total());
        return most;
    };
    CHECK(slowest(split) < slowest({6, 6, 6, 6}));
    // resolve_pp_layers puts it in the config; the step is faster than with the even split
    Config auto_cfg = heavy;
    resolve_pp_layers(auto_cfg, hs);
    CHECK(auto_cfg.parallel.pp_layers == split);
    CHECK(step_of(heavy).total < step_of(gpt_config(24, 1024, 16, 262144, 2048,
                                                     {{"parallel", {{"dp", 1}, {"pp", 4}}}, {"train", {{"grad_accum", 8}}}}))
                                      .total);

    Config light = gpt_config(24, 4096, 32, 512, 2048, {{"parallel", {{"dp", 1}, {"pp", 4}, {"pp_layers", "auto"}}}});
    CHECK(balance_pp_layers(light, model_shape(light.model)) == std::vector<int>{6, 6, 6, 6});
    // interleaved: one entry per virtual stage
    Config inter = gpt_config(24, 1024, 16, 262144, 2048,
                              {{"parallel", {{"dp", 1}, {"pp", 2}, {"pp_virtual", 2}, {"pp_schedule", "interleaved"},
                                             {"pp_layers", "auto"}}},
                               {"train", {{"grad_accum", 4}}}});
    const std::vector<int> isplit = balance_pp_layers(inter, model_shape(inter.model));
    REQUIRE(isplit.size() == 4);
    CHECK(isplit[3] < isplit[1]);
    CHECK_THAT(error_of([] {
                   Config few = gpt_config(3, 64, 2, 512, 64, {{"parallel", {{"dp", 1}, {"pp", 4}, {"pp_layers", "auto"}}}});
                   balance_pp_layers(few, model_shape(few.model));
               }),
               Catch::Contains("parallel.pp_layers"));
    CHECK_THAT(error_of([] { gpt_config(2, 64, 2, 512, 64, {{"parallel", {{"pp_layers", "even"}}}}); }),
               Catch::Contains("parallel.pp_layers") && Catch::Contains("auto"));
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// section 4: activation bytes per layer with 16-bit activations and 1-byte dropout masks,
// s sequence, b micro-batch, h hidden, a heads, t tensor-parallel ranks with sequence parallelism:
// no recomputation s·b·h·(34 + 5·a·s/h)/t, selective 34·s·b·h/t, full 2·s·b·h/t.
TEST_CASE("activation memory per layer against Megatron's formula, term by term", "[plan]") {
    struct Shape {
        const char* name;
        int layers, h, a, s, b, t;
    };
    const Shape shapes[] = {
        {"GPT-3 XL 1.3B", 24, 2048, 16, 2048, 1, 1},
        {"GPT-3 175B", 96, 12288, 96, 2048, 1, 1},
        {"GPT-3 175B, tp 8 + SP", 96, 12288, 96, 2048, 1, 8},
        {"Megatron 530B, tp 8 + SP", 105, 20480, 128, 2048, 1, 8},
    };
    for (const Shape& sh : shapes) {
        Config cfg = gpt_config(sh.layers, sh.h, sh.a, 51200, sh.s,
                                {{"parallel", {{"dp", 1}, {"tp", sh.t}, {"sequence_parallel", sh.t > 1}}}});
        const ModelShape shape = model_shape(cfg.model);
        const double sbh = double(sh.s) * sh.b * sh.h, t = sh.t;
        for (const char* rc_name : {"none", "selective", "full"}) {
            INFO(sh.name << ", recompute " << rc_name);
            const Recompute rc = parse_recompute(rc_name);
            const auto terms = activation_terms(shape, DType::BF16, sh.b, sh.s, sh.t, sh.t > 1, rc);
            double ours = 0, paper = 0, ours_matched = 0, paper_matched = 0;
            for (const ActivationTerm& term : terms) {
                INFO(term.name);
                ours += term.ours, paper += term.paper;
                if (term.ours > 0 && term.paper > 0) {  // a term both hold: within 5%
                    CHECK(std::fabs(term.ours - term.paper) <= 0.05 * term.paper);
                    ours_matched += term.ours, paper_matched += term.paper;
                }
            }
            // the paper's terms add up to its published totals
            const double published = rc == Recompute::None        ? sbh * (34.0 + 5.0 * sh.a * sh.s / sh.h) / t
                                     : rc == Recompute::Selective ? 34.0 * sbh / t
                                                                  : 2.0 * sbh / t;
            CHECK(paper == Approx(published).epsilon(1e-12));
            // ours add up to what a layer of the run allocates (one layer more, one micro-batch in flight)
            ModelShape more = shape;
            more.n_layer = shape.n_layer + 1;
            const ModelLayout lay = model_layout(shape, cfg.parallel, 0, 0), lay_more = model_layout(more, cfg.parallel, 0, 0);
            const double per_layer = double(Model::activation_bytes_of(more, DType::BF16, sh.b, sh.s, lay_more, {1}, rc)) -
                                     double(Model::activation_bytes_of(shape, DType::BF16, sh.b, sh.s, lay, {1}, rc));
            CHECK(ours == per_layer);
            // where the two hold the same tensors they agree within 5% overall
            if (rc == Recompute::Full) {
                CHECK(std::fabs(ours - published) <= 0.05 * published);
            } else {
                CHECK(ours_matched == Approx(paper_matched).epsilon(0.05));
                // ours keep no a·s² scores and no dropout masks: less than the paper
                CHECK(ours < published);
            }
            if (rc == Recompute::None) {  // the paper without the a·s² terms and the masks: 32 s·b·h/t
                CHECK(std::fabs(ours - 32.0 * sbh / t) <= 0.05 * 32.0 * sbh / t);
            }
        }
    }
}

// fp8 with a GELU MLP: fc2's input casts apply the GELU to fc1's kept output, so no layer keeps
// the GELU's output (N F bytes of dtype a layer, the largest single term at 4h); one buffer for the
// forwards the fp8 GEMM cannot take, whatever the layer count. A gated MLP (Llama) keeps its
// activation as before. Every fp8 layer keeps its linears' inputs cast transposed (a byte an
// element: Fp8Stash).
TEST_CASE("fp8 activations: no GELU output per layer, the transposed input casts; the terms and the carve agree",
          "[plan]") {
    for (const char* arch : {"gpt2", "llama"}) {
        INFO(arch);
        Config cfg = gpt_config(4, 256, 4, 512, 128, {{"model", {{"arch", arch}}}});
        const ModelShape shape = model_shape(cfg.model);
        ModelShape more = shape;
        more.n_layer = shape.n_layer + 1;
        const ModelLayout lay = model_layout(shape, cfg.parallel, 0, 0), lay_more = model_layout(more, cfg.parallel, 0, 0);
        const int b = 2, s = 128;
        for (const char* rc_name : {"none", "selective", "full"}) {
            INFO(rc_name);
            const Recompute rc = parse_recompute(rc_name);
            auto per_layer = [&](bool fp8) {
                return double(Model::activation_bytes_of(more, DType::BF16, b, s, lay_more, {1}, rc, false, fp8)) -
                       double(Model::activation_bytes_of(shape, DType::BF16, b, s, lay, {1}, rc, false, fp8));
            };
            auto terms = [&](bool fp8) {
                double sum = 0;
                for (const ActivationTerm& t : activation_terms(shape, DType::BF16, b, s, 1, false, rc, fp8)) sum += t.ours;
                return sum;
            };
            CHECK(terms(true) == per_layer(true));
            const double N = double(b) * s, gelu_out = N * shape.ffn() * 2;  // bf16
            // the linears' transposed input casts (Fp8Stash): a byte an input element, and 256 for
            // the four 1/s; full recompute keeps one set for all layers
            const double stash = N * (3.0 * shape.d_model + shape.ffn()) + 256;
            const bool saves = std::string(arch) == "gpt2" && rc == Recompute::None;
            const bool full = rc == Recompute::Full;
            CHECK(per_layer(true) - per_layer(false) == (full ? 0.0 : stash) - (saves ? gelu_out : 0.0));
            // the whole model: no recompute saves L GELU outputs less the one shared buffer (full and
            // selective recompute kept one already) and adds L stashes (full: one)
            const double whole = double(Model::activation_bytes_of(shape, DType::BF16, b, s, lay, {1}, rc, false, true)) -
                                 double(Model::activation_bytes_of(shape, DType::BF16, b, s, lay, {1}, rc, false, false));
            CHECK(whole == (full ? 1 : shape.n_layer) * stash - (saves ? (shape.n_layer - 1) * gelu_out : 0.0));
        }
    }
}

TEST_CASE("--plan=search: every result fits and equals the memory plan, fastest first, deterministic", "[plan]") {
    // GPT-2 124M on 8 GPUs, 32 sequences of 1024 per step
    const json base = {{"parallel", {{"dp", 8}}}, {"train", {{"micro_batch", 4}}}, {"plan", {{"world", 8}}}};
    Config roomy = gpt_config(12, 768, 12, 50257, 1024, base);
    const ModelShape shape = model_shape(roomy.model);
    const auto best = search_layouts(roomy, shape, DType::BF16, 3);
    REQUIRE(best.size() == 3);
    // the obvious answer: a small model on one node trains fastest as plain data parallelism with no recompute
    const ParallelConfig& pc = best[0].cfg.parallel;
    CHECK(pc.dp == 8);
    CHECK(pc.tp == 1);
    CHECK(pc.pp == 1);
    CHECK(best[0].cfg.train.recompute == "none");
    CHECK(best[0].cfg.train.micro_batch * best[0].cfg.train.grad_accum * pc.dp == 32);
    for (size_t i = 1; i < best.size(); i++) CHECK(best[i - 1].time.tokens_per_s >= best[i].time.tokens_per_s);

    // a tight budget: the roomy winner does not fit, the answers do, by the plan of every rank
    const size_t winner = best[0].max_bytes;
    Config tight = roomy;
    tight.plan.gpu_mem_gib = double(winner) * 0.6 / double(1ull << 30);
    size_t examined = 0;
    const auto fit = search_layouts(tight, shape, DType::BF16, 5, &examined);
    REQUIRE(!fit.empty());
    CHECK(examined > fit.size());
    const double budget = plan_device(tight).mem_bytes;
    for (const LayoutChoice& c : fit) {
        INFO(c.overrides());
        const ProcessGrid g = make_process_grid(c.cfg.parallel, 8, 0);
        size_t most = 0;
        for (const RankMemory& r : plan_memory(c.cfg, shape, g, DType::BF16)) most = std::max(most, r.mem.total());
        CHECK(c.max_bytes == most);
        CHECK(double(most) <= budget);
        const bool saves = c.cfg.parallel.zero > 0 || c.cfg.train.recompute != "none" || c.cfg.parallel.tp > 1 ||
                           c.cfg.parallel.pp > 1 || c.cfg.train.micro_batch < 4;
        CHECK(saves);
    }
    for (size_t i = 1; i < fit.size(); i++) CHECK(fit[i - 1].time.tokens_per_s >= fit[i].time.tokens_per_s);
    const auto again = search_layouts(tight, shape, DType::BF16, 5);
    REQUIRE(again.size() == fit.size());
    for (size_t i = 0; i < fit.size(); i++) CHECK(again[i].overrides() == fit[i].overrides());

    // nothing fits a budget below the smallest layout
    Config none = roomy;
    none.plan.gpu_mem_gib = 1e-3;
    CHECK(search_layouts(none, shape, DType::BF16, 5).empty());
}

TEST_CASE("--plan=search keeps the given cp; with MoE it searches ep", "[plan]") {
    // 8 GPUs, cp 2: every layout found spans the 8 ranks with cp 2, its plan is the memory
    // printed, and the overrides name cp (before, the search ignored cp and every candidate was a
    // layout for 16 processes, refused). With 8 experts, ep is searched too: every divisor of 8
    // that divides dp x cp, each named in the overrides
    const json base = {{"parallel", {{"dp", 4}, {"cp", 2}}}, {"train", {{"micro_batch", 2}}}, {"plan", {{"world", 8}}}};
    Config cfg = gpt_config(12, 768, 12, 50257, 1024, base);
    for (bool moe : {false, true}) {
        if (moe) cfg.model.moe.num_experts = 8, cfg.model.moe.top_k = 2, cfg.model.moe.expert_ffn_dim = 1024;
        const ModelShape shape = model_shape(cfg.model);
        size_t examined = 0;
        const auto found = search_layouts(cfg, shape, DType::BF16, SIZE_MAX, &examined);
        INFO("moe " << moe << ": " << found.size() << " of " << examined);
        REQUIRE(!found.empty());
        bool other_dp = false;
        std::set<int> eps;
        for (const LayoutChoice& c : found) {
            const ParallelConfig& pc = c.cfg.parallel;
            INFO(c.overrides());
            CHECK(pc.cp == 2);
            CHECK(pc.dp * pc.cp * pc.tp * pc.pp == 8);
            CHECK(c.overrides().find("parallel.cp=2") != std::string::npos);
            CHECK(c.cfg.train.micro_batch * c.cfg.train.grad_accum * pc.dp == 2 * 4);  // the same sequences per step
            CHECK((8 % pc.ep == 0 && pc.dp * pc.cp % pc.ep == 0));
            CHECK((c.overrides().find(strfmt("parallel.ep=%d", pc.ep)) != std::string::npos) == moe);
            const ProcessGrid g = make_process_grid(pc, 8, 0);
            size_t most = 0;
            for (const RankMemory& r : plan_memory(c.cfg, shape, g, DType::BF16)) most = std::max(most, r.mem.total());
            CHECK(c.max_bytes == most);
            other_dp = other_dp || pc.dp != 4;
            eps.insert(pc.ep);
        }
        CHECK(other_dp);  // tp or pp in the answers: the search varied the layout
        CHECK(eps == (moe ? std::set<int>{1, 2, 4, 8} : std::set<int>{1}));
    }
}

// Published H100 throughput (test/data/published_h100_throughput.json: its source and why these
// rows) against the step-time model, each row's layout as published and Megatron-Core's setup:
// FP8, the distributed optimizer (ZeRO-1), sequence parallelism with tp, no recomputation,
// gradient buckets of 40M parameters (Megatron's default: 160 MiB of fp32), tensor-parallel
// communication overlapped (--tp-comm-overlap), and one achieved fraction of the FP8 peak for
// every row, 0.43 (fitted: the one free number; dev/bench/PLANNER.md).
TEST_CASE("step time against published H100 throughput: every row within 15%", "[plan]") {
    std::ifstream in(find_data_file("published_h100_throughput.json"));
    const json table = json::parse(in);
    REQUIRE(table["rows"].size() == 7);
    for (const json& r : table["rows"]) {
        const int gpus = r["gpus"], tp = r["tp"], pp = r["pp"], vp = r["vp"], mbs = r["mbs"], gbs = r["gbs"];
        const int dp = gpus / (tp * pp);
        json model = {{"arch", r["arch"]}, {"n_layer", r["n_layer"]}, {"d_model", r["d_model"]}, {"n_head", r["n_head"]},
                      {"vocab_size", r["vocab_size"]}, {"max_seq_len", r["seq"]}};
        if (r["arch"] == "llama") model["n_kv_head"] = r["n_kv_head"], model["ffn_dim"] = r["ffn_dim"];
        const json j = {{"device", "cuda"},
                        {"precision", "fp8"},
                        {"model", model},
                        {"data", {{"train", "unused_*.bin"}}},
                        {"train", {{"seq_len", r["seq"]}, {"micro_batch", mbs}, {"grad_accum", gbs / (dp * mbs)}}},
                        {"parallel", {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"pp_virtual", vp},
                                      {"pp_schedule", vp > 1 ? "interleaved" : "1f1b"}, {"zero", 1},
                                      {"sequence_parallel", tp > 1}, {"bucket_mb", 160}}},
                        {"plan", {{"efficiency", 0.43}, {"tp_overlap", true}}}};
        const Config cfg = config_from_json(j, false);
        const ModelShape shape = model_shape(cfg.model);
        INFO(r["name"].get<std::string>() << " on " << gpus << " GPUs");
        REQUIRE(r["cp"] == 1);
        REQUIRE(dp * mbs * cfg.train.grad_accum == gbs);
        // the shape is the one measured: its FLOPs per token are the published TFLOP/s per token
        const double published_flops = r["tflops_gpu"].get<double>() * 1e12 / r["tokens_s_gpu"].get<double>();
        CHECK(flops_per_token(shape, cfg.train.seq_len) == Approx(published_flops).epsilon(0.03));
        const StepTime t = step_of(cfg);
        const double ours = t.tokens_per_s / gpus, published = r["tokens_s_gpu"];
        INFO("ours " << ours << " tokens/s per GPU, published " << published);
        CHECK(std::fabs(ours / published - 1) <= 0.15);
    }
}

TEST_CASE("--plan=search misses no layout that fits (all dp layouts of a tiny model, checked one by one)", "[plan]") {
    // 2 GPUs, 8 sequences per step; ZeRO-3's unit buffers make it larger than ZeRO-2 on 2 DP ranks,
    // so a budget between the two must keep ZeRO-2 layouts that a prune by "ZeRO-3 takes least" would drop
    const json base = {{"device", "cpu"}, {"precision", "fp32"}, {"parallel", {{"dp", 2}}},
                       {"train", {{"micro_batch", 4}}}, {"plan", {{"world", 2}}}};
    Config cfg = gpt_config(4, 32, 4, 512, 16, base);
    const ModelShape shape = model_shape(cfg.model);
    const ProcessGrid g = make_process_grid(cfg.parallel, 2, 0);
    const auto largest = [&](const Config& c) {
        size_t most = 0;
        for (const RankMemory& r : plan_memory(c, shape, g, DType::F32)) most = std::max(most, r.mem.total());
        return most;
    };
    Config z2 = cfg, z3 = cfg;
    z2.parallel.zero = 2, z3.parallel.zero = 3;
    z2.train.micro_batch = z3.train.micro_batch = 1, z2.train.grad_accum = z3.train.grad_accum = 4;
    z2.train.recompute = z3.train.recompute = "full";  // the least memory of each stage
    REQUIRE(largest(z3) > largest(z2));
    cfg.plan.gpu_mem_gib = double(largest(z2)) / double(1ull << 30);
    const auto found = search_layouts(cfg, shape, DType::F32, SIZE_MAX);
    std::vector<std::string> got;
    for (const LayoutChoice& c : found) got.push_back(c.overrides());
    int fitting = 0;
    for (int zero = 0; zero <= 3; zero++)
        for (const char* rc : {"none", "selective", "full"})
            for (int mb : {1, 2, 4}) {
                LayoutChoice c;
                c.cfg = cfg;
                c.cfg.parallel.zero = zero, c.cfg.train.recompute = rc;
                c.cfg.train.micro_batch = mb, c.cfg.train.grad_accum = 4 / mb;
                if (double(largest(c.cfg)) > plan_device(cfg).mem_bytes) continue;
                fitting++;
                INFO(c.overrides());
                CHECK(std::find(got.begin(), got.end(), c.overrides()) != got.end());
            }
    CHECK(fitting > 0);
}

TEST_CASE("a plan refuses what it cannot count, naming the sizes, and allocates nothing for them (issue 34)", "[plan]") {
    // issue 34's shape: 2^26 layers of d_model 2^26 (3.6e24 parameters)
    Config huge = gpt_config(1 << 26, 1 << 26, 1, 1 << 24, 1 << 26);
    std::string m = error_of([&] { check_plannable(huge, model_shape(huge.model)); });
    CHECK_THAT(m, Catch::Contains("model: 3.63e+24 parameters (model.n_layer = 67108864, model.d_model = 67108864)") &&
                      !Catch::Contains("this machine"));
    // small layers, but 2^20 of them on one rank: the rank's tensor table would be the model's size
    Config deep = gpt_config(1 << 20, 8, 1, 64, 8);
    m = error_of([&] { check_plannable(deep, model_shape(deep.model)); });
    CHECK_THAT(m, Catch::Contains("model.n_layer: 1048576 layers over parallel.pp = 1 stages put 1048576"));
    deep.parallel.pp = 64;  // 16384 a rank: planned
    CHECK_NOTHROW(check_plannable(deep, model_shape(deep.model)));
    // a schedule of 2^21 micro-batches x 2 stages to simulate
    Config accum = gpt_config(4, 64, 4, 64, 16, {{"parallel", {{"pp", 2}}}, {"train", {{"grad_accum", 1 << 21}}}});
    m = error_of([&] { check_plannable(accum, model_shape(accum.model)); });
    CHECK_THAT(m, Catch::Contains("train.grad_accum: 2097152 micro-batches x 2 pipeline stages"));
    Config acts = gpt_config(1024, 65536, 64, 64, 2048, {{"device", "cpu"}, {"train", {{"micro_batch", 1 << 19}}}});
    m = error_of([&] { check_plannable(acts, model_shape(acts.model)); });
    CHECK_THAT(m, Catch::Contains("train.micro_batch: 524288 sequences of train.seq_len = 2048 tokens"));
    // a 70B-class model is planned as before
    Config llama = gpt_config(80, 8192, 64, 32000, 4096, {{"parallel", {{"pp", 8}}}, {"train", {{"grad_accum", 64}}}});
    CHECK_NOTHROW(check_plannable(llama, model_shape(llama.model)));
}

TEST_CASE("--plan=search answers within seconds on issue 34's shapes and says what it skipped", "[plan]") {
    struct Case {
        int world, n_layer, d_model, n_head, seq, grad_accum;
    };
    for (const Case& k : {Case{1000000, 64, 8192, 64, 64, 1024}, Case{1024, 4096, 65536, 64, 65536, 1}}) {
        Config cfg = gpt_config(k.n_layer, k.d_model, k.n_head, 50257, k.seq,
                                {{"plan", {{"world", k.world}}}, {"train", {{"grad_accum", k.grad_accum}}}});
        const ModelShape shape = model_shape(cfg.model);
        check_plannable(cfg, shape);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string text = search_text(cfg, shape, DType::BF16);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        INFO(text);
        CHECK(secs < 10.0);
        CHECK_THAT(text, Catch::Contains("layouts examined") && Catch::Contains("skipped"));
    }
}

TEST_CASE("pp_layers auto: the heap's water-filling equals the plain one, layer for layer", "[plan]") {
    // the plain water-filling (each layer to the stage it leaves cheapest, the earliest on a tie), as
    // it was written before the heap, against balance_pp_layers on stages of unequal cost
    for (int pp : {2, 3, 4, 8}) {
        for (int v : {1, 2}) {
            Config cfg = gpt_config(61, 256, 4, 50257, 256, {{"parallel", {{"pp", pp}, {"pp_virtual", v}}}});
            if (v > 1) cfg.parallel.pp_schedule = "interleaved";
            const ModelShape shape = model_shape(cfg.model);
            const int stages = pp * v;
            const StageCost c = stage_cost(cfg, shape, plan_device(cfg), 1, 1, 1);
            std::vector<int> n(size_t(stages), 1);
            for (int left = shape.n_layer - stages; left > 0; left--) {
                int best = 0;
                for (int st = 1; st < stages; st++)
                    if (c.stage(st, stages, n[size_t(st)] + 1).total() < c.stage(best, stages, n[size_t(best)] + 1).total())
                        best = st;
                n[size_t(best)]++;
            }
            INFO("pp " << pp << " v " << v);
            CHECK(balance_pp_layers(cfg, shape) == n);
        }
    }
}
