// SPDX-License-Identifier: Apache-2.0

// Package wire is the engines' wire protocol: the messages two engines exchange (hello and
// its challenge and proof, request-info, data chunk header, done, abort, abort-ack, the RMA
// offer and release, the pull wire, the goodbye) as Go types, and their checked binary
// encoding (Decode, DecodeData, Encode). It is internal to package transfer: a serving
// process never sees a message, and a transport carries the bytes without reading them (but
// for the kind byte, transport.Kind). wire.go documents the format.
package wire
