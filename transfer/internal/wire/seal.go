// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
)

// Cluster keys (docs/protocol.md, "The cluster key"). With keys set, every hello, hello
// challenge and proof ends in a seal, `key id [8] | mac [32]`: the id names the key (the first 8
// bytes of its SHA-256), and the mac is HMAC-SHA256, under a key derived from it by HKDF-SHA256
// with the label "kvxfer hello v4", over the whole message with the mac zero. A sealed message
// is its unsealed layout followed by the seal, so its size says whether it carries one; a
// wire-3 engine refuses a sealed message as malformed, and sends none.
//
// The same keyring seals ContextParams blobs (SealParams, OpenParams), with a key derived under
// its own label, "kvxfer params v3", so neither kind of seal ever opens as the other.

// Sizes of a seal and its parts.
const (
	KeyIDBytes      = 8
	MACBytes        = sha256.Size
	SealBytes       = KeyIDBytes + MACBytes
	ClusterKeyBytes = 32
	helloMACLabel   = "kvxfer hello v4"
	paramsMACLabel  = "kvxfer params v3"
)

// Seal is a message's MAC trailer; the zero Seal is no seal.
type Seal struct {
	Sealed bool
	KeyID  [KeyIDBytes]byte
	MAC    [MACBytes]byte
}

func (s Seal) append(b []byte) []byte {
	if !s.Sealed {
		return b
	}
	return append(append(b, s.KeyID[:]...), s.MAC[:]...)
}

// openSeal splits a message of the given unsealed size from its seal, if it has one.
func openSeal(b []byte, size int, what string) (Seal, []byte, error) {
	switch len(b) {
	case size:
		return Seal{}, b, nil
	case size + SealBytes:
		s := Seal{Sealed: true}
		copy(s.KeyID[:], b[size:])
		copy(s.MAC[:], b[size+KeyIDBytes:])
		return s, b[:size], nil
	}
	return Seal{}, nil, malformed(min(len(b), size), "%s of %d bytes, want %d, or %d sealed", what, len(b), size, size+SealBytes)
}

// Keyring holds an engine's cluster keys: the first seals, every one opens.
type Keyring struct {
	keys []ringKey
}

type ringKey struct {
	id     [KeyIDBytes]byte
	mac    []byte // derived for hello MACs
	params []byte // derived for ContextParams MACs
}

// NewKeyring derives the MAC keys from keys, each ClusterKeyBytes long and all different.
func NewKeyring(keys [][]byte) (*Keyring, error) {
	r := &Keyring{}
	for i, k := range keys {
		if len(k) != ClusterKeyBytes {
			return nil, fmt.Errorf("key %d is %d bytes, want %d", i, len(k), ClusterKeyBytes)
		}
		sum := sha256.Sum256(k)
		rk := ringKey{}
		copy(rk.id[:], sum[:KeyIDBytes])
		for j, o := range r.keys {
			if o.id == rk.id {
				return nil, fmt.Errorf("key %d repeats key %d", i, j)
			}
		}
		mk, err := hkdf.Key(sha256.New, k, nil, helloMACLabel, MACBytes)
		if err != nil {
			return nil, err
		}
		pk, err := hkdf.Key(sha256.New, k, nil, paramsMACLabel, MACBytes)
		if err != nil {
			return nil, err
		}
		rk.mac, rk.params = mk, pk
		r.keys = append(r.keys, rk)
	}
	return r, nil
}

// SealMessage encodes m (a Hello, HelloChallenge or HelloProof; any other kind is encoded
// as it is) sealed with the first key.
func (r *Keyring) SealMessage(m Message) []byte {
	k := r.keys[0]
	s := Seal{Sealed: true, KeyID: k.id}
	switch m := m.(type) {
	case *Hello:
		c := *m
		c.Seal = s
		return k.sign(Encode(&c))
	case *HelloChallenge:
		c := *m
		c.Seal = s
		return k.sign(Encode(&c))
	case *HelloProof:
		c := *m
		c.Seal = s
		return k.sign(Encode(&c))
	}
	return Encode(m)
}

// sign fills the mac of b, sealed with a zero mac.
func (k ringKey) sign(b []byte) []byte { return signWith(k.mac, b) }

func signWith(key, b []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(b)
	copy(b[len(b)-MACBytes:], h.Sum(nil))
	return b
}

// SealParams seals a ContextParams blob (docs/protocol.md, "ContextParams v3"): b ends in its
// seal, `key id [8] | mac [32]`, and its checksum field is zero (the caller fills it after).
// SealParams writes the first key's id and the mac, HMAC-SHA256 under the key derived with the
// label "kvxfer params v3" over b with the mac zero. The label keeps a params mac from ever
// passing for a hello's, and the other way.
func (r *Keyring) SealParams(b []byte) {
	k := r.keys[0]
	copy(b[len(b)-SealBytes:], k.id[:])
	clear(b[len(b)-MACBytes:])
	signWith(k.params, b)
}

// OpenParams checks a ContextParams blob's seal: b ends in the seal and its checksum field is
// zero. Nil when a key of the ring made it, else ErrUnsealed (b too short to hold one),
// ErrUnknownKey or ErrBadMAC. b is not modified.
func (r *Keyring) OpenParams(b []byte) error {
	if len(b) < SealBytes {
		return ErrUnsealed
	}
	seal := Seal{Sealed: true}
	copy(seal.KeyID[:], b[len(b)-SealBytes:])
	copy(seal.MAC[:], b[len(b)-MACBytes:])
	for _, k := range r.keys {
		if k.id != seal.KeyID {
			continue
		}
		c := append([]byte(nil), b...)
		if !hmac.Equal(signWith(k.params, clearMAC(c))[len(c)-MACBytes:], seal.MAC[:]) {
			return ErrBadMAC
		}
		return nil
	}
	return ErrUnknownKey
}

func clearMAC(b []byte) []byte {
	clear(b[len(b)-MACBytes:])
	return b
}

// Why a sealed message did not open.
var (
	ErrUnsealed   = errors.New("no seal")
	ErrUnknownKey = errors.New("sealed with a key this engine does not hold")
	ErrBadMAC     = errors.New("its mac does not match")
)

// Open checks the seal of b, whose decoding carries seal: nil when a key of the ring made it,
// else ErrUnsealed, ErrUnknownKey or ErrBadMAC.
func (r *Keyring) Open(b []byte, seal Seal) error {
	if !seal.Sealed || len(b) < SealBytes {
		return ErrUnsealed
	}
	for _, k := range r.keys {
		if k.id != seal.KeyID {
			continue
		}
		c := append([]byte(nil), b...)
		clear(c[len(c)-MACBytes:])
		h := hmac.New(sha256.New, k.mac)
		h.Write(c)
		if !hmac.Equal(h.Sum(nil), seal.MAC[:]) {
			return ErrBadMAC
		}
		return nil
	}
	return ErrUnknownKey
}
