// SPDX-License-Identifier: Apache-2.0

// Package sample is the counting rules' fixture.
package sample

import "io"

// Two constants, one unexported.
const (
	A = 1
	b = 2
)

// V is a variable.
var V, w = 1, 2

// F is a function.
func F() {}

func g() {}

// T has two exported fields, one embedded, one unexported.
type T struct {
	X, Y int
	z    int
	io.Reader
}

// NewT is listed under T.
func NewT() *T { return nil }

// M is a method.
func (T) M() {}

func (T) m() {}

// I has one method and an embedded interface.
type I interface {
	Do()
	io.Closer
}

// K is an enum whose constants go doc lists under K.
type K int

// The K values.
const (
	K1 K = iota
	K2
)

type hidden struct{ Exported int }
