// Finding the committed test data (test/data) from wherever the test binary runs.
#pragma once
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// The path of test/data/<name>: under $LLMC_TEST_DATA, test/data, the folder beside this
// source file, data or ../test/data, whichever holds it; fails the test otherwise.
inline std::string find_data_file(const std::string& name) {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("LLMC_TEST_DATA")) dirs.push_back(env);
    dirs.push_back("test/data");
    const std::string here = __FILE__;  // .../test/test_data_files.h
    const size_t slash = here.find_last_of('/');
    if (slash != std::string::npos) dirs.push_back(here.substr(0, slash) + "/data");
    dirs.push_back("data");
    dirs.push_back("../test/data");
    for (const auto& d : dirs) {
        const std::string p = d + "/" + name;
        if (FILE* f = std::fopen(p.c_str(), "rb")) {
            std::fclose(f);
            return p;
        }
    }
    FAIL("cannot find test data file " << name << " (run from the repository root or set LLMC_TEST_DATA)");
    return "";
}
