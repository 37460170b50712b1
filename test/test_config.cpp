// Config: schema defaults, overrides, and one test per class of bad input.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "llmc/core/common.h"
#include "llmc/core/config.h"
#include "llmc/cuda/cuda_ops.h"
#include "test/temp_dir.h"
#include "test/user_error.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A fresh folder (test/temp_dir.h) holding two train shards, one val shard and a tokenizer
// folder. Config loading only globs the shards, so their content does not matter.
struct ConfigDir : TempDir {
    ConfigDir() : TempDir("test_config") {
        touch("train_000.bin");
        touch("train_001.bin");
        touch("val_000.bin");
        touch("init.bin");
        fs::create_directory(path + "/tok");
        touch("tok/encoder.json");
        touch("tok/vocab.bpe");
    }
    void touch(const std::string& name) const { std::ofstream(file(name)) << "x"; }
    std::string train_glob() const { return path + "/train_*.bin"; }
    std::string val_glob() const { return path + "/val_*.bin"; }
    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(file(name)) << text;
        return file(name);
    }
};

// Runs load_config on {"train_gpt", args...}.
Config load(const std::vector<std::string>& args, bool* print = nullptr) {
    std::vector<std::string> all = {"train_gpt"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : all) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    bool dummy = false;
    return load_config(static_cast<int>(all.size()), argv.data(), print ? print : &dummy);
}

json minimal(const ConfigDir& t) { return json{{"data", {{"train", t.train_glob()}}}}; }

}  // namespace

TEST_CASE("config: defaults equal the initialisers in config.h", "[config]") {
    ConfigDir t;
    Config c = config_from_json(minimal(t));
    Config d;
    CHECK(c.device == d.device);
    CHECK(c.precision == d.precision);
    CHECK(c.model.arch == "gpt2");
    CHECK(c.model.n_layer == d.model.n_layer);
    CHECK(c.model.n_head == d.model.n_head);
    CHECK(c.model.d_model == d.model.d_model);
    CHECK(c.model.vocab_size == d.model.vocab_size);
    CHECK(c.model.max_seq_len == d.model.max_seq_len);
    CHECK(c.model.init == "random");
    CHECK(c.train.micro_batch == d.train.micro_batch);
    CHECK(c.train.steps == d.train.steps);
    CHECK(c.train.lr == d.train.lr);
    CHECK(c.train.lr_schedule == d.train.lr_schedule);
    CHECK(c.train.beta2 == d.train.beta2);
    CHECK(c.train.grad_clip == d.train.grad_clip);
    CHECK(c.train.seed == d.train.seed);
    CHECK(c.train.max_bad_steps == 8);
    CHECK(c.eval.batches == d.eval.batches);
    CHECK(c.checkpoint.keep == d.checkpoint.keep);
    CHECK(c.checkpoint.resume == "auto");
    CHECK(c.tokenizer_dir.empty());
    CHECK(c.out_dir == d.out_dir);
    CHECK(c.data.train == t.train_glob());
    CHECK(c.data.val.empty());
    CHECK_FALSE(c.data.shuffle);

    // resolved holds every key, nested, with defaults filled
    const json& r = c.resolved;
    CHECK(r.at("device") == "auto");
    CHECK(r.at("model").at("n_layer") == d.model.n_layer);
    CHECK(r.at("train").at("lr") == d.train.lr);
    CHECK(r.at("train").at("lr_schedule") == "cosine");
    CHECK(r.at("data").at("shuffle") == false);
    CHECK(r.at("log").at("jsonl") == "");
    CHECK(r.at("checkpoint").at("every") == 0);
    CHECK(r.at("tokenizer") == "");
    CHECK(r.at("out_dir") == "out");
    for (const char* s : {"model", "data", "train", "eval", "log", "checkpoint"}) CHECK(r.at(s).is_object());
}

TEST_CASE("config: values from a file and overrides of each type", "[config]") {
    ConfigDir t;
    json file = minimal(t);
    file["train"]["steps"] = 20;
    file["model"]["n_layer"] = 2;
    std::string cfg = t.write("cfg.json", file.dump(2));
    bool print = false;
    Config c = load({cfg, "train.lr=1e-3",         // number
                     "train.steps=7",              // int (overrides the file)
                     "model.d_model=64", "model.n_head=4",
                     "train.warmup_steps=1e0",     // an integral number is an int
                     "data.shuffle=true",          // bool
                     "device=cpu",                 // enum, unquoted
                     "precision=\"bf16\"",         // enum, quoted JSON string
                     "out_dir=123",                // string key: the text as is
                     "data.val=" + t.val_glob(), "eval.every=5", "tokenizer=" + t.path + "/tok",
                     "model.init=" + t.path + "/init.bin", "--print-config"},
                    &print);
    CHECK(print);
    CHECK(c.train.lr == 1e-3);
    CHECK(c.train.steps == 7);
    CHECK(c.model.n_layer == 2);  // from the file
    CHECK(c.model.d_model == 64);
    CHECK(c.train.warmup_steps == 1);
    CHECK(c.data.shuffle);
    CHECK(c.device == "cpu");
    CHECK(c.precision == "bf16");
    CHECK(c.out_dir == "123");
    CHECK(c.data.val == t.val_glob());
    CHECK(c.eval.every == 5);
    CHECK(c.tokenizer_dir == t.path + "/tok");
    CHECK(c.model.init == t.path + "/init.bin");
    CHECK(c.resolved.at("out_dir") == "123");
    CHECK(c.resolved.at("train").at("steps") == 7);
}

TEST_CASE("config: overrides alone, nested objects created", "[config]") {
    ConfigDir t;
    // no config file: the first argument is an override; "train" and "data" objects are created
    bool print = true;
    Config c = load({"data.train=" + t.train_glob(), "train.lr=0.5", "checkpoint.keep=3"}, &print);
    CHECK_FALSE(print);
    CHECK(c.train.lr == 0.5);
    CHECK(c.checkpoint.keep == 3);
    CHECK(c.data.train == t.train_glob());
    // "-" as an explicit "no file"
    Config c2 = load({"-", "data.train=" + t.train_glob(), "--print-config"}, &print);
    CHECK(print);
    // a flag first, then overrides
    Config c3 = load({"--print-config", "data.train=" + t.train_glob()});
    CHECK(c3.data.train == t.train_glob());
    // a whole section as a JSON object merges key by key
    Config c4 = load({"data.train=" + t.train_glob(), "model={\"n_layer\": 3, \"d_model\": 96}", "model.n_head=3"});
    CHECK(c4.model.n_layer == 3);
    CHECK(c4.model.d_model == 96);
    CHECK(c4.model.n_head == 3);
    CHECK(c4.model.vocab_size == Config().model.vocab_size);
    // the last override of a key wins
    Config c5 = load({"data.train=" + t.train_glob(), "train.steps=3", "train.steps=4"});
    CHECK(c5.train.steps == 4);
}

TEST_CASE("config: resolved JSON round-trips through config_from_json", "[config]") {
    ConfigDir t;
    Config c = load({"data.train=" + t.train_glob(), "data.val=" + t.val_glob(), "eval.every=2", "train.lr=6e-4",
                     "train.lr_schedule=wsd", "train.beta1=0.8", "data.shuffle=true", "model.n_layer=3"});
    Config r = config_from_json(c.resolved);
    CHECK(r.resolved == c.resolved);
    CHECK(r.train.lr == 6e-4);
    CHECK(r.train.lr_schedule == "wsd");
    CHECK(r.model.n_layer == 3);
    // and through text, as a checkpoint stores it
    Config r2 = config_from_json(json::parse(c.resolved.dump()));
    CHECK(r2.resolved == c.resolved);
    CHECK(r2.train.beta1 == 0.8);
}

TEST_CASE("config: unknown keys suggest the nearest valid key", "[config]") {
    ConfigDir t;
    std::string m = error_of([&] { load({"data.train=" + t.train_glob(), "train.lrr=1e-3"}); });
    CHECK_THAT(m, Catch::Contains("train.lrr") && Catch::Contains("did you mean train.lr?"));

    m = error_of([&] { load({"data.train=" + t.train_glob(), "train.n_layer=4"}); });
    CHECK_THAT(m, Catch::Contains("train.n_layer") && Catch::Contains("did you mean model.n_layer?"));

    // in a file, including a misspelt section
    json j = minimal(t);
    j["trian"] = {{"lr", 1e-3}};
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("\"trian\"") && Catch::Contains("did you mean train?"));

    j = minimal(t);
    j["model"]["nlayer"] = 2;
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("model.nlayer") && Catch::Contains("did you mean model.n_layer?"));

    j = minimal(t);
    j["steps"] = 5;  // a leaf at the wrong level
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("did you mean train.steps?"));

    // nothing close: the valid keys of the section are listed
    m = error_of([&] { load({"data.train=" + t.train_glob(), "train.zzzzzzzzzz=1"}); });
    CHECK_THAT(m, Catch::Contains("train.zzzzzzzzzz") && Catch::Contains("valid keys in train:") &&
                      Catch::Contains("micro_batch"));
}

TEST_CASE("config: wrong types", "[config]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    std::string m = error_of([&] { load({g, "train.steps=ten"}); });
    CHECK_THAT(m, Catch::Contains("train.steps: expected an integer, got string \"ten\""));

    m = error_of([&] { load({g, "model.n_layer=3.5"}); });
    CHECK_THAT(m, Catch::Contains("model.n_layer") && Catch::Contains("expected an integer"));

    m = error_of([&] { load({g, "train.lr=fast"}); });
    CHECK_THAT(m, Catch::Contains("train.lr: expected a number"));

    m = error_of([&] { load({g, "data.shuffle=1"}); });
    CHECK_THAT(m, Catch::Contains("data.shuffle: expected a boolean"));

    json j = minimal(t);
    j["out_dir"] = 5;
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("out_dir: expected a string, got number 5"));

    j = minimal(t);
    j["train"]["lr"] = json::array({1, 2});
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("train.lr: expected a number"));

    j = minimal(t);
    j["train"] = 3;  // a section must be an object
    m = error_of([&] { config_from_json(j); });
    CHECK_THAT(m, Catch::Contains("train: expected an object"));

    m = error_of([&] { load({g, "model=4"}); });
    CHECK_THAT(m, Catch::Contains("model: is a section"));
}

TEST_CASE("config: a number beyond a double on the command line is out of range, not a string (issue 34)", "[config]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    std::string m = error_of([&] { load({g, "plan.gpu_mem_gib=1e309"}); });
    CHECK_THAT(m, Catch::Contains("plan.gpu_mem_gib: 1e309 is out of range") && !Catch::Contains("string"));
    m = error_of([&] { load({g, "train.lr=-2e400"}); });
    CHECK_THAT(m, Catch::Contains("train.lr: -2e400 is out of range"));
    m = error_of([&] { load({g, "train.steps=1e309"}); });
    CHECK_THAT(m, Catch::Contains("train.steps: 1e309 is out of range"));
    // words stay words
    m = error_of([&] { load({g, "train.lr=inf"}); });
    CHECK_THAT(m, Catch::Contains("train.lr: expected a number, got string \"inf\""));
}

TEST_CASE("config: model.moe keys without model.moe.num_experts are refused naming the key; with it 0, ignored (issue 34)",
          "[config]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    std::string m = error_of([&] { load({g, "model.moe.top_k=9"}); });
    CHECK_THAT(m, Catch::Contains("model.moe.top_k: set, but model.moe.num_experts is not") &&
                      Catch::Contains("or remove model.moe.top_k"));
    m = error_of([&] { load({g, "model.moe.every=2", "model.moe.capacity_factor=2"}); });
    CHECK_THAT(m, Catch::Contains("model.moe.every: set") && Catch::Contains("model.moe.every, model.moe.capacity_factor"));
    // MoE switched off on purpose (a dense run of an MoE config): the other keys are moot, accepted
    const Config c = load({g, "model.moe.top_k=9", "model.moe.num_experts=0"});
    CHECK(c.model.moe.num_experts == 0);
    CHECK_NOTHROW(load({g, "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.expert_ffn_dim=64"}));
    // a key at its default changes nothing: accepted (a dense model's --print-config reads back)
    CHECK_NOTHROW(load({g, "model.moe.top_k=" + std::to_string(Config().model.moe.top_k)}));
}

TEST_CASE("config: parallel.local_sgd's values and combinations are checked naming the key", "[config][local_sgd]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    const Config d = load({g});
    CHECK((d.parallel.local_sgd.every == 0 && d.parallel.local_sgd.outer_lr == 1.0 &&
           d.parallel.local_sgd.outer_momentum == 0.0));
    CHECK(d.resolved.at("parallel").at("local_sgd").at("every") == 0);
    const Config c = load({g, "parallel.local_sgd.every=4", "parallel.local_sgd.outer_lr=0.7",
                           "parallel.local_sgd.outer_momentum=0.9", "parallel.zero=1"});
    CHECK((c.parallel.local_sgd.every == 4 && c.parallel.local_sgd.outer_lr == 0.7 &&
           c.parallel.local_sgd.outer_momentum == 0.9));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=-1"}); }), Catch::Contains("parallel.local_sgd.every"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=2.5"}); }), Catch::Contains("parallel.local_sgd.every"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.local_sgd.outer_lr=0"}); }),
               Catch::Contains("parallel.local_sgd.outer_lr"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.local_sgd.outer_lr=-0.5"}); }),
               Catch::Contains("parallel.local_sgd.outer_lr"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.local_sgd.outer_momentum=1"}); }),
               Catch::Contains("parallel.local_sgd.outer_momentum"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.local_sgd.outer_momentum=-0.1"}); }),
               Catch::Contains("parallel.local_sgd.outer_momentum"));
    // the outer optimizer's keys without local SGD would be ignored
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.outer_lr=0.7"}); }),
               Catch::Contains("parallel.local_sgd.outer_lr: set, but parallel.local_sgd.every is not"));
    CHECK_NOTHROW(load({g, "parallel.local_sgd.outer_lr=0.7", "parallel.local_sgd.every=0"}));
    // ZeRO 2 and 3, context and expert parallelism: refused, saying what works
    for (int zero : {2, 3})
        CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.zero=" + std::to_string(zero)}); }),
                   Catch::Contains("parallel.zero: " + std::to_string(zero)) && Catch::Contains("stages 0 and 1"));
    CHECK_THAT(error_of([&] { load({g, "parallel.local_sgd.every=4", "parallel.cp=2"}); }),
               Catch::Contains("parallel.cp: 2") && Catch::Contains("parallel.cp=1"));
    CHECK_THAT(error_of([&] {
                   load({g, "parallel.local_sgd.every=4", "parallel.ep=2", "model.moe.num_experts=2", "parallel.dp=2"});
               }),
               Catch::Contains("parallel.ep: 2") && Catch::Contains("parallel.ep=1"));
}

TEST_CASE("config: parallel.grad_compression and powersgd_rank are checked naming the key", "[config][powersgd]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    const Config d = load({g});
    CHECK((d.parallel.grad_compression == "none" && d.parallel.powersgd_rank == 4));
    const Config c = load({g, "parallel.grad_compression=powersgd", "parallel.powersgd_rank=8"});
    CHECK((c.parallel.grad_compression == "powersgd" && c.parallel.powersgd_rank == 8));
    CHECK(c.resolved.at("parallel").at("powersgd_rank") == 8);
    CHECK_THAT(error_of([&] { load({g, "parallel.grad_compression=topk"}); }),
               Catch::Contains("parallel.grad_compression"));
    for (const char* bad : {"0", "-1", "2.5"})
        CHECK_THAT(error_of([&] { load({g, "parallel.grad_compression=powersgd", std::string("parallel.powersgd_rank=") + bad}); }),
                   Catch::Contains("parallel.powersgd_rank"));
    CHECK_THAT(error_of([&] { load({g, "parallel.powersgd_rank=8"}); }),
               Catch::Contains("parallel.powersgd_rank: set (8), but parallel.grad_compression is \"none\""));
    const std::string p = "parallel.grad_compression=powersgd";
    CHECK_THAT(error_of([&] { load({g, p, "parallel.zero=1"}); }),
               Catch::Contains("parallel.zero: 1") && Catch::Contains("parallel.zero=0"));
    CHECK_THAT(error_of([&] { load({g, p, "parallel.local_sgd.every=4"}); }),
               Catch::Contains("parallel.local_sgd.every: 4"));
    for (const char* axis : {"tp", "pp", "cp"})
        CHECK_THAT(error_of([&] { load({g, p, std::string("parallel.") + axis + "=2"}); }),
                   Catch::Contains(std::string("parallel.") + axis + ": 2") &&
                       Catch::Contains(std::string("parallel.") + axis + "=1"));
    CHECK_THAT(error_of([&] { load({g, p, "parallel.ep=2", "model.moe.num_experts=2", "parallel.dp=2"}); }),
               Catch::Contains("parallel.ep: 2"));
}

TEST_CASE("config: out-of-range values and enums", "[config]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    struct Case {
        std::string arg, key, range;
    };
    std::vector<Case> cases = {
        {"train.lr=0", "train.lr", "(0, 3.40282e+38]"},
        {"train.lr=-1e-3", "train.lr", "(0, 3.40282e+38]"},
        {"train.lr=1e300", "train.lr", "(0, 3.40282e+38]"},  // beyond fp32, where the optimizer computes
        {"train.steps=0", "train.steps", ">= 1"},
        {"train.micro_batch=0", "train.micro_batch", ">= 1"},
        {"train.warmup_steps=-1", "train.warmup_steps", ">= 0"},
        {"train.beta1=1", "train.beta1", "[0, 1)"},
        {"train.beta2=-0.1", "train.beta2", "[0, 1)"},
        {"train.eps=0", "train.eps", "> 0"},
        {"train.final_lr_frac=1.5", "train.final_lr_frac", "[0, 1]"},
        {"train.grad_clip=-1", "train.grad_clip", ">= 0"},
        {"train.max_bad_steps=0", "train.max_bad_steps", ">= 1"},
        {"model.n_head=0", "model.n_head", "[1, 67108864]"},
        {"model.vocab_size=16777217", "model.vocab_size", "[2, 16777216]"},
        {"model.vocab_size=1", "model.vocab_size", "[2, 16777216]"},
        {"model.max_seq_len=0", "model.max_seq_len", "[1, 67108864]"},
        {"eval.batches=1e9", "eval.batches", "[0, 1000000]"},  // a typo would stall every evaluation
        {"eval.sample_tokens=1e9", "eval.sample_tokens", "[0, 65536]"},
        {"eval.batches=-2", "eval.batches", "[0, 1000000]"},
        {"checkpoint.keep=0", "checkpoint.keep", ">= 1"},
        {"checkpoint.every=-1", "checkpoint.every", ">= 0"},
        {"train.steps=1e12", "train.steps", "32-bit"},
    };
    for (const Case& c : cases) {
        INFO(c.arg);
        std::string m = error_of([&] { load({g, c.arg}); });
        CHECK_THAT(m, Catch::Contains(c.key + ":") && Catch::Contains("out of range") && Catch::Contains(c.range));
    }
    // boundaries that are allowed
    CHECK(load({g, "model.vocab_size=65536"}).model.vocab_size == 65536);
    CHECK(load({g, "train.beta1=0"}).train.beta1 == 0.0);
    CHECK(load({g, "train.final_lr_frac=1"}).train.final_lr_frac == 1.0);
    CHECK(load({g, "train.grad_clip=0"}).train.grad_clip == 0.0);

    std::string m = error_of([&] { load({g, "device=tpu"}); });
    CHECK_THAT(m, Catch::Contains("device") && Catch::Contains("auto, cpu, cuda"));
    m = error_of([&] { load({g, "precision=fp64"}); });
    CHECK_THAT(m, Catch::Contains("precision") && Catch::Contains("fp32, bf16, fp16, fp8"));
    // fp16's loss scale: "dynamic" (stored as 0) or a positive number; its keys refused elsewhere
    CHECK(load({g, "precision=fp16"}).train.loss_scale == 0.0);
    CHECK(load({g, "precision=fp16"}).resolved["train"]["loss_scale"] == "dynamic");
    CHECK(load({g, "precision=fp16", "train.loss_scale=dynamic"}).train.loss_scale == 0.0);
    CHECK(load({g, "precision=fp16", "train.loss_scale=1024"}).train.loss_scale == 1024.0);
    CHECK(load({g, "precision=fp16", "train.loss_scale=1024"}).resolved["train"]["loss_scale"] == 1024.0);
    CHECK(load({g, "precision=fp16", "train.loss_scale_window=5"}).train.loss_scale_window == 5);
    m = error_of([&] { load({g, "precision=fp16", "train.loss_scale=0"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale"));
    m = error_of([&] { load({g, "precision=fp16", "train.loss_scale=-2"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale"));
    m = error_of([&] { load({g, "precision=fp16", "train.loss_scale=auto"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale: expected a number or \"dynamic\""));
    m = error_of([&] { load({g, "precision=fp16", "train.loss_scale_window=0"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale_window"));
    m = error_of([&] { load({g, "precision=fp16", "train.loss_scale=8", "train.loss_scale_window=5"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale_window: 5 applies to the dynamic loss scale only"));
    m = error_of([&] { load({g, "precision=bf16", "train.loss_scale=8"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale: 8 applies to precision \"fp16\" only"));
    m = error_of([&] { load({g, "train.loss_scale_window=5"}); });
    CHECK_THAT(m, Catch::Contains("train.loss_scale_window: 5 applies to precision \"fp16\" only"));
    m = error_of([&] { load({g, "fp8.recipe=dynamic"}); });
    CHECK_THAT(m, Catch::Contains("fp8.recipe") && Catch::Contains("delayed, current"));
    m = error_of([&] { load({g, "kernels.attention_backward=v7"}); });
    CHECK_THAT(m, Catch::Contains("kernels.attention_backward") &&
                      Catch::Contains("auto, dq_from_ds, fused, wgmma_dq, wgmma, wgmma_pipelined, wgmma_ss"));
    CHECK(load({g, "kernels.attention_backward=wgmma_pipelined"}).kernels.attention_backward == "wgmma_pipelined");
    m = error_of([&] { load({g, "kernels.attention_forward=128"}); });
    CHECK_THAT(m, Catch::Contains("kernels.attention_forward") &&
                      Catch::Contains("auto, keys128, wgmma, wgmma_pipelined"));
    CHECK(load({g, "kernels.attention_forward=wgmma"}).kernels.attention_forward == "wgmma");
    CHECK(load({g, "kernels.attention_forward=wgmma_pipelined"}).kernels.attention_forward == "wgmma_pipelined");
    m = error_of([&] { load({g, "kernels.layernorm_backward=registers"}); });
    CHECK_THAT(m, Catch::Contains("kernels.layernorm_backward") && Catch::Contains("auto, streamed"));
    CHECK(load({g, "kernels.layernorm_backward=streamed"}).kernels.layernorm_backward == "streamed");
    CHECK(load({g}).kernels.attention_backward == "auto");
    m = error_of([&] { load({g, "kernels.attention_wgmma_layout=k_major"}); });
    CHECK_THAT(m, Catch::Contains("kernels.attention_wgmma_layout") && Catch::Contains("auto, mn_major"));
    CHECK(load({g, "kernels.attention_forward=wgmma", "kernels.attention_wgmma_layout=mn_major"})
              .kernels.attention_wgmma_layout == "mn_major");
    CHECK(load({g, "kernels.attention_backward=wgmma_ss", "kernels.attention_wgmma_layout=mn_major"})
              .kernels.attention_wgmma_layout == "mn_major");
    m = error_of([&] { load({g, "kernels.attention_wgmma_layout=mn_major"}); });
    CHECK_THAT(m, Catch::Contains("kernels.attention_wgmma_layout: \"mn_major\" applies to the wgmma ways") &&
                      Catch::Contains("neither is one (\"auto\", \"auto\")"));
    CHECK(load({g, "kernels.attention_backward=wgmma_pipelined", "kernels.attention_wgmma_layout=mn_major"})
              .kernels.attention_wgmma_layout == "mn_major");
    m = error_of([&] { load({g, "parallel.pp_layers=[2,0]"}); });
    CHECK_THAT(m, Catch::Contains("parallel.pp_layers") && Catch::Contains(">= 1"));
    m = error_of([&] { load({g, "parallel.pp_layers=3"}); });
    CHECK_THAT(m, Catch::Contains("parallel.pp_layers: expected an array of integers"));
    CHECK(load({g, "parallel.pp_layers=[1,3]"}).parallel.pp_layers == std::vector<int>{1, 3});
    m = error_of([&] { load({g, "train.lr_schedule=step"}); });
    CHECK_THAT(m, Catch::Contains("train.lr_schedule") && Catch::Contains("constant, cosine, linear, wsd"));
    m = error_of([&] { load({g, "model.arch=mistral"}); });
    CHECK_THAT(m, Catch::Contains("model.arch") && Catch::Contains("gpt2, llama"));
    m = error_of([&] { load({g, "out_dir="}); });
    CHECK_THAT(m, Catch::Contains("out_dir: must not be empty"));
}

TEST_CASE("config: inconsistent values", "[config]") {
    ConfigDir t;
    std::string g = "data.train=" + t.train_glob();
    std::string m = error_of([&] { load({g, "model.d_model=100", "model.n_head=3"}); });
    CHECK_THAT(m, Catch::Contains("model.d_model") && Catch::Contains("model.n_head"));

    m = error_of([&] { load({g, "train.seq_len=2048"}); });
    CHECK_THAT(m, Catch::Contains("train.seq_len") && Catch::Contains("model.max_seq_len"));

    m = error_of([&] { load({g, "train.steps=5", "train.warmup_steps=6"}); });
    CHECK_THAT(m, Catch::Contains("train.warmup_steps") && Catch::Contains("train.steps"));

    m = error_of([&] { load({"train.steps=5"}); });  // data.train missing
    CHECK_THAT(m, Catch::Contains("data.train") && Catch::Contains("required"));
    m = error_of([&] { load({"data.train="}); });  // data.train empty
    CHECK_THAT(m, Catch::Contains("data.train") && Catch::Contains("required"));

    m = error_of([&] { load({"data.train=" + t.path + "/nothing_*.bin"}); });
    CHECK_THAT(m, Catch::Contains("data.train") && Catch::Contains("no file matches") &&
                      Catch::Contains("nothing_*.bin"));
    m = error_of([&] { load({g, "data.val=" + t.path + "/nothing_*.bin"}); });
    CHECK_THAT(m, Catch::Contains("data.val") && Catch::Contains("no file matches"));

    m = error_of([&] { load({g, "model.init=" + t.path + "/missing.bin"}); });
    CHECK_THAT(m, Catch::Contains("model.init") && Catch::Contains("random"));

    m = error_of([&] { load({g, "eval.every=10"}); });
    CHECK_THAT(m, Catch::Contains("eval.every") && Catch::Contains("data.val"));

    m = error_of([&] { load({g, "checkpoint.resume=" + t.path + "/no_such_ckpt"}); });
    CHECK_THAT(m, Catch::Contains("checkpoint.resume") && Catch::Contains("auto, never"));

    m = error_of([&] { load({g, "tokenizer=" + t.path}); });  // a folder without the files
    CHECK_THAT(m, Catch::Contains("tokenizer") && Catch::Contains("encoder.json"));

    // CUDA's grid limits are configuration errors, not launch failures: attention's sequences per
    // micro-batch (grid z) and the FP8 casts' tokens per micro-batch (32 a block on grid y)
    m = error_of([&] { load({g, "device=cuda", "train.micro_batch=65536", "train.seq_len=1"}); });
    CHECK_THAT(m, Catch::Contains("train.micro_batch: 65536") && Catch::Contains("65535"));
    CHECK(load({g, "device=cpu", "train.micro_batch=65536", "train.seq_len=1"}).train.micro_batch == 65536);
    CHECK(load({g, "device=cuda", "train.micro_batch=65535", "train.seq_len=1"}).train.micro_batch == 65535);
    m = error_of([&] { load({g, "device=cuda", "precision=fp8", "train.micro_batch=2048", "train.seq_len=1024"}); });
    CHECK_THAT(m, Catch::Contains("train.micro_batch * train.seq_len = 2097152") && Catch::Contains("2097120"));
    CHECK(load({g, "device=cuda", "precision=fp8", "train.micro_batch=2048", "train.seq_len=1024", "parallel.cp=2"})
              .train.micro_batch == 2048);
    CHECK(load({g, "device=cuda", "precision=bf16", "train.micro_batch=2048", "train.seq_len=1024"}).train.micro_batch ==
          2048);

    // resume values that are fine
    CHECK(load({g, "checkpoint.resume=never"}).checkpoint.resume == "never");
    CHECK(load({g, "checkpoint.resume=" + t.path + "/init.bin"}).checkpoint.resume == t.path + "/init.bin");
}

TEST_CASE("config: bad config files and arguments", "[config]") {
    ConfigDir t;
    std::string m = error_of([&] { load({t.path + "/missing.json"}); });
    CHECK_THAT(m, Catch::Contains("missing.json") && Catch::Contains("not found"));

    std::string bad = t.write("bad.json", "{\n  \"train\": {\"lr\": 1e-3,}\n}\n");
    m = error_of([&] { load({bad}); });
    CHECK_THAT(m, Catch::Contains("bad.json") && Catch::Contains("invalid JSON") && Catch::Contains("line 2"));

    std::string arr = t.write("arr.json", "[1, 2]");
    m = error_of([&] { load({arr}); });
    CHECK_THAT(m, Catch::Contains("arr.json") && Catch::Contains("top level must be a JSON object"));
    m = error_of([&] { config_from_json(json::array()); });
    CHECK_THAT(m, Catch::Contains("top level must be a JSON object"));

    // comments are allowed in config files
    std::string commented = t.write("c.json", "// a comment\n{\"data\": {\"train\": \"" + t.train_glob() + "\"}}\n");
    CHECK(load({commented}).data.train == t.train_glob());

    std::string g = "data.train=" + t.train_glob();
    m = error_of([&] { load({g, "stray"}); });
    CHECK_THAT(m, Catch::Contains("\"stray\""));
    m = error_of([&] { load({g, "--verbose"}); });
    CHECK_THAT(m, Catch::Contains("--verbose") && Catch::Contains("--print-config"));
    m = error_of([&] { load({g, "=3"}); });
    CHECK_THAT(m, Catch::Contains("=3"));
    m = error_of([&] { load({g, "train..lr=3"}); });
    CHECK_THAT(m, Catch::Contains("train..lr"));
}

TEST_CASE("config: usage lists every key with its default", "[config]") {
    std::string u = config_usage();
    CHECK_THAT(u, Catch::Contains("--print-config") && Catch::Contains("train.lr") &&
                      Catch::Contains("model.vocab_size") && Catch::Contains("checkpoint.resume") &&
                      Catch::Contains("auto|cpu|cuda"));
}

TEST_CASE("config: train.recompute, plan.world and the --plan flags", "[config]") {
    ConfigDir t;
    const std::string g = "data.train=" + t.train_glob();
    CHECK(load({g}).train.recompute == "none");
    CHECK(load({g, "train.recompute=full"}).train.recompute == "full");
    std::string m = error_of([&] { load({g, "train.recompute=some"}); });
    CHECK_THAT(m, Catch::Contains("train.recompute") && Catch::Contains("none, selective, full"));
    CHECK(load({g}).plan.world == 0);  // "auto"
    CHECK(load({g, "plan.world=auto"}).plan.world == 0);
    CHECK(load({g, "plan.world=1024"}).plan.world == 1024);
    m = error_of([&] { load({g, "plan.world=0"}); });
    CHECK_THAT(m, Catch::Contains("plan.world"));

    auto plan_of = [&](const std::vector<std::string>& args) {
        std::vector<std::string> all = {"train_gpt"};
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& s : all) argv.push_back(&s[0]);
        std::string plan = "unset";
        load_config(int(all.size()), argv.data(), nullptr, &plan);
        return plan;
    };
    CHECK(plan_of({g}).empty());
    CHECK(plan_of({g, "--plan"}) == "text");
    CHECK(plan_of({g, "--plan=json"}) == "json");
    CHECK(plan_of({g, "--plan=search"}) == "search");
    m = error_of([&] { plan_of({g, "--plan=yaml"}); });
    CHECK_THAT(m, Catch::Contains("--plan=yaml") && Catch::Contains("--plan=json") && Catch::Contains("--plan=search"));
}

TEST_CASE("config: a key twice in one object, or a NUL byte, is refused naming the file", "[config]") {
    ConfigDir t;
    const std::string dup = t.write("dup.json", "{ \"train\": { \"lr\": 0.1, \"steps\": 3, \"lr\": 0.2 } }");
    const std::string msg = error_of([&] { load({dup}); });
    CHECK_THAT(msg, Catch::Contains("dup.json") && Catch::Contains("\"train.lr\" appears twice"));
    // the same key in two objects is no duplicate
    const std::string two = t.write("two.json", "{ \"eval\": { \"every\": 0 }, \"checkpoint\": { \"every\": 0 } }");
    CHECK_NOTHROW(load({two, "data.train=" + t.train_glob()}));
    const std::string text = std::string("{ \"train\": { \"steps\": 3 } }") + '\0' + "junk";
    std::ofstream(t.path + "/nul.json", std::ios::binary) << text;
    CHECK_THAT(error_of([&] { load({t.path + "/nul.json"}); }),
               Catch::Contains("nul.json") && Catch::Contains("NUL byte at byte " + std::to_string(text.find('\0'))));
}

TEST_CASE("config: bytes that are not UTF-8 are refused naming the key (found by fuzz_config)", "[config]") {
    ConfigDir t;
    const std::string g = "data.train=" + t.train_glob();
    CHECK_THAT(error_of([&] { load({g, "out_dir=ab\xB1"}); }), Catch::Contains("out_dir: the value is not valid UTF-8 (byte 2)"));
    CHECK_THAT(error_of([&] { load({g, "train.steps=\xB1"}); }), Catch::Contains("train.steps"));
    CHECK_THAT(error_of([&] { load({g, "train={\"st\xB1\": 1}"}); }), Catch::Contains("train"));
}

TEST_CASE("config: a number beyond double, and model dimensions beyond 2^26, are refused (found by fuzzing)",
          "[config]") {
    ConfigDir t;
    const std::string g = "data.train=" + t.train_glob();
    const std::string big = t.write("big.json", "{ \"train\": { \"lr\": 1e400 } }");
    CHECK_THAT(error_of([&] { load({big, g}); }), Catch::Contains("big.json") && Catch::Contains("out of range"));
    for (const char* key : {"model.n_layer", "model.n_head", "model.d_model", "model.max_seq_len", "model.ffn_dim"})
        CHECK_THAT(error_of([&] { load({g, std::string(key) + "=1073741832"}); }),
                   Catch::Contains(key) && Catch::Contains("67108864"));
}

// The section "kernels" as the CUDA backend takes it (llmc/cuda/kernel_ways.cpp, plain C++ in
// every binary): each name to the way KernelWays documents, a wrong one refused naming its key.
TEST_CASE("config: the kernels section's names become the CUDA kernels' ways", "[config]") {
    const KernelWays d = cuda_kernel_ways("auto", "auto", "auto");
    CHECK((d.fwd_key_tile == 0 && d.fwd_wgmma == 0 && d.bwd_dq == 0 && d.ln_bwd_registers && !d.wgmma_mn &&
           !d.ce_row_in_smem));
    CHECK(cuda_kernel_ways("keys128", "auto", "auto").fwd_key_tile == 128);
    CHECK(cuda_kernel_ways("wgmma", "auto", "auto").fwd_wgmma == 1);
    CHECK(cuda_kernel_ways("wgmma_pipelined", "auto", "auto").fwd_wgmma == 2);
    int dq = 0;
    for (const char* b : {"dq_from_ds", "fused", "wgmma_dq", "wgmma", "wgmma_pipelined", "wgmma_ss"})
        CHECK(cuda_kernel_ways("auto", b, "auto").bwd_dq == ++dq);
    CHECK(!cuda_kernel_ways("auto", "auto", "streamed").ln_bwd_registers);
    CHECK(cuda_kernel_ways("wgmma", "wgmma", "auto", "mn_major").wgmma_mn);
    CHECK_THAT(error_of([&] { cuda_kernel_ways("auto", "v7", "auto"); }),
               Catch::Contains("kernels.attention_backward") && Catch::Contains("\"v7\""));
    CHECK_THAT(error_of([&] { cuda_kernel_ways("auto", "auto", "registers"); }),
               Catch::Contains("kernels.layernorm_backward") && Catch::Contains("auto, streamed"));
}
