// The config's schema (internal to llmc/core): every key config.json may hold, with its type,
// range or values, where it lives in Config, and its help line. config.cpp reads it for the
// defaults, the checks, unknown-key suggestions, the resolved JSON and the usage text.
#pragma once
#include <limits>
#include <string>
#include <vector>

#include "llmc/core/config.h"

namespace config_schema {

enum class KType { Int, Number, Bool, String, Enum, IntList };

constexpr double NONE = std::numeric_limits<double>::quiet_NaN();

struct Key {
    std::string path;                  // "train.lr"
    KType type;
    void* (*field)(Config&);           // where the value lives in Config (type per `type`)
    double lo = NONE, hi = NONE;       // bounds (NaN = unbounded)
    bool lo_excl = false, hi_excl = false;
    std::vector<std::string> allowed;  // Enum: accepted values
    std::vector<std::string> planned;  // Enum: recognised values that are not supported yet
    bool nonempty = false;             // String: "" is rejected
    bool auto_ok = false;              // Int: also accepts the string "auto", stored as 0
    const char* word = nullptr;        // Number: also accepts this string, stored as 0
    bool* (*auto_flag)(Config&) = nullptr;  // IntList: also accepts "auto", stored as [] and this flag
    std::string help;
};

// every key, in the order the usage text lists them
const std::vector<Key>& schema();

}  // namespace config_schema
