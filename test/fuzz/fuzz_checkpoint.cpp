// A checkpoint folder: model.bin and state.bin from the input (split at "\n@@\n"), loaded as
// resume loads them for a tiny model. When the input's first byte is odd, state.bin's checksum
// is recomputed before loading, so that the fuzzer reaches the metadata checks behind it.
#include "llmc/io/checkpoint.h"
#include "llmc/io/model_file.h"
#include "test/fuzz/fuzz_util.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const bool fix_checksum = data[0] & 1;
    std::vector<std::string> parts = fuzz::split(data + 1, size - 1, "\n@@\n");
    if (parts.size() != 2) return 0;
    std::string& state = parts[1];
    if (fix_checksum && state.size() >= 32) {
        int32_t header[8];
        std::memcpy(header, state.data(), sizeof(header));
        if (header[3] == CHECKSUM_FNV1A || header[3] == CHECKSUM_XXH3) {  // (another kind is refused first)
            const uint64_t h = checkpoint_checksum(header[3], state.data() + 32, state.size() - 32);
            std::memcpy(&header[4], &h, sizeof(h));
            std::memcpy(&state[0], header, sizeof(header));
        }
    }
    const std::string dir = fuzz::work_dir() + "/ckpt";
    make_dirs(dir, "fuzz");
    fuzz::write_file("ckpt/model.bin", reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size());
    fuzz::write_file("ckpt/state.bin", reinterpret_cast<const uint8_t*>(state.data()), state.size());
    fuzz::write_file("ckpt/DONE", reinterpret_cast<const uint8_t*>("ok\n"), 3);
    const ModelShape shape{1, 2, 8, 60, 128, 8};  // the seeds' model (test/fuzz/make_seeds.sh)
    try {
        WholeState whole;
        checkpoint_load(dir, shape, &whole);
    } catch (const UserError&) {
    }
    return 0;
}
