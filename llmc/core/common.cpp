#include "llmc/core/common.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <vector>

int& log_rank() {
    static int rank = -1;
    return rank;
}

std::string rank_prefix() {
    return log_rank() < 0 ? std::string() : strfmt("[rank %d] ", log_rank());
}

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
    std::fprintf(stderr, "%sinternal error at %s:%d: %s (%s)\n", rank_prefix().c_str(), file, line,
                 msg.c_str(), expr);
    std::fflush(stderr);
    check_failed(strfmt("internal error at %s:%d: %s (%s)", file, line, msg.c_str(), expr));
}


std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::vector<char> buf(n + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    va_end(ap2);
    return std::string(buf.data(), n);
}

void make_dirs(const std::string& path, const char* what) {
    std::string cur;
    for (size_t i = 0; i <= path.size(); i++) {
        if ((i == path.size() || path[i] == '/') && !cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 &&
            errno != EEXIST)
            throw UserError(strfmt("%s: cannot create folder %s: %s", what, cur.c_str(), std::strerror(errno)));
        if (i < path.size()) cur += path[i];
    }
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
    return strfmt("%.1f %s", b, units[u]);
}
