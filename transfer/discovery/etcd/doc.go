// SPDX-License-Identifier: Apache-2.0

// Package etcd is discovery's etcd backend (the v3 API): importing it, usually for its side
// effect alone,
//
//	import _ "github.com/kvxfer/kvxfer/transfer/discovery/etcd"
//
// makes discovery.Open accept "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" targets (default
// prefix "/kvxfer"). Each worker lives under PREFIX/workers/NAME, its value the
// discovery.Worker as JSON, attached to a lease of discovery.Config.TTL that the publisher
// keeps alive, so a worker that dies disappears within the TTL. It is a package of its own so
// that a program using only the embedded HTTP registry links no etcd client.
package etcd
