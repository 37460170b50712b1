#include "llmc/core/common.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
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

// f(begin, n) over [0, bytes) in one slice a thread (64-byte aligned cuts); one call under 16 MiB
template <class F> static void in_slices(size_t bytes, F f) {
    if (bytes < (size_t(16) << 20)) return f(0, bytes);
#ifdef _OPENMP
#pragma omp parallel
    {
        const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
        const size_t per = (bytes / nt + 63) / 64 * 64, b = std::min(bytes, t * per), e = std::min(bytes, b + per);
        if (e > b) f(b, e - b);
    }
#else
    f(0, bytes);
#endif
}

std::unique_ptr<float[]> zeroed_floats(size_t n) {
    std::unique_ptr<float[]> p(new float[n]);
    char* d = reinterpret_cast<char*>(p.get());
    in_slices(n * sizeof(float), [d](size_t b, size_t len) { std::memset(d + b, 0, len); });
    return p;
}

void parallel_copy(void* dst, const void* src, size_t bytes) {
    in_slices(bytes, [dst, src](size_t b, size_t len) { std::memcpy((char*)dst + b, (const char*)src + b, len); });
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

std::vector<std::string> glob_files(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g;
    std::memset(&g, 0, sizeof(g));
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) out.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    std::sort(out.begin(), out.end());
    return out;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UserError(strfmt("cannot write %s: %s", tmp_.c_str(), std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
    throw UserError(strfmt("cannot write %s (%s): %s; any previous %s is kept", path_.c_str(), what, std::strerror(err),
                           path_.c_str()));
}

void AtomicFile::write(const void* p, size_t n) {
    LLMC_ASSERT(fd_ >= 0, "AtomicFile::write after commit");
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd_, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) fail("write");
        c += w;
        n -= size_t(w);
    }
}

void AtomicFile::write_at(uint64_t offset, const void* p, size_t n) {
    LLMC_ASSERT(fd_ >= 0, "AtomicFile::write_at after commit");
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd_, c, n, off_t(offset));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) fail("write");
        c += w, offset += uint64_t(w), n -= size_t(w);
    }
}

void AtomicFile::commit() {
    LLMC_ASSERT(fd_ >= 0, "AtomicFile::commit twice");
    if (::fsync(fd_) != 0) fail("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw UserError(strfmt("cannot write %s (close): %s", path_.c_str(), std::strerror(err)));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw UserError(strfmt("cannot rename %s to %s: %s", tmp_.c_str(), path_.c_str(), std::strerror(err)));
    }
    // make the rename durable
    std::string dir = path_.find('/') == std::string::npos ? "." : path_.substr(0, path_.rfind('/'));
    const int dfd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void write_file_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) {
    AtomicFile f(path);
    for (const auto& part : parts) f.write(part.first, part.second);
    f.commit();
}

void NonFiniteCount::add(const float* x, size_t k, size_t at) {
    size_t b = 0;  // counted without an early exit, so the loop vectorises
    for (size_t i = 0; i < k; i++) b += !std::isfinite(x[i]);
    if (b > 0 && bad == 0) {
        size_t i = 0;
        while (std::isfinite(x[i])) i++;
        first = at + i, value = x[i];
    }
    bad += b;
}
