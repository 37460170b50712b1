// An llm.c model file as model.init reads it: the header, then the weights, any shape.
#include "llmc/io/model_file.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz::write_file("model.bin", data, size);
    try {
        int version = 0;
        const ModelShape shape = model_file_shape(path, &version);
        model_file_read(path, &shape);
    } catch (const UserError&) {
    }
    return 0;
}
