// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package streambench

import "github.com/kvxfer/kvxfer/transfer"

func ucxPair(Config, *transfer.Config, *transfer.Config, *bench) (transfer.Transport, transfer.Transport, error) {
	return nil, nil, ErrNoUCX
}
