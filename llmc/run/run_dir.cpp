#include "llmc/run/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>

#include "llmc/core/common.h"
#include "llmc/model/optimizer.h"

namespace {

bool exists(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

// Locks <dir>/train_gpt.lock until the process exits (the descriptor is never closed). key: the
// config key that names dir, for the messages.
void lock_dir(const std::string& dir, const char* key) {
    const std::string path = dir + "/train_gpt.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw UserError(strfmt("%s: cannot create %s: %s", key, path.c_str(), std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        char holder[64] = {0};
        const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
        ::close(fd);
        if (err != EWOULDBLOCK)
            throw UserError(strfmt("%s: cannot lock %s: %s", key, path.c_str(), std::strerror(err)));
        std::string pid = n > 0 ? std::string(holder, size_t(n)) : "unknown";
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
        throw UserError(strfmt("%s: %s is in use by another train_gpt (pid %s holds %s); wait for it to end, "
                               "or give this run another %s",
                               key, dir.c_str(), pid.c_str(), path.c_str(), key));
    }
    const std::string pid = strfmt("%d\n", int(::getpid()));
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
        throw UserError(strfmt("%s: cannot write %s: %s", key, path.c_str(), std::strerror(errno)));
}

bool same_dir(const std::string& a, const std::string& b) {
    struct stat sa, sb;
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_writable(const std::string& dir, const char* key) {
    make_dirs(dir, key);
    const std::string probe = dir + strfmt("/.train_gpt_probe.%d", int(::getpid()));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw UserError(strfmt("%s: cannot write in %s: %s", key, dir.c_str(), std::strerror(errno)));
    ::close(fd);
    ::unlink(probe.c_str());
}

// step_NNNNNNNN folders in dir (complete or not) by step: (step, name)
std::vector<std::pair<int, std::string>> step_folders(const std::string& dir) {
    std::vector<std::pair<int, std::string>> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
        int step;
        char tail;
        if (std::sscanf(e->d_name, "step_%d%c", &step, &tail) == 1) out.emplace_back(step, e->d_name);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

void prepare_run_dirs(const Config& cfg, const std::string& ckpt_dir) {
    check_writable(cfg.out_dir, "out_dir");
    lock_dir(cfg.out_dir, "out_dir");
    const char* ckpt_key = cfg.checkpoint.dir.empty() ? "out_dir" : "checkpoint.dir";
    check_writable(ckpt_dir, ckpt_key);
    // two runs with their own out_dir may share a checkpoint.dir: lock it too (once: a second
    // lock on the same file from this process would fail)
    if (!same_dir(ckpt_dir, cfg.out_dir)) lock_dir(ckpt_dir, ckpt_key);
    if (cfg.checkpoint.resume != "never") return;
    std::string found;
    const auto steps = step_folders(ckpt_dir);
    if (!steps.empty()) found = strfmt("%zu checkpoint%s in %s", steps.size(), steps.size() == 1 ? "" : "s", ckpt_dir.c_str());
    const std::string log = cfg.log.jsonl.empty() ? cfg.out_dir + "/log.jsonl" : cfg.log.jsonl;
    if (found.empty() && exists(log)) found = log;
    const std::string model = cfg.out_dir + strfmt("/model_%08d.bin", cfg.train.steps);
    if (found.empty() && exists(model)) found = model;
    if (!found.empty())
        throw UserError(strfmt("checkpoint.resume: \"never\" starts a new run, but out_dir %s holds an earlier run "
                               "(%s) that it would mix with; give the new run another out_dir, continue the old one "
                               "with checkpoint.resume=auto, or delete the folder",
                               cfg.out_dir.c_str(), found.c_str()));
}

std::vector<std::string> set_aside_later_checkpoints(const std::string& ckpt_dir, int step) {
    std::vector<std::string> moved;
    for (const auto& s : step_folders(ckpt_dir)) {
        if (s.first <= step) continue;
        const std::string from = ckpt_dir + "/" + s.second;
        std::string to = ckpt_dir + "/abandoned_" + s.second;
        for (int i = 2; exists(to); i++) to = ckpt_dir + strfmt("/abandoned%d_", i) + s.second;  // an earlier rollback's
        if (std::rename(from.c_str(), to.c_str()) != 0)
            throw UserError(strfmt("checkpoint.resume: cannot set aside %s (a later checkpoint of the branch being "
                                   "rolled back): %s",
                                   from.c_str(), std::strerror(errno)));
        moved.push_back(to);
    }
    return moved;
}

namespace {

using json = nlohmann::json;

void flatten(const json& j, const std::string& prefix, std::map<std::string, json>* out) {
    if (!j.is_object()) {
        (*out)[prefix] = j;
        return;
    }
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
}

bool in_list(const std::string& key, std::initializer_list<const char*> list) {
    for (const char* k : list)
        if (key == k || (k[std::strlen(k) - 1] == '.' && key.rfind(k, 0) == 0)) return true;
    return false;
}

// How a run is laid out, computed, evaluated, logged and saved: changing it leaves the training
// recipe the same. (precision changes the arithmetic as a layout changes the order of sums; the
// fp8 converter has its own rule for fp8.*: other settings than the checkpoint's are refused.)
bool harmless_key(const std::string& key) {
    // local SGD is a training recipe (its outer optimizer and sync interval), not a layout
    if (in_list(key, {"parallel.local_sgd."})) return false;
    // so is PowerSGD: the gradients the optimizer sees (its state resumes only at the same rank)
    if (in_list(key, {"parallel.grad_compression", "parallel.powersgd_rank"})) return false;
    return in_list(key, {"eval.", "log.", "out.", "checkpoint.", "parallel.", "plan.", "device", "precision", "fp8.",
                         "out_dir", "tokenizer", "data.val", "model.init", "model.init_seed", "train.recompute",
                         "train.offload_optimizer", "train.offload_activations",
                         "train.max_bad_steps"});
}
// Keys judged by their effect (below) rather than by their value.
bool schedule_key(const std::string& key) {
    return in_list(key, {"train.lr", "train.lr_schedule", "train.warmup_steps", "train.final_lr_frac",
                         "train.decay_frac", "train.steps"});
}

// The saved run's lr schedule: this run's TrainConfig with the saved config's schedule values.
// False when the saved config does not hold all of them, well typed.
bool saved_schedule(const json& config, TrainConfig* t) {
    const auto it = config.find("train");
    if (it == config.end() || !it->is_object()) return false;
    const json& j = *it;
    auto num = [&](const char* k, double* v) {
        const auto f = j.find(k);
        if (f == j.end() || !f->is_number()) return false;
        *v = f->get<double>();
        return true;
    };
    auto integer = [&](const char* k, int* v) {
        const auto f = j.find(k);
        if (f == j.end() || !f->is_number_integer() || f->get<int64_t>() < 0 || f->get<int64_t>() > INT32_MAX) return false;
        *v = f->get<int>();
        return true;
    };
    const auto sched = j.find("lr_schedule");
    if (sched == j.end() || !sched->is_string()) return false;
    t->lr_schedule = sched->get<std::string>();
    return in_list(t->lr_schedule, {"constant", "cosine", "linear", "wsd"}) && num("lr", &t->lr) &&
           num("final_lr_frac", &t->final_lr_frac) && num("decay_frac", &t->decay_frac) &&
           integer("warmup_steps", &t->warmup_steps) && integer("steps", &t->steps) && t->steps >= 1;
}

std::string describe_shards(const json& shards) {
    std::string s = strfmt("%zu shard%s", shards.size(), shards.size() == 1 ? "" : "s");
    for (size_t i = 0; i < shards.size() && i < 3; i++)
        s += strfmt("%s%s (%llu B)", i ? ", " : ": ", shards[i][0].get<std::string>().c_str(),
                    (unsigned long long)shards[i][1].get<uint64_t>());
    return s + (shards.size() > 3 ? ", ..." : "");
}

}  // namespace

std::vector<ResumeChange> resume_changes(const TrainState& saved, const Config& cfg, int dp, const json& shards) {
    std::vector<ResumeChange> out;
    if (!saved.config.is_object()) return out;  // a checkpoint without its config: nothing to compare
    // the learning rate of every remaining step both runs have, under each one's schedule
    TrainConfig before = cfg.train;
    bool lr_known = saved_schedule(saved.config, &before), lr_differs = !lr_known;
    if (lr_known)
        for (int s = saved.step; s < std::min(before.steps, cfg.train.steps); s++)
            if (lr_at(before, s) != lr_at(cfg.train, s)) {
                out.push_back({strfmt("learning rate of step %d", s + 1), strfmt("%g", lr_at(before, s)),
                               strfmt("%g", lr_at(cfg.train, s)), true});
                lr_differs = true;
                break;
            }
    // the tokens of a step, and the shards they come from
    const json& t = saved.config.contains("train") ? saved.config["train"] : json();
    auto int_of = [](const json& o, const char* k) {  // a positive int, else 0
        return o.is_object() && o.contains(k) && o[k].is_number_integer() && o[k].get<int64_t>() > 0 &&
                       o[k].get<int64_t>() <= INT32_MAX
                   ? o[k].get<int>()
                   : 0;
    };
    const int mb = int_of(t, "micro_batch"), T = int_of(t, "seq_len"), ga = int_of(t, "grad_accum");
    const double tokens = double(mb) * T * ga * saved.loader_dp;  // no overflow: at most 2^124
    const double now = double(cfg.train.micro_batch) * cfg.train.seq_len * cfg.train.grad_accum * dp;
    if (tokens > 0 && tokens != now)
        out.push_back({"tokens per step (micro_batch x seq_len x grad_accum x dp)",
                       strfmt("%.0f (%d x %d x %d x %d)", tokens, mb, T, ga, saved.loader_dp),
                       strfmt("%.0f (%d x %d x %d x %d)", now, cfg.train.micro_batch, cfg.train.seq_len,
                              cfg.train.grad_accum, dp),
                       true});
    const bool shards_known = saved.train_shards.is_array();
    if (shards_known && saved.train_shards != shards)
        out.push_back({"training shards", describe_shards(saved.train_shards), describe_shards(shards), true});
    // every key whose value differs
    std::map<std::string, json> a, b;
    flatten(saved.config, "", &a);
    flatten(cfg.resolved, "", &b);
    for (const auto& kv : a) {
        const auto it = b.find(kv.first);
        const std::string& k = kv.first;
        if (it == b.end() || it->second == kv.second) continue;
        if (k == "checkpoint.resume" || k == "checkpoint.allow_changes") continue;  // how to resume, not what
        const bool breaks = schedule_key(k)       ? lr_differs
                            : k == "data.train"    ? !shards_known
                            : k == "train.grad_accum" ? false  // the tokens per step say it
                                                   : !harmless_key(k);
        out.push_back({k, kv.second.dump(), it->second.dump(), breaks});
    }
    return out;
}

std::string check_resume_changes(const std::vector<ResumeChange>& changes, const Config& cfg, const std::string& from) {
    if (changes.empty()) return std::string();
    std::string lines = strfmt("resume: this run differs from the one that saved %s:\n", from.c_str()), breaking;
    for (const ResumeChange& c : changes) {
        lines += strfmt("  %s: %s -> %s%s\n", c.key.c_str(), c.before.c_str(), c.after.c_str(),
                        c.breaks ? " (no exact resume)" : "");
        if (c.breaks) breaking += strfmt("%s%s: %s -> %s", breaking.empty() ? "" : "; ", c.key.c_str(),
                                         c.before.c_str(), c.after.c_str());
    }
    if (breaking.empty()) return lines;
    if (!cfg.checkpoint.allow_changes)
        throw UserError(strfmt("checkpoint.resume: %s cannot continue exactly, this run changes what it depends on: "
                               "%s. Resume with the checkpoint's values, or set checkpoint.allow_changes=true to "
                               "continue with the changes",
                               from.c_str(), breaking.c_str()));
    return lines + "warning: checkpoint.allow_changes=true: continuing with these changes; the run is not the "
                   "one the checkpoint's settings would have made\n";
}
