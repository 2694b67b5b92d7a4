// SPDX-License-Identifier: Apache-2.0

// Package cmastats is what the UCX transport counts of the gets it serves by
// process_vm_readv (docs/onecopy.md): the stress harness, the hostile-peer checks and the
// tests read it from the transport's implementation (internal/transportimpl), where a
// program has no need to.
package cmastats

// Stats counts the gets a transport served with process_vm_readv, and the keys and reads it
// kept from it.
type Stats struct {
	Gets     uint64 // gets read by process_vm_readv that succeeded
	Bytes    uint64 // their bytes
	Refused  uint64 // pool keys whose first read the kernel refused (EPERM, ENOSYS, ...): UCX gets them
	Unproven uint64 // pool keys whose peer did not prove its process and ranges: UCX gets them
	Blocked  uint64 // reads that did not return within the transport's CMA read timeout: their gets failed, memory unknown
}
