// Token shards in llm.c's formats: a 1024-byte header of 256 int32 (magic, version, token
// count, rest zero) followed by the tokens, little-endian.
//   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards), for vocabularies <= 65536
//   magic 20240801, version 7: uint32 tokens (llm.c's "llama-3" shards), for larger vocabularies
// The token count is the int32 header[2] in both, so a shard holds fewer than 2^31 tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

constexpr int SHARD_MAGIC = 20240520;  // uint16 tokens
constexpr int SHARD_VERSION = 1;
constexpr int SHARD_MAGIC_U32 = 20240801;  // uint32 tokens
constexpr int SHARD_VERSION_U32 = 7;
constexpr size_t SHARD_HEADER_BYTES = 1024;
constexpr long SHARD_U16_MAX_VOCAB = 65536;  // larger vocabularies need uint32 shards

struct ShardInfo {
    size_t tokens;       // token count
    size_t token_bytes;  // 2 (uint16) or 4 (uint32)
};

// Reads and checks a shard's header and file size. Throws UserError naming the file on an
// unknown magic or version, or a size that does not match the header (truncated or corrupt).
ShardInfo shard_info(const std::string& path);
// The token count of shard_info(path).
size_t shard_read_header(const std::string& path);

// Writes tokens as a shard (to path + ".tmp", then renamed): uint16 tokens as version 1,
// uint32 tokens as version 7. Throws UserError on I/O failure.
void shard_write(const std::string& path, const uint16_t* tokens, size_t count);
void shard_write(const std::string& path, const uint32_t* tokens, size_t count);

