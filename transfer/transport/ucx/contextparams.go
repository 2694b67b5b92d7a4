// SPDX-License-Identifier: Apache-2.0

package ucx

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/kvxfer/kvxfer/layout"
	"github.com/kvxfer/kvxfer/transfer/internal/paramhooks"
	"github.com/kvxfer/kvxfer/transfer/internal/stale"
	"github.com/kvxfer/kvxfer/transfer/internal/wire"
	"github.com/kvxfer/kvxfer/transfer/transport"
)

// ErrBadMetadata: a ContextParams blob is malformed, corrupted, truncated, or from an
// incompatible version. Decoding it changed nothing.
var ErrBadMetadata = errors.New("kvxfer: bad context params")

// ErrStaleIncarnation: a ContextParams names a life of its sender that is over (the sender
// restarted, replaced its worker, or died), so its request cannot be served; the error names
// the peer, the incarnation the params carry and the current one. Checked before any transfer
// starts, so nothing waits out a deadline.
var ErrStaleIncarnation = stale.ErrStaleIncarnation

// ContextParams is what a prefill engine hands to decode, through the serving stack's own
// control plane, when a request's prefill is done: who to ask (the sender's UCX worker address
// and incarnation) and what to ask for (the request id, the sender's layout, selection and
// block ids). What RMA needs to read the sender's pool (its regions and packed remote keys)
// travels on the engines' own wire, not here. Encode with MarshalBinary; decode with
// UnmarshalContextParams.
//
// The blob is versioned and checksummed:
//
//	magic "KVXP" | version u16 (2 or 3) | flags u16 | length u32 (whole blob) | crc32c u32 (of the
//	whole blob with this field zero)
//	request u64 | incarnation u64 | layout 12 x i64 | selection 4 x i64
//	blocks u32 n, n x i32 | address u32 n, n bytes
//	[secret 16 bytes, when flags has contextParamsFlagSecret]
//	[exposure, when flags has contextParamsFlagExposure: pool address u64 | generation address u64 |
//	 generation u64 | key length u16 | generation key length u16 | region count u16 | reserved u16 = 0 |
//	 regions count x (address u64 | bytes u64) | key | generation key]
//	[nothing: flag contextParamsFlagAnonymous has no section of its own]
//	[key id 8 bytes | mac 32 bytes, when flags has contextParamsFlagMAC]
//
// all little-endian (docs/protocol.md, "ContextParams v3"). The optional sections follow in
// flag order. Params without them are written as version 2 (flags zero), which a decoder of the
// previous release reads; a version-3 blob without them, those bytes but for the version
// field, decodes too. A blob that sets an unknown flag is refused. (Version 1 also carried a list
// of registered regions that nothing filled; this build refuses it.) Decoding accepts exactly
// one encoding per value, so a decoded blob re-encodes to the same bytes.
//
// Decoding needs no key and checks no seal: with cluster keys, the receiver calls Verify (or
// transfer.Engine.VerifyParams, which counts what it refuses) before using the params, and the
// sender seals them with Sign (or Engine.SignParams) before MarshalBinary.
type ContextParams struct {
	// transport.RequestID names the request on both sides.
	RequestID transport.RequestID
	// Incarnation identifies one life of the sender's engine: a sender that restarts, or
	// replaces its worker, has a new one. The sender's Transport.CheckParams and the
	// receiver's discovery.CheckParams refuse params of a life that is over with
	// ErrStaleIncarnation, so requests meant for the old life fail at once instead of
	// waiting out a deadline or reaching the new one's memory.
	Incarnation uint64
	// WorkerAddress is the sender's UCX worker address (native.Worker.Address).
	WorkerAddress []byte
	// Layout, Selection and Blocks are the sender's plan of the request (layout.NewPlan).
	Layout    layout.Layout
	Selection layout.Selection
	Blocks    []int32
	// Secret is the request's capability (section Secret): nil, or 16
	// random bytes the sender's engine drew for this request. Whoever holds the blob holds the
	// secret; it never travels on the engines' wire.
	Secret []byte
	// exposure (section Exposure, flag 2) is what a one-hop read of the request needs: nil, or
	// the sender's pool as its RMA registration names it (docs/protocol.md, "One-hop reads").
	// It needs a Secret. The encoder and the decoder check its bounds: the keys' sizes
	// (wire.MaxRMAKey), 1 to 16 regions, sorted and disjoint, each inside the layout's pool,
	// no address that wraps.
	exposure *transport.Exposure
	// anonymous (flag 4) says the sender named no receiver (transfer.Engine.Expose): the
	// first receiver that proves Secret claims the request. It needs a Secret.
	anonymous bool
	// seal is the cluster key's MAC over the blob (section MAC): nil when unsigned. Sign sets
	// it, Verify checks it; any change to the params after Sign makes Verify refuse them.
	seal *paramsSeal
}

// Package transfer's tests reach the sections a program never sets through paramhooks.
func init() {
	h := &paramhooks.Hooks
	h.Exposure = func(cp any) *transport.Exposure { return cp.(*ContextParams).exposure }
	h.Anonymous = func(cp any) bool { return cp.(*ContextParams).anonymous }
	h.SetAnonymous = func(cp any, anonymous bool) { cp.(*ContextParams).anonymous = anonymous }
	h.Sealed = func(cp any) bool { return cp.(*ContextParams).seal != nil }
	h.CopySeal = func(dst, src any) { dst.(*ContextParams).seal = src.(*ContextParams).seal }
}

// paramsSeal is a ContextParams blob's MAC section: the id of the cluster key that signed it
// (the first 8 bytes of the key's SHA-256) and HMAC-SHA256, under a key derived from it by
// HKDF-SHA256 with the label "kvxfer params v3", over the whole blob with the mac and the
// checksum zero.
type paramsSeal struct {
	KeyID [wire.KeyIDBytes]byte
	MAC   [wire.MACBytes]byte
}

// Bounds of the format, generous for real use and small enough that a hostile length cannot
// make the decoder allocate much.
const (
	// contextParamsVersion is the newest format version this package reads and writes: a blob
	// with a section (Secret, Seal) is written in it.
	contextParamsVersion = 3
	// contextParamsMinVersion is the oldest version this package reads (2: no flags), and the
	// one it writes params without sections in, so a decoder of the previous release reads
	// them.
	contextParamsMinVersion = 2
	// contextParamsFlagSecret announces the Secret section.
	contextParamsFlagSecret = 1
	// contextParamsFlagExposure announces the Exposure section.
	contextParamsFlagExposure = 2
	// contextParamsFlagAnonymous announces that the sender named no receiver (Anonymous).
	contextParamsFlagAnonymous = 4
	// contextParamsFlagMAC announces the MAC section (Seal).
	contextParamsFlagMAC = 8
	// contextParamsSealBytes is the size of the MAC section: key id and mac.
	contextParamsSealBytes = wire.SealBytes
	// contextParamsMaxBlocks bounds the block list (a 1M-token request at 16 tokens a block).
	contextParamsMaxBlocks = 1 << 16
	// contextParamsMaxRegions bounds an Exposure's regions.
	contextParamsMaxRegions = 16
	// contextParamsExposureFixed is the Exposure section but for its regions and keys.
	contextParamsExposureFixed = 8 + 8 + 8 + 2 + 2 + 2 + 2
	// contextParamsMaxExposure bounds the Exposure section: its regions and its two keys at
	// their bounds (wire.MaxRMAKey, as in an RMA offer).
	contextParamsMaxExposure = contextParamsExposureFixed + 16*contextParamsMaxRegions + 2*wire.MaxRMAKey

	cpMagic      = "KVXP"
	cpHeaderSize = 16
	cpCRCOffset  = 12
)

var cpCRCTable = crc32.MakeTable(crc32.Castagnoli)

// Plan rebuilds the sender's plan, validating the layout, selection and block ids.
func (c *ContextParams) Plan() (*layout.Plan, error) {
	return layout.NewPlan(c.Layout, c.Selection, c.Blocks)
}

// Validate checks everything MarshalBinary and UnmarshalContextParams require: a valid plan,
// a worker address, and the format's bounds. The error matches ErrBadMetadata and names the
// field.
func (c *ContextParams) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrBadMetadata, field, fmt.Sprintf(format, args...))
	}
	switch {
	case len(c.WorkerAddress) == 0:
		return bad("WorkerAddress", "empty")
	case len(c.WorkerAddress) > wire.ParamsMaxAddress:
		return bad("WorkerAddress", "%d bytes, at most %d", len(c.WorkerAddress), wire.ParamsMaxAddress)
	case len(c.Blocks) > contextParamsMaxBlocks:
		return bad("Blocks", "%d blocks, at most %d", len(c.Blocks), contextParamsMaxBlocks)
	case c.Secret != nil && len(c.Secret) != wire.ParamsSecretBytes:
		return bad("Secret", "%d bytes, want %d or none", len(c.Secret), wire.ParamsSecretBytes)
	case c.anonymous && c.Secret == nil:
		return bad("Anonymous", "params that name no receiver need a Secret")
	case c.exposure != nil && c.Secret == nil:
		return bad("Exposure", "params a receiver reads at once need a Secret to end the read with")
	}
	if _, err := c.Plan(); err != nil {
		return fmt.Errorf("%w: plan: %w", ErrBadMetadata, err)
	}
	if c.exposure != nil {
		return checkExposure(c.exposure, c.Layout.SpanBytes())
	}
	return nil
}

// checkExposure is the Exposure section's bounds, for a pool of span bytes (a valid layout's).
func checkExposure(x *transport.Exposure, span int64) error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: Exposure.%s: %s", ErrBadMetadata, field, fmt.Sprintf(format, args...))
	}
	switch {
	case len(x.Key) == 0 || len(x.Key) > wire.MaxRMAKey:
		return bad("Key", "%d bytes, want 1 to %d", len(x.Key), wire.MaxRMAKey)
	case len(x.GenKey) == 0 || len(x.GenKey) > wire.MaxRMAKey:
		return bad("GenKey", "%d bytes, want 1 to %d: a one-hop read is always checked against its generation word", len(x.GenKey), wire.MaxRMAKey)
	case x.GenAddr > math.MaxUint64-8:
		return bad("GenAddr", "a word at %#x wraps around", x.GenAddr)
	case span <= 0 || x.Addr > math.MaxUint64-uint64(span):
		return bad("Addr", "a %d-byte pool at %#x wraps around", span, x.Addr)
	case len(x.Regions) == 0 || len(x.Regions) > contextParamsMaxRegions:
		return bad("Regions", "%d regions, want 1 to %d", len(x.Regions), contextParamsMaxRegions)
	}
	next := x.Addr // regions are sorted and disjoint: each starts at or after the last's end
	for i, r := range x.Regions {
		at, n := r[0], r[1]
		switch {
		case n == 0:
			return bad("Regions", "region %d is empty", i)
		case at < next:
			return bad("Regions", "region %d at %#x starts before %#x (the pool's start or the last region's end)", i, at, next)
		case at-x.Addr > uint64(span) || n > uint64(span)-(at-x.Addr):
			return bad("Regions", "region %d [%#x, +%d) leaves the %d-byte pool at %#x", i, at, n, span, x.Addr)
		}
		next = at + n // inside the pool, which does not wrap
	}
	return nil
}

// MarshalBinary encodes the params after validating them.
func (c *ContextParams) MarshalBinary() ([]byte, error) {
	out, err := c.encode(c.seal)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(out[cpCRCOffset:], crc32.Checksum(out, cpCRCTable))
	return out, nil
}

// encode is MarshalBinary with the given seal and the checksum left zero.
func (c *ContextParams) encode(seal *paramsSeal) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.encodeUnchecked(seal)
}

// encodeUnchecked writes the params as they are, valid or not (encode checks them first), into
// one buffer of their exact size: the prefill encodes each request's params, so the encoder
// allocates nothing else (TestContextParams_CodecAllocations).
func (c *ContextParams) encodeUnchecked(seal *paramsSeal) ([]byte, error) {
	le := binary.LittleEndian
	var flags uint16
	n := cpHeaderSize + 16 + 16*8 + 4 + 4*len(c.Blocks) + 4 + len(c.WorkerAddress) + len(c.Secret)
	if c.Secret != nil {
		flags |= contextParamsFlagSecret
	}
	if x := c.exposure; x != nil {
		flags |= contextParamsFlagExposure
		n += contextParamsExposureFixed + 16*len(x.Regions) + len(x.Key) + len(x.GenKey)
	}
	if c.anonymous {
		flags |= contextParamsFlagAnonymous
	}
	if seal != nil {
		flags |= contextParamsFlagMAC
		n += contextParamsSealBytes
	}
	version := uint16(contextParamsVersion)
	if flags == 0 {
		version = contextParamsMinVersion // the oldest format that carries them (docs/deploy.md, section 7)
	}
	b := make([]byte, 0, n)
	b = append(b, cpMagic...)
	b = le.AppendUint16(b, version)
	b = le.AppendUint16(b, flags)
	b = le.AppendUint32(b, 0) // length, patched below
	b = le.AppendUint32(b, 0) // crc, patched by MarshalBinary
	b = le.AppendUint64(b, uint64(c.RequestID))
	b = le.AppendUint64(b, c.Incarnation)
	l := c.Layout
	for _, v := range [...]int64{l.NumLayers, l.KVFactor, l.NumHeads, l.HeadDim, l.ElemSize, l.TokensPerBlock,
		l.NumBlocks, l.StrideBlock, l.StrideLayer, l.StrideKV, l.StrideHead, l.StrideToken} {
		b = le.AppendUint64(b, uint64(v))
	}
	s := c.Selection
	for _, v := range [...]int64{s.LayerBegin, s.LayerEnd, s.HeadBegin, s.HeadEnd} {
		b = le.AppendUint64(b, uint64(v))
	}
	b = le.AppendUint32(b, uint32(len(c.Blocks)))
	for _, v := range c.Blocks {
		b = le.AppendUint32(b, uint32(v))
	}
	b = le.AppendUint32(b, uint32(len(c.WorkerAddress)))
	b = append(b, c.WorkerAddress...)
	b = append(b, c.Secret...)
	if x := c.exposure; x != nil {
		b = le.AppendUint64(b, x.Addr)
		b = le.AppendUint64(b, x.GenAddr)
		b = le.AppendUint64(b, x.Generation)
		b = le.AppendUint16(b, uint16(len(x.Key)))
		b = le.AppendUint16(b, uint16(len(x.GenKey)))
		b = le.AppendUint16(b, uint16(len(x.Regions)))
		b = le.AppendUint16(b, 0) // reserved
		for _, r := range x.Regions {
			b = le.AppendUint64(b, r[0])
			b = le.AppendUint64(b, r[1])
		}
		b = append(b, x.Key...)
		b = append(b, x.GenKey...)
	}
	if seal != nil {
		b = append(b, seal.KeyID[:]...)
		b = append(b, seal.MAC[:]...)
	}
	le.PutUint32(b[8:], uint32(len(b)))
	return b, nil
}

// OneHop is what a one-hop read of these params needs (transfer.Spec.Params): their Exposure
// section and the sender's plan, or nil, nil without the section.
func (c *ContextParams) OneHop() (*transport.Exposure, *layout.Plan, error) {
	if c.exposure == nil {
		return nil, nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	p, err := c.Plan()
	return c.exposure, p, err
}

// Sign seals the params with the first of keys (cluster keys, as transfer.Config.ClusterKeys):
// it seals them with the MAC of their encoding. Sign last: any change after it makes Verify refuse
// the params. An error (no keys, or keys that are not ClusterKeyBytes each and all different,
// or invalid params) matches ErrBadMetadata for the params and names the keys otherwise.
func (c *ContextParams) Sign(keys [][]byte) error {
	ring, err := paramsRing(keys)
	if err != nil {
		return err
	}
	if ring == nil {
		return errors.New("kvxfer: signing context params: no cluster key")
	}
	b, err := c.encode(&paramsSeal{})
	if err != nil {
		return err
	}
	ring.SealParams(b)
	s := &paramsSeal{}
	copy(s.KeyID[:], b[len(b)-contextParamsSealBytes:])
	copy(s.MAC[:], b[len(b)-wire.MACBytes:])
	c.seal = s
	return nil
}

// Verify checks the params' seal against keys (any of them may have signed; none: nothing is
// checked and Verify returns nil). Params with no seal, sealed under a key not among keys, or
// whose encoding is not what was sealed (a request id, block, address, incarnation or secret
// changed, or a seal copied from other params) are refused with an *transport.AuthError (What
// "params", Peer the sender they name) matching transport.ErrUnauthenticated. Keys that make no
// keyring are an error of their own.
func (c *ContextParams) Verify(keys [][]byte) error {
	ring, err := paramsRing(keys)
	if err != nil || ring == nil {
		return err
	}
	refuse := func(r transport.AuthRefusal) error {
		return &transport.AuthError{Peer: PeerFromAddress(c.WorkerAddress), What: "params", Reason: r}
	}
	if c.seal == nil {
		return refuse(transport.AuthUnsealed)
	}
	b, err := c.encode(c.seal)
	if err != nil {
		return err
	}
	switch err := ring.OpenParams(b); {
	case err == nil:
		return nil
	case errors.Is(err, wire.ErrUnknownKey):
		return refuse(transport.AuthUnknownKey)
	default:
		return refuse(transport.AuthBadMAC)
	}
}

func paramsRing(keys [][]byte) (*wire.Keyring, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	ring, err := wire.NewKeyring(keys)
	if err != nil {
		return nil, fmt.Errorf("kvxfer: cluster keys for context params: %w", err)
	}
	return ring, nil
}

// cpReader reads the body with bounds checks; the first failure sticks.
type cpReader struct {
	b   []byte
	err error
}

// take's slice has no room past its n bytes, so an append to it never writes into what follows.
func (r *cpReader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: truncated in %s: need %d bytes, %d left", ErrBadMetadata, what, n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *cpReader) u16(what string) uint16 {
	if v := r.take(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *cpReader) u32(what string) uint32 {
	if v := r.take(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *cpReader) u64(what string) uint64 {
	if v := r.take(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// exposure reads the Exposure section's structure (its bounds are Validate's). The lengths
// are checked against their bounds before anything is taken for them.
func (r *cpReader) exposure() *transport.Exposure {
	x := &transport.Exposure{Addr: r.u64("exposure"), GenAddr: r.u64("exposure"), Generation: r.u64("exposure")}
	nk, ngk, nr, reserved := int(r.u16("exposure")), int(r.u16("exposure")), int(r.u16("exposure")), r.u16("exposure")
	switch {
	case r.err != nil:
	case nk > wire.MaxRMAKey || ngk > wire.MaxRMAKey || nr > contextParamsMaxRegions:
		r.err = fmt.Errorf("%w: exposure of %d regions, a %d-byte key and a %d-byte generation key: at most %d regions and %d-byte keys",
			ErrBadMetadata, nr, nk, ngk, contextParamsMaxRegions, wire.MaxRMAKey)
	case reserved != 0:
		r.err = fmt.Errorf("%w: exposure's reserved field is %#x, want 0", ErrBadMetadata, reserved)
	}
	if r.err != nil {
		return nil
	}
	if nr > 0 {
		x.Regions = make([][2]uint64, nr)
		for i := range x.Regions {
			x.Regions[i] = [2]uint64{r.u64("exposure region"), r.u64("exposure region")}
		}
	}
	if nk > 0 {
		x.Key = r.take(nk, "exposure key")
	}
	if ngk > 0 {
		x.GenKey = r.take(ngk, "exposure generation key")
	}
	return x
}

// UnmarshalContextParams decodes a blob made by MarshalBinary. Anything else (garbage, a
// truncated or corrupted blob, another version) returns an error matching ErrBadMetadata and
// a nil result: nothing is decoded in part.
func UnmarshalContextParams(blob []byte) (*ContextParams, error) {
	if len(blob) < cpHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadMetadata, len(blob), cpHeaderSize)
	}
	le := binary.LittleEndian
	if string(blob[:4]) != cpMagic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrBadMetadata, blob[:4], cpMagic)
	}
	version, flags := le.Uint16(blob[4:]), le.Uint16(blob[6:])
	if version < contextParamsMinVersion || version > contextParamsVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads versions %d to %d", ErrBadMetadata, version, contextParamsMinVersion, contextParamsVersion)
	}
	known := uint16(contextParamsFlagSecret | contextParamsFlagExposure | contextParamsFlagAnonymous | contextParamsFlagMAC)
	if version == 2 {
		known = 0
	}
	if flags&^known != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x in version %d", ErrBadMetadata, flags&^known, version)
	}
	if n := le.Uint32(blob[8:]); int64(n) != int64(len(blob)) {
		return nil, fmt.Errorf("%w: header says %d bytes, blob has %d", ErrBadMetadata, n, len(blob))
	}
	want := le.Uint32(blob[cpCRCOffset:])
	// The params' byte fields (address, secret, the exposure's keys) are slices of this one
	// copy of the blob, which nothing else holds: one allocation for all of them.
	own := append([]byte(nil), blob...)
	le.PutUint32(own[cpCRCOffset:], 0)
	if got := crc32.Checksum(own, cpCRCTable); got != want {
		return nil, fmt.Errorf("%w: checksum %#08x, computed %#08x", ErrBadMetadata, want, got)
	}

	r := &cpReader{b: own[cpHeaderSize:]}
	c := &ContextParams{}
	c.RequestID = transport.RequestID(r.u64("request id"))
	c.Incarnation = r.u64("incarnation")
	var lv [12]int64
	for i := range lv {
		lv[i] = int64(r.u64("layout"))
	}
	c.Layout = layout.Layout{NumLayers: lv[0], KVFactor: lv[1], NumHeads: lv[2], HeadDim: lv[3], ElemSize: lv[4],
		TokensPerBlock: lv[5], NumBlocks: lv[6], StrideBlock: lv[7], StrideLayer: lv[8], StrideKV: lv[9],
		StrideHead: lv[10], StrideToken: lv[11]}
	var sv [4]int64
	for i := range sv {
		sv[i] = int64(r.u64("selection"))
	}
	c.Selection = layout.Selection{LayerBegin: sv[0], LayerEnd: sv[1], HeadBegin: sv[2], HeadEnd: sv[3]}
	nb := r.u32("block count")
	if r.err == nil && nb > contextParamsMaxBlocks {
		return nil, fmt.Errorf("%w: %d blocks, at most %d", ErrBadMetadata, nb, contextParamsMaxBlocks)
	}
	if raw := r.take(int(nb)*4, "blocks"); raw != nil {
		c.Blocks = make([]int32, nb)
		for i := range c.Blocks {
			c.Blocks[i] = int32(le.Uint32(raw[4*i:]))
		}
	}
	na := r.u32("address length")
	if r.err == nil && na > wire.ParamsMaxAddress {
		return nil, fmt.Errorf("%w: %d-byte address, at most %d", ErrBadMetadata, na, wire.ParamsMaxAddress)
	}
	c.WorkerAddress = r.take(int(na), "worker address")
	if flags&contextParamsFlagSecret != 0 {
		c.Secret = r.take(wire.ParamsSecretBytes, "secret")
	}
	if flags&contextParamsFlagExposure != 0 {
		if c.exposure = r.exposure(); r.err != nil {
			return nil, r.err
		}
	}
	c.anonymous = flags&contextParamsFlagAnonymous != 0
	if flags&contextParamsFlagMAC != 0 {
		c.seal = &paramsSeal{}
		copy(c.seal.KeyID[:], r.take(wire.KeyIDBytes, "key id"))
		copy(c.seal.MAC[:], r.take(wire.MACBytes, "mac"))
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrBadMetadata, len(r.b))
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// PeerFromAddress names the peer at a UCX worker address, as Transport does. The peer a
// ContextParams came from is PeerFromAddress(cp.WorkerAddress): pass it as transfer.Spec.Peer of
// the Receive. A sender that restarted has a new worker address, hence a new peer, so nothing
// meant for its old life reaches the new one.
func PeerFromAddress(addr []byte) transport.Peer { return transport.Peer(hex.EncodeToString(addr)) }
