#include "llmc/cuda/device_arch.h"

#include <cctype>
#include <sstream>

#include "llmc/core/common.h"

// GPU_ARCH's words with spaces between, as make takes them (the Makefile's macro joins them by commas)
static std::string spaced(std::string built) {
    for (char& c : built)
        if (c == ',') c = ' ';
    return built;
}

bool arch_runs_on(const std::string& built, int major, int minor) {
    std::istringstream in(spaced(built));
    std::string w;
    while (in >> w) {
        size_t digits = 0;
        while (digits < w.size() && std::isdigit((unsigned char)w[digits])) digits++;
        if (digits < 2 || digits + 1 < w.size()) continue;  // not an architecture nvcc names so
        const int cc = std::stoi(w.substr(0, digits)), bmaj = cc / 10, bmin = cc % 10;
        const char suffix = digits < w.size() ? w[digits] : '\0';
        if (suffix == 'a' ? (major == bmaj && minor == bmin)
                          : (suffix == '\0' || suffix == 'f') && major == bmaj && minor >= bmin)
            return true;
    }
    return false;
}

std::string arch_mismatch(const std::string& built, const std::string& device_name, int major, int minor) {
    if (arch_runs_on(built, major, minor)) return "";
    // (Hopper's own: 90a, with the wgmma kernels)
    const std::string want = major == 9 && minor == 0 ? "90a" : strfmt("%d%d", major, minor);
    const std::string archs = spaced(built);
    return strfmt("device=cuda: %s (compute capability %d.%d) runs none of this build's device code, built for "
                  "GPU_ARCH=\"%s\": rebuild with make GPU_ARCH=\"%s %s\" (or GPU_ARCH=%s alone)",
                  device_name.c_str(), major, minor, archs.c_str(), archs.c_str(), want.c_str(), want.c_str());
}
