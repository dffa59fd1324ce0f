// Whole-file reading, and the up-front check that an output file can be written, with errors that name the path and
// the OS reason. Tested by tests/core/test_file.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>

namespace fp4moe {

// The most bytes read_file and read_stream read whole: more than any config, tokenizer or dataset fp4moe reads
// (ShareGPT's JSON is ~0.7 GB); a device such as /dev/zero, or the wrong file, is refused instead of exhausting
// memory.
inline constexpr uint64_t kMaxReadFileBytes = uint64_t{1} << 30;

// The file's bytes; throws fp4moe::Error "cannot open <path>: <strerror>" when it cannot be read,
// "<path> is a directory, not a file" for a directory, and "<path>: more than <max_bytes> bytes, ..." past max_bytes.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = kMaxReadFileBytes);
// The rest of `in` (standard input), bounded as read_file; `what` names it in the errors.
std::string read_stream(std::istream& in, const std::string& what, uint64_t max_bytes = kMaxReadFileBytes);

// Fails, naming `what` (e.g. "--cache") and the path, unless a file can be written at `path` now, so that a command
// refuses a bad output path before its work rather than after it. The path must not be a directory; an existing
// file must be writable; otherwise its parent must be a writable directory, or with create_parents (the writer makes
// the missing directories) its nearest existing ancestor must be. With via_rename (the writer writes a temporary
// file beside it and renames it over the path) the directory must be writable whether or not the file exists, a link
// is followed to its file, and something there that is not a regular file (a device, a FIFO) is refused.
// Creates nothing.
void check_writable_file(const std::filesystem::path& path, const std::string& what, bool create_parents = false,
                         bool via_rename = false);

// Where a writer that renames a temporary file over `path` should write: the file a chain of links at `path` ends at
// (follow_links; the links are kept). Fails, starting with `head` and naming the resolved target, when something
// other than a regular file is there (a directory, a device such as /dev/null, a FIFO): the rename would replace it.
// check_writable_file (via_rename), SafetensorsWriter::write and TuneCache::save use it.
std::filesystem::path rename_target(const std::filesystem::path& path, const std::string& head);

// The file a chain of symbolic links ends at (the path itself when it is no link; a dangling link's target, which
// writing creates). Fails naming the path on a loop (more than 40 links).
std::filesystem::path follow_links(const std::filesystem::path& path);

// Fails unless something can be created in `dir` now: `dir` (with walk_up, its nearest existing ancestor, as for a
// writer that makes the missing directories) exists, is a directory and is writable. The message is
// "<head> cannot be <verb>: <the directory> does not exist / is not a directory / is not writable (<reason>)".
// Creates nothing. check_writable_file and quantize's output-directory check use it.
void check_can_create_in(const std::filesystem::path& dir, const std::string& head, const std::string& verb,
                         bool walk_up);

}  // namespace fp4moe
