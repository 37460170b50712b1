// A .safetensors file: the header, then every tensor read as float.
#include "llmc/io/safetensors.h"
#include "llmc/core/common.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz::write_file("model.safetensors", data, size);
    try {
        SafetensorsReader r(path);
        for (const auto& e : r.entries()) r.read(e.first);
    } catch (const UserError&) {
    }
    return 0;
}
