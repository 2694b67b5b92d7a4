// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package native

/*
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <ucs/debug/log_def.h>

// The Go side, in callbacks.go: 1 if a logger took the line.
extern int kvxGoUCXLog(int level, char *file, unsigned line, char *msg);

// kvx_ucx_log is pushed onto UCX's log handlers once per process. UCX calls its handlers
// newest first for every line its level lets through, from whatever thread logs (a worker's
// progress, UCX's async thread). A fatal line goes on to UCX's own handler too, since UCX
// aborts after it.
static ucs_log_func_rc_t kvx_ucx_log(const char *file, unsigned line, const char *function,
                                     ucs_log_level_t level,
                                     const ucs_log_component_config_t *comp_conf,
                                     const char *format, va_list ap) {
	(void)function;
	(void)comp_conf;
	if (level == UCS_LOG_LEVEL_FATAL) return UCS_LOG_FUNC_RC_CONTINUE;
	char buf[1024];
	va_list aq;
	va_copy(aq, ap);
	vsnprintf(buf, sizeof(buf), format, aq);
	va_end(aq);
	return kvxGoUCXLog((int)level, (char *)file, line, buf) ? UCS_LOG_FUNC_RC_STOP
	                                                         : UCS_LOG_FUNC_RC_CONTINUE;
}

static void kvx_ucx_log_install(void) { ucs_log_push_handler(kvx_ucx_log); }

// kvx_ucx_log_warn logs msg through UCX's own dispatch, as UCX logs its warnings.
static void kvx_ucx_log_warn(const char *msg) { ucs_warn("%s", msg); }
*/
import "C"

import (
	"sync"
	"unsafe"

	"go.uber.org/zap"
)

// UCX's log is one per process, so its lines go to one logger: that of the oldest open
// Context whose logger takes warnings. With none (no Context, or only no-op loggers), UCX
// prints them itself, as it would without kvxfer.
var ucxLog struct {
	sync.Mutex
	installed bool
	loggers   []*zap.Logger // by age; a Context's is removed when it closes
}

// routeUCXLog sends UCX's log lines to l while the returned func has not been called. A
// logger that drops warnings (zap.NewNop) is not added: UCX then keeps its own stderr lines.
func routeUCXLog(l *zap.Logger) (stop func()) {
	if l == nil || !l.Core().Enabled(zap.WarnLevel) {
		return func() {}
	}
	l = l.Named("ucx")
	ucxLog.Lock()
	defer ucxLog.Unlock()
	if !ucxLog.installed {
		C.kvx_ucx_log_install()
		ucxLog.installed = true
	}
	ucxLog.loggers = append(ucxLog.loggers, l)
	var once sync.Once
	return func() {
		once.Do(func() {
			ucxLog.Lock()
			defer ucxLog.Unlock()
			for i, x := range ucxLog.loggers {
				if x == l {
					ucxLog.loggers = append(ucxLog.loggers[:i], ucxLog.loggers[i+1:]...)
					break
				}
			}
		})
	}
}

// ucxLogLine logs one of UCX's lines; it reports false when no logger takes them.
func ucxLogLine(level int, file string, line uint, msg string) (took bool) {
	// A logger may panic (zaptest's, once its test has ended and another test's context still
	// makes UCX talk): never across the C frames of UCX's log dispatch.
	defer func() {
		if recover() != nil {
			took = false
		}
	}()
	ucxLog.Lock()
	var l *zap.Logger
	if len(ucxLog.loggers) > 0 {
		l = ucxLog.loggers[0]
	}
	ucxLog.Unlock()
	if l == nil {
		return false
	}
	fields := []zap.Field{zap.String("ucx_level", ucxLevelName(level)), zap.String("at", file), zap.Uint("line", line)}
	switch level {
	case C.UCS_LOG_LEVEL_ERROR, C.UCS_LOG_LEVEL_WARN:
		// UCX says ERROR of what it returns to kvxfer as a status (a peer that went away, say),
		// which the engine then handles and reports itself: a warning here, not an error.
		l.Warn(msg, fields...)
	case C.UCS_LOG_LEVEL_DIAG, C.UCS_LOG_LEVEL_INFO:
		l.Info(msg, fields...)
	default:
		l.Debug(msg, fields...)
	}
	return true
}

func ucxLevelName(level int) string {
	switch level {
	case C.UCS_LOG_LEVEL_ERROR:
		return "ERROR"
	case C.UCS_LOG_LEVEL_WARN:
		return "WARN"
	case C.UCS_LOG_LEVEL_DIAG:
		return "DIAG"
	case C.UCS_LOG_LEVEL_INFO:
		return "INFO"
	}
	return "DEBUG"
}

// ucxWarnForTest logs msg through UCX's own log dispatch (ucs_warn), as UCX logs a warning.
func ucxWarnForTest(msg string) {
	c := C.CString(msg)
	defer C.free(unsafe.Pointer(c))
	C.kvx_ucx_log_warn(c)
}
