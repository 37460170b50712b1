#include "llmc/run/progress.h"

#include <algorithm>
#include <cmath>

#include "llmc/core/common.h"

Progress::Progress(int total_steps, double tokens_per_step, size_t window)
    : total_(total_steps), tokens_per_step_(tokens_per_step), window_(std::max<size_t>(1, window)) {}

void Progress::start(int step, double wall_ms) {
    first_ = step_ = step;
    start_ms_ = wall_ms;
}

void Progress::step_done(double step_ms) {
    step_++;
    steps_ms_ += step_ms;
    recent_.push_back(step_ms);
    if (recent_.size() > window_) recent_.pop_front();
}

void Progress::val_loss(int step, double loss) {
    if (best_val_step_ < 0 || loss < best_val_) best_val_ = loss, best_val_step_ = step;
}

double Progress::eta_s() const {
    if (recent_.empty()) return -1;
    return median(std::vector<double>(recent_.begin(), recent_.end())) / 1000.0 * double(total_ - step_);
}

std::string Progress::step_suffix() const {
    const double eta = eta_s();
    return strfmt(" | %s tok | ETA %s", human_count(tokens()).c_str(), eta < 0 ? "?" : human_duration(eta).c_str());
}

std::string Progress::summary(double wall_ms, const std::string& checkpoint_dir) const {
    const int steps = step_ - first_;
    std::string s = strfmt("done: %d step%s%s, %s tokens, wall time %s, mean %.0f tok/s", step_, step_ == 1 ? "" : "s",
                           first_ > 0 ? strfmt(" (%d in this run, resumed at %d)", steps, first_).c_str() : "",
                           human_count(tokens()).c_str(), human_duration((wall_ms - start_ms_) / 1000.0).c_str(),
                           steps_ms_ > 0 ? double(steps) * tokens_per_step_ / (steps_ms_ / 1000.0) : 0.0);
    s += best_val_step_ >= 0 ? strfmt(", best val loss %.6f (step %d)\n", best_val_, best_val_step_) : "\n";
    for (const std::string& w : weights_) s += "weights: " + w + "\n";
    s += checkpoint_.empty() ? "checkpoints: none written by this run (in " + checkpoint_dir + ")\n"
                             : "checkpoints: " + checkpoint_dir + " (latest " + checkpoint_ + ")\n";
    return s;
}

double median(std::vector<double> v) {
    LLMC_ASSERT(!v.empty(), "median of an empty list");
    const size_t n = v.size(), mid = n / 2;
    std::nth_element(v.begin(), v.begin() + long(mid), v.end());
    const double hi = v[mid];
    if (n % 2) return hi;
    return (*std::max_element(v.begin(), v.begin() + long(mid)) + hi) / 2.0;
}

std::string human_count(double n) {
    const char* units[] = {"", "K", "M", "B", "T"};
    int u = 0;
    while (std::fabs(n) >= 1000.0 && u < 4) n /= 1000.0, u++;
    if (u == 0) return strfmt("%.0f", n);
    return strfmt(std::fabs(n) >= 100 ? "%.0f%s" : std::fabs(n) >= 10 ? "%.1f%s" : "%.2f%s", n, units[u]);
}

std::string human_duration(double seconds) {
    const long s = long(std::floor(std::max(0.0, seconds)));
    if (s < 60) return strfmt("%lds", s);
    if (s < 3600) return strfmt("%ldm%02lds", s / 60, s % 60);
    if (s < 86400) return strfmt("%ldh%02ldm", s / 3600, s % 3600 / 60);
    return strfmt("%ldd%02ldh", s / 86400, s % 86400 / 3600);
}
