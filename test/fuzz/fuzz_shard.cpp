// A token shard: the header check, then the data loader reading every window of it (tokens
// checked against the vocabulary), with and without shuffling.
#include "llmc/data/dataloader.h"
#include "llmc/data/shard.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz::write_file("shard_000.bin", data, size);
    try {
        const ShardInfo info = shard_info(path);
        if (info.tokens > (1u << 16)) return 0;  // the header matched the size: reading it all is slow, not news
        for (bool shuffle : {false, true}) {
            DataLoader dl(path, 2, 4, 0, 1, shuffle, 7, 300);
            std::vector<int32_t> x(8), y(8);
            for (uint64_t i = 0; i < dl.windows_per_epoch() + 1; i++) dl.next(x.data(), y.data());
            LoaderPosition p = dl.position();
            dl.reset();
            dl.set_position(p);
        }
    } catch (const UserError&) {
    }
    return 0;
}
