// Config loading: one schema table (config_schema.cpp) drives defaults, type and range checks,
// unknown-key suggestions, the resolved JSON and the usage text.
#include "llmc/core/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "llmc/core/common.h"
#include "llmc/core/config_schema.h"
#include "llmc/core/utf8.h"

using nlohmann::json;
using namespace config_schema;

namespace {

const Key* find_key(const std::string& path) {
    for (const Key& k : schema())
        if (k.path == path) return &k;
    return nullptr;
}

// Section names ("model", "train", ...) that hold keys.
const std::vector<std::string>& sections() {
    static const std::vector<std::string> secs = [] {
        std::vector<std::string> out;
        for (const Key& k : schema()) {
            for (size_t dot = k.path.find('.'); dot != std::string::npos; dot = k.path.find('.', dot + 1)) {
                std::string s = k.path.substr(0, dot);  // every enclosing section ("model", "model.moe")
                if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
            }
        }
        return out;
    }();
    return secs;
}

bool is_section(const std::string& path) {
    const auto& s = sections();
    return std::find(s.begin(), s.end(), path) != s.end();
}

std::string leaf_of(const std::string& path) {
    size_t dot = path.rfind('.');
    return dot == std::string::npos ? path : path.substr(dot + 1);
}
std::string section_of(const std::string& path) {
    size_t dot = path.rfind('.');
    return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string join(const std::vector<std::string>& v, const char* sep) {
    std::string out;
    for (size_t i = 0; i < v.size(); i++) {
        if (i) out += sep;
        out += v[i];
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// Unknown keys: nearest-name suggestion
// ---------------------------------------------------------------------------------------

std::string lower(std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
}

// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), case-insensitive.
int edit_distance(const std::string& a0, const std::string& b0) {
    std::string a = lower(a0), b = lower(b0);
    size_t n = a.size(), m = b.size();
    std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
    for (size_t i = 0; i <= n; i++) d[i][0] = static_cast<int>(i);
    for (size_t j = 0; j <= m; j++) d[0][j] = static_cast<int>(j);
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[n][m];
}

// The valid name nearest to an unknown path, or "" when nothing is close. Compares the full
// paths, and the leaf names (a leaf found in another section costs one extra edit), so
// "train.lrr" -> "train.lr" and "train.n_layer" -> "model.n_layer".
std::string suggest(const std::string& path) {
    std::vector<std::string> cands;
    for (const Key& k : schema()) cands.push_back(k.path);
    for (const std::string& s : sections()) cands.push_back(s);
    std::string leaf = leaf_of(path), sec = section_of(path);
    std::string best;
    int best_score = INT_MAX, best_full = INT_MAX;
    for (const std::string& c : cands) {
        int full = edit_distance(path, c);
        int by_leaf = edit_distance(leaf, leaf_of(c)) + (lower(section_of(c)) == lower(sec) ? 0 : 1);
        int score = std::min(full, by_leaf);
        if (score < best_score || (score == best_score && full < best_full)) {
            best = c, best_score = score, best_full = full;
        }
    }
    int limit = std::max(1, std::min(3, static_cast<int>(leaf.size()) / 2));
    return best_score <= limit ? best : std::string();
}

std::string keys_in(const std::string& section) {
    std::vector<std::string> names;
    if (section.empty()) {
        for (const Key& k : schema())
            if (k.path.find('.') == std::string::npos) names.push_back(k.path);
        for (const std::string& s : sections())
            if (s.find('.') == std::string::npos) names.push_back(s);
        return "valid top-level keys: " + join(names, ", ");
    }
    for (const Key& k : schema())
        if (section_of(k.path) == section) names.push_back(leaf_of(k.path));
    for (const std::string& s : sections())  // sub-sections ("moe" in model)
        if (section_of(s) == section) names.push_back(leaf_of(s) + " (a section)");
    return "valid keys in " + section + ": " + join(names, ", ");
}

[[noreturn]] void unknown_key(const std::string& path) {
    std::string s = suggest(path);
    std::string sec = section_of(path);
    std::string hint;
    if (!s.empty())
        hint = "did you mean " + s + "?";
    else
        hint = keys_in(is_section(sec) ? sec : std::string());
    throw UserError(strfmt("unknown config key \"%s\" (%s)", path.c_str(), hint.c_str()));
}

// ---------------------------------------------------------------------------------------
// Value checks
// ---------------------------------------------------------------------------------------

std::string describe_value(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return std::string("boolean ") + (v.get<bool>() ? "true" : "false");
        case json::value_t::string:  // (a command-line value may hold any bytes: shown, not thrown)
            return "string " + v.dump(-1, ' ', false, json::error_handler_t::replace);
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
        case json::value_t::number_float: return "number " + v.dump();
        case json::value_t::object: return "an object";
        case json::value_t::array: return "an array";
        default: return "a value of unsupported type";
    }
}

std::string fmt_num(double x) { return x == std::floor(x) && std::fabs(x) < 1e15 ? strfmt("%.0f", x) : strfmt("%g", x); }

std::string range_text(const Key& k) {
    bool has_lo = !std::isnan(k.lo), has_hi = !std::isnan(k.hi);
    if (has_lo && has_hi)
        return strfmt("must be in %s%s, %s%s", k.lo_excl ? "(" : "[", fmt_num(k.lo).c_str(), fmt_num(k.hi).c_str(),
                      k.hi_excl ? ")" : "]");
    if (has_lo) return strfmt("must be %s %s", k.lo_excl ? ">" : ">=", fmt_num(k.lo).c_str());
    if (has_hi) return strfmt("must be %s %s", k.hi_excl ? "<" : "<=", fmt_num(k.hi).c_str());
    return "";
}

void check_range(const Key& k, double x, const std::string& shown) {
    bool bad = false;
    if (!std::isnan(k.lo)) bad |= k.lo_excl ? !(x > k.lo) : !(x >= k.lo);
    if (!std::isnan(k.hi)) bad |= k.hi_excl ? !(x < k.hi) : !(x <= k.hi);
    if (bad)
        throw UserError(strfmt("%s: %s is out of range (%s)", k.path.c_str(), shown.c_str(), range_text(k).c_str()));
}

std::string type_text(const Key& k) {
    switch (k.type) {
        case KType::Int: return k.auto_ok ? "an integer or \"auto\"" : "an integer";
        case KType::Number: return k.word ? strfmt("a number or \"%s\"", k.word) : "a number";
        case KType::Bool: return "a boolean (true or false)";
        case KType::String: return "a string";
        case KType::Enum: return "one of " + join(k.allowed, ", ");
        case KType::IntList: return k.auto_flag ? "an array of integers or \"auto\"" : "an array of integers";
    }
    return "";
}

[[noreturn]] void wrong_type(const Key& k, const json& v) {
    throw UserError(strfmt("%s: expected %s, got %s", k.path.c_str(), type_text(k).c_str(),
                           describe_value(v).c_str()));
}

// Checks v against k and stores it into c.
void assign(const Key& k, const json& v, Config& c) {
    void* dst = k.field(c);
    switch (k.type) {
        case KType::Int: {
            if (k.auto_ok && v.is_string() && v.get<std::string>() == "auto") {
                *static_cast<int*>(dst) = 0;
                break;
            }
            long long x;
            if (v.is_number_unsigned()) {
                unsigned long long u = v.get<unsigned long long>();
                x = u > static_cast<unsigned long long>(LLONG_MAX) ? LLONG_MAX : static_cast<long long>(u);
            } else if (v.is_number_integer()) {
                x = v.get<long long>();
            } else if (v.is_number_float()) {
                // 1e4 is accepted as 10000; 3.5 is not an integer.
                double d = v.get<double>();
                if (!std::isfinite(d) || d != std::floor(d)) wrong_type(k, v);
                if (std::fabs(d) > 9e18) {
                    x = d > 0 ? LLONG_MAX : LLONG_MIN;
                } else {
                    x = static_cast<long long>(d);
                }
            } else {
                wrong_type(k, v);
            }
            std::string shown = v.dump();
            check_range(k, static_cast<double>(x), shown);
            if (x > INT_MAX || x < INT_MIN)
                throw UserError(strfmt("%s: %s is out of range (must fit in a 32-bit integer: <= %d)", k.path.c_str(),
                                       shown.c_str(), INT_MAX));
            *static_cast<int*>(dst) = static_cast<int>(x);
            break;
        }
        case KType::Number: {
            if (k.word && v.is_string() && v.get<std::string>() == k.word) {
                *static_cast<double*>(dst) = 0.0;
                break;
            }
            if (!v.is_number()) wrong_type(k, v);
            double x = v.get<double>();
            check_range(k, x, v.dump());
            *static_cast<double*>(dst) = x;
            break;
        }
        case KType::Bool:
            if (!v.is_boolean()) wrong_type(k, v);
            *static_cast<bool*>(dst) = v.get<bool>();
            break;
        case KType::String: {
            if (!v.is_string()) wrong_type(k, v);
            std::string s = v.get<std::string>();
            if (k.nonempty && s.empty()) throw UserError(strfmt("%s: must not be empty", k.path.c_str()));
            *static_cast<std::string*>(dst) = s;
            break;
        }
        case KType::Enum: {
            if (!v.is_string()) wrong_type(k, v);
            std::string s = v.get<std::string>();
            if (std::find(k.allowed.begin(), k.allowed.end(), s) == k.allowed.end()) {
                std::string allowed = join(k.allowed, ", ");
                if (std::find(k.planned.begin(), k.planned.end(), s) != k.planned.end())
                    throw UserError(strfmt("%s: \"%s\" is not supported yet (allowed values: %s)", k.path.c_str(),
                                           s.c_str(), allowed.c_str()));
                std::string hint;
                for (const std::string& a : k.allowed)
                    if (lower(a) == lower(s)) hint = " (did you mean " + a + "?)";
                throw UserError(strfmt("%s: \"%s\" is not an allowed value (allowed values: %s)%s", k.path.c_str(),
                                       s.c_str(), allowed.c_str(), hint.c_str()));
            }
            *static_cast<std::string*>(dst) = s;
            break;
        }
        case KType::IntList: {
            if (k.auto_flag) *k.auto_flag(c) = false;
            if (k.auto_flag && v.is_string() && v.get<std::string>() == "auto") {
                *k.auto_flag(c) = true;
                static_cast<std::vector<int>*>(dst)->clear();
                break;
            }
            if (!v.is_array()) wrong_type(k, v);
            std::vector<int> out;
            for (const json& e : v) {
                if (!e.is_number_integer() && !e.is_number_unsigned()) wrong_type(k, v);
                long long x = e.get<long long>();
                check_range(k, double(x), e.dump());
                if (x > INT_MAX) throw UserError(strfmt("%s: %s is out of range", k.path.c_str(), e.dump().c_str()));
                out.push_back(int(x));
            }
            *static_cast<std::vector<int>*>(dst) = out;
            break;
        }
    }
}

json read_field(const Key& k, Config& c) {
    void* p = k.field(c);
    switch (k.type) {
        case KType::Int:
            if (k.auto_ok && *static_cast<int*>(p) == 0) return "auto";
            return *static_cast<int*>(p);
        case KType::Number:
            if (k.word && *static_cast<double*>(p) == 0.0) return k.word;
            return *static_cast<double*>(p);
        case KType::Bool: return *static_cast<bool*>(p);
        case KType::String:
        case KType::Enum: return *static_cast<std::string*>(p);
        case KType::IntList:
            if (k.auto_flag && *k.auto_flag(c)) return "auto";
            return *static_cast<std::vector<int>*>(p);
    }
    return nullptr;
}

std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
        size_t dot = path.find('.', start);
        parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return parts;
}

// The value at a dotted path, or nullptr when absent.
const json* lookup(const json& root, const std::string& path) {
    const json* cur = &root;
    for (const std::string& p : split_path(path)) {
        if (!cur->is_object()) return nullptr;
        auto it = cur->find(p);
        if (it == cur->end()) return nullptr;
        cur = &*it;
    }
    return cur;
}

// Sets the value at a dotted path, creating (or replacing non-object) intermediate objects.
void set_path(json& root, const std::string& path, const json& v) {
    json* cur = &root;
    for (const std::string& p : split_path(path)) {
        if (!cur->is_object()) *cur = json::object();
        cur = &(*cur)[p];
    }
    *cur = v;
}

// Rejects unknown keys and sections that are not objects.
void check_keys(const json& obj, const std::string& prefix) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (find_key(path)) continue;  // a leaf: its type is checked by assign()
        if (is_section(path)) {
            if (!it.value().is_object())
                throw UserError(strfmt("%s: expected an object (a section with keys; %s), got %s", path.c_str(),
                                       keys_in(path).c_str(), describe_value(it.value()).c_str()));
            check_keys(it.value(), path);
            continue;
        }
        unknown_key(path);
    }
}

bool path_exists(const std::string& p, bool* is_dir = nullptr) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return false;
    if (is_dir) *is_dir = S_ISDIR(st.st_mode);
    return true;
}

// model.moe.* keys set to other than their defaults on a model without MoE layers would be ignored.
// Without model.moe.num_experts the user believes MoE is configured and it is not: refused, naming
// the key. An explicit num_experts 0 is MoE switched off on purpose (a dense run of an MoE config),
// the other keys knowingly moot: a warning names them. (Keys at their defaults, as in the
// --print-config of a dense model, change nothing either way.)
void check_moe_keys(const json& j, const Config& c) {
    if (c.model.moe.num_experts != 0) return;
    Config defaults;
    std::vector<std::string> moot;
    for (const Key& k : schema()) {
        if (k.path.rfind("model.moe.", 0) != 0 || k.path == "model.moe.num_experts") continue;
        const json* v = lookup(j, k.path);
        if (v && *v != read_field(k, defaults)) moot.push_back(k.path);
    }
    if (moot.empty()) return;
    if (!lookup(j, "model.moe.num_experts"))
        throw UserError(strfmt("%s: set, but model.moe.num_experts is not (0 by default: no MoE layers), so it would "
                               "be ignored; set model.moe.num_experts >= 2 for a mixture of experts, or remove %s",
                               moot[0].c_str(), join(moot, ", ").c_str()));
    if (log_rank() <= 0)
        std::fprintf(stderr, "warning: model.moe.num_experts is 0 (no MoE layers): %s ignored\n", join(moot, ", ").c_str());
}

// parallel.local_sgd: outer_lr or outer_momentum away from their defaults without `every` would be
// ignored (refused when `every` is not given; a warning when it is 0 on purpose, as for model.moe).
// Local SGD keeps each DP rank's whole model and inner AdamW (llmc/train/local_sgd.h): ZeRO 2 and 3
// shard what every replica must hold whole; under cp and ep a replica spans several DP-group ranks
// whose gradients must still be summed every step.
void check_local_sgd(const json& j, const Config& c) {
    const LocalSgdConfig& l = c.parallel.local_sgd;
    if (l.every == 0) {
        Config defaults;
        std::vector<std::string> moot;
        if (l.outer_lr != defaults.parallel.local_sgd.outer_lr) moot.push_back("parallel.local_sgd.outer_lr");
        if (l.outer_momentum != defaults.parallel.local_sgd.outer_momentum)
            moot.push_back("parallel.local_sgd.outer_momentum");
        if (moot.empty()) return;
        if (!lookup(j, "parallel.local_sgd.every"))
            throw UserError(strfmt("%s: set, but parallel.local_sgd.every is not (0 by default: local SGD off), so it "
                                   "would be ignored; set parallel.local_sgd.every >= 1 (inner steps between syncs) "
                                   "for local SGD, or remove %s",
                                   moot[0].c_str(), join(moot, ", ").c_str()));
        if (log_rank() <= 0)
            std::fprintf(stderr, "warning: parallel.local_sgd.every is 0 (local SGD off): %s ignored\n",
                         join(moot, ", ").c_str());
        return;
    }
    const ParallelConfig& p = c.parallel;
    if (p.zero >= 2)
        throw UserError(strfmt("parallel.zero: %d with parallel.local_sgd.every = %d: local SGD works with ZeRO "
                               "stages 0 and 1 only (each DP rank keeps its whole model, gradients and inner AdamW; "
                               "stage 1 shards the outer state); use parallel.zero=0 or 1",
                               p.zero, l.every));
    if (p.cp > 1)
        throw UserError(strfmt("parallel.cp: %d with parallel.local_sgd.every = %d: local SGD runs over the DP "
                               "group only (a context-parallel replica would still need its gradient all-reduce "
                               "every step); use parallel.cp=1",
                               p.cp, l.every));
    if (p.ep > 1)
        throw UserError(strfmt("parallel.ep: %d with parallel.local_sgd.every = %d: local SGD runs over the DP "
                               "group only (expert parallelism spreads a replica's experts over DP ranks); use "
                               "parallel.ep=1",
                               p.ep, l.every));
}

// parallel.grad_compression = powersgd replaces ZeRO-0's all-reduce over the DP group
// (llmc/train/powersgd.h): the other ZeRO stages reduce-scatter shards, local SGD has no gradient
// all-reduce, and the tensors of tp/pp/cp/ep ranks are not the whole model's whose state the
// checkpoint holds. powersgd_rank without powersgd would be ignored.
void check_grad_compression(const json& j, const Config& c) {
    const ParallelConfig& p = c.parallel;
    if (p.grad_compression != "powersgd") {
        if (p.powersgd_rank != Config().parallel.powersgd_rank && lookup(j, "parallel.powersgd_rank"))
            throw UserError(strfmt("parallel.powersgd_rank: set (%d), but parallel.grad_compression is \"%s\", so it "
                                   "would be ignored; set parallel.grad_compression=powersgd or remove it",
                                   p.powersgd_rank, p.grad_compression.c_str()));
        return;
    }
    const char* why = "PowerSGD compresses ZeRO-0's gradient all-reduce over the DP group";
    if (p.zero != 0)
        throw UserError(strfmt("parallel.zero: %d with parallel.grad_compression = powersgd: %s (ZeRO >= 1 "
                               "reduce-scatters shards); use parallel.zero=0",
                               p.zero, why));
    if (p.local_sgd.every > 0)
        throw UserError(strfmt("parallel.local_sgd.every: %d with parallel.grad_compression = powersgd: local SGD has "
                               "no gradient all-reduce to compress; use one or the other",
                               p.local_sgd.every));
    // the error feedback holds residuals of loss-scaled gradients: a scale change would mix scales
    if (c.precision == "fp16")
        throw UserError("precision: fp16 with parallel.grad_compression = powersgd: the error feedback would carry "
                        "gradients of an old loss scale into the new one; use fp32 with PowerSGD");
    const std::pair<const char*, int> axes[] = {{"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep}};
    for (const auto& a : axes)
        if (a.second > 1)
            throw UserError(strfmt("parallel.%s: %d with parallel.grad_compression = powersgd: %s only (its state is "
                                   "checkpointed per DP rank for the whole model); use parallel.%s=1",
                                   a.first, a.second, why, a.first));
}

void check_consistency(const Config& c, bool check_files) {
    const ModelConfig& m = c.model;
    const TrainConfig& t = c.train;
    if (m.d_model % m.n_head != 0)
        throw UserError(strfmt("model.d_model: %d is not divisible by model.n_head = %d (d_model must be a multiple "
                               "of n_head)",
                               m.d_model, m.n_head));
    if (m.arch == "gpt2" && m.n_kv_head != 0 && m.n_kv_head != m.n_head)
        throw UserError(strfmt("model.n_kv_head: %d, but model.arch \"gpt2\" has n_kv_head = n_head = %d (grouped-query "
                               "attention needs model.arch \"llama\")", m.n_kv_head, m.n_head));
    if (m.arch == "gpt2" && m.ffn_dim != 0 && m.ffn_dim != 4 * m.d_model)
        throw UserError(strfmt("model.ffn_dim: %d, but model.arch \"gpt2\" has ffn_dim = 4 x d_model = %d", m.ffn_dim,
                               4 * m.d_model));
    if (m.arch == "llama" && m.n_kv_head != 0 && m.n_head % m.n_kv_head != 0)
        throw UserError(strfmt("model.n_kv_head: %d does not divide model.n_head = %d (each key/value head serves "
                               "n_head / n_kv_head query heads)", m.n_kv_head, m.n_head));
    if (m.arch == "llama" && (m.d_model / m.n_head) % 2 != 0)
        throw UserError(strfmt("model.n_head: head dimension d_model / n_head = %d / %d is odd (rotary embeddings "
                               "rotate pairs of dimensions)", m.d_model, m.n_head));
    if (m.moe.num_experts == 1)
        throw UserError("model.moe.num_experts: 1 (a mixture needs >= 2 experts; 0 = no MoE layers)");
    if (m.moe.num_experts > 0 && m.moe.top_k > m.moe.num_experts)
        throw UserError(strfmt("model.moe.top_k: %d exceeds model.moe.num_experts = %d", m.moe.top_k,
                               m.moe.num_experts));
    if (m.moe.num_experts > 0 && m.moe.every > m.n_layer)
        throw UserError(strfmt("model.moe.every: %d exceeds model.n_layer = %d (no layer would be MoE)", m.moe.every,
                               m.n_layer));
    if (c.parallel.ep > 1 && m.moe.num_experts == 0)
        throw UserError(strfmt("parallel.ep: %d needs model.moe (expert parallelism splits the MoE layers' experts; "
                               "this model has none)", c.parallel.ep));
    if (c.parallel.ep > 1 && m.moe.num_experts % c.parallel.ep != 0)
        throw UserError(strfmt("parallel.ep: %d does not divide model.moe.num_experts = %d (each expert-parallel rank "
                               "holds num_experts / ep whole experts)", c.parallel.ep, m.moe.num_experts));
    const KernelsConfig& kc = c.kernels;
    if (kc.attention_wgmma_layout != "auto" && kc.attention_forward.compare(0, 5, "wgmma") != 0 &&
        kc.attention_backward.compare(0, 5, "wgmma") != 0)
        throw UserError(strfmt("kernels.attention_wgmma_layout: \"%s\" applies to the wgmma ways of "
                               "kernels.attention_forward and kernels.attention_backward, and neither is one (\"%s\", "
                               "\"%s\")", kc.attention_wgmma_layout.c_str(), kc.attention_forward.c_str(),
                               kc.attention_backward.c_str()));
    if (m.moe.num_experts > 0 && c.precision == "fp8")
        throw UserError("precision: fp8 with model.moe: the experts' linears have no fp8 path yet (use fp32 or bf16)");
    // loss scaling is fp16's: another precision refuses its keys rather than ignore them
    const TrainConfig defaults;
    if (c.precision != "fp16" && t.loss_scale != defaults.loss_scale)
        throw UserError(strfmt("train.loss_scale: %g applies to precision \"fp16\" only (this run is \"%s\"; remove "
                               "the key)", t.loss_scale, c.precision.c_str()));
    if (c.precision != "fp16" && t.loss_scale_window != defaults.loss_scale_window)
        throw UserError(strfmt("train.loss_scale_window: %d applies to precision \"fp16\" only (this run is \"%s\"; "
                               "remove the key)", t.loss_scale_window, c.precision.c_str()));
    if (t.loss_scale != 0.0 && t.loss_scale_window != defaults.loss_scale_window)
        throw UserError(strfmt("train.loss_scale_window: %d applies to the dynamic loss scale only (train.loss_scale "
                               "is the fixed %g)", t.loss_scale_window, t.loss_scale));
    if (t.seq_len > m.max_seq_len)
        throw UserError(strfmt("train.seq_len: %d exceeds model.max_seq_len = %d (must be <= model.max_seq_len)",
                               t.seq_len, m.max_seq_len));
    if (t.offload_activations && t.recompute != "full")
        throw UserError(strfmt("train.offload_activations: true needs train.recompute = \"full\" (got \"%s\"): "
                               "offload moves the layer inputs full recompute keeps to host memory",
                               t.recompute.c_str()));
    if (t.cuda_graphs) {  // (one process, and device auto resolving to the CPU: train_gpt.cu's Run)
        const char* why = c.device == "cpu"                   ? "device \"cpu\" has no CUDA graphs"
                          : t.offload_optimizer               ? "train.offload_optimizer waits for its host update"
                          : t.offload_activations             ? "train.offload_activations copies beside the graph"
                          : m.moe.num_experts > 0             ? "model.moe routes tokens on the host"
                                                              : nullptr;
        if (why)
            throw UserError(strfmt("train.cuda_graphs: true is not available here: %s (set it false)", why));
    }
    if (t.warmup_steps > t.steps)
        throw UserError(strfmt("train.warmup_steps: %d exceeds train.steps = %d (must be in [0, train.steps])",
                               t.warmup_steps, t.steps));
    // CUDA launch limits (a grid's y and z extents are at most 65535 blocks): attention puts the
    // micro-batch's sequences on z; the FP8 casts put 32 rows (tokens) a block on y
    if (c.device != "cpu" && t.micro_batch > 65535)
        throw UserError(strfmt("train.micro_batch: %d exceeds 65535 sequences per micro-batch, the CUDA attention "
                               "kernels' limit (device \"%s\"; raise train.grad_accum instead)",
                               t.micro_batch, c.device.c_str()));
    const long long fp8_rows = static_cast<long long>(t.micro_batch) * (t.seq_len / std::max(1, c.parallel.cp));
    if (c.device != "cpu" && c.precision == "fp8" && fp8_rows > 65535LL * 32)
        throw UserError(strfmt("train.micro_batch * train.seq_len%s = %lld tokens per micro-batch exceeds %lld, the "
                               "CUDA FP8 casts' limit (raise train.grad_accum instead)",
                               c.parallel.cp > 1 ? " / parallel.cp" : "", fp8_rows, 65535LL * 32));
    long long tokens_per_step = static_cast<long long>(t.micro_batch) * t.seq_len * t.grad_accum;
    if (tokens_per_step > INT_MAX)
        throw UserError(strfmt("train.micro_batch * train.seq_len * train.grad_accum = %lld tokens per step is too "
                               "large (must be <= %d)",
                               tokens_per_step, INT_MAX));

    if (c.data.train.empty())
        throw UserError("data.train: required: a glob of training shards (e.g. data.train=\"data/train_*.bin\")");
    if (check_files && glob_files(c.data.train).empty())
        throw UserError(strfmt("data.train: no file matches \"%s\" (must be a glob matching at least one shard)",
                               c.data.train.c_str()));
    if (check_files && !c.data.val.empty() && glob_files(c.data.val).empty())
        throw UserError(strfmt("data.val: no file matches \"%s\" (must be a glob matching at least one shard, or "
                               "\"\" for no validation)",
                               c.data.val.c_str()));
    if (c.eval.every > 0 && c.data.val.empty())
        throw UserError(strfmt("eval.every: %d needs validation data but data.val is empty (set data.val to a glob "
                               "of shards, or eval.every=0)",
                               c.eval.every));

    bool is_dir = false;
    if (m.init != "random" && (!path_exists(m.init, &is_dir) || is_dir))
        throw UserError(strfmt("model.init: \"%s\" is neither \"random\" nor an existing file (allowed: random, or "
                               "the path of an llm.c checkpoint, of a transformers .safetensors file or of a "
                               "sharded one's .safetensors.index.json)",
                               m.init.c_str()));
    const std::string& r = c.checkpoint.resume;
    if (r != "auto" && r != "never" && !path_exists(r))
        throw UserError(strfmt("checkpoint.resume: \"%s\" does not exist (allowed: auto, never, or the path of a "
                               "checkpoint)",
                               r.c_str()));
    if (!c.tokenizer_dir.empty()) {
        if (!path_exists(c.tokenizer_dir, &is_dir) || !is_dir)
            throw UserError(strfmt("tokenizer: \"%s\" is not a folder (must be a folder holding encoder.json and "
                                   "vocab.bpe, or \"\" for token ids only)",
                                   c.tokenizer_dir.c_str()));
        for (const char* f : {"encoder.json", "vocab.bpe"}) {
            std::string p = c.tokenizer_dir + "/" + f;
            if (!path_exists(p, &is_dir) || is_dir)
                throw UserError(strfmt("tokenizer: \"%s\" has no %s (must be a folder holding encoder.json and "
                                       "vocab.bpe, or \"\" for token ids only)",
                                       c.tokenizer_dir.c_str(), f));
        }
    }
}

std::string first_key_in(const std::string& section) {
    for (const Key& k : schema())
        if (section_of(k.path) == section) return k.path;
    return section;
}

// Applies one key=value override to the JSON tree. Strings need no quotes on the command line:
// a value that is not valid JSON, or any value given to a string key, is taken as plain text.
void apply_override(json& root, const std::string& arg) {
    size_t eq = arg.find('=');
    std::string path = arg.substr(0, eq), text = arg.substr(eq + 1);
    if (path.empty()) throw UserError(strfmt("override \"%s\": missing key before '='", arg.c_str()));
    for (const std::string& part : split_path(path))
        if (part.empty()) throw UserError(strfmt("override \"%s\": malformed key \"%s\"", arg.c_str(), path.c_str()));
    json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) v = text;
    if (const Key* k = find_key(path)) {
        if (k->type == KType::Int || k->type == KType::Number) {
            // a number beyond a double (1e309) is no JSON number: say so, not "got a string"
            char* end = nullptr;
            const double x = std::strtod(text.c_str(), &end);
            if (v.is_string() && !text.empty() && *end == '\0' && std::isinf(x) &&
                text.find_first_of("iInN") == std::string::npos)
                throw UserError(strfmt("%s: %s is out of range (beyond the largest double, about 1.8e308%s%s)",
                                       path.c_str(), text.c_str(), range_text(*k).empty() ? "" : "; ",
                                       range_text(*k).c_str()));
        }
        if ((k->type == KType::String || k->type == KType::Enum) && !v.is_string()) v = text;
        set_path(root, path, v);
        return;
    }
    if (is_section(path)) {
        if (!v.is_object())
            throw UserError(strfmt("%s: is a section, not a value: set its keys (e.g. %s=...) or give a JSON "
                                   "object; got %s (%s)",
                                   path.c_str(), first_key_in(path).c_str(), describe_value(v).c_str(),
                                   keys_in(path).c_str()));
        for (auto it = v.begin(); it != v.end(); ++it)
            apply_override(root, path + "." + it.key() + "=" + it.value().dump());
        return;
    }
    unknown_key(path);
}

json read_config_file(const std::string& path) {
    bool is_dir = false;
    if (!path_exists(path, &is_dir))
        throw UserError(strfmt("config file \"%s\": not found", path.c_str()));
    if (is_dir) throw UserError(strfmt("config file \"%s\": is a folder, not a JSON file", path.c_str()));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UserError(strfmt("config file \"%s\": cannot open: %s", path.c_str(), std::strerror(errno)));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const size_t nul = text.find('\0');
    if (nul != std::string::npos)
        throw UserError(strfmt("config file \"%s\": a NUL byte at byte %zu (not a text file?)", path.c_str(), nul));
    // nlohmann keeps the last of two equal keys silently: refuse the file instead
    std::vector<std::set<std::string>> seen;  // keys of each open object
    std::vector<std::string> at;              // the last key of each open object
    std::string dup;
    const json::parser_callback_t check_dup = [&](int, json::parse_event_t ev, json& parsed) {
        if (ev == json::parse_event_t::object_start) {
            seen.emplace_back();
            at.emplace_back();
        } else if (ev == json::parse_event_t::object_end) {
            seen.pop_back();
            at.pop_back();
        } else if (ev == json::parse_event_t::key) {
            at.back() = parsed.get<std::string>();
            if (!seen.back().insert(at.back()).second && dup.empty()) dup = join(at, ".");
        }
        return true;
    };
    try {
        json j = json::parse(text, check_dup, /*allow_exceptions=*/true, /*ignore_comments=*/true);
        if (!dup.empty())
            throw UserError(strfmt("config file \"%s\": key \"%s\" appears twice in one object (JSON keeps the "
                                   "last silently); keep one",
                                   path.c_str(), dup.c_str()));
        return j;
    } catch (const json::parse_error& e) {
        std::string msg = e.what();
        size_t close = msg.find("] ");
        if (msg.rfind("[json.exception", 0) == 0 && close != std::string::npos) msg = msg.substr(close + 2);
        throw UserError(strfmt("config file \"%s\": invalid JSON (byte %zu): %s", path.c_str(), e.byte, msg.c_str()));
    } catch (const json::out_of_range& e) {  // a number beyond double (1e400): nlohmann's 406
        throw UserError(strfmt("config file \"%s\": invalid JSON: a number out of range (%s)", path.c_str(), e.what()));
    }
}

// Every key and string of the config is UTF-8: JSON cannot hold other bytes (nlohmann throws
// when such a string is written out: in messages, the resolved config, a checkpoint).
void check_utf8(const json& j, const std::string& path) {
    const auto check = [&](const std::string& s, const char* what) {
        const size_t at = utf8_invalid_at(s);
        if (at != std::string::npos)
            throw UserError(strfmt("%s: %s is not valid UTF-8 (byte %zu)", path.empty() ? "config" : path.c_str(), what,
                                   at));
    };
    if (j.is_string()) check(j.get_ref<const std::string&>(), "the value");
    if (j.is_array())
        for (const json& e : j) check_utf8(e, path);
    if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) {
            check(it.key(), "a key");
            check_utf8(it.value(), path.empty() ? it.key() : path + "." + it.key());
        }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Public interface
// ---------------------------------------------------------------------------------------

Config config_from_json(const json& j, bool check_files) {
    if (!j.is_object())
        throw UserError(strfmt("config: the top level must be a JSON object, got %s", describe_value(j).c_str()));
    check_utf8(j, "");
    check_keys(j, "");
    Config c;
    for (const Key& k : schema())
        if (const json* v = lookup(j, k.path)) assign(k, *v, c);
    check_moe_keys(j, c);
    check_local_sgd(j, c);
    check_grad_compression(j, c);
    check_consistency(c, check_files);
    c.resolved = json::object();
    for (const Key& k : schema()) set_path(c.resolved, k.path, read_field(k, c));
    return c;
}

std::string config_usage() {
    std::string u =
        "usage: train_gpt [CONFIG.json | -] [key=value ...] [--print-config] [--plan[=json|=search]] [--help]\n"
        "\n"
        "  CONFIG.json      JSON config (first argument; omit it or give \"-\" to use defaults + overrides)\n"
        "  key=value        override any key by its dotted path, e.g. train.lr=3e-4 model.n_layer=4\n"
        "                   data.train=\"data/train_*.bin\"; the value is JSON when it parses as JSON,\n"
        "                   else plain text (string keys always take the text as is)\n"
        "  --print-config   print the fully resolved config (defaults filled) and exit\n"
        "  --plan[=json]    print what every kind of rank of the layout allocates (plan.world processes;\n"
        "                   no mpirun, nothing allocated), the model FLOPs per step and the estimated step\n"
        "                   time on plan.gpu, and exit\n"
        "  --plan=search    rank the layouts of plan.world GPUs that fit plan.gpu's memory by estimated\n"
        "                   tokens/s and print the best as key=value overrides, and exit\n"
        "  --help           print this help and exit\n"
        "\n"
        "keys (default; allowed values):\n";
    Config defaults;
    size_t width = 0;
    for (const Key& k : schema()) width = std::max(width, k.path.size());
    for (const Key& k : schema()) {
        std::string allowed;
        switch (k.type) {
            case KType::Int: allowed = k.auto_ok ? "integer|auto" : "integer"; break;
            case KType::Number: allowed = k.word ? std::string("number|") + k.word : "number"; break;
            case KType::Bool: allowed = "true|false"; break;
            case KType::String: allowed = k.nonempty ? "non-empty string" : "string"; break;
            case KType::Enum: allowed = join(k.allowed, "|"); break;
            case KType::IntList: allowed = k.auto_flag ? "[integer, ...]|auto" : "[integer, ...]"; break;
        }
        std::string range = range_text(k);
        if (!range.empty()) allowed += ", " + range.substr(std::strlen("must be "));
        u += strfmt("  %-*s %s (default %s; %s)\n", static_cast<int>(width), k.path.c_str(), k.help.c_str(),
                    read_field(k, defaults).dump().c_str(), allowed.c_str());
    }
    return u;
}

Config load_config(int argc, char** argv, bool* print_config, std::string* plan) {
    if (print_config) *print_config = false;
    if (plan) plan->clear();
    json root = json::object();
    int i = 1;
    if (argc > 1) {
        std::string first = argv[1];
        if (first == "-") {
            i = 2;
        } else if (first.find('=') == std::string::npos && first.rfind("-", 0) != 0) {
            root = read_config_file(first);
            if (!root.is_object())
                throw UserError(strfmt("config file \"%s\": the top level must be a JSON object, got %s", first.c_str(),
                                       describe_value(root).c_str()));
            i = 2;
        }
    }
    std::set<std::string> overridden;
    for (; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--print-config") {
            if (print_config) *print_config = true;
        } else if (a == "--plan" || a == "--plan=json" || a == "--plan=search") {
            if (plan) *plan = a == "--plan" ? "text" : a.substr(std::strlen("--plan="));
        } else if (a.rfind("--plan=", 0) == 0) {
            throw UserError(strfmt("flag \"%s\": --plan prints text, --plan=json one JSON object, --plan=search the "
                                   "fastest layouts that fit (no other form)",
                                   a.c_str()));
        } else if (a == "--help" || a == "-h") {
            std::fputs(config_usage().c_str(), stdout);
            std::fflush(stdout);
            std::exit(0);
        } else if (a.rfind("-", 0) == 0) {
            throw UserError(strfmt("unknown flag \"%s\" (flags: --print-config, --plan, --plan=json, --plan=search, --help; overrides are written "
                                   "key=value without dashes, e.g. train.lr=3e-4)",
                                   a.c_str()));
        } else if (a.find('=') != std::string::npos) {
            const std::string key = a.substr(0, a.find('='));
            if (!overridden.insert(key).second && log_rank() <= 0)
                std::fprintf(stderr, "warning: %s is given twice on the command line; the last (%s) wins\n",
                             key.c_str(), a.c_str());
            apply_override(root, a);
        } else {
            throw UserError(strfmt("unexpected argument \"%s\": neither key=value nor a known flag (the config file "
                                   "must be the first argument; see --help)",
                                   a.c_str()));
        }
    }
    return config_from_json(root, !(plan && !plan->empty()));  // a plan reads no data: its files need not exist
}

DType run_dtype(const std::string& precision, const std::string& device) {
    // fp8 keeps everything but the block linears in bf16 on CUDA and fp32 on the CPU; CUDA stores
    // fp16 as IEEE half, the CPU emulates it in fp32 storage (llmc/cpu/fp16_ops.h)
    if (precision == "fp16") return device == "cuda" ? DType::F16 : DType::F32;
    return precision == "bf16" || (precision == "fp8" && device == "cuda") ? DType::BF16 : DType::F32;
}
