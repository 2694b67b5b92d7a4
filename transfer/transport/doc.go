// SPDX-License-Identifier: Apache-2.0

// Package transport is the contract between kvxfer's engine (package transfer) and the
// transports that move its bytes: Transport, the Completion a posted operation reports with
// its memory verdict, the Inbound the engine binds, the optional capabilities the engine asks
// for with a type assertion (DirectTransport, RMATransport, TagReserver, ControlBound, ...),
// and the errors both sides report.
//
// A transport imports this package and never package transfer, so the engine's tests can
// import any transport. To add one, write a package beside the in-memory and UCX ones that
// implements Transport (and whichever capabilities it has) and passes the conformance suite
// in package transporttest (call transporttest.Run from the new package's tests).
package transport
