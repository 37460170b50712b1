// A run's progress for the console: tokens seen, an estimate of the time left from the median of
// the recent step times (robust to the slow first step, evaluations and checkpoint saves), and
// the one-paragraph summary at the end. Pure bookkeeping: the caller measures and prints.
#pragma once
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

class Progress {
public:
    // total_steps: the run's last step; window: how many recent step times the median covers.
    Progress(int total_steps, double tokens_per_step, size_t window = 20);
    // The loop starts at `step` (> 0 after a resume: those steps' tokens count as seen).
    void start(int step, double wall_ms);
    void step_done(double step_ms);
    void val_loss(int step, double loss);
    void wrote_weights(const std::string& path) { weights_.push_back(path); }
    void wrote_checkpoint(const std::string& path) { checkpoint_ = path; }

    int step() const { return step_; }
    double tokens() const { return double(step_) * tokens_per_step_; }
    // Seconds left: the median of the last `window` step times times the steps left; < 0 before
    // the first step of this process.
    double eta_s() const;
    // " | 12.3K tok | ETA 4m05s": what the step line appends.
    std::string step_suffix() const;
    // The end of the run: steps, tokens, wall time, mean tokens/s of this process's steps, best
    // validation loss, the weights written and where the checkpoints are (one line each).
    std::string summary(double wall_ms, const std::string& checkpoint_dir) const;

private:
    int total_, first_ = 0, step_ = 0;
    double tokens_per_step_;
    size_t window_;
    double start_ms_ = 0, steps_ms_ = 0;  // wall clock at start(); summed step times
    std::deque<double> recent_;
    double best_val_ = -1;
    int best_val_step_ = -1;
    std::vector<std::string> weights_;
    std::string checkpoint_;
};

// The median of a non-empty list (the mean of the two middle values for an even count).
double median(std::vector<double> v);
// "950", "61.4K", "1.23M", "4.56B".
std::string human_count(double n);
// "45s", "3m05s", "2h07m", "3d04h"; "0s" for anything below a second.
std::string human_duration(double seconds);
