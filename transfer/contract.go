// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// The Transport contract lives in package transport, so that a transport (package ucx, package
// mem, or a new one) is written against it without importing the engine. These aliases name
// the few of its types a caller of the engine meets; a transport's author reads package
// transport, which has the rest (its optional capabilities, completions, tags).
type (
	// RequestID names one request across the prefill and decode workers (transport.RequestID).
	RequestID = transport.RequestID
	// Peer is a transport's name for a remote engine (transport.Peer).
	Peer = transport.Peer
)

// Transport is what New takes: a transport that a transport package made (ucx.New,
// ucx.NewDevice, mem.Network.Transport). A program makes it and hands it to New, which drives
// the contract of package transport behind it (internal/transportimpl) and closes it in
// Engine.Close; a program calls Close itself only on a transport it never gave an engine.
type Transport interface {
	// Close stops the transport; force tears down what is in flight (transport.Transport).
	Close(force bool) error
}
