// SPDX-License-Identifier: Apache-2.0

package transfer

import (
	"errors"

	"github.com/kvxfer/kvxfer/transfer/transport"
	"go.uber.org/zap"
)

// SignParams seals p (a transport's ContextParams: *ucx.ContextParams) with the engine's first
// cluster key (Config.ClusterKeys), so an engine of the same fleet can verify it
// (docs/protocol.md, "ContextParams v3"). Call it on the params a Send hands out, after the
// last change to them and before they are encoded. Without keys it leaves p unsigned and
// returns nil.
func (e *Engine) SignParams(p transport.Params) error {
	if len(e.cfg.ClusterKeys) == 0 {
		return nil
	}
	return p.Sign(e.cfg.ClusterKeys)
}

// VerifyParams checks, before a Receive uses them, that p was signed by a cluster key of this
// engine's: params unsigned, signed by a key it does not hold, or changed since they were
// signed are refused with an *AuthError (matching ErrUnauthenticated) and counted
// (an Observer's OnAuthRefused; kvxfer_auth_refused_total{what="params"}). Without keys it
// checks nothing and returns nil, as an engine without keys reads sealed hellos.
func (e *Engine) VerifyParams(p transport.Params) error {
	if len(e.cfg.ClusterKeys) == 0 {
		return nil
	}
	err := p.Verify(e.cfg.ClusterKeys)
	var ae *AuthError
	if errors.As(err, &ae) {
		e.log.Debug("refusing unauthenticated context params", zap.String("peer", ae.Peer.Short()), zap.Error(ae))
		notifyAuthRefused(e.obs, ae)
	}
	return err
}
