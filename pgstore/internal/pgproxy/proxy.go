// Package pgproxy is a TCP proxy for tests that sits between a PostgreSQL
// client and server on 127.0.0.1, reads the wire protocol (the startup
// packet, then typed messages: one type byte and an int32 length that
// counts itself) in both directions, and cuts connections at chosen
// points: before a COMMIT reaches the server, after the server committed
// but before its reply reaches the client, when a transaction touches a
// given statement (a blob upload, say), or on the connections that ran a
// given statement (the session-lock connection).
//
// It understands both ways a client sends COMMIT: a simple Query message
// ("commit", as pgx's Tx.Commit sends it) and the extended protocol (Parse
// of the statement, possibly long before under a cached name, then Bind
// and Execute of a portal on it, as pgx sends statements of a Batch); and
// the commit without one: statements executed through the extended
// protocol outside a transaction block are one implicit transaction,
// which the server commits at the pipeline's Sync (a pgx.Batch without
// BEGIN), so such a Sync is a COMMIT to the rules. (The proxy assumes, as
// pgx does, that the client waits for a Sync's ReadyForQuery before it
// sends the next Sync.)
//
// A Proxy is safe for concurrent use. It holds no TLS: connect with
// sslmode=disable (an SSLRequest is answered by the server and passed on;
// a connection on which the server accepts TLS is forwarded opaquely and
// cannot be cut by a rule).
package pgproxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Cut says where a Rule cuts its connection.
type Cut int

const (
	// BeforeCommit closes the connection instead of forwarding the COMMIT
	// (the Query message or the Execute of a portal bound to a COMMIT
	// statement): the server rolls the transaction back. The messages
	// before it (an earlier transaction of the same pipeline) reach the
	// server.
	BeforeCommit Cut = iota + 1
	// AfterCommit forwards the COMMIT and everything the client sends
	// with it, then closes the connection when the server's
	// CommandComplete "COMMIT" arrives (for an implicit transaction: the
	// Sync's ReadyForQuery, unless an error came before it), before
	// forwarding it: the transaction is committed and the client never
	// hears so. In a pipeline that holds several transactions, the cut
	// waits for the matching transaction's own COMMIT reply (replies are
	// counted in order), and the replies before it reach the client.
	AfterCommit
	// AfterCommitSent forwards the COMMIT and closes the connection at
	// once, without waiting for the server: whether the transaction
	// commits is a race, which is the point.
	AfterCommitSent
	// OnMatch closes the connection as soon as the transaction matches
	// the rule, without forwarding the client message that made it match.
	OnMatch
)

func (c Cut) String() string {
	switch c {
	case BeforeCommit:
		return "before COMMIT"
	case AfterCommit:
		return "after COMMIT, before its reply"
	case AfterCommitSent:
		return "right after COMMIT was sent"
	case OnMatch:
		return "on match"
	}
	return fmt.Sprintf("Cut(%d)", int(c))
}

// Rule is a cut armed on the proxy. It fires once, on the first
// connection whose transaction matches: every string in Match appears in
// the transaction's statements (SQL text) or in the bytes of its
// parameters (as they are, or hex-encoded as PostgreSQL's text form of
// bytea spells them). A transaction starts at BEGIN and ends at COMMIT or
// ROLLBACK; outside BEGIN, one runs until a Sync (an implicit transaction)
// or a simple Query that says BEGIN. An empty Match matches every transaction. With Refuse, the proxy
// turns new connections away (as Refuse(true)) from the moment the rule
// fires, before it cuts: the client's reconnection after the cut cannot
// slip in before a test's own Refuse call.
type Rule struct {
	Cut    Cut
	Match  []string
	Refuse bool
}

// Armed is a rule on the proxy. Fired is closed when the rule cut a
// connection.
type Armed struct {
	rule  Rule
	fired chan struct{}
	once  sync.Once
	mu    sync.Mutex
	conn  int // id of the connection that fired
}

// Fired is closed once the rule has cut its connection.
func (a *Armed) Fired() <-chan struct{} { return a.fired }

// Wait waits up to d for the rule to fire and reports whether it did.
func (a *Armed) Wait(d time.Duration) bool {
	select {
	case <-a.fired:
		return true
	case <-time.After(d):
		return false
	}
}

func (a *Armed) fire(id int) {
	a.once.Do(func() {
		a.mu.Lock()
		a.conn = id
		a.mu.Unlock()
		close(a.fired)
	})
}

// Proxy forwards connections from its own address to a PostgreSQL server.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   map[int]*conn
	nextID  int
	rules   []*Armed
	refuse  bool
	closed  bool
	log     []string
	maxLogs int
}

// New starts a proxy on 127.0.0.1 (a free port) to target, a host:port.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproxy: listen on 127.0.0.1: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[int]*conn{}, maxLogs: 1000}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, host:port, to put in the client's DSN.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Arm adds a rule; it fires once, on the first transaction that matches
// it, and is then removed.
func (p *Proxy) Arm(r Rule) *Armed {
	a := &Armed{rule: r, fired: make(chan struct{})}
	p.mu.Lock()
	p.rules = append(p.rules, a)
	p.mu.Unlock()
	return a
}

// Disarm removes a rule that has not fired.
func (p *Proxy) Disarm(a *Armed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if r == a {
			p.rules = append(p.rules[:i], p.rules[i+1:]...)
			return
		}
	}
}

// Refuse makes the proxy close new connections at once (on) or forward
// them again (off), as a server that cannot be reached.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// CutAll closes every open connection and returns how many it closed.
func (p *Proxy) CutAll() int {
	return p.CutWhere(func(Conn) bool { return true })
}

// CutWhere closes every open connection for which match is true and
// returns how many it closed.
func (p *Proxy) CutWhere(match func(Conn) bool) int {
	p.mu.Lock()
	var cut []*conn
	for _, c := range p.conns {
		if match(c.info()) {
			cut = append(cut, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.cut("CutWhere")
	}
	return len(cut)
}

// Conns describes the open connections.
func (p *Proxy) Conns() []Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Conn, 0, len(p.conns))
	for _, c := range p.conns {
		out = append(out, c.info())
	}
	return out
}

// Log is what the proxy did: each cut, with the connection and why.
func (p *Proxy) Log() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

func (p *Proxy) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.log) < p.maxLogs {
		p.log = append(p.log, fmt.Sprintf(format, args...))
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			client.Close()
			continue
		}
		p.nextID++
		c := &conn{p: p, id: p.nextID, client: client, stmts: map[string]string{}, portals: map[string]string{},
			params: map[string]string{}, seen: map[string]bool{}}
		p.conns[c.id] = c
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			c.serve()
			p.mu.Lock()
			delete(p.conns, c.id)
			p.mu.Unlock()
		}()
	}
}

// Conn describes one proxied connection.
type Conn struct {
	ID     int
	Params map[string]string // the startup packet's parameters (user, database, options, GUCs)
	SQL    []string          // every distinct statement the client ran on it, in order
}

// Saw reports whether a statement containing s ran on the connection.
func (c Conn) Saw(s string) bool {
	for _, q := range c.SQL {
		if strings.Contains(q, s) {
			return true
		}
	}
	return false
}

// conn is one client connection and its server connection.
type conn struct {
	p              *Proxy
	id             int
	client, server net.Conn

	mu       sync.Mutex
	done     bool
	params   map[string]string
	sqlOrder []string
	seen     map[string]bool
	stmts    map[string]string // prepared statement name -> SQL
	portals  map[string]string // portal name -> SQL
	tx       bytes.Buffer      // the current transaction's SQL and parameter bytes
	pending  *Armed            // AfterCommit: cut when the COMMIT's CommandComplete arrives
	// ends counts the COMMIT and ROLLBACK statements forwarded, answered
	// those whose reply came back (or that a Sync's ReadyForQuery showed
	// skipped); pendingN is the pending COMMIT's number among ends, so that
	// the cut waits for its own reply, not an earlier transaction's in the
	// same pipeline. syncs holds ends as of each forwarded Sync (and
	// simple Query), answered up to which its ReadyForQuery settles.
	ends, answered, pendingN int
	syncs                    []int
	// The implicit transaction: block is true from an executed BEGIN to
	// its COMMIT or ROLLBACK; ran, an Execute outside a block since the
	// last Sync; pendingSync, an AfterCommit on a Sync that commits one,
	// cut at the Sync's ReadyForQuery unless failed (an ErrorResponse
	// since the last ReadyForQuery: the server rolled it back).
	block       bool
	ran         bool
	pendingSync *Armed
	failed      bool
}

func (c *conn) info() Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	params := make(map[string]string, len(c.params))
	for k, v := range c.params {
		params[k] = v
	}
	return Conn{ID: c.id, Params: params, SQL: append([]string(nil), c.sqlOrder...)}
}

func (c *conn) cut(why string) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return
	}
	c.done = true
	c.mu.Unlock()
	c.p.logf("conn %d cut: %s", c.id, why)
	c.client.Close()
	if c.server != nil {
		c.server.Close()
	}
}

func (c *conn) serve() {
	defer c.cut("closed")
	server, err := net.Dial("tcp", c.p.target)
	if err != nil {
		c.p.logf("conn %d: dial %s: %v", c.id, c.p.target, err)
		return
	}
	c.mu.Lock()
	c.server = server
	done := c.done
	c.mu.Unlock()
	if done {
		server.Close()
		return
	}
	cr := bufio.NewReaderSize(c.client, 64<<10)
	sr := bufio.NewReaderSize(server, 64<<10)
	opaque, err := c.startup(cr, sr)
	if err != nil {
		return
	}
	if opaque {
		go func() { _, _ = io.Copy(c.client, sr); c.cut("server closed") }()
		_, _ = io.Copy(server, cr)
		return
	}
	go c.fromServer(sr)
	c.fromClient(cr)
}

const (
	codeSSL    = 80877103
	codeGSS    = 80877104
	codeCancel = 80877102
)

// startup forwards the untyped packets the client starts with: an
// SSLRequest or GSSENCRequest (and the server's one-byte answer), then the
// StartupMessage or a CancelRequest. It reports opaque when the rest of
// the connection cannot be parsed (TLS or GSS accepted, or a cancel).
func (c *conn) startup(cr, sr *bufio.Reader) (opaque bool, err error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(cr, hdr[:]); err != nil {
			return false, err
		}
		n := int(binary.BigEndian.Uint32(hdr[:4]))
		code := binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > 1<<20 {
			return false, fmt.Errorf("pgproxy: startup packet of %d bytes", n)
		}
		body := make([]byte, n-8)
		if _, err := io.ReadFull(cr, body); err != nil {
			return false, err
		}
		if _, err := c.server.Write(append(hdr[:], body...)); err != nil {
			return false, err
		}
		switch code {
		case codeSSL, codeGSS:
			b, err := sr.ReadByte()
			if err != nil {
				return false, err
			}
			if _, err := c.client.Write([]byte{b}); err != nil {
				return false, err
			}
			if b != 'N' {
				return true, nil
			}
			continue
		case codeCancel:
			return true, nil
		}
		// StartupMessage: protocol version, then name/value pairs.
		fields := bytes.Split(body, []byte{0})
		c.mu.Lock()
		for i := 0; i+1 < len(fields); i += 2 {
			if len(fields[i]) == 0 {
				break
			}
			c.params[string(fields[i])] = string(fields[i+1])
		}
		c.mu.Unlock()
		return false, nil
	}
}

// readMsg reads one typed message: its type and its body.
func readMsg(r *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 || n > 1<<30 {
		return 0, nil, fmt.Errorf("pgproxy: message %q of length %d", hdr[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

func writeMsg(w *bufio.Writer, typ byte, body []byte) error {
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(body)+4))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(body)
	return err
}

// cstr splits a NUL-terminated string off b.
func cstr(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// verb is the statement's first word, lower-cased ("commit", "begin").
func verb(sql string) string {
	s := strings.TrimSpace(strings.ToLower(sql))
	s = strings.TrimRight(s, "; \t\n")
	if i := strings.IndexAny(s, " \t\n;("); i >= 0 {
		s = s[:i]
	}
	return s
}

func isCommit(sql string) bool { v := verb(sql); return v == "commit" || v == "end" }
func isBegin(sql string) bool  { v := verb(sql); return v == "begin" || v == "start" }
func isRollback(sql string) bool {
	v := verb(sql)
	return v == "rollback" || v == "abort"
}

// note records a statement the client ran.
func (c *conn) note(sql string) {
	if !c.seen[sql] && len(c.sqlOrder) < 1000 {
		c.seen[sql] = true
		c.sqlOrder = append(c.sqlOrder, sql)
	}
}

// fromClient forwards the client's messages, applying the rules.
func (c *conn) fromClient(cr *bufio.Reader) {
	w := bufio.NewWriterSize(c.server, 64<<10)
	for {
		typ, body, err := readMsg(cr)
		if err != nil {
			return
		}
		rules := c.p.rulesSnapshot() // before c.mu: the proxy's lock comes first
		// run is the SQL that this message executes, if it executes one.
		run, executes := "", false
		c.mu.Lock()
		switch typ {
		case 'Q':
			run, _ = cstr(body)
			executes = true
			c.note(run)
		case 'P':
			name, rest := cstr(body)
			sql, _ := cstr(rest)
			c.stmts[name] = sql
			c.note(sql)
		case 'B':
			portal, rest := cstr(body)
			stmt, rest := cstr(rest)
			sql := c.stmts[stmt]
			c.portals[portal] = sql
			if !isBegin(sql) && !isCommit(sql) && !isRollback(sql) {
				c.tx.WriteString(sql)
				c.tx.WriteByte(0)
				c.tx.Write(rest) // the parameters, as sent
				c.tx.WriteByte(0)
			}
		case 'E':
			portal, _ := cstr(body)
			run = c.portals[portal]
			executes = true
		case 'C':
			if len(body) > 0 && body[0] == 'S' {
				name, _ := cstr(body[1:])
				delete(c.stmts, name)
			}
		}
		if executes && isBegin(run) {
			c.tx.Reset()
		} else if typ == 'Q' && !isCommit(run) && !isRollback(run) {
			c.tx.WriteString(run)
			c.tx.WriteByte(0)
		}
		// commits: this message commits a transaction (a COMMIT, or the
		// Sync of an implicit one).
		commits := executes && isCommit(run)
		switch {
		case executes && isBegin(run):
			c.block = true
		case executes && (isCommit(run) || isRollback(run)):
			c.block = false
		case typ == 'E' && !c.block:
			c.ran = true
		case typ == 'S':
			commits = !c.block && c.ran
			c.ran = false
		}
		var cutNow, after, afterSent *Armed
		for _, a := range rules {
			if !c.matchesLocked(a.rule.Match) {
				continue
			}
			switch {
			case a.rule.Cut == OnMatch:
				cutNow = a
			case a.rule.Cut == BeforeCommit && commits:
				cutNow = a
			case a.rule.Cut == AfterCommit && commits && c.pending == nil && c.pendingSync == nil:
				after = a
			case a.rule.Cut == AfterCommitSent && commits:
				afterSent = a
			}
			if cutNow != nil || after != nil || afterSent != nil {
				break
			}
		}
		if executes && (isCommit(run) || isRollback(run)) {
			c.ends++
		}
		if after != nil && typ == 'S' {
			c.pendingSync = after
		} else if after != nil {
			c.pending, c.pendingN = after, c.ends
		}
		if typ == 'S' || typ == 'Q' {
			c.syncs = append(c.syncs, c.ends)
		}
		if executes && (isCommit(run) || isRollback(run)) || typ == 'S' && !c.block {
			c.tx.Reset()
		}
		c.mu.Unlock()

		if cutNow != nil {
			if c.p.take(cutNow) {
				_ = w.Flush() // what came before the message reaches the server, as it would have
				cutNow.fire(c.id)
				c.cut(fmt.Sprintf("rule %s %q: message %q not forwarded", cutNow.rule.Cut, cutNow.rule.Match, typ))
				return
			}
		}
		if after != nil && !c.p.take(after) {
			c.mu.Lock()
			c.pending, c.pendingSync = nil, nil
			c.mu.Unlock()
		}
		if err := writeMsg(w, typ, body); err != nil {
			return
		}
		if afterSent != nil {
			if err := w.Flush(); err != nil {
				return
			}
			if c.p.take(afterSent) {
				afterSent.fire(c.id)
				c.cut(fmt.Sprintf("rule %s %q: COMMIT (message %q) forwarded", afterSent.rule.Cut, afterSent.rule.Match, typ))
				return
			}
		}
		if cr.Buffered() == 0 || w.Buffered() > 32<<10 {
			if err := w.Flush(); err != nil {
				return
			}
		}
		if typ == 'X' {
			_ = w.Flush()
			return
		}
	}
}

// fromServer forwards the server's messages; a pending AfterCommit cut
// fires on the COMMIT's CommandComplete, or on the ReadyForQuery of an
// implicit transaction's Sync that no ErrorResponse came before.
func (c *conn) fromServer(sr *bufio.Reader) {
	defer c.cut("server side ended")
	w := bufio.NewWriterSize(c.client, 64<<10)
	for {
		typ, body, err := readMsg(sr)
		if err != nil {
			_ = w.Flush()
			return
		}
		c.mu.Lock()
		var rearm *Armed
		switch typ {
		case 'E':
			c.failed = true
		case 'C':
			if tag, _ := cstr(body); tag == "COMMIT" || tag == "ROLLBACK" {
				c.answered++
			}
		case 'Z':
			if len(c.syncs) > 0 {
				c.answered, c.syncs = c.syncs[0], c.syncs[1:]
			}
			if ps := c.pendingSync; ps != nil {
				c.pendingSync = nil
				if c.failed {
					rearm = ps // rolled back at the Sync: the rule did not fire
				} else {
					c.mu.Unlock()
					_ = w.Flush()
					ps.fire(c.id)
					c.cut(fmt.Sprintf("rule %s %q: ReadyForQuery of the implicit transaction's Sync not forwarded", ps.rule.Cut, ps.rule.Match))
					return
				}
			}
			c.failed = false
		}
		pending := c.pending
		if pending != nil {
			switch typ {
			case 'C':
				// Another statement's reply, an earlier transaction's end,
				// or this one rolled back at its COMMIT (it had failed: the
				// rule is put back at the Sync's ReadyForQuery).
				if tag, _ := cstr(body); c.answered != c.pendingN || tag != "COMMIT" {
					pending = nil
				}
			case 'Z':
				if c.answered < c.pendingN {
					pending = nil // an earlier Sync's: the COMMIT is in a later one
					break
				}
				// The COMMIT never ran (an error before it): the rule
				// did not fire; put it back.
				c.pending = nil
				c.mu.Unlock()
				c.p.rearm(pending)
				c.mu.Lock()
				pending = nil
			default:
				pending = nil
			}
		}
		c.mu.Unlock()
		if rearm != nil {
			c.p.rearm(rearm)
		}
		if pending != nil {
			_ = w.Flush() // the replies before the COMMIT's reach the client, as they would have
			pending.fire(c.id)
			c.cut(fmt.Sprintf("rule %s %q: CommandComplete COMMIT not forwarded", pending.rule.Cut, pending.rule.Match))
			return
		}
		if err := writeMsg(w, typ, body); err != nil {
			return
		}
		if sr.Buffered() == 0 || w.Buffered() > 32<<10 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// matchesLocked reports whether the connection's transaction so far
// contains every string of match.
func (c *conn) matchesLocked(match []string) bool {
	tx := c.tx.Bytes()
	for _, m := range match {
		if !bytes.Contains(tx, []byte(m)) && !bytes.Contains(tx, []byte(hex.EncodeToString([]byte(m)))) {
			return false
		}
	}
	return true
}

func (p *Proxy) rulesSnapshot() []*Armed {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Armed(nil), p.rules...)
}

// take removes a from the armed rules; false if another connection took
// it first.
func (p *Proxy) take(a *Armed) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range p.rules {
		if r == a {
			p.rules = append(p.rules[:i], p.rules[i+1:]...)
			if a.rule.Refuse {
				p.refuse = true
			}
			return true
		}
	}
	return false
}

func (p *Proxy) rearm(a *Armed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.rules = append(p.rules, a)
	}
}
