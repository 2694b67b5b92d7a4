// SPDX-License-Identifier: Apache-2.0

package observe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server is Handler on a listener of its own: what a binary's --http ADDR flag needs.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// Serve listens on addr ("127.0.0.1:9400", ":0" for any free port) and serves Handler(cfg)
// until Close. The listener is open when Serve returns, so a probe can be pointed at Addr at
// once.
func Serve(addr string, cfg HandlerConfig) (*Server, error) {
	h, err := Handler(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kvxfer/observe: listening on %q for the probes and /metrics: %w", addr, err)
	}
	s := &Server{ln: ln, done: make(chan error, 1),
		// A probe or scraper that stalls must not hold a connection (and a goroutine) forever.
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on, with the port chosen when addr asked for ":0".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, lets requests in progress finish until ctx ends, then closes what is
// left. It returns once the serving goroutine has ended.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	if serveErr := <-s.done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}
