#include "llmc/data/shard.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "llmc/core/common.h"

ShardInfo shard_info(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        throw UserError(strfmt("shard %s: is a folder, not a token shard", path.c_str()));
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw UserError(strfmt("shard %s: cannot open: %s", path.c_str(), std::strerror(errno)));
    int32_t header[256];
    size_t got = std::fread(header, sizeof(int32_t), 256, f);
    std::fclose(f);
    if (got != 256)
        throw UserError(strfmt("shard %s: truncated header (%zu of 1024 bytes)", path.c_str(), got * 4));
    if (header[0] != SHARD_MAGIC && header[0] != SHARD_MAGIC_U32)
        throw UserError(strfmt("shard %s: bad magic %d (expected %d for uint16 or %d for uint32 tokens: not an "
                               "llm.c token shard)",
                               path.c_str(), header[0], SHARD_MAGIC, SHARD_MAGIC_U32));
    const bool u32 = header[0] == SHARD_MAGIC_U32;
    const int version = u32 ? SHARD_VERSION_U32 : SHARD_VERSION;
    if (header[1] != version)
        throw UserError(strfmt("shard %s: unsupported version %d for magic %d (expected %d)", path.c_str(), header[1],
                               header[0], version));
    if (header[2] < 0) throw UserError(strfmt("shard %s: negative token count %d", path.c_str(), header[2]));
    ShardInfo info{static_cast<uint32_t>(header[2]), u32 ? sizeof(uint32_t) : sizeof(uint16_t)};
    if (stat(path.c_str(), &st) != 0) throw UserError(strfmt("shard %s: cannot stat", path.c_str()));
    size_t expect = SHARD_HEADER_BYTES + info.tokens * info.token_bytes;
    if (static_cast<size_t>(st.st_size) != expect)
        throw UserError(strfmt("shard %s: file is %lld bytes but the header's %zu %s tokens need %zu (truncated or "
                               "corrupt)",
                               path.c_str(), static_cast<long long>(st.st_size), info.tokens, u32 ? "uint32" : "uint16",
                               expect));
    return info;
}

size_t shard_read_header(const std::string& path) { return shard_info(path).tokens; }

namespace {

template <class Token>
void write_shard(const std::string& path, int magic, int version, const Token* tokens, size_t count) {
    if (count > 0x7fffffffu) throw UserError(strfmt("shard %s: %zu tokens exceed the format's int32 count", path.c_str(), count));
    std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw UserError(strfmt("shard %s: cannot write: %s", tmp.c_str(), std::strerror(errno)));
    int32_t header[256] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(count);
    bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
    ok = ok && (count == 0 || std::fwrite(tokens, sizeof(Token), count, f) == count);
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw UserError(strfmt("shard %s: write failed: %s", path.c_str(), std::strerror(errno)));
    }
}

}  // namespace

void shard_write(const std::string& path, const uint16_t* tokens, size_t count) {
    write_shard(path, SHARD_MAGIC, SHARD_VERSION, tokens, count);
}

void shard_write(const std::string& path, const uint32_t* tokens, size_t count) {
    write_shard(path, SHARD_MAGIC_U32, SHARD_VERSION_U32, tokens, count);
}
