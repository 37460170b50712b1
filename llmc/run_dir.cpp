#include "llmc/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "llmc/common.h"

namespace {

bool exists(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

// Locks <out_dir>/train_gpt.lock until the process exits (the descriptor is never closed).
void lock_out_dir(const std::string& out_dir) {
    const std::string path = out_dir + "/train_gpt.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw UserError(strfmt("out_dir: cannot create %s: %s", path.c_str(), std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        char holder[64] = {0};
        const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
        ::close(fd);
        if (err != EWOULDBLOCK)
            throw UserError(strfmt("out_dir: cannot lock %s: %s", path.c_str(), std::strerror(err)));
        std::string pid = n > 0 ? std::string(holder, size_t(n)) : "unknown";
        while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
        throw UserError(strfmt("out_dir: %s is in use by another train_gpt (pid %s holds %s); wait for it to end, "
                               "or give this run another out_dir",
                               out_dir.c_str(), pid.c_str(), path.c_str()));
    }
    const std::string pid = strfmt("%d\n", int(::getpid()));
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
        throw UserError(strfmt("out_dir: cannot write %s: %s", path.c_str(), std::strerror(errno)));
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
    lock_out_dir(cfg.out_dir);
    check_writable(ckpt_dir, cfg.checkpoint.dir.empty() ? "out_dir" : "checkpoint.dir");
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
