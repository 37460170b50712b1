// Token shards in llm.c's format: a 1024-byte header of 256 int32
// (magic 20240520, version 1, token count, rest zero) followed by uint16 tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

constexpr int SHARD_MAGIC = 20240520;
constexpr int SHARD_VERSION = 1;
constexpr size_t SHARD_HEADER_BYTES = 1024;

// Reads and checks a shard's header and file size; returns the token count.
// Throws UserError naming the file on a wrong magic, version or size.
size_t shard_read_header(const std::string& path);

// Writes tokens as a shard (to path + ".tmp", then renamed). Throws UserError on I/O failure.
void shard_write(const std::string& path, const uint16_t* tokens, size_t count);

// Sorted list of files matching a glob pattern (empty when none match).
std::vector<std::string> glob_files(const std::string& pattern);
