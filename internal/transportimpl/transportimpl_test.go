// SPDX-License-Identifier: Apache-2.0

package transportimpl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvxfer/kvxfer/internal/transportimpl"
)

// handle is a public transport handle over an implementation, as ucx.Transport is: it keeps
// none of the contract itself.
type handle struct{ impl *impl }

// impl stands for a transport's implementation; other for a transport no resolver knows.
type (
	impl  struct{ name string }
	other struct{ name string }
)

// A registered resolver finds the implementation behind its handles, a nil handle included
// (nil); every other value resolves to itself, and nil to nil.
func TestOf(t *testing.T) {
	transportimpl.Register(func(tr any) (any, bool) {
		if h, ok := tr.(*handle); ok {
			if h == nil {
				return nil, true
			}
			return h.impl, true
		}
		return nil, false
	})
	in, o := &impl{"a"}, &other{"b"}
	var nilHandle *handle
	cases := []struct {
		desc     string
		in, want any
	}{
		{"a handle: its implementation", &handle{impl: in}, in},
		{"a nil handle: nil", nilHandle, nil},
		{"a value no resolver knows: itself", o, o},
		{"nil: nil", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			require.Equal(t, c.want, transportimpl.Of(c.in))
		})
	}
}
