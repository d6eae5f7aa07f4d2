// The last line of defence of cpdrift-inspect's "one line and status 2, never a crash": HDF5
// 1.10 does not checksum its metadata, and some corrupted object headers make the library
// itself fault (a SIGSEGV freeing a half-decoded attribute; found by fuzzing, docs/inspect.md).
#pragma once

namespace cpd::inspect {

/// Installs handlers for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT (on an alternate stack).
/// While HDF5 reads a file (file_being_read() names it) they print `cpdrift-inspect: error:
/// <file>: ...` and end the process with status 2; elsewhere the fault is the tool's own: an
/// "internal error" line and status 3. For the executable only: tests and the fuzz target keep
/// the default behaviour, so a fault there is seen.
void install_fault_guard();

}  // namespace cpd::inspect
