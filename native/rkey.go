// SPDX-License-Identifier: Apache-2.0

package native

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// RemoteKeyError says where a peer's packed remote key stops being one this process's UCX
// packs. It matches ErrBadRemoteKey.
type RemoteKeyError struct {
	Offset int    // byte of the key at fault
	Reason string // what is wrong there
}

// Error implements error.
func (e *RemoteKeyError) Error() string {
	return fmt.Sprintf("%v: at byte %d: %s", ErrBadRemoteKey, e.Offset, e.Reason)
}

// Unwrap returns ErrBadRemoteKey.
func (e *RemoteKeyError) Unwrap() error { return ErrBadRemoteKey }

// The packed remote key of UCX 1.13 (src/ucp/core/ucp_rkey.c), as ucp_rkey_pack lays it out:
//
//	md map u64 | memory type u8 | per md in the map, lowest first: key length u8 | transport key
//
// The md indices are the packing process's; the peer's worker address says which transport
// each is (its devices' md bytes and the transports' name checksums), and UCX unpacks the key
// of each md it reaches with that transport's component. ucp_ep_rkey_unpack takes no length
// and trusts every count; a component's unpack reads its own fixed layout whatever length the
// key gives, and a failed one (a segment that cannot be attached) leaves UCX to destroy a half
// made key, which crashes the process. CheckRemoteKey walks the key with bounds, and each
// transport key against its transport's layout, before UCX sees it.
const (
	rkeyHeader        = 8 + 1 // md map, memory type
	rkeyMemoryTypes   = 5     // UCS_MEMORY_TYPE_LAST of UCX 1.13: host, CUDA, CUDA managed, ROCm, ROCm managed
	rkeyMemoryHost    = 0     // UCS_MEMORY_TYPE_HOST
	rkeyPosixLen      = 8 + 8 + 8
	rkeyPosixPIDNSLen = 8       // sizeof(ucs_sys_ns_t): the pid namespace a procfs segment's packer reserves room for
	rkeySysvLen       = 4 + 8   // shmid u32 | owner's address u64
	rkeyIBLen         = 8       // UCT_IB_MD_PACKED_RKEY_SIZE
	posixSegFlagHuge  = 1 << 61 // UCT_POSIX_SEG_FLAG_HUGETLB
	posixSegFlags     = posixSegFlagProcLink | posixSegFlagShmOpen | posixSegFlagHuge | posixSegFlagPIDNS
	posixSegFileName  = "ucx_shm_posix_" // UCT_POSIX_FILE_FMT, before the hex mmid
)

// rkeyKind is how a transport's component packs its part of a remote key.
type rkeyKind int

const (
	rkeyEmpty   rkeyKind = iota // self, tcp, cma: nothing (the transport needs no key)
	rkeyPosix                   // posix shared memory: segment id | address | length [| directory]
	rkeySysv                    // System V shared memory: shmid | owner's address
	rkeyIB                      // InfiniBand verbs: the memory key
	rkeyCUDAIPC                 // cuda_ipc: an IPC handle of the peer's device allocation (cudaMalloc, VMM, a memory pool)
)

// rkeyLayouts are the transports of the UCX builds kvxfer runs on (Debian's libucx0 1.13: built
// in self, tcp, posix, sysv; the cma and ib modules; the libucx-cu12 wheel's 1.22 adds
// cuda_copy and cuda_ipc) by the name checksum a worker address carries (ucs_crc16_string of
// the name), with how each packs a key. A transport this UCX has that is not here is refused
// where a key names its md: its layout is unknown to this check.
var rkeyLayouts = func() map[uint16]rkeyTransport {
	m := map[uint16]rkeyTransport{}
	for _, t := range []rkeyTransport{
		{"self", rkeyEmpty}, {"tcp", rkeyEmpty}, {"cma", rkeyEmpty}, {"cuda_copy", rkeyEmpty},
		{"cuda_ipc", rkeyCUDAIPC},
		{"posix", rkeyPosix}, {"sysv", rkeySysv},
		{"rc_verbs", rkeyIB}, {"ud_verbs", rkeyIB}, {"rc_mlx5", rkeyIB}, {"dc_mlx5", rkeyIB}, {"ud_mlx5", rkeyIB},
	} {
		m[crc16String(t.name)] = t
	}
	return m
}()

type rkeyTransport struct {
	name string
	kind rkeyKind
}

// crc16String is ucs_crc16_string (CRC-16/X-25), the checksum UCX names transports by in a
// worker address.
func crc16String(s string) uint16 {
	crc := uint16(0xffff)
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i])
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x8408
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// keySegment is the shared-memory segment a key's posix or sysv part names: what UCX attaches
// and maps into this process at unpack (ucp_rkey_ptr then shows it), and what bounds every
// view or get through the key.
type keySegment struct {
	kind      rkeyKind
	at        int    // offset of the transport key in the packed key
	base      uint64 // the segment's address in the peer
	size      uint64 // posix: the length the key declares; sysv: unknown (0) until the segment is looked at
	reachable bool   // the peer is on this host (its address's entry for the transport has this host's device), so UCX attaches it

	// posix
	segID uint64 // flags and mmid
	dir   string // the directory of a segment named by path (neither procfs nor shm_open)
	// sysv
	shmid uint32

	ownerPID int // the peer's pid as its address names it (posix FIFO, cma); 0: not named
}

// CheckRemoteKey reports whether key is a remote key this process's UCX packs, for an endpoint
// to the worker at peer (its worker address, which CheckAddress accepted) from the worker
// whose own address is local: inside the given bytes, ending exactly at their end, with a
// known memory type, and every transport key that UCX would unpack (the md is in the peer's
// address on a transport this worker has) exactly as that transport packs one: the right
// length, known flags, a shared-memory segment with a positive length that does not wrap the
// address space, at most one such segment. Anything else is a *RemoteKeyError. It reads the
// bytes only; whether a named segment exists, and how large it really is, UnpackRemoteKey asks
// the system before UCX attaches it.
func CheckRemoteKey(key, peer, local []byte) error {
	_, err := parseRemoteKey(key, peer, local)
	return err
}

// rkeyMD is what a peer's address says of one of its mds: the transports on it that this
// worker has (their checksums), and each one's device address.
type rkeyMD struct {
	csums []uint16
	devs  [][]byte
}

func parseRemoteKey(key, peer, local []byte) (*keySegment, error) {
	withName, err := addressHasName(local)
	if err != nil {
		return nil, fmt.Errorf("this worker's own address: %w", err)
	}
	if err := CheckAddress(peer, local); err != nil {
		return nil, fmt.Errorf("the peer's worker address: %w", err)
	}
	ours := map[uint16][]byte{} // this worker's transports, and each one's device address
	var localDir []byte         // the directory this worker's posix segments are named in, if by path
	_ = walkAddressEntries(local, withName, func(e addrEntry) error {
		ours[e.csum] = e.dev
		if e.csum == addrPosixChecksum && len(e.iface) > 8 && binary.LittleEndian.Uint64(e.iface)&(posixSegFlagProcLink|posixSegFlagShmOpen) == 0 {
			localDir = e.iface[8:]
		}
		return nil
	})
	mds := map[int]*rkeyMD{}
	_ = walkAddressEntries(peer, withName, func(e addrEntry) error {
		if _, ok := ours[e.csum]; !ok {
			return nil // UCX reaches no md through a transport it does not have
		}
		i := int(e.md & addrMDIndexMask)
		if mds[i] == nil {
			mds[i] = &rkeyMD{}
		}
		mds[i].csums = append(mds[i].csums, e.csum)
		mds[i].devs = append(mds[i].devs, e.dev)
		return nil
	})
	ownerPID, sameNS := 0, true
	if f, ok := findPosixFIFO(peer, withName); ok {
		ownerPID = int(f.pid)
		if mine, ok := findPosixFIFO(local, withName); ok {
			// A peer in another pid namespace: UCX's posix transport does not reach it, and
			// its pid names another process here.
			sameNS = f.nsFlag == mine.nsFlag && bytes.Equal(f.rest, mine.rest)
		}
	} else if h, ok := AddressInfo(peer, local); ok {
		ownerPID = h.PID
	}

	if len(key) < rkeyHeader {
		return nil, &RemoteKeyError{0, fmt.Sprintf("%d bytes, fewer than the md map and memory type", len(key))}
	}
	mdMap := binary.LittleEndian.Uint64(key)
	if mt := key[8]; mt >= rkeyMemoryTypes {
		return nil, &RemoteKeyError{8, fmt.Sprintf("memory type %d, which UCX does not know", mt)}
	}
	var seg *keySegment
	at := rkeyHeader
	for i := range 64 {
		if mdMap&(1<<i) == 0 {
			continue
		}
		if at >= len(key) {
			return nil, &RemoteKeyError{at, fmt.Sprintf("md %d's key length runs past the %d-byte key", i, len(key))}
		}
		n := int(key[at])
		at++
		if at+n > len(key) {
			return nil, &RemoteKeyError{at - 1, fmt.Sprintf("md %d's key of %d bytes runs past the %d-byte key", i, n, len(key))}
		}
		tl := key[at : at+n]
		md := mds[i]
		if md == nil {
			at += n
			continue // UCX skips the key of an md it does not reach
		}
		t, err := rkeyTransportOf(md, i, at)
		if err != nil {
			return nil, err
		}
		s, err := checkTransportKey(t, tl, i, at, localDir)
		if err != nil {
			return nil, err
		}
		if s != nil {
			if seg != nil {
				return nil, &RemoteKeyError{at, fmt.Sprintf("md %d names a second shared-memory segment (memory is allocated by one md)", i)}
			}
			s.reachable = bytes.Equal(md.devs[0], ours[md.csums[0]]) && (s.kind != rkeyPosix || sameNS)
			s.ownerPID = ownerPID
			seg = s
		}
		at += n
	}
	if err := checkRKeySysDev(key[at:], at, rkeySysDevSection, systemDevices()); err != nil {
		return nil, err
	}
	return seg, nil
}

// rkeySysDevSection says whether this UCX packs a system-device section after the md keys:
// UCX 1.13 packs nothing there, later versions (the 1.22 of GPU hosts) do.
var rkeySysDevSection = func() bool {
	var major, minor int
	_, err := fmt.Sscanf(UCXVersion(), "%d.%d", &major, &minor)
	return err == nil && (major > 1 || minor > 13)
}()

// The system-device section of a UCX after 1.13 (ucp_rkey_pack_memh), present only when the
// memory's system device is known:
//
//	sys_dev u8 | per device in the packer's device map, lowest first: sys_dev u8 | latency fp8 | bandwidth fp8 | terminator 255
//
// The sys_dev byte may carry a flush flag in bit 7 (UCP_SYS_DEVICE_FLUSH_BIT). The device map
// is 64 bits wide, so each distance names a device below 64, in increasing order, and a section
// holds at most 64 of them. UCX 1.22 packs the section for host memory too, as the one byte
// UCS_SYS_DEVICE_ID_UNKNOWN (255) and no distances. UCX 1.22's ucp_ep_rkey_unpack, which takes
// no length, reads that byte whether or not the key has it, and a device it does not know
// crashes it: over posix, a key without the section (the byte read past the key's end) or with
// a device id past the devices this UCX enumerated died with SIGSEGV in most runs
// (FuzzRemoteKey's seeds against the libucx-cu12 wheel). For a known device it reads 3-byte
// distance records until a byte 255 (the terminator the packer ends them with), with no
// bound: a section without it is read past the key's end. Where UCX reads distances it fills
// a table indexed by device (a device of 64 or more shifts a 64-bit map past its width). The
// first GPU run (device memory: GPU 0, one distance and the terminator) found the terminator,
// which this check had not known.
const (
	rkeySysDevUnknown   = 255    // UCS_SYS_DEVICE_ID_UNKNOWN, also the distances' terminator
	rkeySysDevFlush     = 1 << 7 // UCP_SYS_DEVICE_FLUSH_BIT
	rkeyDistanceBytes   = 3      // ucp_rkey_packed_distance_t
	rkeyMaxDistanceDevs = 64     // bits in ucp_sys_dev_map_t
)

// checkRKeySysDev checks what follows the md keys (at: its offset in the key): nothing where
// this UCX packs no system-device section (newer false), else nothing or a whole section.
func checkRKeySysDev(b []byte, at int, newer bool, devices int) error {
	switch {
	case !newer && len(b) == 0:
		return nil
	case !newer:
		return &RemoteKeyError{at, fmt.Sprintf("%d bytes after the last md's key", len(b))}
	case len(b) == 0:
		return &RemoteKeyError{at, "no system-device section (this UCX reads one past the key's end)"}
	case b[0] == rkeySysDevUnknown && len(b) > 1:
		return &RemoteKeyError{at + 1, "distances from an unknown device (UCX packs none)"}
	case b[0] == rkeySysDevUnknown:
		return nil
	case int(b[0]&^rkeySysDevFlush) >= devices:
		return &RemoteKeyError{at, fmt.Sprintf("system device %d, and this UCX knows %d (it looks the device up in its table)", b[0]&^rkeySysDevFlush, devices)}
	case b[len(b)-1] != rkeySysDevUnknown || len(b) == 1:
		return &RemoteKeyError{at + len(b), "device distances without the terminator (this UCX reads them until a byte 255, past the key's end)"}
	}
	recs := b[1 : len(b)-1]
	if len(recs)%rkeyDistanceBytes != 0 {
		return &RemoteKeyError{at + 1, fmt.Sprintf("%d bytes of device distances, not whole %d-byte records", len(recs), rkeyDistanceBytes)}
	}
	prev := -1
	for i := 0; i < len(recs); i += rkeyDistanceBytes {
		dev := int(recs[i])
		switch {
		case dev >= rkeyMaxDistanceDevs:
			return &RemoteKeyError{at + 1 + i, fmt.Sprintf("a distance to device %d, past the %d a device map holds", dev, rkeyMaxDistanceDevs)}
		case dev <= prev:
			return &RemoteKeyError{at + 1 + i, fmt.Sprintf("a distance to device %d after one to device %d (UCX packs them in increasing order, once each)", dev, prev)}
		}
		prev = dev
	}
	return nil
}

// rkeyUnpackRefused are the transports that pack no key and whose key this UCX refuses to
// unpack: after 1.13 (the 1.22 of GPU hosts) tcp's and cma's components fail any unpack with
// UCS_ERR_UNSUPPORTED, so a key naming their md fails the whole ucp_ep_rkey_unpack, where
// UCX 1.13 unpacked their empty keys (FuzzRemoteKey found it against the libucx-cu12 wheel:
// an empty key for the cma md).
var rkeyUnpackRefused = map[string]bool{"tcp": rkeySysDevSection, "cma": rkeySysDevSection}

// rkeyTransportOf is the one transport md i is, among those the peer's address lists on it.
func rkeyTransportOf(md *rkeyMD, i, at int) (rkeyTransport, error) {
	var t rkeyTransport
	for j, c := range md.csums {
		known, ok := rkeyLayouts[c]
		if !ok {
			return t, &RemoteKeyError{at, fmt.Sprintf("md %d is a transport (name checksum %#04x) whose keys this check does not know", i, c)}
		}
		if j > 0 && known.kind != t.kind {
			return t, &RemoteKeyError{at, fmt.Sprintf("md %d is both %s and %s in the peer's address", i, t.name, known.name)}
		}
		t = known
	}
	return t, nil
}

// checkTransportKey checks md i's transport key tl (at: its offset) against how transport t
// packs one, and returns the segment it names, if any. localDir is the directory this
// worker's own posix segments are named in (nil: procfs or shm_open).
func checkTransportKey(t rkeyTransport, tl []byte, i, at int, localDir []byte) (*keySegment, error) {
	bad := func(off int, format string, args ...any) error {
		return &RemoteKeyError{at + off, fmt.Sprintf("md %d (%s): ", i, t.name) + fmt.Sprintf(format, args...)}
	}
	switch t.kind {
	case rkeyEmpty:
		if len(tl) != 0 {
			return nil, bad(0, "a key of %d bytes, where the transport packs none", len(tl))
		}
		if rkeyUnpackRefused[t.name] {
			return nil, bad(0, "a key for %s, which this UCX refuses to unpack (it packs none for it)", t.name)
		}
		return nil, nil
	case rkeyCUDAIPC:
		return nil, checkCUDAIPCKey(tl, bad)
	case rkeyIB:
		if len(tl) != rkeyIBLen {
			return nil, bad(0, "a key of %d bytes, where the transport packs %d", len(tl), rkeyIBLen)
		}
		return nil, nil
	case rkeySysv:
		if len(tl) != rkeySysvLen {
			return nil, bad(0, "a key of %d bytes, where the transport packs %d", len(tl), rkeySysvLen)
		}
		shmid := binary.LittleEndian.Uint32(tl)
		if shmid > math.MaxInt32 {
			return nil, bad(0, "shmid %d is negative as the int UCX attaches", shmid)
		}
		return &keySegment{kind: rkeySysv, at: at, shmid: shmid, base: binary.LittleEndian.Uint64(tl[4:])}, nil
	}
	// posix
	if len(tl) < rkeyPosixLen {
		return nil, bad(0, "a key of %d bytes, fewer than the segment id, address and length", len(tl))
	}
	id, base, size := binary.LittleEndian.Uint64(tl), binary.LittleEndian.Uint64(tl[8:]), binary.LittleEndian.Uint64(tl[16:])
	s := &keySegment{kind: rkeyPosix, at: at, segID: id, base: base, size: size}
	extra := tl[rkeyPosixLen:]
	switch {
	case id&posixSegFlagProcLink != 0: // /proc/PID/fd/FD, with room for a pid namespace
		if len(extra) != 0 && len(extra) != rkeyPosixPIDNSLen {
			return nil, bad(rkeyPosixLen, "%d bytes after a procfs segment, where the transport packs 0 or %d", len(extra), rkeyPosixPIDNSLen)
		}
		if id&(1<<posixProcIDBits-1) == 0 {
			return nil, bad(0, "a procfs segment id with pid 0")
		}
	case id&posixSegFlagPIDNS != 0:
		return nil, bad(0, "segment id %#x: a pid namespace without procfs, which UCX never packs", id)
	case id&posixSegFlagShmOpen != 0: // /dev/shm/ucx_shm_posix_MMID
		if len(extra) != 0 {
			return nil, bad(rkeyPosixLen, "%d bytes after a shm_open segment, where the transport packs none", len(extra))
		}
	default: // DIR/ucx_shm_posix_MMID, DIR after the key
		dir, ok := bytes.CutSuffix(extra, []byte{0})
		if !ok || len(dir) == 0 || bytes.IndexByte(dir, 0) >= 0 {
			return nil, bad(rkeyPosixLen, "a segment named by path without a directory ending the key (UCX would read past it)")
		}
		if !bytes.Equal(dir, bytes.TrimRight(localDir, "\x00")) {
			return nil, bad(rkeyPosixLen, "segment directory %q, which is not this process's UCX_POSIX_DIR", dir)
		}
		s.dir = string(dir)
	}
	if size == 0 {
		return nil, bad(16, "a segment of length 0 (UCX asserts on it)")
	}
	if base+size < base {
		return nil, bad(8, "a segment at %#x of %d bytes wraps the address space", base, size)
	}
	return s, nil
}

// contains reports whether [addr, addr+n) lies inside [base, base+size), without overflow.
func contains(base, size, addr, n uint64) bool {
	if n == 0 || addr < base {
		return false
	}
	off := addr - base
	return off <= size && n <= size-off
}

// The cuda_ipc transport key of UCX 1.22 (src/uct/cuda/cuda_ipc/cuda_ipc_md.h,
// uct_cuda_ipc_rkey_t, and uct_cuda_ipc_extended_rkey_t where the packer runs in a pid
// namespace that is not the host's):
//
//	handle type u32 | pad | handle union (64: a legacy CUipcMemHandle, a fabric handle, or a
//	file descriptor and system id) | [fabric builds: pool export data (64) | pool (8)] |
//	buffer id u64 | pid i32 (bit 31: a pid namespace follows) | pad | allocation base u64 |
//	allocation length u64 | GPU uuid (16) | [pid namespace u32 | pad]
//
// A build with CUDA fabric handles (HAVE_CUDA_FABRIC, the wheel's) packs 192 or 200 bytes,
// one without 120 or 128. UCX's unpack copies the struct whatever the key's length, so the
// length is checked first; then the handle type: a legacy, VMM or memory-pool handle is
// opened by the CUDA driver, which checks it, but a POSIX file descriptor handle makes UCX
// take that descriptor out of the process the key names (pidfd_getfd on the key's pid and
// fd): a peer would choose which process of this host to take a descriptor from, so such a
// key is refused (kvxfer's pools are cudaMalloc'd: legacy handles).
const (
	cudaIPCHandleMempool = 3 // ..._MEMPOOL; 1 legacy, 2 VMM, 4 POSIX_FD
	cudaIPCHandlePosixFD = 4
	cudaIPCPIDNSFlag     = 1 << 31 // UCT_CUDA_IPC_RKEY_FLAG_PID_NS
)

// cudaIPCLayout is where a cuda_ipc key's fields lie, by the build that packed it.
type cudaIPCLayout struct{ size, pid, base int }

var cudaIPCLayouts = []cudaIPCLayout{
	{size: 192, pid: 152, base: 160}, // with fabric handles
	{size: 120, pid: 80, base: 88},   // without
}

// checkCUDAIPCKey checks a cuda_ipc transport key; bad makes the error at an offset in it.
func checkCUDAIPCKey(tl []byte, bad func(int, string, ...any) error) error {
	var l *cudaIPCLayout
	ext := false
	for i := range cudaIPCLayouts {
		switch len(tl) {
		case cudaIPCLayouts[i].size:
			l = &cudaIPCLayouts[i]
		case cudaIPCLayouts[i].size + 8:
			l, ext = &cudaIPCLayouts[i], true
		}
	}
	if l == nil {
		return bad(0, "a key of %d bytes, where the transport packs 120, 128, 192 or 200", len(tl))
	}
	switch ht := binary.LittleEndian.Uint32(tl); {
	case ht == cudaIPCHandlePosixFD:
		return bad(0, "a POSIX file descriptor handle: UCX would take the descriptor out of whichever process the key's pid names")
	case ht > cudaIPCHandleMempool:
		return bad(0, "handle type %d, which UCX does not pack", ht)
	}
	pid := binary.LittleEndian.Uint32(tl[l.pid:])
	if (pid&cudaIPCPIDNSFlag != 0) != ext {
		return bad(l.pid, "a pid namespace flag that does not match the key's %d bytes", len(tl))
	}
	if pid&^cudaIPCPIDNSFlag == 0 {
		return bad(l.pid, "pid 0")
	}
	base, size := binary.LittleEndian.Uint64(tl[l.base:]), binary.LittleEndian.Uint64(tl[l.base+8:])
	if size == 0 || base+size < base {
		return bad(l.base, "an allocation at %#x of %d bytes: empty or wrapping the address space", base, size)
	}
	return nil
}
