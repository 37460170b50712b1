#include "llmc/logger.h"

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "llmc/common.h"

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
