// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/layout"
)

// The control connection is how the two ends of a run find each other: a small TCP
// connection that serve (or run, for its own peer) opens, carrying newline-delimited JSON
// messages. It carries the hello (version and pool layout, checked before any memory is
// registered), then the engines' ContextParams, then each end's checksums. Bulk data never
// crosses it: that is the transport's job.

// controlVersion is the control protocol's version; both ends must speak the same one. 2: a
// perftest request carries UCX settings (perftestMsg.Env), which a version 1 server would ignore.
// 3: the prefill end reports a round's Sends in one Sent when asked (Report), not one each.
const controlVersion = 3

// controlMagic starts every hello, so a connection to something that is not kvxbench is told
// apart from a kvxbench of another version.
const controlMagic = "kvxbench-control"

// maxControlMessage bounds one control message, so a peer that streams garbage cannot grow
// our memory.
const maxControlMessage = 16 << 20

// Control errors. A peer that never answers, speaks another protocol or another version, or
// holds a pool that cannot exchange blocks with ours, is refused with one of these.
var (
	errPeerUnreachable  = errors.New("peer does not answer")
	errPeerNotKvxbench  = errors.New("peer is not kvxbench")
	errPeerVersion      = errors.New("peer speaks another control protocol version")
	errPeerIncompatible = errors.New("peer's KV layout is incompatible")
	errPeerFailed       = errors.New("peer reported an error")
)

// hello is the first message each end sends.
type hello struct {
	Magic   string `json:"magic"`
	Version int    `json:"version"`
	// Role is prefill (sends KV) or decode (receives it).
	Role string `json:"role"`
	// Layout is this end's whole pool.
	Layout layout.Layout `json:"layout"`
	// Rank and TP place the end among its tensor-parallel peers. Heterogeneous TP: two
	// prefill ranks of TP=2 each send all their heads to one decode rank of TP=1, which
	// receives rank r's into its heads [r*H/2, (r+1)*H/2); or one prefill rank of TP=1 sends
	// heads [r*H/2, (r+1)*H/2) to decode rank r of TP=2, which holds those alone. A decode
	// end that holds two ranks (run --decode-tp 2) says hello as its rank 0.
	Rank int `json:"rank"`
	TP   int `json:"tp"`
	// KeyID names the end's cluster key (RunConfig.keyID; empty without one): both ends
	// must hold the same, or none.
	KeyID string `json:"key_id,omitempty"`
}

// message is every control message after the hello: one of its fields is set.
type message struct {
	// Error: the sender stops, and says why.
	Error *string `json:"error,omitempty"`
	// Addr carries the sender's transfer-engine address, once, after the hello.
	Addr []byte `json:"addr,omitempty"`
	// Scenario (decode to prefill) starts a scenario; the prefill end answers Ready.
	Scenario *scenarioMsg `json:"scenario,omitempty"`
	// Ready (prefill to decode): the scenario's request is planned; Checksum is the CRC-32C
	// of the stream every request of it sends.
	Ready *readyMsg `json:"ready,omitempty"`
	// Req (decode to prefill) asks for one request: post its Send.
	Req *reqMsg `json:"req,omitempty"`
	// Posted (prefill to decode) answers a Req whose Sender is first or expose: the
	// request's Send or Expose is posted, and the params an Expose handed out.
	Posted *postedMsg `json:"posted,omitempty"`
	// Report (decode to prefill, after a round's clock stopped) asks for the outcome of
	// every request asked since the last Report; the prefill end waits for their Sends to
	// end and answers one Sent.
	Report bool `json:"report,omitempty"`
	// Sent (prefill to decode) answers Report. Sent after the round rather than as each
	// Send ends, the reports cost the measured window nothing.
	Sent *sentReport `json:"sent,omitempty"`
	// PerftestServe (decode to prefill, two hosts) asks the prefill host to start a
	// ucx_perftest server for the baseline; it answers PerftestPort.
	PerftestServe *perftestMsg `json:"perftest_serve,omitempty"`
	PerftestPort  int          `json:"perftest_port,omitempty"`
	// Bye ends the run.
	Bye bool `json:"bye,omitempty"`
}

type perftestMsg struct {
	Test    string        `json:"test"`
	Size    int64         `json:"size"`
	TLS     string        `json:"tls"`
	Iters   int           `json:"iters"`
	Warmup  int           `json:"warmup"`
	Timeout time.Duration `json:"timeout"`
	// ErrorHandling and Env are perftest.Config's: the server must run with the client's
	// settings (a client sending 1 MiB TCP segments aborts a server that takes 64 KiB ones).
	ErrorHandling bool     `json:"error_handling,omitempty"`
	Env           []string `json:"env,omitempty"`
}

type scenarioMsg struct {
	Tokens int64 `json:"tokens"`
	// Layers > 0 plans only the first layers of each block (a latency row's one-layer chunk).
	Layers int64 `json:"layers,omitempty"`
}

type readyMsg struct {
	Checksum uint32 `json:"checksum"`
	// RankChecksums, where the decode end holds several ranks (--decode-tp), is each decode
	// rank's share's checksum (Checksum is rank 0's); Bytes counts every share.
	RankChecksums []uint32 `json:"rank_checksums,omitempty"`
	Bytes         int64    `json:"bytes"`
}

type reqMsg struct {
	ID uint64 `json:"id"`
	// Secret is the request's claim secret (transfer.Spec.Secret), drawn by the decode end
	// for each request of a run with a cluster key, as a serving stack hands it over in the
	// request's ContextParams: the prefill end's Send then takes only a request that proves it.
	Secret []byte `json:"secret,omitempty"`
	// Sender is the run's --sender: empty (after) posts the Send and answers only Sent;
	// first posts the Send, expose an Expose, and each answers Posted before Sent.
	Sender string `json:"sender,omitempty"`
	// DecodeRank is the decode rank whose share of the heads the request moves, where the
	// decode end holds several (--decode-tp): each rank's share is a request of its own.
	DecodeRank int `json:"decode_rank,omitempty"`
}

// postedMsg says a request's Send or Expose is posted. Params is the exposure's params as its
// transport encodes them (ucx.ContextParams), nil where the transport issues none; Secret is
// the exposure's claim secret, for such a transport's receiver (the params carry it where
// there are params).
type postedMsg struct {
	ID     uint64 `json:"id"`
	Params []byte `json:"params,omitempty"`
	Secret []byte `json:"secret,omitempty"`
	Err    string `json:"err,omitempty"`
}

// sentReport is one entry per request asked since the last Report, in the order asked (none:
// an empty list), saying how its Send ended and the time it spent gathering.
type sentReport struct {
	Sends []sentMsg `json:"sends"`
}

type sentMsg struct {
	ID       uint64 `json:"id"`
	GatherNs int64  `json:"gather_ns"`
	Err      string `json:"err,omitempty"`
}

// control is one end of a control connection. Every read and write carries a deadline.
type control struct {
	sendMu  sync.Mutex // one writer at a time: request goroutines report concurrently
	conn    net.Conn
	r       *bufio.Reader
	timeout time.Duration
	peer    string
}

func newControl(conn net.Conn, timeout time.Duration) *control {
	return &control{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), timeout: timeout, peer: conn.RemoteAddr().String()}
}

// dialControl connects to a serving kvxbench at addr, within timeout.
func dialControl(addr string, timeout time.Duration) (*control, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("%w: no kvxbench serve answers at %s within %v: %v", errPeerUnreachable, addr, timeout, err)
	}
	return newControl(conn, timeout), nil
}

func (c *control) Close() error { return c.conn.Close() }

// send writes one message within the timeout.
func (c *control) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode control message: %w", err)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return err
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%w: writing to %s: %v", errPeerUnreachable, c.peer, err)
	}
	return nil
}

// recv reads one message within wait (the control timeout when wait is zero).
func (c *control) recv(v any, wait time.Duration) error {
	if wait == 0 {
		wait = c.timeout
	}
	if err := c.conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return err
	}
	var line []byte
	for {
		part, isPrefix, err := c.r.ReadLine()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && len(line) == 0 {
				return &idleError{peer: c.peer, wait: wait}
			}
			return fmt.Errorf("%w: reading from %s: %v", errPeerUnreachable, c.peer, err)
		}
		line = append(line, part...)
		if len(line) > maxControlMessage {
			return fmt.Errorf("%w: %s sent a control message over %d bytes", errPeerNotKvxbench, c.peer, maxControlMessage)
		}
		if !isPrefix {
			break
		}
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("%w: %s sent %q: %v", errPeerNotKvxbench, c.peer, truncate(string(line), 60), err)
	}
	return nil
}

// recvMessage reads one message and turns a peer's error report into an error.
func (c *control) recvMessage(wait time.Duration) (message, error) {
	var m message
	if err := c.recv(&m, wait); err != nil {
		return m, err
	}
	if m.Error != nil {
		return m, fmt.Errorf("%w: %s", errPeerFailed, *m.Error)
	}
	return m, nil
}

// sendError tells the peer why this end stops; best effort, since the connection may be the
// thing that failed.
func (c *control) sendError(err error) {
	msg := err.Error()
	_ = c.send(message{Error: &msg})
}

// exchangeHello sends ours and checks theirs: magic, version, and that the two pools can
// exchange this run's blocks. On a refusal both ends learn why.
func (c *control) exchangeHello(ours hello) (hello, error) {
	ours.Magic, ours.Version = controlMagic, controlVersion
	if err := c.send(ours); err != nil {
		return hello{}, err
	}
	var theirs hello
	if err := c.recv(&theirs, 0); err != nil {
		return hello{}, err
	}
	if err := checkHello(ours, theirs); err != nil {
		c.sendError(err)
		return hello{}, err
	}
	return theirs, nil
}

// exchangeAddr sends this end's engine address and returns the peer's. The engines are made
// after the hello, so a version or layout mismatch is refused before any memory is
// registered.
func (c *control) exchangeAddr(ours []byte) ([]byte, error) {
	if err := c.send(message{Addr: ours}); err != nil {
		return nil, err
	}
	m, err := c.recvMessage(0)
	if err != nil {
		return nil, err
	}
	if len(m.Addr) == 0 {
		return nil, fmt.Errorf("%w: %s sent no engine address after the hello", errPeerNotKvxbench, c.peer)
	}
	return m.Addr, nil
}

// checkHello refuses a peer that is not kvxbench, speaks another version, plays the same
// role, or whose pool moves a different stream than ours.
func checkHello(ours, theirs hello) error {
	switch {
	case theirs.Magic != controlMagic:
		return fmt.Errorf("%w: its hello has magic %q", errPeerNotKvxbench, truncate(theirs.Magic, 40))
	case theirs.Version != controlVersion:
		return fmt.Errorf("%w: it speaks version %d, this kvxbench speaks %d; run the same build on both ends", errPeerVersion, theirs.Version, controlVersion)
	case theirs.Role == ours.Role:
		return fmt.Errorf("%w: both ends are %s; one must serve (prefill) and one connect (decode)", errPeerIncompatible, ours.Role)
	case theirs.KeyID != ours.KeyID && (theirs.KeyID == "" || ours.KeyID == ""):
		return fmt.Errorf("%w: only one end holds a cluster key; give both ends the same --cluster-key, or neither", errPeerIncompatible)
	case theirs.KeyID != ours.KeyID:
		return fmt.Errorf("%w: the two ends hold different cluster keys (--cluster-key); their engines would refuse each other's hellos", errPeerIncompatible)
	}
	if err := theirs.Layout.Validate(); err != nil {
		return fmt.Errorf("%w: its layout is invalid: %v", errPeerIncompatible, err)
	}
	prefill, decode := ours, theirs
	if ours.Role == roleDecode {
		prefill, decode = theirs, ours
	}
	// One block of each side's selection moves the same bytes exactly when every block does.
	ssel, err := senderSelection(prefill.Layout, prefill, decode)
	if err != nil {
		return fmt.Errorf("%w: %v", errPeerIncompatible, err)
	}
	a, err := layout.NewPlan(prefill.Layout, ssel, []int32{0})
	if err != nil {
		return fmt.Errorf("%w: prefill layout: %v", errPeerIncompatible, err)
	}
	sel, err := receiverSelection(decode.Layout, prefill, decode)
	if err != nil {
		return fmt.Errorf("%w: %v", errPeerIncompatible, err)
	}
	b, err := layout.NewPlan(decode.Layout, sel, []int32{0})
	if err != nil {
		return fmt.Errorf("%w: decode selection: %v", errPeerIncompatible, err)
	}
	if err := layout.Compatible(a, b); err != nil {
		return fmt.Errorf("%w: %v", errPeerIncompatible, err)
	}
	return nil
}

// Roles of the two ends.
const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// receiverSelection is the share of the decode pool that one prefill rank fills: all of it
// when both have the same TP or the decode end has more ranks (each then holds only the heads
// it takes), else the prefill rank's slice of heads (prefill TP a multiple of decode TP).
func receiverSelection(l layout.Layout, prefill, decode hello) (layout.Selection, error) {
	return tpShare(l, prefill.TP, decode.TP, prefill.Rank, "decode", "prefill")
}

// senderSelection is the share of the prefill pool that one decode rank takes: all of it when
// both have the same TP or the prefill end has more ranks, else the decode rank's slice of
// heads (decode TP a multiple of prefill TP; decode.Rank names the rank).
func senderSelection(l layout.Layout, prefill, decode hello) (layout.Selection, error) {
	return tpShare(l, decode.TP, prefill.TP, decode.Rank, "prefill", "decode")
}

// tpShare is the slice of heads of pool l (held by an end of TP mine) that rank of the other
// end (TP theirs) moves: all of l when theirs is not above mine.
func tpShare(l layout.Layout, theirs, mine, rank int, pool, other string) (layout.Selection, error) {
	sel := l.All()
	theirs, mine = max(theirs, 1), max(mine, 1)
	if theirs <= mine {
		if mine%theirs != 0 {
			return sel, fmt.Errorf("%s TP %d must be a multiple of %s TP %d", pool, mine, other, theirs)
		}
		return sel, nil
	}
	if theirs%mine != 0 {
		return sel, fmt.Errorf("%s TP %d must be a multiple of %s TP %d", other, theirs, pool, mine)
	}
	ratio := int64(theirs / mine)
	if l.NumHeads%ratio != 0 {
		return sel, fmt.Errorf("%s pool's %d heads do not split over %d %s ranks", pool, l.NumHeads, ratio, other)
	}
	share := l.NumHeads / ratio
	r := int64(rank) % ratio
	sel.HeadBegin, sel.HeadEnd = r*share, (r+1)*share
	return sel, nil
}

// idleError: the peer sent nothing within the wait. It matches errPeerUnreachable; loops that
// poll the connection while watching a deadline of their own tell it apart with isIdle.
type idleError struct {
	peer string
	wait time.Duration
}

func (e *idleError) Error() string {
	return fmt.Sprintf("%v: %s sent nothing within %v", errPeerUnreachable, e.peer, e.wait)
}

func (e *idleError) Unwrap() error { return errPeerUnreachable }

func isIdle(err error) bool {
	var ie *idleError
	return errors.As(err, &ie)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
