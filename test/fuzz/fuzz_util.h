// Shared by the libFuzzer targets (test/fuzz/README.md): each target writes its input to files
// and calls the loader the trainer uses on them. A UserError is the expected answer to bad input;
// anything else (a crash, a sanitizer report, another exception, a leak, a huge allocation) is
// a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "llmc/core/common.h"

namespace fuzz {

// A folder of this process's own under /tmp (in memory where /dev/shm exists), made once and
// removed at exit (libFuzzer ends a run by exit(); a crash keeps the folder beside its input).
inline const std::string& work_dir() {
    // on the heap, never freed: the exit handler runs after static objects are destroyed
    static const std::string* dir = [] {
        const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        const std::string* d = new std::string(strfmt("%s/llmc_fuzz_%d", base, int(::getpid())));
        make_dirs(*d, "fuzz work dir");
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(*dir, ec);
        });
        return d;
    }();
    return *dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = work_dir() + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
    return path;
}

// Splits the input at each occurrence of sep (the parts exclude it).
inline std::vector<std::string> split(const uint8_t* data, size_t size, const std::string& sep) {
    std::vector<std::string> parts;
    const std::string s(reinterpret_cast<const char*>(data), size);
    size_t start = 0;
    for (size_t at; (at = s.find(sep, start)) != std::string::npos; start = at + sep.size())
        parts.push_back(s.substr(start, at - start));
    parts.push_back(s.substr(start));
    return parts;
}

}  // namespace fuzz
