// A fresh folder for a test's files: NAME_XXXXXX under $TMPDIR (else /tmp), removed with all it
// holds when the TempDir goes out of scope, the test passed or not. `make test` points TMPDIR at a
// folder of its own and fails when anything is left in it (test/run_tests.sh).
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

// $TMPDIR, else /tmp: where tests put what they write
inline std::string temp_base() {
    const char* base = std::getenv("TMPDIR");
    return base && *base ? base : "/tmp";
}

struct TempDir {
    std::string path;
    explicit TempDir(const std::string& name) {
        const std::string tmpl = temp_base() + "/" + name + "_XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        REQUIRE(mkdtemp(buf.data()) != nullptr);
        path = buf.data();
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return path + "/" + name; }
};
