// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package stress

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/internal/hostile"
)

// hostile runs fault hostile for the traffic phase: the hostile peer harness beside the soak,
// its findings added as breaches. The channel closes when it is over (at once without the
// fault).
func (ps *procSoak) hostile(ctx context.Context, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if !ps.cfg.has(FaultHostile) {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		bin, cleanup, err := hostile.FindPeer()
		if err != nil {
			ps.addBreach(fmt.Sprintf("fault hostile: %v", err))
			return
		}
		defer cleanup()
		cfg := hostile.Config{PeerBin: bin, TLS: ps.tls, Duration: d, Seed: ps.cfg.Seed}
		if strings.Contains(ps.tls, "tcp") {
			cfg.NetDevices = "lo"
		}
		rep, err := hostile.Run(ctx, cfg)
		if rep != nil {
			for _, n := range rep.Sent {
				ps.injected[FaultHostile].Add(int64(n))
			}
			for _, f := range rep.Failures {
				ps.addBreach("fault hostile: " + f)
			}
			ps.log.Info("hostile peer harness: " + rep.String())
		}
		if err != nil {
			ps.addBreach(fmt.Sprintf("fault hostile: %v", err))
		}
	}()
	return done
}
