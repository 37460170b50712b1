// The tokenizer's files: encoder.json and vocab.bpe from the input (split at "\n@@\n"), then a
// third part, if any, encoded and its ids decoded.
#include "llmc/data/tokenizer.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> parts = fuzz::split(data, size, "\n@@\n");
    if (parts.size() < 2) return 0;
    make_dirs(fuzz::work_dir() + "/tok", "fuzz");
    fuzz::write_file("tok/encoder.json", reinterpret_cast<const uint8_t*>(parts[0].data()), parts[0].size());
    fuzz::write_file("tok/vocab.bpe", reinterpret_cast<const uint8_t*>(parts[1].data()), parts[1].size());
    try {
        const Tokenizer tok = Tokenizer::load(fuzz::work_dir() + "/tok");
        if (parts.size() > 2) {
            std::vector<int> ids = tok.encode(parts[2]);
            tok.decode(ids);
            ids.push_back(tok.vocab_size());  // one id out of range: a UserError
            tok.decode(ids);
        }
    } catch (const UserError&) {
    }
    return 0;
}
