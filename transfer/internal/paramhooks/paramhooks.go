// SPDX-License-Identifier: Apache-2.0

// Package paramhooks lets package transfer's tests read and forge the wire sections of a
// ucx.ContextParams that a program never sets (its one-hop Exposure, the Anonymous flag, the
// cluster key's seal), without package ucx exporting them. Package ucx fills Hooks from its
// init; nothing else sets it. Every function takes a *ucx.ContextParams as cp.
package paramhooks

import "github.com/kvxfer/kvxfer/transfer/transport"

// Hooks is filled by package ucx's init.
var Hooks struct {
	// Exposure is cp's one-hop section (nil without one), to read or change in place.
	Exposure func(cp any) *transport.Exposure
	// Anonymous and SetAnonymous read and set the flag that the sender named no receiver.
	Anonymous    func(cp any) bool
	SetAnonymous func(cp any, anonymous bool)
	// Sealed reports whether cp carries a cluster key's seal; CopySeal puts src's seal on dst
	// (a replay of one request's seal onto another's params).
	Sealed   func(cp any) bool
	CopySeal func(dst, src any)
}
