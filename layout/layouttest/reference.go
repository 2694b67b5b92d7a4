// SPDX-License-Identifier: Apache-2.0

package layouttest

import (
	"fmt"

	"github.com/kvxfer/kvxfer/layout"
)

// ReferenceGather copies the plan's stream out of pool into dst element by element, with its
// own loops rather than the shared index helpers. It is slow on purpose: tests use it as the
// ground truth that the C and CUDA paths must match.
func ReferenceGather(p *layout.Plan, pool, dst []byte) error {
	return reference(p, pool, dst, true)
}

// ReferenceScatter copies a plan's stream from src into pool element by element (see
// ReferenceGather).
func ReferenceScatter(p *layout.Plan, src, pool []byte) error {
	return reference(p, pool, src, false)
}

func reference(p *layout.Plan, pool, stream []byte, gather bool) error {
	l, s := p.Layout(), p.Selection()
	if span := l.SpanBytes(); int64(len(pool)) < span {
		return &layout.FieldError{Field: "pool", Value: int64(len(pool)), Reason: fmt.Sprintf("needs %d bytes", span), Err: layout.ErrBufferTooSmall}
	}
	if int64(len(stream)) < p.Bytes() {
		return &layout.FieldError{Field: "stream", Value: int64(len(stream)), Reason: fmt.Sprintf("needs %d bytes", p.Bytes()), Err: layout.ErrBufferTooSmall}
	}
	pos := int64(0)
	for layer := s.LayerBegin; layer < s.LayerEnd; layer++ {
		for kv := int64(0); kv < l.KVFactor; kv++ {
			for _, block := range p.Blocks() {
				for head := s.HeadBegin; head < s.HeadEnd; head++ {
					for tok := int64(0); tok < l.TokensPerBlock; tok++ {
						base := int64(block)*l.StrideBlock + layer*l.StrideLayer + kv*l.StrideKV +
							head*l.StrideHead + tok*l.StrideToken
						for d := int64(0); d < l.HeadDim; d++ {
							for e := int64(0); e < l.ElemSize; e++ {
								at := base + d*l.ElemSize + e
								if gather {
									stream[pos] = pool[at]
								} else {
									pool[at] = stream[pos]
								}
								pos++
							}
						}
					}
				}
			}
		}
	}
	return nil
}
