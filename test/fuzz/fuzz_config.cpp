// The config parser and the command-line overrides: input = the config file, then "\n@@\n" and
// one override (key=value) per further part. Runs load_config as main does.
#include "llmc/core/config.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> parts = fuzz::split(data, size, "\n@@\n");
    const std::string path = fuzz::write_file("config.json", reinterpret_cast<const uint8_t*>(parts[0].data()),
                                              parts[0].size());
    std::vector<std::string> args = {"train_gpt", path};
    for (size_t i = 1; i < parts.size() && i < 16; i++) {
        // a command-line argument ends at its first NUL, as the kernel passes it
        const std::string arg = parts[i].substr(0, parts[i].find('\0'));
        if (arg == "--help" || arg == "-h") continue;  // prints the usage and exits 0, by design
        args.push_back(arg);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    bool print = false;
    try {
        Config cfg = load_config(int(args.size()), argv.data(), &print);
        (void)cfg.resolved.dump();
    } catch (const UserError&) {
    }
    return 0;
}
