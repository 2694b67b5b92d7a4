// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// UCX tags: the top 4 bits say what a message is, so the control receive's mask never
// matches data. A data tag carries 28 bits of a hash of (sender, request, sub-transfer,
// nonce) and the 32-bit chunk sequence. 28 bits collide: among 10,000 live transfers on one
// worker, two share a hash with a chance near 17%. So a receiving transfer reserves its hash
// (ReserveTags) before it posts, and a hash that another live transfer holds, or that drain
// receives of a cancelled one still watch, is refused with transport.ErrTagCollision: the engine draws
// another nonce, which moves the hash. Two live transfers therefore never share tags, and a
// late chunk of an old transfer meets either a drain or no receive at all for as long as the
// drains last (Config.drainTimeout); past that, the staging path's chunk header still
// carries the nonce and is checked.
const (
	ucxKindShift = 60
	ucxKindData  = uint64(1) << ucxKindShift
	ucxKindCtrl  = uint64(2) << ucxKindShift
	ucxKindMask  = uint64(0xf) << ucxKindShift
	ucxSeqMask   = uint64(0xffffffff) // a data tag's chunk sequence
)

func ucxDataTag(sender transport.Peer, tag transport.Tag) uint64 {
	h := fnv.New32a()
	h.Write([]byte(sender))
	var b [18]byte
	binary.LittleEndian.PutUint64(b[:], uint64(tag.Request))
	binary.LittleEndian.PutUint16(b[8:], tag.Sub)
	binary.LittleEndian.PutUint64(b[10:], tag.Nonce)
	h.Write(b[:])
	return ucxKindData | uint64(h.Sum32()&0x0fffffff)<<32 | uint64(tag.Seq)
}

// ucxTagHash is the part of a data tag that names the transfer, whatever its kind bits.
func ucxTagHash(tag uint64) uint64 { return tag &^ ucxKindMask &^ ucxSeqMask }

// ucxTagOwner is the transfer a reserved hash belongs to.
type ucxTagOwner struct {
	from    transport.Peer
	request transport.RequestID
	sub     uint16
	nonce   uint64
}

// ReserveTags implements transport.TagReserver: it reserves the hash of the receive's data tags from
// peer, or fails with transport.ErrTagCollision if another transfer's receives or drains hold it.
func (t *ucxTransport) ReserveTags(from transport.Peer, tag transport.Tag) (func(), error) {
	owner := ucxTagOwner{from, tag.Request, tag.Sub, tag.Nonce}
	hash := ucxTagHash(ucxDataTag(from, tag))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, transport.ErrClosed
	}
	if held, ok := t.tagOwners[hash]; ok && held != owner {
		return nil, fmt.Errorf("%w: tag hash %#x of request %d held by request %d", transport.ErrTagCollision, hash>>32, tag.Request, held.request)
	}
	if t.drainingLocked(hash) {
		return nil, fmt.Errorf("%w: tag hash %#x of request %d is drained for a cancelled transfer", transport.ErrTagCollision, hash>>32, tag.Request)
	}
	t.tagOwners[hash] = owner
	return func() {
		t.mu.Lock()
		if t.tagOwners[hash] == owner {
			delete(t.tagOwners, hash)
		}
		t.mu.Unlock()
	}, nil
}

// drainingLocked reports whether drain receives watch tags of hash.
func (t *ucxTransport) drainingLocked(hash uint64) bool {
	return len(t.drains[ucxKindData|hash]) > 0 || len(t.drains[ucxKindDevHeader|hash]) > 0
}
