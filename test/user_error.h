// The message of the UserError a test expects: error_of(f) returns it, and fails the test when f
// throws none.
#pragma once
#include <catch2/catch.hpp>

#include <string>

#include "llmc/core/common.h"

template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const UserError& e) {
        return e.what();
    }
    FAIL("expected a UserError");
    return "";
}
