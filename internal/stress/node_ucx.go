// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"github.com/kvxfer/kvxfer/internal/cmastats"
	"github.com/kvxfer/kvxfer/internal/transportimpl"
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// ucxTracked is a UCX transport with the soak's slot checks: it embeds the implementation behind
// *ucx.Transport (internal/transportimpl, what transfer.New drives), as ucxContract, so the
// engine finds every optional capability a serving process's engine finds (the pull wire's
// generation words, reads in place, RMA emulation, tag reservation, lanes, pool holds...),
// and runs the paths a serving process runs. Wrapping it in slotTracker alone would hide
// them, and the peer-process soak once moved every request by plain staging because of it.
// Only the posts that carry a buffer are checked.
type ucxTracked struct {
	ucxContract
	slots *slotTracker
}

// ucxContract is every capability the UCX transport's implementation offers the engine
// (TestUCXTracked_KeepsEveryCapabilityTheEngineAsksFor holds the list complete).
type ucxContract interface {
	transport.DeviceRMATransport
	transport.RMAEmulation
	transport.RMAKeyPreparer
	transport.RMAMapper
	transport.RMALanes
	transport.RMAGenerations
	transport.GenerationWords
	transport.PoolHolder
	transport.TagReserver
	transport.TransportHealth
	transport.ControlBound
	transport.LargeSegmentSender
	transport.PeerCloser
	transport.ParamsIssuer
}

var (
	_ transport.RMATransport    = (*ucxTracked)(nil)
	_ transport.TransportHealth = (*ucxTracked)(nil)
)

func newUCXTracked(tr *ucx.Transport, slotBytes int64) *ucxTracked {
	return &ucxTracked{ucxContract: transportimpl.Of(tr).(ucxContract), slots: newSlotTracker(tr, tr.StagingMemory(), slotBytes)}
}

// PostSend implements transfer.Transport: a staging slot's send, checked.
func (u *ucxTracked) PostSend(to transfer.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	u.slots.check("send", tag, buf)
	return u.ucxContract.PostSend(to, tag, buf, done)
}

// PostRecv implements transfer.Transport: a staging slot's receive, checked.
func (u *ucxTracked) PostRecv(from transfer.Peer, tag transport.Tag, buf []byte, done func(transport.Completion)) (transport.OpID, error) {
	u.slots.check("receive", tag, buf)
	return u.ucxContract.PostRecv(from, tag, buf, done)
}

// PostSendIOV implements transport.DirectTransport: never staging memory.
func (u *ucxTracked) PostSendIOV(to transfer.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	u.slots.checkDirect("direct send", tag, iov...)
	return u.ucxContract.PostSendIOV(to, tag, iov, done)
}

// PostRecvIOV implements transport.DirectTransport: never staging memory.
func (u *ucxTracked) PostRecvIOV(from transfer.Peer, tag transport.Tag, iov [][]byte, done func(transport.Completion)) (transport.OpID, error) {
	u.slots.checkDirect("direct receive", tag, iov...)
	return u.ucxContract.PostRecvIOV(from, tag, iov, done)
}

// PostGet implements transport.RMATransport: the pull wire gets into a staging slot of its
// own (checked as a slot), the RMA mode into the caller's pool.
func (u *ucxTracked) PostGet(from transfer.Peer, tag transport.Tag, key []byte, addr uint64, dst []byte, done func(transport.Completion)) (transport.OpID, error) {
	if u.slots.inStaging(dst) {
		u.slots.check("get", tag, dst)
	}
	return u.ucxContract.PostGet(from, tag, key, addr, dst, done)
}

// cmaStats reads the UCX transport's process_vm_readv counts from its implementation.
func cmaStats(tr *ucx.Transport) cmastats.Stats {
	return transportimpl.Of(tr).(interface{ CMAStats() cmastats.Stats }).CMAStats()
}

// workersReplaced is how many wedged workers the UCX transport replaced.
func workersReplaced(tr *ucx.Transport) int {
	return transportimpl.Of(tr).(interface{ WorkersReplaced() int }).WorkersReplaced()
}
