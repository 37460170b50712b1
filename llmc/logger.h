// Run log: one console line per step (main rank) and one JSON object per line in log.jsonl.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

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
