// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// UCX's own log lines reach the engine's zap logger (named "ucx", UCX's level and source as
// fields), not stderr; a no-op logger leaves UCX printing them itself; a closed Context's
// logger hears no more.
func TestUCXLogLinesGoThroughTheContextsLogger(t *testing.T) {
	core, seen := observer.New(zapcore.DebugLevel)
	ctx, err := NewContext(ContextConfig{TLS: "self", Logger: zap.New(core)})
	require.NoError(t, err)
	quiet, err := NewContext(ContextConfig{TLS: "self"}) // no-op logger: not routed
	require.NoError(t, err)
	defer func() { require.NoError(t, quiet.Close()) }()

	ucxWarnForTest("kvxfer log test: first")
	lines := seen.FilterMessage("kvxfer log test: first").All()
	require.Len(t, lines, 1, "the line went through UCX's dispatch to the logger, once")
	require.Equal(t, zapcore.WarnLevel, lines[0].Level)
	require.Equal(t, "ucx", lines[0].LoggerName)
	require.Equal(t, "WARN", lines[0].ContextMap()["ucx_level"])
	require.NotEmpty(t, lines[0].ContextMap()["at"], "names UCX's source file")

	require.NoError(t, ctx.Close())
	ucxWarnForTest("kvxfer log test: after close")
	require.Empty(t, seen.FilterMessage("kvxfer log test: after close").All(), "a closed context's logger hears nothing more")
	require.False(t, ucxLogLine(int(2), "x.c", 1, "no logger"), "with only a no-op logger left, UCX prints its own lines")
}
