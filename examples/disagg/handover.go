// SPDX-License-Identifier: Apache-2.0

package main

// The control plane between the workers: the serving stack's own HTTP, not kvxfer's. The
// decode worker asks the prefill worker to prefill a prompt and gets back the request's
// ucx.ContextParams as an application/octet-stream blob (versioned and checksummed by
// kvxfer); everything else is small JSON.

const (
	// pathPrefill answers a prefillRequest with the request's ContextParams blob.
	pathPrefill = "/v1/prefill"
	// pathAbort answers an abortRequest with an abortReply.
	pathAbort = "/v1/abort"
	// pathDone is the decode worker saying it has finished, so a prefill process started on
	// its own (-role=prefill) knows when to report and exit.
	pathDone = "/v1/done"
	// contextParamsType is the content type of a ContextParams blob.
	contextParamsType = "application/octet-stream"
	// maxContextParamsBytes bounds the blob the decode worker reads (a few hundred bytes
	// here; kvxfer's own bound for 64Ki blocks is about 300 KiB).
	maxContextParamsBytes = 1 << 20
)

// prefillRequest asks the prefill worker to prefill a prompt.
type prefillRequest struct {
	Request uint64 `json:"request"`
	Tokens  int    `json:"tokens"`
	// Decode is the peer name of the decode engine that will pull the KV: the router picks
	// both workers before prefill starts.
	Decode string `json:"decode"`
}

// abortRequest tells the prefill worker a request is gone (its client disconnected).
type abortRequest struct {
	Request uint64 `json:"request"`
}

// abortReply says what the prefill worker's engine did with the abort.
type abortReply struct {
	Outcome string `json:"outcome"`
}

// doneRequest says the decode worker is finished.
type doneRequest struct {
	// Decode is the decode engine's peer name, for the prefill worker's log line.
	Decode string `json:"decode"`
}
