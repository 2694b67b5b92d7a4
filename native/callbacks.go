// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// Go functions called from C. They live in their own file because a file with //export may
// only declare C in its preamble; the C adapters that call them are in ucx.go. Both run on a
// worker's progress goroutine, inside kvx_ucx_progress, a post or kvx_ucx_cancel, so they
// touch the loop-owned state freely and must never block.

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import "runtime/cgo"

// kvxGoRequestDone receives a request's one completion (ucx.h's on_done). user is the
// Request's cgo.Handle, deleted by Request.finish: exactly once, since ucx.c calls this once
// per live request and frees the request after it returns.
//
//export kvxGoRequestDone
func kvxGoRequestDone(user C.uint64_t, status C.int, length C.size_t) {
	r := cgo.Handle(user).Value().(*Request)
	r.onCallback(status, length)
}

// kvxGoEndpointError receives UCX's report that an endpoint's peer failed, possibly from
// inside a post (see Worker.posting). user is the Endpoint's cgo.Handle, deleted when the
// endpoint is released.
//
//export kvxGoEndpointError
func kvxGoEndpointError(user C.uint64_t, status C.int) {
	ep := cgo.Handle(user).Value().(*Endpoint)
	ep.reportError(int(status))
}
