// The HDF5 calls the dump reader makes, each checked: an owned id, the error stack read into one
// line, a group's members, an object's scalar attributes. Everything here throws InspectError
// naming the file; nothing prints.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "inspect/dump_reader.h"
#include "io/h5_handle.h"

namespace cpd::inspect::h5 {

using h5io::Handle;

/// Turns HDF5's automatic error printing off, for good (the reader reports errors itself).
void silence_errors();

/// The most specific messages of HDF5's error stack as one line (then clears it): "truncated
/// file: eof = 800, sblock->base_addr = 0, stored_eof = 2048".
std::string error_stack_text();

/// Throws InspectError("<file>: <what>: <HDF5's reason>").
[[noreturn]] void fail(const std::string& file, const std::string& what);

/// `id` when it is valid, else fail(file, what).
hid_t checked(hid_t id, const std::string& file, const std::string& what);

/// Opens `path` read-only (file locking off: a reader never writes).
Handle open_file(const std::string& path);
/// Opens an in-memory file image read-only (HDF5's core driver over a copy of the bytes).
Handle open_image(const void* data, std::size_t size, const std::string& name);

enum class Kind { group, dataset, other };
struct Member {
  std::string name;
  Kind kind = Kind::other;
};
/// The members of group `path` in name order; soft and external links are refused (a dump has
/// none, and following one would open another file).
std::vector<Member> members(hid_t file, const std::string& path, const std::string& file_name);

/// Every attribute of the object at `path`: scalar fixed-length strings, integers (as int64) and
/// floats (as double). Any other kind of attribute is refused, naming it.
Attributes read_attributes(hid_t file, const std::string& path, const std::string& file_name);

}  // namespace cpd::inspect::h5
