// Package natsjs is an effectively adapter written outside the effectively
// module, for NATS JetStream: publishing a message to a stream becomes an
// effect that happens once per idempotency key for as long as the stream's
// duplicate window lasts.
//
// JetStream deduplicates on the Nats-Msg-Id header: a message whose id the
// stream saw within its duplicate window (StreamConfig.Duplicates, 2 minutes
// by default) is acknowledged as a duplicate and not stored again. The
// adapter sends the key as the Nats-Msg-Id, so the stream itself enforces
// the key, atomically with storing the message, and declares the window as
// its contract's Horizon: a redelivery later than the window publishes a
// second message. Choose a window longer than the broker's redelivery
// delay plus the longest replay, or put a journal in front.
//
// The stream does not compare payloads: a duplicate id is acknowledged
// whatever the body. The adapter adds a fingerprint header, and on a
// duplicate acknowledgement reads the stored message back (one more round
// trip, only on replays) to tell a replay from key reuse.
package natsjs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"effectively.dev/effects"
)

// FingerprintHeader holds the hex fingerprint of the message's subject,
// data and headers, for telling a replay from key reuse.
const FingerprintHeader = "Effectively-Fingerprint"

const op = "natsjs.Apply"

// ErrReservedHeader is returned, before any I/O, for a Message whose Header
// sets Nats-Msg-Id or the fingerprint header: both are the adapter's.
var ErrReservedHeader = errors.New("natsjs: header is set by the adapter")

// Message is what one effect publishes. Subject must be bound to the
// Publisher's stream.
type Message struct {
	Subject string
	Data    []byte
	Header  nats.Header // optional; must not set Nats-Msg-Id or the fingerprint header
}

// DefaultAckTimeout is how long Apply waits for the stream's
// acknowledgement unless [WithAckTimeout] says otherwise.
const DefaultAckTimeout = 5 * time.Second

// Publisher publishes one message per idempotency key to a JetStream stream.
// It implements effects.Effect[Message] and is safe for concurrent use.
type Publisher struct {
	js         jetstream.JetStream
	stream     jetstream.Stream
	contract   effects.Contract
	ackTimeout time.Duration
}

// Option configures a [Publisher].
type Option func(*config)

type config struct{ ackTimeout time.Duration }

// WithAckTimeout bounds how long Apply waits for the acknowledgement of a
// publish, and for the read-back of a duplicate's first message (default
// [DefaultAckTimeout]), whatever the caller's context allows: when the connection drops after the request was sent, the
// client reconnects but the reply is lost for good, and without a bound
// Apply would wait for the caller's whole deadline. The publish is then
// ErrAmbiguous, and a retry with the same key replays it if it was stored,
// provided the retry comes within the duplicate window: [New] refuses a
// timeout that is not shorter than the stream's window.
func WithAckTimeout(d time.Duration) Option { return func(c *config) { c.ackTimeout = d } }

// New returns a Publisher for the stream named stream. It reads the
// stream's configuration once, to declare its duplicate window as the
// contract's horizon. It returns an *effects.ConfigError for a missing
// argument, a bad option, or a stream without a duplicate window.
func New(ctx context.Context, js jetstream.JetStream, stream string, opts ...Option) (*Publisher, error) {
	c := config{ackTimeout: DefaultAckTimeout}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	switch {
	case js == nil || stream == "":
		return nil, &effects.ConfigError{Op: "natsjs.New", Option: "js, stream", Reason: "a JetStream context and a stream name are required"}
	case c.ackTimeout <= 0:
		return nil, &effects.ConfigError{Op: "natsjs.New", Option: "WithAckTimeout", Reason: fmt.Sprintf("%v, want > 0", c.ackTimeout)}
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("natsjs.New: stream %q: %w", stream, err)
	}
	window := s.CachedInfo().Config.Duplicates
	switch {
	case window <= 0:
		return nil, &effects.ConfigError{Op: "natsjs.New", Option: "stream", Reason: fmt.Sprintf("stream %q has no duplicate window: it cannot deduplicate", stream)}
	case c.ackTimeout >= window:
		return nil, &effects.ConfigError{Op: "natsjs.New", Option: "WithAckTimeout", Reason: fmt.Sprintf(
			"%v is not shorter than stream %q's duplicate window %v: a retry after a lost acknowledgement would publish again", c.ackTimeout, stream, window)}
	}
	return &Publisher{js: js, stream: s, ackTimeout: c.ackTimeout, contract: effects.Contract{
		Guarantee:       effects.EffectivelyOnce,
		Enforcer:        "nats jetstream: Nats-Msg-Id deduplication in stream " + stream,
		Horizon:         window,
		DetectsKeyReuse: true,
	}}, nil
}

// Contract declares effectively-once within the stream's duplicate window.
func (p *Publisher) Contract() effects.Contract { return p.contract }

// Apply publishes m with the key as its Nats-Msg-Id. It returns Applied with
// the stream sequence ("stream/seq"), or Replayed with the first message's
// sequence when the stream saw the key within its window.
func (p *Publisher) Apply(ctx context.Context, key effects.Key, m Message) (effects.Result, error) {
	if err := key.Validate(); err != nil {
		return effects.Result{}, err
	}
	for k := range m.Header {
		if strings.EqualFold(k, jetstream.MsgIDHeader) || strings.EqualFold(k, FingerprintHeader) {
			return effects.Result{}, fmt.Errorf("%s key %q: %w: %s", op, key, ErrReservedHeader, k)
		}
	}
	fp := fingerprint(m)
	msg := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header{}}
	for k, vs := range m.Header {
		msg.Header[k] = slices.Clone(vs)
	}
	msg.Header.Set(FingerprintHeader, fp)
	actx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	ack, err := p.js.PublishMsg(actx, msg, jetstream.WithMsgID(string(key)))
	cancel()
	if err != nil {
		return effects.Result{}, classify(key, err)
	}
	ref := fmt.Sprintf("%s/%d", ack.Stream, ack.Sequence)
	if !ack.Duplicate {
		return effects.Result{Status: effects.Applied, Ref: ref}, nil
	}
	// Bounded like the publish: a reply lost on the way back would
	// otherwise leave the read waiting for as long as ctx lasts.
	gctx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	first, err := p.stream.GetMsg(gctx, ack.Sequence)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// The stream still remembers the id, but limits removed the first
		// message: nothing was stored now, and nothing is left to compare.
		return effects.Result{Status: effects.Replayed, Ref: ref}, nil
	case err != nil:
		// The duplicate ack is certain; only the payload check is missing.
		return effects.Result{}, effects.Transient(op, key, fmt.Errorf("reading back message %s: %w", ref, err))
	case first.Header.Get(FingerprintHeader) != fp:
		return effects.Result{}, &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key,
			Err: fmt.Errorf("message %s was published under this key with another payload", ref)}
	}
	return effects.Result{Status: effects.Replayed, Ref: ref}, nil
}

// classify sorts a failed publish. Only "no responders" (no stream listens
// on the subject) proves nothing was stored; a JetStream API error is a
// refusal; anything else (a timeout, a lost connection) may have stored it.
func classify(key effects.Key, err error) error {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return effects.Transient(op, key, err)
	case errors.As(err, &api), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%s key %q: %w", op, key, err)
	}
	return effects.Ambiguous(op, key, err)
}

// fingerprint covers the subject, the data and the caller's headers.
func fingerprint(m Message) string {
	fields := [][]byte{[]byte(m.Subject), m.Data}
	for _, k := range slices.Sorted(maps.Keys(m.Header)) {
		for _, v := range m.Header[k] {
			fields = append(fields, []byte(k), []byte(v))
		}
	}
	return hex.EncodeToString(effects.Fingerprint(fields...))
}
