// SPDX-License-Identifier: Apache-2.0

// Package peernames remembers the discovery names of the peers this process found through a
// registry, so that logs and errors name a peer "prefill-0/peer-1a2b3c4d5e6f" instead of by its
// hash alone (transport.Peer.Short). The registry is the authority for names in a deployment,
// so one table serves every engine of the process; it is bounded, and only ever a label: the
// hash beside the name still tells two addresses that claimed one name apart.
package peernames

import "sync"

const (
	// maxNames bounds the table: far more workers than a deployment has, and a registry
	// that lists more only costs old labels.
	maxNames = 4096
	// maxNameLen cuts a long name (a registry allows 128 characters) to keep log lines short.
	maxNameLen = 32
)

var table struct {
	sync.RWMutex
	names map[string]string // peer -> name
}

// Remember labels peer with name; the latest name a registry gave for peer wins.
func Remember(peer, name string) {
	if peer == "" || name == "" {
		return
	}
	if len(name) > maxNameLen {
		name = name[:maxNameLen]
	}
	table.Lock()
	defer table.Unlock()
	if table.names == nil {
		table.names = make(map[string]string)
	}
	if _, ok := table.names[peer]; !ok && len(table.names) >= maxNames {
		for p := range table.names { // full: forget one label, any
			delete(table.names, p)
			break
		}
	}
	table.names[peer] = name
}

// Name returns peer's label, if a registry gave one.
func Name(peer string) (string, bool) {
	table.RLock()
	defer table.RUnlock()
	name, ok := table.names[peer]
	return name, ok
}
