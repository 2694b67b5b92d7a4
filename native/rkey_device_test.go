// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

// The remote-key checks of what a UCX after 1.13 packs: the system-device section and the CUDA
// transports' keys (split from rkey_test.go, which holds the helpers they use).

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// The system-device section a UCX after 1.13 packs after the md keys (the memory's device, 255
// when unknown, then whole distance records to devices below 64 in increasing order) is taken
// where this UCX reads one (1.22), only with a device it knows, and nothing at all after the md
// keys where it packs none (1.13).
func TestRemoteKey_SystemDeviceSection(t *testing.T) {
	const devices = 4 // the system devices this UCX knows, for the test
	for _, c := range []struct {
		desc    string
		section []byte
		newer   bool   // taken by a UCX that reads the section
		reason  string // why, where refused
	}{
		{"the unknown device alone (UCX 1.22's host memory)", []byte{rkeySysDevUnknown}, true, ""},
		{"a known device, no distances, the terminator", []byte{0, rkeySysDevUnknown}, true, ""},
		{"a known device, one distance, the terminator (UCX 1.22's device memory on one GPU)", []byte{0, 0, 0x40, 0x80, rkeySysDevUnknown}, true, ""},
		{"a known device with the flush flag and two distances", []byte{rkeySysDevFlush | 3, 0, 0x40, 0x80, 63, 0x41, 0x81, rkeySysDevUnknown}, true, ""},
		{"none (UCX 1.22 reads a byte past the key)", nil, false, "no system-device section"},
		{"a known device without the terminator", []byte{0}, false, "without the terminator"},
		{"distances without the terminator", []byte{3, 0, 0x40, 0x80, 63, 0x41, 0x81}, false, "without the terminator"},
		{"a device this UCX does not know", []byte{devices, rkeySysDevUnknown}, false, "this UCX knows 4"},
		{"a device this UCX does not know, under the flush flag", []byte{rkeySysDevFlush | devices, rkeySysDevUnknown}, false, "this UCX knows 4"},
		{"distances from the unknown device", []byte{rkeySysDevUnknown, 1, 0, 0}, false, "unknown device"},
		{"a cut distance", []byte{3, 1, 0x40, rkeySysDevUnknown}, false, "not whole 3-byte records"},
		{"a distance to device 64", []byte{3, 64, 0, 0, rkeySysDevUnknown}, false, "past the 64"},
		{"distances out of order", []byte{3, 5, 0, 0, 2, 0, 0, rkeySysDevUnknown}, false, "increasing order"},
		{"a device twice", []byte{3, 5, 0, 0, 5, 0, 0, rkeySysDevUnknown}, false, "increasing order"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			err := checkRKeySysDev(c.section, 40, true, devices)
			if c.newer {
				require.NoError(t, err)
			} else {
				var ke *RemoteKeyError
				require.ErrorAs(t, err, &ke)
				require.ErrorIs(t, err, ErrBadRemoteKey)
				require.GreaterOrEqual(t, ke.Offset, 40)
				require.Contains(t, ke.Reason, c.reason)
			}
			err = checkRKeySysDev(c.section, 40, false, devices)
			if len(c.section) == 0 {
				require.NoError(t, err, "nothing after the md keys, as UCX 1.13 packs")
			} else {
				require.ErrorIs(t, err, ErrBadRemoteKey, "UCX 1.13 packs nothing after the md keys")
			}
		})
	}
}

// TestRemoteKey_CUDATransportKeys: the CUDA transports of UCX 1.22 (the libucx-cu12 wheel a GPU
// host runs) are keys this check knows: cuda_copy packs none, cuda_ipc its rkey struct, which
// is checked before UCX copies it (a key of another length would be read past), and whose POSIX
// file descriptor handle is refused (UCX would take a descriptor out of whichever process the
// key's pid names). The first GPU run (docs/gpu-results.md) found device keys refused as "a
// transport whose keys this check does not know".
func TestRemoteKey_CUDATransportKeys(t *testing.T) {
	for _, name := range []string{"cuda_copy", "cuda_ipc"} {
		_, ok := rkeyLayouts[crc16String(name)]
		require.True(t, ok, "%s is a transport whose keys the check knows", name)
	}
	key := func(l cudaIPCLayout, ext bool, handle, pid uint32, base, size uint64) []byte {
		n := l.size
		if ext {
			n += 8
			pid |= cudaIPCPIDNSFlag
		}
		b := make([]byte, n)
		binary.LittleEndian.PutUint32(b, handle)
		binary.LittleEndian.PutUint32(b[l.pid:], pid)
		binary.LittleEndian.PutUint64(b[l.base:], base)
		binary.LittleEndian.PutUint64(b[l.base+8:], size)
		return b
	}
	fabric, plain := cudaIPCLayouts[0], cudaIPCLayouts[1]
	flagOnly := key(fabric, false, 1, 4242, 1<<40, 1<<30)
	binary.LittleEndian.PutUint32(flagOnly[fabric.pid:], 4242|cudaIPCPIDNSFlag)
	for _, c := range []struct {
		desc   string
		tl     []byte
		reason string // "" where taken
	}{
		{"legacy handle, fabric build", key(fabric, false, 1, 4242, 1<<40, 1<<30), ""},
		{"legacy handle, fabric build, pid namespace", key(fabric, true, 1, 4242, 1<<40, 1<<30), ""},
		{"VMM handle, build without fabric", key(plain, false, 2, 4242, 1<<40, 1<<30), ""},
		{"memory pool handle, pid namespace, build without fabric", key(plain, true, 3, 4242, 1<<40, 1<<30), ""},
		{"no IPC (UCX finds it unreachable)", key(fabric, false, 0, 4242, 1<<40, 1<<30), ""},
		{"empty", nil, "a key of 0 bytes"},
		{"one byte short", key(fabric, false, 1, 4242, 1<<40, 1<<30)[:191], "a key of 191 bytes"},
		{"a POSIX file descriptor handle", key(fabric, false, 4, 4242, 1<<40, 1<<30), "POSIX file descriptor"},
		{"a handle type UCX does not pack", key(plain, false, 9, 4242, 1<<40, 1<<30), "handle type 9"},
		{"a pid namespace flag on the short key", flagOnly, "pid namespace flag"},
		{"pid 0", key(fabric, false, 1, 0, 1<<40, 1<<30), "pid 0"},
		{"an empty allocation", key(fabric, false, 1, 4242, 1<<40, 0), "empty or wrapping"},
		{"an allocation wrapping the address space", key(plain, false, 1, 4242, ^uint64(0)-10, 1<<20), "empty or wrapping"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			seg, err := checkTransportKey(rkeyTransport{"cuda_ipc", rkeyCUDAIPC}, c.tl, 5, 100, nil)
			require.Nil(t, seg, "a device key names no shared-memory segment")
			if c.reason == "" {
				require.NoError(t, err)
				return
			}
			var ke *RemoteKeyError
			require.ErrorAs(t, err, &ke)
			require.ErrorIs(t, err, ErrBadRemoteKey)
			require.GreaterOrEqual(t, ke.Offset, 100)
			require.Contains(t, ke.Reason, "md 5 (cuda_ipc)")
			require.Contains(t, ke.Reason, c.reason)
		})
	}
	seg, err := checkTransportKey(rkeyTransport{"cuda_copy", rkeyEmpty}, nil, 4, 100, nil)
	require.NoError(t, err, "cuda_copy packs no key")
	require.Nil(t, seg)
	_, err = checkTransportKey(rkeyTransport{"cuda_copy", rkeyEmpty}, []byte{1}, 4, 100, nil)
	require.ErrorIs(t, err, ErrBadRemoteKey)
}

// TestRemoteKey_OnlyHostKeysMapForInPlaceReads: after UCX unpacked a key, only host memory is
// read in place; a device key UCX "maps" (cuda_ipc's ucp_rkey_ptr is a device pointer) serves
// gets only, and a host key UCX maps where no segment bounds it is refused. The second GPU run
// refused every two-process device transfer as an unbound mapping.
func TestRemoteKey_OnlyHostKeysMapForInPlaceReads(t *testing.T) {
	key := func(memType byte) []byte { k := make([]byte, rkeyHeader); k[8] = memType; return k }
	bound := &keySegment{kind: rkeyPosix, size: 1 << 20, reachable: true}
	for _, c := range []struct {
		desc      string
		memType   byte
		ucxMapped bool
		seg       *keySegment
		mapped    bool
		refused   bool
	}{
		{"host, mapped over a checked segment", 0, true, bound, true, false},
		{"host, not mapped (tcp, cma)", 0, false, nil, false, false},
		{"host, mapped with no segment found", 0, true, nil, false, true},
		{"host, mapped over a segment UCX does not attach here", 0, true, &keySegment{kind: rkeyPosix, size: 1 << 20}, false, true},
		{"CUDA, mapped by cuda_ipc: gets only", 1, true, nil, false, false},
		{"CUDA managed, mapped: gets only", 2, true, nil, false, false},
		{"CUDA, not mapped (cuda_copy)", 1, false, nil, false, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			mapped, err := hostMapping(key(c.memType), c.ucxMapped, c.seg)
			require.Equal(t, c.mapped, mapped)
			if c.refused {
				require.ErrorIs(t, err, ErrBadRemoteKey)
			} else {
				require.NoError(t, err)
			}
		})
	}
}
