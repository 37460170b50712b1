// Run log: one console line per step (main rank) and one JSON object per line in log.jsonl.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

// Resuming at `step`: drops from the log.jsonl at path the records the resumed run writes again
// (steps after `step`, logged after the checkpoint was saved, and the evaluation at `step`), so
// that the log reads as one run. Rewrites the file atomically; a missing file is left missing.
void trim_run_log(const std::string& path, int step);

class Logger {
public:
    // path "" = no file. append: keep earlier records (resume).
    Logger(const std::string& path, bool enabled, bool append);
    ~Logger();
    void record(const nlohmann::json& j);  // appends one line and flushes
    void print(const char* fmt, ...) __attribute__((format(printf, 2, 3)));

private:
    FILE* f_ = nullptr;
    bool enabled_;
};
