// SPDX-License-Identifier: Apache-2.0

package sample

// NotCounted lives in a test file.
func NotCounted() {}
