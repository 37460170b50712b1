#include "llmc/io/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "llmc/io/model_file.h"
#include "llmc/io/piece_file.h"
#include "llmc/precision/bf16.h"

#define XXH_INLINE_ALL  // xxhash (Debian's libxxhash-dev) as a header: nothing to link
#include <xxhash.h>

namespace {

constexpr int32_t STATE_MAGIC = 20241121;
// version 2: a local SGD section follows (LocalSgdState); written only then, so that the
// checkpoints of other runs stay readable by version-1 readers
// version 3: a PowerSGD section follows (PowerSgdState), likewise (the two never come together)
constexpr int32_t STATE_VERSION = 1, STATE_VERSION_LOCAL_SGD = 2, STATE_VERSION_POWERSGD = 3;

// The checksum of state.bin (everything after its header) and of model.bin (the metadata's
// "model_checksum"), of the kind in state.bin's header[3]: XXH3-64, written since 2026-11-28; FNV-1a 64
// (0), which the checkpoints before carry, a byte at a time: here (CPU) saving a 326M-parameter model
// hashed its 3.9 GB in 6.8 s, 0.65 s with XXH3 (a 1.5B model's 25 GB: some 40 s a save and a load).
class Checksum {
public:
    explicit Checksum(int32_t kind) : kind_(kind) {
        if (kind_ == CHECKSUM_XXH3) XXH3_64bits_reset(&xxh_);
    }
    void update(const void* p, size_t n) {
        if (kind_ == CHECKSUM_XXH3) XXH3_64bits_update(&xxh_, p, n);
        else fnv_ = fnv1a(p, n, fnv_);
    }
    uint64_t digest() const { return kind_ == CHECKSUM_XXH3 ? XXH3_64bits_digest(&xxh_) : fnv_; }

private:
    int32_t kind_;
    uint64_t fnv_ = FNV1A_INIT;
    XXH3_state_t xxh_;
};

bool exists(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

void remove_tree(const std::string& path) {
    DIR* d = ::opendir(path.c_str());
    if (d) {
        while (dirent* e = ::readdir(d)) {
            std::string n = e->d_name;
            if (n == "." || n == "..") continue;
            std::string p = path + "/" + n;
            struct stat st;
            if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
            else ::unlink(p.c_str());
        }
        ::closedir(d);
    }
    ::rmdir(path.c_str());
}

// step_NNNNNNNN folders (complete or not), sorted by step
std::vector<std::pair<int, std::string>> list_steps(const std::string& dir, bool complete_only) {
    std::vector<std::pair<int, std::string>> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        int step;
        char tail;
        if (std::sscanf(n.c_str(), "step_%d%c", &step, &tail) != 1) continue;
        std::string p = dir + "/" + n;
        if (complete_only && !exists(p + "/DONE")) continue;
        out.emplace_back(step, p);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

uint64_t checkpoint_checksum(int32_t kind, const void* data, size_t n) {
    LLMC_ASSERT(kind == CHECKSUM_FNV1A || kind == CHECKSUM_XXH3, "checkpoint_checksum: unknown kind");
    Checksum h(kind);
    h.update(data, n);
    return h.digest();
}

// LLMC_FAULT=<point> (or <point>_<step>) kills the process (SIGKILL): a crash at that point.
// LLMC_FAULT=hang:<point> (or hang:<point>_<step>) makes it stall instead, sleeping forever in
// place, as a rank stuck in a kernel or a deadlock would: nothing ends it but the other ranks'
// communicator watchdogs (parallel.timeout_s) or a signal from the launcher.
// LLMC_FAULT=usr1:<point>, term:<point> or int:<point> sends the process that signal and carries
// on, as a launcher's SIGUSR1, SIGTERM or a Ctrl-C arriving there would (llmc/run/preempt.h).
// LLMC_FAULT=nan:<point> returns true there: the caller puts a NaN in (train_gpt: a gradient).
// LLMC_FAULT=slow:<point> sleeps 5 s there and goes on (a slow disk).
bool fault_point(const char* name, int step) {
    const char* f = std::getenv("LLMC_FAULT");
    if (!f) return false;
    struct Mode {
        const char* prefix;
        int signal;  // 0: hang, -1: return true, -2: sleep 5 s
        const char* what;
    };
    static const Mode modes[] = {{"hang:", 0, "this process hangs here (sleeps forever)"},
                                 {"nan:", -1, "injecting a NaN here"},
                                 {"slow:", -2, "sleeping 5 s"},
                                 {"usr1:", SIGUSR1, "sending this process SIGUSR1"},
                                 {"term:", SIGTERM, "sending this process SIGTERM"},
                                 {"int:", SIGINT, "sending this process SIGINT"},
                                 {"", SIGKILL, "killing this process (SIGKILL)"}};
    const Mode* mode = modes;
    while (std::strncmp(f, mode->prefix, std::strlen(mode->prefix)) != 0) mode++;  // "" matches last
    const char* point = f + std::strlen(mode->prefix);
    if (std::strcmp(point, name) != 0 && strfmt("%s_%d", name, step) != point) return false;
    const char* only = std::getenv("LLMC_FAULT_RANK");
    if (only && std::atoi(only) != std::max(0, log_rank())) return false;
    std::fprintf(stderr, "%sLLMC_FAULT=%s: %s\n", rank_prefix().c_str(), f, mode->what);
    std::fflush(stdout);
    std::fflush(stderr);
    if (mode->signal == -1) return true;
    if (mode->signal == -2) {
        ::sleep(5);
        return false;
    }
    if (mode->signal == 0)
        for (;;) ::pause();  // returns only after a signal handler ran; sleep on
    ::kill(::getpid(), mode->signal);
    return false;
}

void check_resume_within(const TrainState& st, int steps, const std::string& from) {
    if (st.step > steps)
        throw UserError(strfmt("checkpoint.resume: %s was saved at step %d, past train.steps = %d; raise train.steps "
                               "to at least %d, or resume an earlier checkpoint",
                               from.c_str(), st.step, steps, st.step));
}

namespace {

// One array of a checkpoint: named for NonFiniteState's message; fp8's bytes have no reader.
struct SavedArray {
    std::string what;
    ReadFileOrder read;
    size_t n;
    const std::vector<uint8_t>* bytes;
};

// What a checkpoint writes, in the order it writes it: the weights (model.bin), then state.bin's
// m, v (master), fp8's bytes; local SGD's anchor and momentum, each further replica's params, m, v
// (and master); PowerSGD's error feedback of each DP rank, then Q.
std::vector<SavedArray> saved_arrays(const StateView& s, size_t num_params) {
    std::vector<SavedArray> out = {{"weights", s.main.params, num_params, nullptr},
                                   {"Adam m", s.main.m, num_params, nullptr},
                                   {"Adam v", s.main.v, num_params, nullptr}};
    if (s.main.master) out.push_back({"master weights", s.main.master, num_params, nullptr});
    if (!s.fp8.empty()) out.push_back({"fp8", nullptr, 0, &s.fp8});
    if (s.local_dp > 0) {
        out.push_back({"local SGD anchor weights", s.anchor, num_params, nullptr});
        out.push_back({"local SGD outer momentum", s.momentum, num_params, nullptr});
    }
    for (size_t k = 0; k < s.replicas.size(); k++) {
        const ArraysView& r = s.replicas[k];
        const std::string of = strfmt(" of DP rank %zu", k + 1);
        for (const auto& p : {std::make_pair("weights", &r.params), std::make_pair("Adam m", &r.m),
                              std::make_pair("Adam v", &r.v), std::make_pair("master weights", &r.master)})
            if (*p.second) out.push_back({p.first + of, *p.second, num_params, nullptr});
    }
    for (size_t k = 0; k < s.psgd_errors.size(); k++)
        out.push_back({strfmt("PowerSGD error feedback of DP rank %zu", k), s.psgd_errors[k], num_params, nullptr});
    if (!s.psgd_errors.empty()) {
        const std::vector<float>* q = &s.psgd_q;
        out.push_back({"PowerSGD factors Q",
                       [q](size_t first, size_t n, float* o) { std::memcpy(o, q->data() + first, n * sizeof(float)); },
                       q->size(), nullptr});
    }
    return out;
}

// a.read with every chunk checked finite: at the first that is not, NonFiniteState naming the
// array, how many of its elements are not finite and the first of them (the array read again)
ReadFileOrder checked(const SavedArray& a, int step) {
    return [a, step](size_t first, size_t n, float* out) {
        a.read(first, n, out);
        NonFiniteCount here;
        here.add(out, n);
        if (here.bad == 0) return;
        NonFiniteCount all;
        for_each_chunk(a.read, a.n, [&](size_t f, const float* x, size_t k) { all.add(x, k, f); });
        throw NonFiniteState(strfmt("step %d: %zu of %zu %s are not finite (the first at index %zu, %g); not "
                                    "saving: the checkpoints already written are kept (lower train.lr or check the "
                                    "data, then resume from the last one)",
                                    step, all.bad, a.n, a.what.c_str(), all.first, double(all.value)));
    };
}

}  // namespace

void check_finite_state(const StateView& state, int step) {
    for (const SavedArray& a : saved_arrays(state, state.num_params))
        if (a.read) for_each_chunk(checked(a, step), a.n, [](size_t, const float*, size_t) {});
}

void check_finite_state(const WholeState& whole, int step) { check_finite_state(view_of(whole, TrainState()), step); }

nlohmann::json shard_list(const std::vector<std::string>& files) {
    nlohmann::json out = nlohmann::json::array();
    for (const std::string& f : files) {
        struct stat st;
        const uint64_t bytes = ::stat(f.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
        out.push_back(nlohmann::json::array({f.substr(f.find_last_of('/') + 1), bytes}));  // not {name: bytes}
    }
    return out;
}

std::string checkpoint_latest(const std::string& dir) {
    auto steps = list_steps(dir, true);
    return steps.empty() ? std::string() : steps.back().second;
}

std::string checkpoint_save(const std::string& dir, const TrainState& st, const ModelShape& shape, int model_version,
                            const WholeState& whole, const nlohmann::json& config, int keep) {
    const size_t num_params = ::num_params(shape);
    bool ok = whole.params.size() == num_params && whole.m.size() == num_params && whole.v.size() == num_params &&
              (whole.master.empty() || whole.master.size() == num_params);
    const LocalSgdState& local = whole.local_sgd;
    ok = ok && (local.empty() || (local.anchor.size() == num_params && local.momentum.size() == num_params));
    for (const ReplicaState& r : local.replicas)
        ok = ok && r.params.size() == num_params && r.m.size() == num_params && r.v.size() == num_params &&
             r.master.size() == whole.master.size();
    for (const std::vector<float>& e : whole.powersgd.errors) ok = ok && e.size() == num_params;
    LLMC_ASSERT(ok, "checkpoint_save: the whole state has the wrong size");
    return checkpoint_save(dir, view_of(whole, st), shape, model_version, config, keep);
}

std::string checkpoint_save(const std::string& dir, const StateView& state, const ModelShape& shape, int model_version,
                            const nlohmann::json& config, int keep) {
    const TrainState& st = state.st;
    const size_t num_params = ::num_params(shape);
    LLMC_ASSERT(state.num_params == num_params && state.main.params && state.main.m && state.main.v,
                "checkpoint_save: the state is of another model");
    LLMC_ASSERT(state.local_dp == 0 || int(state.replicas.size()) + 1 == state.local_dp,
                "checkpoint_save: the local SGD state has the wrong number of replicas");
    for (const ArraysView& r : state.replicas)
        LLMC_ASSERT(bool(r.master) == bool(state.main.master), "checkpoint_save: a replica's master weights differ");
    LLMC_ASSERT(state.local_dp == 0 || state.psgd_errors.empty(), "checkpoint_save: PowerSGD comes with local SGD");
    make_dirs(dir, "checkpoint.dir");
    const std::string final_dir = dir + "/" + strfmt("step_%08d", st.step);
    const std::string tmp_dir = final_dir + ".tmp";
    remove_tree(tmp_dir);
    if (::mkdir(tmp_dir.c_str(), 0755) != 0)
        throw UserError(strfmt("checkpoint.dir: cannot save checkpoint %s (cannot create %s: %s); earlier "
                               "checkpoints are kept",
                               final_dir.c_str(), tmp_dir.c_str(), std::strerror(errno)));
    try {
        const std::vector<SavedArray> arrays = saved_arrays(state, num_params);
        Checksum model_sum(CHECKSUM_XXH3);  // of the bytes written: the file is not read back
        model_file_write(tmp_dir + "/model.bin", shape, checked(arrays[0], st.step), model_version,
                         [&](const void* p, size_t n) { model_sum.update(p, n); });
        fault_point("checkpoint_after_model", st.step);
        nlohmann::json meta = {
            {"step", st.step},
            {"loader", {{"epoch", st.loader.epoch}, {"shard", st.loader.shard}, {"window", st.loader.window},
                        {"seed", st.loader.seed}}},
            {"loader_dp", st.loader_dp},
            {"skipped_steps", st.skipped},
            {"train_shards", st.train_shards},
            {"num_params", num_params},
            {"has_master", bool(state.main.master)},
            {"fp8_bytes", state.fp8.size()},  // absent in checkpoints from before fp8: read as 0
            {"model_version", model_version},
            {"model_checksum", model_sum.digest()},
            {"config", config}};
        if (state.local_dp > 0) meta["local_sgd"] = {{"replicas", state.local_dp}};
        if (st.loss_scale > 0.0) meta["loss_scale"] = {{"scale", st.loss_scale}, {"clean_steps", st.loss_scale_clean}};
        if (!state.psgd_errors.empty())
            meta["powersgd"] = {{"rank", state.psgd_rank}, {"replicas", state.psgd_errors.size()},
                                {"q_floats", state.psgd_q.size()}};
        const std::string meta_s = meta.dump();
        // the header, its checksum written last: of the metadata and every array after it (all but
        // the weights), in this order
        const int32_t version = state.local_dp > 0            ? STATE_VERSION_LOCAL_SGD
                                : !state.psgd_errors.empty() ? STATE_VERSION_POWERSGD
                                                              : STATE_VERSION;
        int32_t header[8] = {STATE_MAGIC, version, int32_t(meta_s.size()), CHECKSUM_XXH3, 0, 0, 0, 0};
        AtomicFile f(tmp_dir + "/state.bin");
        f.write(header, sizeof(header));
        Checksum sum(CHECKSUM_XXH3);
        auto put = [&](const void* p, size_t n) {
            sum.update(p, n);
            f.write(p, n);
        };
        put(meta_s.data(), meta_s.size());
        for (size_t k = 1; k < arrays.size(); k++) {
            if (arrays[k].bytes) put(arrays[k].bytes->data(), arrays[k].bytes->size());
            else for_each_chunk(checked(arrays[k], st.step), arrays[k].n,
                                [&](size_t, const float* x, size_t n) { put(x, n * sizeof(float)); });
        }
        const uint64_t h = sum.digest();
        std::memcpy(&header[4], &h, sizeof(h));
        f.write_at(0, header, sizeof(header));
        f.commit();
        fault_point("checkpoint_after_state", st.step);
    } catch (const UserError& e) {  // a full disk, say: named by the checkpoint the user will look for
        remove_tree(tmp_dir);
        throw UserError(strfmt("checkpoint.dir: cannot save checkpoint %s; earlier checkpoints are kept: %s",
                               final_dir.c_str(), e.what()));
    } catch (...) {  // NonFiniteState: nothing of this checkpoint is left
        remove_tree(tmp_dir);
        throw;
    }
    remove_tree(final_dir);  // an incomplete folder of the same step from an earlier crash
    if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
        int err = errno;
        remove_tree(tmp_dir);
        throw UserError(strfmt("checkpoint: cannot rename %s: %s", tmp_dir.c_str(), std::strerror(err)));
    }
    fault_point("checkpoint_after_rename", st.step);
    write_file_atomic(final_dir + "/DONE", {{"ok\n", 3}});
    fault_point("checkpoint_after_done", st.step);
    // retention: newest `keep` complete checkpoints stay; stale temporaries and older ones go
    auto complete = list_steps(dir, true);
    for (size_t i = 0; i + size_t(keep) < complete.size(); i++) remove_tree(complete[i].second);
    DIR* d = ::opendir(dir.c_str());
    if (d) {
        std::vector<std::string> stale;
        while (dirent* e = ::readdir(d)) {
            std::string n = e->d_name;
            if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0 && n.rfind("step_", 0) == 0)
                stale.push_back(dir + "/" + n);
        }
        ::closedir(d);
        for (auto& s : stale) remove_tree(s);
    }
    return final_dir;
}

namespace {

// A field of a checkpoint's metadata, checked for its type and range: UserError naming the file
// and the field otherwise (never nlohmann's exceptions, never a silently wrapped value).
int64_t meta_int(const nlohmann::json& obj, const char* key, const std::string& file, const std::string& prefix,
                 int64_t lo, int64_t hi) {
    const auto it = obj.find(key);
    if (it == obj.end())
        throw UserError(strfmt("checkpoint %s: metadata lacks \"%s%s\"", file.c_str(), prefix.c_str(), key));
    if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) ||
        it->get<int64_t>() < lo || it->get<int64_t>() > hi)
        throw UserError(strfmt("checkpoint %s: metadata \"%s%s\" is %s, not an integer in [%lld, %lld]", file.c_str(),
                               prefix.c_str(), key, it->dump().c_str(), (long long)lo, (long long)hi));
    return it->get<int64_t>();
}
uint64_t meta_u64(const nlohmann::json& obj, const char* key, const std::string& file, const std::string& prefix) {
    const auto it = obj.find(key);
    if (it == obj.end())
        throw UserError(strfmt("checkpoint %s: metadata lacks \"%s%s\"", file.c_str(), prefix.c_str(), key));
    if (!it->is_number_unsigned())
        throw UserError(strfmt("checkpoint %s: metadata \"%s%s\" is %s, not a non-negative integer", file.c_str(),
                               prefix.c_str(), key, it->dump().c_str()));
    return it->get<uint64_t>();
}

// What state.bin's metadata says, each field checked: UserError naming the file and the field.
struct StateMeta {
    TrainState st;
    bool has_master = false;
    size_t fp8_bytes = 0;
    int replicas = 0;  // local SGD (version 2): the replicas saved, DP rank 0's included
    int psgd_rank = 0;  // PowerSGD (version 3): its rank, the DP ranks' error feedback, Q's floats
    size_t psgd_ranks = 0, q_floats = 0;
};

nlohmann::json parse_meta(const std::string& meta_s, const char* sp) {
    nlohmann::json meta;
    try {
        meta = nlohmann::json::parse(meta_s);
    } catch (const std::exception& e) {
        throw UserError(strfmt("checkpoint %s: corrupt metadata", sp));
    }
    if (!meta.is_object()) throw UserError(strfmt("checkpoint %s: metadata is not a JSON object", sp));
    return meta;
}

StateMeta state_meta(const nlohmann::json& meta, int32_t version, size_t num_params, const std::string& state_path) {
    const char* sp = state_path.c_str();
    StateMeta out;
    TrainState& st = out.st;
    st.step = int(meta_int(meta, "step", state_path, "", 0, INT_MAX));
    st.loader_dp = int(meta_int(meta, "loader_dp", state_path, "", 1, INT_MAX));
    // absent in checkpoints from before they were recorded: 0 skipped, shards and config unknown
    st.skipped = meta.contains("skipped_steps") ? int(meta_int(meta, "skipped_steps", state_path, "", 0, INT_MAX)) : 0;
    if (meta.contains("loss_scale")) {  // an fp16 run's
        const nlohmann::json& ls = meta["loss_scale"];
        if (!ls.is_object() || !ls.contains("scale") || !ls["scale"].is_number() || !(ls["scale"].get<double>() > 0.0) ||
            !std::isfinite(ls["scale"].get<double>()))
            throw UserError(strfmt("checkpoint %s: metadata \"loss_scale\" is not {\"scale\": a positive number, ...}", sp));
        st.loss_scale = ls["scale"].get<double>();
        st.loss_scale_clean = int(meta_int(ls, "clean_steps", state_path, "loss_scale.", 0, INT_MAX));
    }
    if (meta.contains("train_shards")) {
        const nlohmann::json& sh = meta["train_shards"];
        bool ok = sh.is_null() || sh.is_array();
        if (sh.is_array())
            for (const auto& e : sh)
                ok = ok && e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number_unsigned();
        if (!ok) throw UserError(strfmt("checkpoint %s: metadata \"train_shards\" is not a list of [name, bytes]", sp));
        st.train_shards = sh;
    }
    if (meta.contains("config")) {
        if (!meta["config"].is_object())
            throw UserError(strfmt("checkpoint %s: metadata \"config\" is not a JSON object", sp));
        st.config = meta["config"];
    }
    const auto L = meta.find("loader");
    if (L == meta.end() || !L->is_object())
        throw UserError(strfmt("checkpoint %s: metadata \"loader\" is missing or not an object", sp));
    st.loader.epoch = meta_u64(*L, "epoch", state_path, "loader.");
    st.loader.shard = meta_u64(*L, "shard", state_path, "loader.");
    st.loader.window = meta_u64(*L, "window", state_path, "loader.");
    st.loader.seed = meta_u64(*L, "seed", state_path, "loader.");
    const uint64_t saved_params = meta_u64(meta, "num_params", state_path, "");
    if (saved_params != num_params)
        throw UserError(strfmt("checkpoint %s: holds %llu parameters, the configured model has %zu", sp,
                               (unsigned long long)saved_params, num_params));
    const auto master_it = meta.find("has_master");
    if (master_it == meta.end() || !master_it->is_boolean())
        throw UserError(strfmt("checkpoint %s: metadata \"has_master\" is missing or not true/false", sp));
    out.has_master = master_it->get<bool>();
    // absent in checkpoints from before fp8: 0
    out.fp8_bytes = meta.contains("fp8_bytes") ? meta_u64(meta, "fp8_bytes", state_path, "") : 0;
    if (out.fp8_bytes > (size_t(64) << 20))
        throw UserError(strfmt("checkpoint %s: corrupt metadata (fp8_bytes %zu)", sp, out.fp8_bytes));
    const bool has_local = meta.contains("local_sgd");
    if (has_local != (version == STATE_VERSION_LOCAL_SGD))
        throw UserError(strfmt("checkpoint %s: corrupt metadata (a version %d file %s \"local_sgd\")", sp, version,
                               has_local ? "with" : "without"));
    if (has_local && !meta["local_sgd"].is_object())
        throw UserError(strfmt("checkpoint %s: metadata \"local_sgd\" is not an object", sp));
    if (has_local) out.replicas = int(meta_int(meta["local_sgd"], "replicas", state_path, "local_sgd.", 1, 1 << 20));
    const bool has_psgd = meta.contains("powersgd");
    if (has_psgd != (version == STATE_VERSION_POWERSGD))
        throw UserError(strfmt("checkpoint %s: corrupt metadata (a version %d file %s \"powersgd\")", sp, version,
                               has_psgd ? "with" : "without"));
    if (has_psgd) {
        const nlohmann::json& p = meta["powersgd"];
        if (!p.is_object()) throw UserError(strfmt("checkpoint %s: metadata \"powersgd\" is not an object", sp));
        out.psgd_rank = int(meta_int(p, "rank", state_path, "powersgd.", 1, INT_MAX));
        out.psgd_ranks = size_t(meta_int(p, "replicas", state_path, "powersgd.", 1, 1 << 20));
        out.q_floats = meta_u64(p, "q_floats", state_path, "powersgd.");
    }
    return out;
}

// The checkpoint folder's state.bin, opened after its DONE marker is found, and its header read
// into header[8] and checked: UserError naming the folder or the file otherwise.
std::ifstream open_state(const std::string& path, int32_t* header) {
    if (!exists(path + "/DONE"))
        throw UserError(strfmt("checkpoint %s: incomplete (no DONE marker) or not a checkpoint folder", path.c_str()));
    const std::string state_path = path + "/state.bin";
    const char* sp = state_path.c_str();
    std::ifstream in(state_path, std::ios::binary);
    if (!in) throw UserError(strfmt("checkpoint %s: cannot open", sp));
    if (!in.read(reinterpret_cast<char*>(header), 8 * sizeof(int32_t)) || header[0] != STATE_MAGIC)
        throw UserError(strfmt("checkpoint %s: not a train_gpt state file (bad magic)", sp));
    if (header[1] != STATE_VERSION && header[1] != STATE_VERSION_LOCAL_SGD && header[1] != STATE_VERSION_POWERSGD)
        throw UserError(strfmt("checkpoint %s: unsupported version %d", sp, header[1]));
    if (header[2] <= 0 || header[2] > (64 << 20)) throw UserError(strfmt("checkpoint %s: corrupt header", sp));
    const int32_t kind = header[3];
    if (kind != CHECKSUM_FNV1A && kind != CHECKSUM_XXH3)
        throw UserError(strfmt("checkpoint %s: corrupt header (checksum kind %d; a newer train_gpt's file?)", sp, kind));
    return in;
}

// The rest of state.bin (from in's position, after the metadata) holds exactly the arrays the
// metadata announces: checked before any allocation (a corrupt replica count would otherwise ask
// for that many copies of the model). Leaves in where it was.
void check_state_size(std::ifstream& in, const StateMeta& sm, size_t num_params, const char* sp) {
    const double per_copy = double(num_params) * sizeof(float), tensors = sm.has_master ? 4 : 3;
    const double want = per_copy * (tensors - 1) + double(sm.fp8_bytes) +
                        (sm.replicas > 0 ? per_copy * (2 + tensors * (sm.replicas - 1)) : 0.0) +
                        per_copy * double(sm.psgd_ranks) + double(sm.q_floats) * sizeof(float);
    const std::streamoff at = in.tellg();
    in.seekg(0, std::ios::end);
    const std::streamoff file_end = in.tellg();
    in.seekg(at);
    if (at < 0 || double(file_end - at) != want)
        throw UserError(strfmt("checkpoint %s: truncated or wrong size for %zu parameters%s", sp, num_params,
                               sm.replicas > 0 ? strfmt(" and %d local SGD replicas", sm.replicas).c_str() : ""));
}

}  // namespace

StateView view_of(const WholeState& whole, const TrainState& st) {
    auto of = [](const std::vector<float>& x) -> ReadFileOrder {
        if (x.empty()) return nullptr;
        return [p = x.data(), size = x.size()](size_t first, size_t n, float* out) {
            LLMC_ASSERT(first <= size && n <= size - first, "a read past the end of a checkpoint's array");
            std::memcpy(out, p + first, n * sizeof(float));
        };
    };
    StateView v;
    v.st = st;
    v.num_params = whole.params.size();
    v.main = {of(whole.params), of(whole.m), of(whole.v), of(whole.master)};
    const LocalSgdState& local = whole.local_sgd;
    v.local_dp = local.dp();
    v.anchor = of(local.anchor);
    v.momentum = of(local.momentum);
    for (const ReplicaState& r : local.replicas) v.replicas.push_back({of(r.params), of(r.m), of(r.v), of(r.master)});
    v.psgd_rank = whole.powersgd.rank;
    for (const std::vector<float>& e : whole.powersgd.errors) v.psgd_errors.push_back(of(e));
    v.psgd_q = whole.powersgd.q;
    v.fp8 = whole.fp8;
    return v;
}

StateView checkpoint_open(const std::string& path, const ModelShape& shape) {
    const std::string state_path = path + "/state.bin", model_path = path + "/model.bin";
    const char* sp = state_path.c_str();
    int32_t header[8];
    std::ifstream in = open_state(path, header);
    std::string meta_s(size_t(header[2]), '\0');
    if (!in.read(&meta_s[0], std::streamsize(meta_s.size()))) throw UserError(strfmt("checkpoint %s: truncated", sp));
    const nlohmann::json meta = parse_meta(meta_s, sp);
    StateView v;
    ReadFileOrder params = model_file_pieces(model_path, &shape, v.bytes_read);
    const size_t num_params = ::num_params(shape);
    const StateMeta sm = state_meta(meta, header[1], num_params, state_path);
    check_state_size(in, sm, num_params, sp);
    in.close();

    v.st = sm.st;
    v.num_params = num_params;
    auto state = std::make_shared<PieceFile>(state_path, "checkpoint", v.bytes_read);
    uint64_t at = sizeof(header) + meta_s.size();  // state.bin's arrays in the order checkpoint_save wrote them
    auto next = [&](bool present) -> ReadFileOrder {
        if (!present) return nullptr;
        at += num_params * sizeof(float);
        return piece_array(state, at - num_params * sizeof(float), num_params, sizeof(float));
    };
    v.main.params = std::move(params);
    v.main.m = next(true);
    v.main.v = next(true);
    v.main.master = next(sm.has_master);
    v.fp8.resize(sm.fp8_bytes);
    state->read_bytes(at, v.fp8.data(), v.fp8.size());
    at += sm.fp8_bytes;
    if (sm.replicas > 0) {
        v.local_dp = sm.replicas;
        v.anchor = next(true);
        v.momentum = next(true);
        for (int k = 1; k < sm.replicas; k++) {
            ArraysView r;
            r.params = next(true);
            r.m = next(true);
            r.v = next(true);
            r.master = next(sm.has_master);
            v.replicas.push_back(std::move(r));
        }
    }
    v.psgd_rank = sm.psgd_rank;
    for (size_t k = 0; k < sm.psgd_ranks; k++) v.psgd_errors.push_back(next(true));
    v.psgd_q.resize(sm.q_floats);
    state->read(at, v.psgd_q.size(), sizeof(float), v.psgd_q.data());
    return v;
}

TrainState checkpoint_load(const std::string& path, const ModelShape& shape, WholeState* whole) {
    const std::string state_path = path + "/state.bin", model_path = path + "/model.bin";
    const char* sp = state_path.c_str();
    int32_t header[8];
    std::ifstream in = open_state(path, header);
    const int32_t kind = header[3];
    uint64_t stored;
    std::memcpy(&stored, &header[4], sizeof(stored));
    // One pass over each file: its checksum is taken as it is read, and compared before anything
    // read is handed out (each file was read twice: on a network file system, twice the time). The
    // metadata is checked field by field before it is used; a check that fails there first hashes
    // the rest of state.bin, so that a corrupt file is called corrupt whatever its damage made of
    // a field.
    Checksum sum(kind);  // of everything after the header
    constexpr size_t piece = size_t(1) << 20;  // read, then hashed while in the cache
    auto read = [&](void* p, size_t n) {  // n bytes of state.bin into p, hashed
        char* c = static_cast<char*>(p);
        for (size_t at = 0; at < n; at += piece) {
            const size_t k = std::min(piece, n - at);
            if (!in.read(c + at, std::streamsize(k))) return false;
            sum.update(c + at, k);
        }
        return true;
    };
    const std::string corrupt = strfmt("checkpoint %s: checksum mismatch (corrupt file)", sp);
    const size_t num_params = ::num_params(shape);
    StateMeta sm;
    std::vector<float> params;
    try {
        std::string meta_s(size_t(header[2]), '\0');
        if (!read(&meta_s[0], meta_s.size())) throw UserError(strfmt("checkpoint %s: truncated", sp));
        const nlohmann::json meta = parse_meta(meta_s, sp);
        // the model: its shape must agree with the config (model_file_read validates what it reads)
        const uint64_t model_stored = meta_u64(meta, "model_checksum", state_path, "");
        Checksum model_sum(kind);
        auto hashed = [&](const void* p, size_t n) { model_sum.update(p, n); };
        if (whole) params = model_file_read(model_path, &shape, hashed);
        else model_file_scan(model_path, &shape, hashed);
        if (model_sum.digest() != model_stored)
            throw UserError(strfmt("checkpoint %s: checksum mismatch (corrupt file)", model_path.c_str()));
        sm = state_meta(meta, header[1], num_params, state_path);
        check_state_size(in, sm, num_params, sp);
    } catch (const UserError&) {  // the rest of state.bin, hashed: corrupt, or what the check said
        in.clear();
        std::vector<char> buf(piece);
        while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
            sum.update(buf.data(), size_t(in.gcount()));
        if (sum.digest() != stored) throw UserError(corrupt);
        throw;
    }
    const bool has_master = sm.has_master;
    // whole null: each array read through a piece's buffer, hashed and dropped (x stays empty)
    std::vector<char> scratch(whole ? 0 : piece);
    auto skip = [&](size_t n) {
        for (size_t at = 0; at < n; at += piece)
            if (!read(scratch.data(), std::min(piece, n - at))) return false;
        return true;
    };
    auto read_all = [&](std::vector<float>& x, size_t n) {
        if (!whole) return skip(n * sizeof(float));
        x.resize(n);
        return read(x.data(), n * sizeof(float));
    };
    std::vector<float> m_l, v_l, master_l;
    std::vector<uint8_t> fp8(sm.fp8_bytes);
    LocalSgdState local;
    const size_t local_n = sm.replicas > 0 ? num_params : 0;
    bool ok = read_all(m_l, num_params) && read_all(v_l, num_params) && read_all(master_l, has_master ? num_params : 0) &&
              read(fp8.data(), fp8.size()) && read_all(local.anchor, local_n) && read_all(local.momentum, local_n);
    local.replicas.resize(sm.replicas > 0 ? size_t(sm.replicas - 1) : 0);
    for (ReplicaState& r : local.replicas)
        ok = ok && read_all(r.params, num_params) && read_all(r.m, num_params) && read_all(r.v, num_params) &&
             read_all(r.master, has_master ? num_params : 0);
    PowerSgdState psgd;
    psgd.rank = sm.psgd_rank;
    psgd.errors.resize(sm.psgd_ranks);
    for (std::vector<float>& e : psgd.errors) ok = ok && read_all(e, num_params);
    ok = ok && read_all(psgd.q, sm.q_floats);
    char extra;
    if (!ok || in.read(&extra, 1))
        throw UserError(strfmt("checkpoint %s: truncated or wrong size for %zu parameters", sp, num_params));
    if (sum.digest() != stored) throw UserError(corrupt);
    if (!whole) return sm.st;

    whole->params = std::move(params);
    whole->m = std::move(m_l);
    whole->v = std::move(v_l);
    whole->master = std::move(master_l);
    whole->fp8 = std::move(fp8);
    whole->local_sgd = std::move(local);
    whole->powersgd = std::move(psgd);
    return sm.st;
}
