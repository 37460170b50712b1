#include "llmc/run/logger.h"

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "llmc/core/common.h"

void trim_run_log(const std::string& path, int step) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return;
    std::string kept, line;
    bool dropped = false;
    for (int c; (c = std::fgetc(f)) != EOF;) {
        line += char(c);
        if (c != '\n') continue;
        const nlohmann::json rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        const bool redone = rec.is_object() && rec.contains("step") && rec["step"].is_number_integer() &&
                            (rec["step"].get<long long>() > step ||
                             (rec["step"].get<long long>() == step && rec.contains("val_loss")));
        if (redone) dropped = true;
        else kept += line;
        line.clear();
    }
    std::fclose(f);
    kept += line;  // a last line without its newline (a crash mid-write) is kept as it was
    if (dropped) write_file_atomic(path, {{kept.data(), kept.size()}});
}

Logger::Logger(const std::string& path, bool enabled, bool append) : enabled_(enabled) {
    if (!enabled || path.empty()) return;
    f_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!f_) throw UserError(strfmt("log.jsonl: cannot open %s: %s", path.c_str(), std::strerror(errno)));
}

Logger::~Logger() {
    if (f_) std::fclose(f_);
}

void Logger::record(const nlohmann::json& j) {
    if (!f_) return;
    std::string line = j.dump();
    std::fprintf(f_, "%s\n", line.c_str());
    std::fflush(f_);
}

void Logger::print(const char* fmt, ...) {
    if (!enabled_) return;
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stdout, fmt, ap);
    va_end(ap);
    std::fflush(stdout);
}
