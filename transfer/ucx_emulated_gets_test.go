// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package transfer

// ucxEmulatedGetsMayCrash reports whether, in a row where the peer process reads this side's
// pool and is then killed, or frozen while this engine closes, this process serves that peer's
// gets through UCX's emulation on a UCX whose purge of the replies still queued may crash it:
// UCX 1.22 over shared memory (no RMA lane there with peer error handling), with the peer
// reading through UCX's gets rather than in place (the rma and pull rows:
// DisableInPlaceReads). UCX builds each reply without setting its datatype, and the purge
// deregisters by it (docs/ucx.md, "UCX purges the replies to a peer's emulated gets with a
// stale datatype"): the closed rma row died inside ucp_ep_close_nbx in ci23 and under gdb.
// UCX 1.13 reads over shared memory with native gets and queues no reply.
func ucxEmulatedGetsMayCrash(transport string, pc ucxPathCase) bool {
	return ucxShm(transport) && !ucxNativeShmGets() && (pc.name == "rma" || pc.name == "pull")
}

// ucxEmulatedGetsSkip is the skip message of the rows ucxEmulatedGetsMayCrash names.
const ucxEmulatedGetsSkip = "UCX 1.22 may crash purging the replies to a lost peer's emulated gets (docs/ucx.md)"
