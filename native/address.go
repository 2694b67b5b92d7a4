// SPDX-License-Identifier: Apache-2.0

package native

import (
	"encoding/binary"
	"fmt"
	"math"
)

// AddressError says where a peer's worker address stops being one this process's UCX can
// read. It matches ErrBadAddress.
type AddressError struct {
	Offset int    // byte of the address at fault
	Reason string // what is wrong there
}

// Error implements error.
func (e *AddressError) Error() string {
	return fmt.Sprintf("%v: at byte %d: %s", ErrBadAddress, e.Offset, e.Reason)
}

// Unwrap returns ErrBadAddress.
func (e *AddressError) Unwrap() error { return ErrBadAddress }

// The packed worker address of UCX 1.13 (src/ucp/wireup/address.c), as ucp_worker_get_address
// lays it out with the default UCX_ADDRESS_VERSION=v1 and UCX_UNIFIED_MODE=n:
//
//	header u8 (format version in the low 4 bits) | uuid u64 | [name: len u8 | bytes]
//	per device: md u8 (0xff: no devices at all) | dev-len u8 | device address
//	            | [paths u8] | [sys-device u8]
//	  per transport (unless the md byte says the device is empty):
//	            name checksum u16 | interface attributes (16 bytes) | iface-len u8 | iface address
//
// ucp_ep_create reads it with no length, trusting every count in it, and asserts on an unknown
// version: a peer's garbage would read past the buffer or abort the process. CheckAddress walks
// it with bounds before UCX does.
const (
	addrFlagLast      = 0x80 // dev-len, iface-len: the last device, the device's last transport
	addrFlagEmptyDev  = 0x80 // md: a device without transports
	addrFlagNumPaths  = 0x40 // dev-len: a paths byte follows the device address
	addrFlagSysDevice = 0x20 // dev-len: a system device byte follows
	addrFlagEPAddr    = 0x40 // iface-len: endpoint addresses follow (never in a worker address)
	addrDevLenMask    = 0x1f
	addrMDIndexMask   = 0x1f // md: the md index (the high bits are flags)
	addrIfaceLenMask  = 0x3f
	addrNullResource  = 0xff // md: the address lists no device
	addrIfaceAttr     = 16   // the packed interface attributes of format v1, non-unified mode
	addrMaxTransports = 64   // UCP_MAX_RESOURCES of the smallest UCX this builds against
)

// CheckAddress reports whether addr is a worker address this process's UCX reads the way it
// reads local, its own worker's address: the same header byte (format version and flags, so
// the same UCX_ADDRESS_VERSION on both sides), and every device and transport entry inside
// the bytes given, ending exactly at their end. Anything else is an *AddressError.
func CheckAddress(addr, local []byte) error {
	withName, err := addressHasName(local)
	if err != nil {
		return fmt.Errorf("this worker's own address: %w", err)
	}
	if len(addr) == 0 {
		return &AddressError{0, "empty"}
	}
	if addr[0] != local[0] {
		return &AddressError{0, fmt.Sprintf("header %#02x (format version %d), this worker's is %#02x (version %d): "+
			"both sides must run UCX with the same UCX_ADDRESS_VERSION", addr[0], addr[0]&0xf, local[0], local[0]&0xf)}
	}
	posixMD := -1 // the md index this UCX gives the posix transport, if it has it
	_ = walkAddress(local, withName, func(md byte, csum uint16, _ []byte, _, _ int) error {
		if csum == addrPosixChecksum {
			posixMD = int(md & addrMDIndexMask)
		}
		return nil
	})
	return walkAddress(addr, withName, func(md byte, csum uint16, iface []byte, at, tl int) error {
		return checkIfaceAddr(md, csum, iface, at, tl, posixMD)
	})
}

// addressHasName finds how this UCX lays out its own address: with the worker's name after
// the uuid (UCX_ADDRESS_DEBUG_INFO) or without.
func addressHasName(local []byte) (bool, error) {
	errPlain := walkAddress(local, false, nil)
	if errPlain == nil {
		return false, nil
	}
	if walkAddress(local, true, nil) == nil {
		return true, nil
	}
	return false, errPlain
}

// walkAddress checks the layout after the header byte, and hands each transport's md byte,
// name checksum and interface address to visit (when not nil).
func walkAddress(b []byte, withName bool, visit func(md byte, csum uint16, iface []byte, at, tl int) error) error {
	if visit == nil {
		return walkAddressEntries(b, withName, nil)
	}
	return walkAddressEntries(b, withName, func(e addrEntry) error { return visit(e.md, e.csum, e.iface, e.at, e.tl) })
}

// addrEntry is one transport of a worker address: its device's md byte and device address,
// its name checksum, its interface address (at: that address's offset) and its index.
type addrEntry struct {
	md         byte
	dev, iface []byte
	csum       uint16
	at, tl     int
}

// walkAddressEntries is walkAddress handing each transport's whole entry to visit.
func walkAddressEntries(b []byte, withName bool, visit func(addrEntry) error) error {
	at := 1 + 8 // header, uuid
	need := func(n int, what string) error {
		if n < 0 || at+n > len(b) {
			return &AddressError{at, fmt.Sprintf("%s of %d bytes runs past the %d-byte address", what, n, len(b))}
		}
		return nil
	}
	if err := need(0, "the uuid"); err != nil {
		return err
	}
	if withName {
		if err := need(1, "the name length"); err != nil {
			return err
		}
		n := int(b[at])
		at++
		if err := need(n, "the worker name"); err != nil {
			return err
		}
		at += n
	}
	if err := need(1, "the first device"); err != nil {
		return err
	}
	if b[at] == addrNullResource {
		at++
		if at != len(b) {
			return &AddressError{at, fmt.Sprintf("%d bytes after an address that lists no device", len(b)-at)}
		}
		return nil
	}
	transports := 0
	for dev := 0; ; dev++ {
		if err := need(2, fmt.Sprintf("device %d's md and length", dev)); err != nil {
			return err
		}
		md := b[at]
		empty := md&addrFlagEmptyDev != 0
		lenByte := b[at+1]
		at += 2
		n := int(lenByte & addrDevLenMask)
		if err := need(n, fmt.Sprintf("device %d's address", dev)); err != nil {
			return err
		}
		devAddr := b[at : at+n]
		at += n
		for _, f := range []byte{addrFlagNumPaths, addrFlagSysDevice} {
			if lenByte&f != 0 {
				if err := need(1, fmt.Sprintf("device %d's paths or system device", dev)); err != nil {
					return err
				}
				at++
			}
		}
		for last := empty; !last; {
			if transports++; transports > addrMaxTransports {
				return &AddressError{at, fmt.Sprintf("more than %d transports", addrMaxTransports)}
			}
			if err := need(2+addrIfaceAttr+1, fmt.Sprintf("transport %d's checksum, attributes and length", transports-1)); err != nil {
				return err
			}
			if err := checkIfaceAttr(b[at+2:at+2+addrIfaceAttr], at+2, transports-1); err != nil {
				return err
			}
			csum := binary.LittleEndian.Uint16(b[at:])
			at += 2 + addrIfaceAttr
			l := b[at]
			at++
			if l&addrFlagEPAddr != 0 {
				return &AddressError{at - 1, fmt.Sprintf("transport %d carries endpoint addresses, which a worker address never does", transports-1)}
			}
			n := int(l & addrIfaceLenMask)
			if err := need(n, fmt.Sprintf("transport %d's interface address", transports-1)); err != nil {
				return err
			}
			if visit != nil {
				if err := visit(addrEntry{md: md, dev: devAddr, iface: b[at : at+n], csum: csum, at: at, tl: transports - 1}); err != nil {
					return err
				}
			}
			at += n
			last = l&addrFlagLast != 0
		}
		if lenByte&addrFlagLast != 0 {
			break
		}
	}
	if at != len(b) {
		return &AddressError{at, fmt.Sprintf("%d bytes after the last device", len(b)-at)}
	}
	return nil
}

// checkIfaceAttr checks a transport's packed interface attributes (overhead, bandwidth and
// latency as 32-bit floats, then priority and capability flags), which UCX's lane selection
// scores without looking: a NaN, an infinity or a negative cost makes the score no number or
// negative, and UCX asserts (select.c: score >= 0), aborting the process. Bandwidth is
// dedicated less shared, so its sign may be either; it is never zero.
func checkIfaceAttr(a []byte, at, transport int) error {
	f := func(i int) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(a[4*i:]))) }
	overhead, bandwidth, latency := f(0), f(1), f(2)
	for i, v := range []float64{overhead, bandwidth, latency} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return &AddressError{at + 4*i, fmt.Sprintf("transport %d's %s is %v", transport, []string{"overhead", "bandwidth", "latency"}[i], v)}
		}
	}
	switch {
	case overhead < 0:
		return &AddressError{at, fmt.Sprintf("transport %d's overhead %v is negative", transport, overhead)}
	case bandwidth == 0:
		return &AddressError{at + 4, fmt.Sprintf("transport %d's bandwidth is zero", transport)}
	case latency < 0:
		return &AddressError{at + 8, fmt.Sprintf("transport %d's latency %v is negative", transport, latency)}
	}
	return nil
}

// The name checksum UCX 1.13 writes for the posix shared-memory transport (ucs_crc16_string
// of "posix": CRC-16/X-25), and the bit of its segment id that says the segment is opened with
// shm_open (UCT_POSIX_SEG_FLAG_SHM_OPEN, mm_posix.c).
const (
	addrPosixChecksum   = 0xd3a7
	posixSegFlagShmOpen = 1 << 62
)

// checkIfaceAddr checks what UCX asserts on or trusts inside a transport's entry. The posix
// transport must sit on the md index this UCX gives it (posixMD; UCX attaches the segment
// through that md and crashes on another one), and an interface address of 8 bytes is the
// segment id alone: without a directory after it, the segment must be opened with shm_open, or
// UCX asserts (mm_posix.c: "dir != NULL") and aborts.
func checkIfaceAddr(md byte, csum uint16, iface []byte, at, tl, posixMD int) error {
	if csum != addrPosixChecksum {
		return nil
	}
	if posixMD >= 0 && int(md&addrMDIndexMask) != posixMD {
		return &AddressError{at, fmt.Sprintf("transport %d (posix) on md %d, where this UCX has it on md %d", tl, md&addrMDIndexMask, posixMD)}
	}
	if len(iface) == 8 && binary.LittleEndian.Uint64(iface)&posixSegFlagShmOpen == 0 {
		return &AddressError{at, fmt.Sprintf("transport %d (posix): a segment id without a directory that does not say shm_open", tl)}
	}
	return nil
}
