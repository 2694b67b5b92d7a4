// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import "context"

// Lanes reports the endpoint's lanes as UCX chose them (ParseEndpointInfo of Info): which
// transports carry it, and whether gets are native or emulated. The lanes are fixed when the
// endpoint is created from the peer's address, so a new endpoint answers at once.
func (ep *Endpoint) Lanes(ctx context.Context) (EndpointLanes, error) {
	info, err := ep.Info(ctx)
	if err != nil {
		return EndpointLanes{}, err
	}
	return ParseEndpointInfo(info), nil
}
