// SPDX-License-Identifier: Apache-2.0

package native

import (
	"encoding/binary"
)

// The name checksum UCX 1.13 writes for the cma transport (ucs_crc16_string of "cma"), and
// the bit of its interface address that says a pid namespace id follows the pid
// (UCT_CMA_IFACE_ADDR_FLAG_PID_NS, cma_iface.h).
const (
	addrCMAChecksum  = 0x8b47
	cmaAddrFlagPIDNS = 1 << 31
)

// AddressHost is what a worker address says about the process that made it, through its cma
// transport's entry (src/uct/sm/scopy/cma/cma_iface.c): the pid, its pid namespace when it is
// not the initial one, and the shared-memory device address (the host's system id, which
// every shared-memory transport of UCX packs as its device address).
type AddressHost struct {
	PID          int    // the process's pid, as its own pid namespace numbers it
	PIDNamespace uint64 // the pid namespace's id (the inode of /proc/<pid>/ns/pid); 0: the initial one
	SystemID     string // the device address of the cma entry: equal on one host, different across hosts
}

// SameProcessSpace reports whether a process with h's address and one with other's run on one
// host in one pid namespace, so that either can name the other by pid (process_vm_readv).
func (h AddressHost) SameProcessSpace(other AddressHost) bool {
	return h.SystemID != "" && h.SystemID == other.SystemID && h.PIDNamespace == other.PIDNamespace
}

// AddressInfo reads the cma transport's entry of a worker address laid out as local (this
// process's own worker address). ok is false when the address carries no cma entry (a UCX
// without cma, a TLS setting that leaves it out, a peer on another host's address format) or
// is not one this UCX reads (CheckAddress).
func AddressInfo(addr, local []byte) (h AddressHost, ok bool) {
	if CheckAddress(addr, local) != nil {
		return AddressHost{}, false
	}
	withName, err := addressHasName(local)
	if err != nil {
		return AddressHost{}, false
	}
	_ = walkAddressEntries(addr, withName, func(e addrEntry) error {
		dev, iface := e.dev, e.iface
		if e.csum != addrCMAChecksum || ok || len(iface) < 4 || len(dev) == 0 {
			return nil
		}
		id := binary.LittleEndian.Uint32(iface)
		h = AddressHost{PID: int(id &^ cmaAddrFlagPIDNS), SystemID: string(dev)}
		if id&cmaAddrFlagPIDNS != 0 {
			switch len(iface) {
			case 4 + 8:
				h.PIDNamespace = binary.LittleEndian.Uint64(iface[4:])
			case 4 + 4:
				h.PIDNamespace = uint64(binary.LittleEndian.Uint32(iface[4:]))
			default:
				return nil // a namespace id this parse cannot read: no pid either
			}
		}
		ok = h.PID > 0
		return nil
	})
	if !ok {
		return AddressHost{}, false
	}
	return h, true
}
