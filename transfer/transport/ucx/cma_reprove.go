// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package ucx

// One key, several pools. UCX packs no address into the key of host memory registered over
// shared memory: every pool a peer registers has the same key, and the proof taken at the
// first read through it (cma_proof.go) names the ranges the peer had registered then. A pool
// the peer registered after that proof lies outside them, and every read of it was refused as
// the peer's protocol error (a sender that registered a second pool after a receiver's first
// read failed each transfer from it, until the endpoint was replaced). So a read outside the
// proven ranges asks the peer again, with a new challenge, and is refused only if it still
// lies outside what the peer proves then.

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/transfer/transport"
)

// postCMAProven is postCMA, except that a read outside the ranges proven for k's key asks the
// peer again which ranges the key covers (reproveCMA) before it is refused: twice at most, since
// the first may only wait for another read's proof, which the peer may have answered before it
// registered the memory this read names.
func (t *ucxTransport) postCMAProven(from transport.Peer, k *ucxRemoteKey, key []byte, remote []unix.RemoteIovec, local [][]byte, total int, done func(transport.Completion)) (transport.OpID, bool, error) {
	id, taken, err := t.postCMA(from, k, remote, local, total, done)
	for range 2 {
		var re *cmaRangeError
		if !errors.As(err, &re) || !t.reproveCMA(from, k, key) {
			break
		}
		id, taken, err = t.postCMA(from, k, remote, local, total, done)
	}
	return id, taken, err
}

// reproveCMA asks from again which ranges key covers (proveCMA, bounded as the first proof),
// and takes the answer's ranges in place of k's route's when the answer comes from the process
// proven before: the same pid, while the pidfd taken then says that process still runs (a pid
// is not given to another process while its process lives). The answer's pidfd is closed: the
// route keeps the first. It reports whether the caller should check the read again: the
// ranges were proven anew, here or by another read's proof that it waited for. One proof per
// key at a time (k.proving). A peer that names memory it never registered costs itself up to
// two proofs per read (each bounded by cmaProofTimeout, on the goroutine posting the read), and
// its reads are refused as before.
func (t *ucxTransport) reproveCMA(from transport.Peer, k *ucxRemoteKey, key []byte) bool {
	t.mu.Lock()
	if wait := k.proving; wait != nil {
		t.mu.Unlock()
		<-wait // bounded by cmaProofTimeout
		return true
	}
	if t.closed || k.dead || !k.cma.use {
		t.mu.Unlock()
		return false
	}
	proving := make(chan struct{})
	k.proving = proving
	pid, pidfd := k.cma.pid, k.cma.pidfd
	t.mu.Unlock()
	proof, err := t.proveCMA(from, key, pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	k.proving = nil
	close(proving)
	if err != nil {
		return false
	}
	_ = unix.Close(proof.pidfd)
	if k.dead || !k.cma.use || k.cma.pidfd != pidfd || proof.pid != pid || t.cma.alive(pidfd) != nil {
		return false
	}
	k.cma.ranges = proof.ranges
	return true
}
