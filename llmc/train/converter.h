// Model converters (torchtitan's idea): after the model is built and before it trains, the run's
// converter changes how parts of it compute. Precision "fp8" converts the block linears into FP8
// linears with a scaling state (llmc/train/fp8_converter.cpp); fp32 and bf16 convert nothing. The
// training loop calls the same hooks whatever the converter is, so it never branches on precision.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/io/checkpoint.h"
#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/run/logger.h"
#include "llmc/model/model.h"

struct MemoryRow {
    std::string name;
    size_t bytes;
    std::string note;
};

class ModelConverter {
public:
    virtual ~ModelConverter() = default;
    // What runs in which precision, for the start-up banner ("fp32", "fp8: linears fp8 (...), rest bf16").
    virtual std::string describe() const = 0;
    virtual void apply(Model& model) = 0;
    // Extra rows of the memory table, and a note on the parameters row.
    virtual std::vector<MemoryRow> memory_rows() const { return {}; }
    virtual std::string params_note() const { return ""; }
    // Start of an optimizer step.
    virtual void begin_step() {}
    // After the step's last backward, on every rank in the same order (it may be a world
    // collective): queues the converter's end of the step, which writes its one number for the
    // log into *word (backend memory, read back with the step's norm and losses: no wait of its own).
    virtual void end_step(Comm& world, float* word) {}
    // That number, read back: the converter's fields of the step's log record and console line.
    virtual void log_step(float word, nlohmann::json& record, std::string& line) {}
    // The converter's part of a checkpoint (WholeState::fp8, StateView::fp8: none here), and its
    // resumption from one.
    virtual void save(std::vector<uint8_t>& fp8) const { fp8.clear(); }
    virtual void load(const std::vector<uint8_t>& fp8, const std::string& from, Logger& log) = 0;
};

// The converter cfg.precision asks for on this backend. Throws UserError naming the config keys
// when it cannot run here (no fp8 matmuls on this device, a linear width fp8 GEMMs cannot take).
std::unique_ptr<ModelConverter> make_model_converter(const Config& cfg, Ops& ops, int tp, const std::string& device,
                                                     DType dtype);
