// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package streambench

import (
	"github.com/kvxfer/kvxfer/transfer"
	"github.com/kvxfer/kvxfer/transfer/transport/ucx"
)

// ucxPair opens two UCX workers in this process, each with its own staging region for its
// engine, and names each side's peer.
func ucxPair(cfg Config, srcCfg, dstCfg *transfer.Config, b *bench) (src, dst transfer.Transport, err error) {
	slots := engineSlots(cfg.Engine)
	st, err := ucx.New(ucx.Config{TLS: cfg.UCXTLS, StagingBytes: slots, Logger: cfg.Engine.Logger})
	if err != nil {
		return nil, nil, err
	}
	dt, err := ucx.New(ucx.Config{TLS: cfg.UCXTLS, StagingBytes: slots, Logger: cfg.Engine.Logger})
	if err != nil {
		_ = st.Close(true)
		return nil, nil, err
	}
	srcCfg.StagingMemory, dstCfg.StagingMemory = st.StagingMemory(), dt.StagingMemory()
	b.srcPeer, b.dstPeer = st.Self(), dt.Self()
	return st, dt, nil
}
