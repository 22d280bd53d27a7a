package runstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Effect is an external side effect that must happen once: a ticket filed,
// a message sent, a payment made. Run.Effect records an intent durably
// before calling Do and the receipt after, so that no session sends it
// twice.
//
// Run.Effect calls Do and Check on its caller's goroutine. Do runs for a
// key only in the session that recorded its newest intent, never while
// another attempt of the key (in any live session, this one included)
// is under way. Check may run for one key in several goroutines and
// sessions at once (each settling an outcome it found unknown), so it
// must only ask. One Effect value used for several keys sees calls for
// each at once. A Do that panics, or calls runtime.Goexit (t.Fatal in a
// test), is recorded as unconfirmed (it may have landed) before the panic
// or Goexit goes on.
type Effect struct {
	// Request is the payload, recorded with the intent (optional). The
	// same key with a different Request is refused with ErrMismatch, as
	// Stripe refuses a reused idempotency key with other parameters.
	Request any

	// Do performs the effect. key is the full key, "<run-id>:<key>": hand
	// it to the receiving system as its idempotency key. Do returns the
	// receipt to record (any JSON, or nil), or ErrPending when the system
	// accepted the request without confirming it. A receipt that is not
	// JSON (a plain-text body: quote it as a JSON string), larger than
	// 4 MiB, nested deeper than 200 levels or with a key twice in an
	// object cannot be recorded: see Run.Effect.
	Do func(ctx context.Context, key string) (json.RawMessage, error)

	// Check asks the receiving system whether the effect with this key
	// happened, and for its receipt. It is called when an earlier attempt
	// ended without a confirmation (the session died, Do failed, or Do
	// returned ErrPending). Optional: without it such an effect is
	// unconfirmed and a person must Resolve it.
	Check func(ctx context.Context, key string) (receipt json.RawMessage, found bool, err error)
}

// Resolution is a person's decision on an unconfirmed side effect.
type Resolution struct {
	Sent    bool            // true: it happened (with Receipt); false: it did not, and may be sent again
	Receipt json.RawMessage // for Sent; nil is recorded as null
	By      string          // who decided (required)
	Note    string          // why, for the record (optional)
}

// Effect performs the side effect e once for key across every session of
// the run, and returns its receipt.
//
// A key already confirmed returns the stored receipt without calling Do.
// Otherwise Effect appends an intent record and makes it durable (see
// Stage.Complete) before calling Do, then appends the confirmation with the receipt, durably, before it
// returns. If a session died between the two, the key is ambiguous (the
// next Open records it as in doubt, EffectInDoubt): Check asks the
// receiving system; found → confirmed; not found → Do again with the same
// key; no Check, or Check failed → the effect is recorded as unconfirmed
// and Effect returns ErrUnconfirmed: a person must decide, with Resolve. A
// failed Do is treated the same way (it may have landed), and so is a
// receipt from Do or Check that cannot be recorded (see Effect.Do): the
// error wraps ErrUnconfirmed and ErrInvalid. A Request that cannot be
// recorded is ErrInvalid before anything is recorded or sent.
//
// When the confirmation (or unconfirmed record) could not be written and
// the Run stayed writable (a lock wait that ran out: Effect returns that
// error), the next Effect of the key in this Run treats the intent as a
// dead session's: Check decides, as above (attempts.go). When that
// happens after Do succeeded (that wait, or a Close while Do ran:
// ErrClosed), the error says that the effect happened and names its
// receipt, recorded nowhere; the next session finds the effect in doubt.
//
// Effect is safe for concurrent use by goroutines and processes: one key is
// attempted by one session at a time; others get ErrBusy meanwhile.
func (r *Run) Effect(ctx context.Context, key string, e Effect) (json.RawMessage, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if e.Do == nil {
		return nil, fmt.Errorf("%w: effect %s has no Do", ErrInvalid, key)
	}
	var payload json.RawMessage
	var phash string
	if e.Request != nil {
		data, err := json.Marshal(e.Request)
		if err != nil {
			return nil, fmt.Errorf("%w: effect %s request: %v", ErrInvalid, key, err)
		}
		if err := checkValue("effect "+key+": request", data); err != nil {
			return nil, err // a json.RawMessage in it may hold a key twice, or nest too deep
		}
		payload, phash = data, fingerprint(data)
	}
	full := r.ID() + ":" + key

	for tries := 0; tries < 10; tries++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Decide under the lock: stored receipt, an attempt elsewhere,
		// an ambiguous outcome to check, or a fresh intent to send.
		var (
			receipt json.RawMessage
			stored  bool
			check   bool // ambiguous: ask Check
			seen    int64
			pending bool
		)
		_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
			cur := s.effects[key]
			if cur != nil && phash != "" && cur.Payload != "" && cur.Payload != phash {
				return nil, fmt.Errorf("%w: effect %s was recorded with another request (%.19s, now %.19s): use a new key for a new request",
					ErrMismatch, key, cur.Payload, phash)
			}
			state := ""
			if cur != nil {
				state = cur.State
			}
			switch state {
			case EffectConfirmed:
				receipt, stored = cur.Receipt, true
				return nil, nil
			case EffectIntent:
				if r.alive(cur.Session) && !r.orphanIntent(key, cur) { // attempts.go
					who := "another session (" + cur.Session + ")"
					if cur.Session == r.session {
						who = "this session"
					}
					return nil, fmt.Errorf("%w: effect %s is being attempted by %s: call Effect again once that attempt ended", ErrBusy, key, who)
				}
				check, seen = true, cur.Seq
				return nil, nil
			case EffectUnconfirmed, EffectInDoubt:
				check, seen, pending = true, cur.Seq, cur.Pending
				return nil, nil
			}
			return []*Record{{Ev: evIntent, Key: key, Data: payload, Reason: phash}}, nil
		})
		if err != nil {
			return nil, err
		}
		if stored {
			r.c.mu.Lock()
			r.c.deduped++
			r.c.mu.Unlock()
			return receipt, nil
		}
		if check {
			again, rec, err := r.checkEffect(ctx, key, full, e, seen, pending, payload, phash)
			if errors.Is(err, errRecheck) {
				continue // another session settled it meanwhile: look again
			}
			if err != nil || !again {
				return rec, err
			}
			// Not found, and this session now holds a fresh intent.
		}
		return r.doEffect(ctx, key, full, e)
	}
	return nil, fmt.Errorf("%w: effect %s: other sessions kept settling it; call Effect again", ErrBusy, key)
}

// checkEffect settles an ambiguous effect with Check. It returns again=true
// when the effect was not found and this session recorded a new intent, so
// the caller should Do it.
func (r *Run) checkEffect(ctx context.Context, key, full string, e Effect, seen int64, pending bool, payload json.RawMessage, phash string) (again bool, receipt json.RawMessage, err error) {
	var found bool
	var cerr error
	if e.Check == nil {
		cerr = errors.New("no Check to ask the receiving system")
	} else {
		receipt, found, cerr = e.Check(ctx, full)
		if cerr == nil && found {
			if err := checkValue("effect "+key+": the receipt Check returned", orNull(receipt)); err != nil {
				found, cerr = false, err // it happened, and its receipt cannot be recorded: a person decides
			}
		}
	}
	var outErr error
	_, err = r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		cur := s.effects[key]
		if cur == nil || cur.Seq != seen {
			return nil, errRecheck // someone else settled it meanwhile
		}
		switch {
		case cerr != nil:
			msg := fmt.Sprintf("outcome unknown: %v", cerr)
			outErr = fmt.Errorf("%w: effect %s: outcome unknown: %w; resolve it with: %s", ErrUnconfirmed, key, cerr, r.where.resolve(key, "-sent RECEIPT|-not-sent -by NAME"))
			if cur.State == EffectUnconfirmed && cur.Error == msg {
				return nil, nil
			}
			// An accepted (pending) effect stays pending: a Check that
			// could not answer does not make it safe to send it again.
			rec := &Record{Ev: evUnconfirmed, Key: key, Error: msg}
			if cur.Pending {
				rec.Reason = pendingReason
			}
			return []*Record{rec}, nil
		case found:
			return []*Record{{Ev: evConfirm, Key: key, Data: orNull(receipt), Note: checkedNote}}, nil
		case pending:
			outErr = fmt.Errorf("%w: effect %s: accepted, not confirmed yet: %w", ErrUnconfirmed, key, ErrPending)
			return nil, nil
		default:
			again = true
			return []*Record{{Ev: evIntent, Key: key, Data: payload, Reason: phash}}, nil
		}
	})
	if err != nil { // errRecheck: another session settled it; the caller looks again
		return false, nil, err
	}
	if outErr != nil {
		return false, nil, outErr
	}
	if found {
		return false, receipt, nil
	}
	return again, nil, nil
}

// doEffect calls Do for an intent this session recorded, then records the
// outcome.
func (r *Run) doEffect(ctx context.Context, key, full string, e Effect) (json.RawMessage, error) {
	if err := r.hit(hookAfterIntent, key); err != nil {
		return nil, err
	}
	receipt, derr := r.callDo(ctx, key, full, e)
	if err := r.hit(hookAfterDo, key); err != nil {
		return nil, err
	}
	var rec *Record
	var bad error // a receipt that cannot be recorded
	if derr == nil {
		bad = checkValue("effect "+key+": the receipt Do returned", orNull(receipt))
	}
	switch {
	case bad != nil:
		rec = &Record{Ev: evUnconfirmed, Key: key, Error: "Do succeeded, but its receipt cannot be recorded: " + bad.Error()}
	case derr == nil:
		rec = &Record{Ev: evConfirm, Key: key, Data: orNull(receipt)}
	case errors.Is(derr, ErrPending):
		rec = &Record{Ev: evUnconfirmed, Key: key, Error: derr.Error(), Reason: pendingReason}
	default:
		rec = &Record{Ev: evUnconfirmed, Key: key, Error: "Do failed, it may have landed: " + derr.Error()}
	}
	if _, err := r.commit(true, func(*state) ([]*Record, error) { return []*Record{rec}, nil }); err != nil {
		r.intentFailed(key) // the next Effect of key asks Check (attempts.go)
		if derr == nil && bad == nil {
			// It happened: say so, with the receipt, which is recorded
			// nowhere (a Close that came meanwhile, a lock wait that ran
			// out, a failed write).
			// Not ErrUnconfirmed: the error is the write's (ErrClosed,
			// ErrLockTimeout ...), which callers (runstate effect) act on.
			return nil, fmt.Errorf("runstate: effect %s happened (Do returned the receipt %.200s), but its confirmation could not be recorded: %w; the next Effect call for the key asks its Check, or resolve it with: %s",
				key, orNull(receipt), err, r.where.resolve(key, "-sent RECEIPT -by NAME"))
		}
		return nil, errors.Join(derr, bad, err)
	}
	if bad != nil {
		return nil, fmt.Errorf("%w: effect %s happened, but %w; return the receipt as JSON (a plain-text body as a JSON string), then resolve it with: %s", ErrUnconfirmed, key, bad, r.where.resolve(key, "-sent RECEIPT -by NAME"))
	}
	if derr != nil {
		next := "the next Effect call for the key asks its Check whether it landed, or resolve it with: "
		if e.Check == nil {
			next = "it has no Check to ask whether it landed: resolve it with: "
		}
		return nil, fmt.Errorf("%w: effect %s: %w; %s%s", ErrUnconfirmed, key, derr, next, r.where.resolve(key, "-sent RECEIPT|-not-sent -by NAME"))
	}
	return orNull(receipt), nil
}

// callDo calls e.Do. When Do panics, the effect is recorded as unconfirmed
// (it may have landed) before the panic goes on: an intent held by this
// live session would otherwise make every later call ErrBusy. So it is
// when Do calls runtime.Goexit (t.Fatal in a test), which then goes on.
func (r *Run) callDo(ctx context.Context, key, full string, e Effect) (receipt json.RawMessage, err error) {
	panicked := true
	defer func() {
		if panicked {
			p := recover()
			what := fmt.Sprintf("Do panicked, it may have landed: %v", p)
			if p == nil { // runtime.Goexit (see Run.Do): no panic to go on with
				what = "Do " + errGoexit.Error() + ", it may have landed"
			}
			if _, err := r.commit(true, func(*state) ([]*Record, error) {
				return []*Record{{Ev: evUnconfirmed, Key: key, Error: what}}, nil
			}); err != nil {
				r.intentFailed(key)
			}
			if p != nil {
				panic(p)
			}
		}
	}()
	receipt, err = e.Do(ctx, full)
	panicked = false
	return receipt, err
}

// pendingReason marks an unconfirmed record written for ErrPending.
const pendingReason = "pending"

// inDoubtReason marks an unconfirmed record that Open writes for an intent
// whose session died: the effect is in doubt (EffectInDoubt), and the next
// Effect call asks Check before anyone needs to decide.
const inDoubtReason = "in-doubt"

func orNull(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

// Resolve records a person's decision on an effect whose outcome is unknown
// (unconfirmed, in doubt, or an intent whose session died): sent, with its
// receipt, or not sent, so that the next Effect call sends it. A Receipt
// that cannot be recorded (see Effect.Do) is ErrInvalid, and nothing is
// recorded. By and Note longer than 64 KiB are cut (see the package
// documentation). When Resolve returns nil the record is durable. Safe
// for concurrent use.
func (r *Run) Resolve(ctx context.Context, key string, res Resolution) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if res.By == "" {
		return fmt.Errorf("%w: Resolve needs the name of the person who decided", ErrInvalid)
	}
	if res.Sent {
		if err := checkValue("effect "+key+": the receipt to resolve it with", orNull(res.Receipt)); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := r.commitCtx(ctx, true, func(s *state) ([]*Record, error) {
		cur := s.effects[key]
		if cur == nil {
			return nil, fmt.Errorf("%w: effect %s is unknown to the run", ErrInvalid, key)
		}
		switch {
		case unsettled(cur.State):
		case cur.State == EffectIntent && !r.alive(cur.Session):
		default:
			return nil, fmt.Errorf("%w: effect %s is %s, not unconfirmed", ErrInvalid, key, cur.State)
		}
		if res.Sent {
			return []*Record{{Ev: evConfirm, Key: key, Data: orNull(res.Receipt), By: res.By, Note: res.Note}}, nil
		}
		return []*Record{{Ev: evResolve, Key: key, By: res.By, Note: res.Note}}, nil
	})
	return err
}

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty effect key", ErrInvalid)
	}
	if len(key) > maxKey {
		return fmt.Errorf("%w: effect key %.40q... is %d bytes, more than %d", ErrInvalid, key, len(key), maxKey)
	}
	if !utf8.ValidString(key) {
		// The ledger (JSON) would hold it with U+FFFD in place of the bad
		// bytes: a later session would not find it, and send it again.
		return fmt.Errorf("%w: effect key %q is not valid UTF-8", ErrInvalid, key)
	}
	for _, c := range key {
		if unicode.IsControl(c) {
			return fmt.Errorf("%w: effect key %q has a control character", ErrInvalid, key)
		}
	}
	return nil
}
