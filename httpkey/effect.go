package httpkey

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"effectively.dev/effects"
	"effectively.dev/effects/journal"
)

// op names the effect in errors and logs.
const op = "httpkey.Apply"

// Effect is an [effects.Effect] that sends one HTTP request per Apply,
// built from the input by the request function given to [New], with the
// effect's key as the request's idempotency key. It is safe for
// concurrent use.
type Effect[In any] struct {
	client   http.Client
	build    func(ctx context.Context, in In) (*http.Request, error)
	place    placement
	name     string // the header's canonical name, or the JSON member's
	display  string // the name as configured, for the contract
	max      int
	replay   string // the replay header's canonical name, "" for none
	replayV  string // the value that marks a replay
	replayA  bool   // any non-empty value marks a replay
	statuses map[int]Outcome
	ref      func(*http.Response, []byte) (string, error)
	j        *journal.Journaled
	contract effects.Contract
}

// New returns the effect that sends build's request over client. build
// makes the request for one input: method, absolute http(s) URL, headers
// (credentials included) and body, as http.NewRequestWithContext would;
// it must not set the key, which Apply adds where the options say (the
// Idempotency-Key header by default), and it is never given the key, so
// the key can never end up in a URL. Apply never follows redirects: a 3xx
// is a configuration error. client's other settings (transport, timeout,
// cookie jar) are used as they are.
//
//	charges, err := httpkey.New(http.DefaultClient,
//		func(ctx context.Context, c Charge) (*http.Request, error) {
//			body, err := json.Marshal(c)
//			if err != nil {
//				return nil, err
//			}
//			req, err := http.NewRequestWithContext(ctx, "POST", "https://payments.example.com/v1/charges", bytes.NewReader(body))
//			if err != nil {
//				return nil, err
//			}
//			req.Header.Set("Content-Type", "application/json")
//			return req, nil
//		},
//		httpkey.IETF(), httpkey.WithHorizon(24*time.Hour), httpkey.WithRef(httpkey.JSONField("id")))
//
// A build error that [effects.ClassOf] does not classify is
// [effects.ErrPoison] (the input cannot become a request); return a
// classified error to say otherwise. New returns a *[effects.ConfigError]
// for a nil client or build, an invalid option, or a missing horizon.
func New[In any](client *http.Client, build func(ctx context.Context, in In) (*http.Request, error), opts ...Option) (*Effect[In], error) {
	cfg := defaults()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	bad := func(option, format string, args ...any) error {
		return &effects.ConfigError{Op: "httpkey.New", Option: option, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case client == nil:
		return nil, bad("client", "nil; pass the *http.Client to send requests with (http.DefaultClient, or one with your transport)")
	case build == nil:
		return nil, bad("build", "nil; pass the function that makes the request for an input")
	case cfg.place == inField && cfg.name == "":
		return nil, bad("WithKeyField", "empty member name")
	case cfg.place != inField && !validToken(cfg.name):
		return nil, bad("WithKeyHeader", "%q is not a valid header name", cfg.name)
	case cfg.maxKeyLen < MinKeyLen:
		return nil, bad("WithMaxKeyLen", "%d: at least %d, to keep shortened keys apart", cfg.maxKeyLen, MinKeyLen)
	case cfg.replayName != "" && !validToken(cfg.replayName):
		return nil, bad("WithReplayHeader", "%q is not a valid header name", cfg.replayName)
	case cfg.replayName != "" && !cfg.replayAny && strings.TrimSpace(cfg.replayValue) == "":
		return nil, bad("WithReplayHeader", "empty value for header %s", cfg.replayName)
	case cfg.horizon <= 0:
		return nil, bad("WithHorizon", "the server's key horizon is not set (%v): give how long the API keeps an idempotency key, "+
			"from its documentation (the IETF draft leaves it to each server; PayPal's differs per API)", cfg.horizon)
	case cfg.refSet && cfg.ref == nil:
		return nil, bad("WithRef", "nil function")
	case cfg.lease <= 0:
		return nil, bad("WithLease", "lease %v is not positive", cfg.lease)
	case cfg.loggerSet && cfg.logger == nil:
		return nil, bad("WithLogger", "nil logger")
	}
	statuses := make(map[int]Outcome, len(cfg.statuses))
	for code, o := range cfg.statuses {
		statuses[code] = o
	}
	for _, a := range cfg.assigned {
		if a.outcome < InFlight || a.outcome > Misconfigured {
			return nil, bad("WithStatus", "unknown outcome %v", a.outcome)
		}
		if len(a.codes) == 0 {
			return nil, bad("WithStatus", "no status given for %v", a.outcome)
		}
		for _, code := range a.codes {
			if code < 400 || code > 599 {
				return nil, bad("WithStatus", "status %d: only 4xx and 5xx can be assigned (2xx is success, 3xx a redirect Apply does not follow)", code)
			}
			statuses[code] = a.outcome
		}
	}

	e := &Effect[In]{
		client:   *client,
		build:    build,
		place:    cfg.place,
		name:     cfg.name,
		display:  cfg.name,
		max:      cfg.maxKeyLen,
		replayV:  strings.TrimSpace(cfg.replayValue),
		replayA:  cfg.replayAny,
		statuses: statuses,
		ref:      cfg.ref,
	}
	e.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if cfg.place != inField {
		e.name = http.CanonicalHeaderKey(cfg.name)
	}
	if cfg.replayName != "" {
		e.replay = http.CanonicalHeaderKey(cfg.replayName)
	}
	serverReuse := false
	for _, o := range statuses {
		serverReuse = serverReuse || o == KeyReused
	}
	jopts := []journal.Option{
		journal.WithLease(cfg.lease),
		journal.WithNotApplied(func(err error) bool { return errors.Is(err, effects.ErrRefused) }),
	}
	if e.replay != "" && serverReuse {
		// The server's key guards the call as Stripe's does: it answers
		// in-flight while another request executes, replays (and says
		// so) after, and refuses another payload. The journal need not
		// gate the call.
		jopts = append(jopts, journal.WithOwnerIdempotency())
	}
	if cfg.logger != nil {
		jopts = append(jopts, journal.WithLogger(cfg.logger))
	}
	jopts = append(jopts, journal.WithObserver(cfg.observer))
	j, err := journal.NewJournaled(op, cfg.journal, jopts...)
	if err != nil {
		return nil, err
	}
	e.j = j
	e.contract = contractOf(cfg, e.describeKey(), serverReuse)
	if err := e.contract.Validate(); err != nil {
		panic(fmt.Sprintf("httpkey: derived an invalid contract: %v", err)) // a bug in contractOf
	}
	return e, nil
}

// contractOf derives the contract from the configuration; see the package
// doc, "The contract".
func contractOf(cfg config, where string, serverReuse bool) effects.Contract {
	c := effects.Contract{
		Enforcer:        fmt.Sprintf("httpkey: %s, kept by the server for %v", where, cfg.horizon),
		Horizon:         cfg.horizon,
		DetectsKeyReuse: serverReuse,
	}
	switch {
	case cfg.replayName != "" && cfg.replayAny:
		c.Enforcer += ", replays marked by a " + cfg.replayName + " header"
	case cfg.replayName != "":
		c.Enforcer += fmt.Sprintf(", replays marked %s: %s", cfg.replayName, strings.TrimSpace(cfg.replayValue))
	default:
		c.Enforcer += ", no replay signal"
	}
	switch {
	case cfg.journal != nil:
		c.Guarantee = effects.EffectivelyOnce
		c.Horizon = 0
		c.DetectsKeyReuse = true // the journal's fingerprint, or the server's check before the record
		c.Enforcer += ", then the journal's record of the response"
	case cfg.replayName != "":
		c.Guarantee = effects.EffectivelyOnce
	default:
		c.Guarantee = effects.AtLeastOnce
		c.DuplicateWindow = effects.Window{
			Trigger: effects.AnyRedelivery,
			Between: fmt.Sprintf("no replay signal: a repeat is reported Applied, though within %v the server answers it "+
				"with its stored response and creates nothing; after %v it executes again", cfg.horizon, cfg.horizon),
		}
	}
	return c
}

// describeKey says where the key goes, for the contract.
func (e *Effect[In]) describeKey() string {
	switch e.place {
	case inField:
		return fmt.Sprintf("key in the JSON body's %q", e.display)
	case inStructuredHeader:
		return "key in the " + e.display + " header (a structured string)"
	}
	return "key in the " + e.display + " header"
}

// Contract is derived from the configuration: effectively-once for the
// server's horizon when the server has a replay signal
// ([WithReplayHeader]); effectively-once with Horizon 0 with a journal;
// at-least-once otherwise. See the package doc.
func (e *Effect[In]) Contract() effects.Contract { return e.contract }

// WireKey returns key as the server receives it (without the quotes of a
// structured header): key itself for keys of printable ASCII without '%',
// '"' and '\' within the length limit, else escaped and perhaps shortened
// (see [WithMaxKeyLen]). Use it to find a request in the vendor's
// dashboard or logs. It returns the error Apply would for an invalid key.
func (e *Effect[In]) WireKey(key effects.Key) (string, error) {
	if err := validate(key); err != nil {
		return "", err
	}
	return wireKey(key, e.max), nil
}

// Apply sends the request for in with key as its idempotency key, or
// finds it sent: Applied with the ref the first time; Replayed afterwards
// when the server's replay signal or the journal tells so (without
// either, every success is Applied). Errors are classified as the package
// doc describes.
func (e *Effect[In]) Apply(ctx context.Context, key effects.Key, in In) (effects.Result, error) {
	if err := validate(key); err != nil {
		return effects.Result{}, err
	}
	req, body, err := e.request(ctx, key, in)
	if err != nil {
		return effects.Result{}, err
	}
	var fp []byte
	if e.j.Journal() != nil {
		// The payload: method, URL and body (without the key). Headers
		// are left out: credentials rotate, tracing headers differ per
		// attempt.
		fp = effects.Fingerprint([]byte(req.Method), []byte(req.URL.String()), body)
	}
	return e.j.Apply(ctx, key, fp, func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
		return e.call(ctx, key, req)
	})
}

// validate refuses keys no request may carry.
func validate(key effects.Key) error {
	if err := key.Validate(); err != nil {
		var ke *effects.Error
		if errors.As(err, &ke) {
			return &effects.Error{Kind: effects.ErrInvalidKey, Op: op, Key: key, Err: ke.Err}
		}
		return err
	}
	return nil
}

// request builds the request for in and puts key in it. It returns the
// body as built (without the key) when the journal's fingerprint or the
// key's field needs it, nil otherwise.
func (e *Effect[In]) request(ctx context.Context, key effects.Key, in In) (*http.Request, []byte, error) {
	req, err := e.build(ctx, in)
	if err != nil {
		if effects.ClassOf(err) != effects.Unclassified {
			return nil, nil, fmt.Errorf("%s key %q: building the request: %w", op, key, err)
		}
		return nil, nil, &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("building the request: %w", err)}
	}
	misbuilt := func(format string, args ...any) error {
		return &effects.ConfigError{Op: op, Option: "the request function", Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case req == nil:
		return nil, nil, misbuilt("returned a nil request and no error")
	case req.URL == nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.Host == "":
		return nil, nil, misbuilt("request URL %q is not an absolute http:// or https:// URL", urlString(req))
	}
	var body []byte
	if e.place == inField || e.j.Journal() != nil {
		if body, err = readBody(req); err != nil {
			return nil, nil, &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("reading the request's body: %w", err)}
		}
	}
	wire := wireKey(key, e.max)
	switch e.place {
	case inField:
		withKey, err := addMember(body, e.name, wire)
		if err != nil {
			return nil, nil, misbuilt("%v", err)
		}
		setBody(req, withKey)
	default:
		if req.Header == nil {
			req.Header = http.Header{}
		}
		if _, ok := req.Header[e.name]; ok {
			return nil, nil, misbuilt("the request already has a %s header; leave it to the effect, which sets it from the key", e.name)
		}
		if e.place == inStructuredHeader {
			wire = `"` + wire + `"` // wireKey leaves nothing a String must escape
		}
		req.Header[e.name] = []string{wire}
	}
	return req, body, nil
}

func urlString(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return req.URL.String()
}

// readBody returns req's body and leaves req able to send it.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		rc, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	b, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	setBody(req, b)
	return b, nil
}

// setBody makes b req's body, resendable (GetBody) and with its length.
func setBody(req *http.Request, b []byte) {
	req.ContentLength = int64(len(b))
	if len(b) == 0 {
		req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// addMember returns the JSON object body with the string member name:
// value added first; the rest of the body is kept byte for byte.
func addMember(body []byte, name, value string) ([]byte, error) {
	rest := bytes.TrimLeft(body, " \t\r\n")
	var members map[string]json.RawMessage
	if len(rest) == 0 || rest[0] != '{' || json.Unmarshal(body, &members) != nil {
		return nil, fmt.Errorf("the body is not a JSON object, so the key cannot go in its %q member (WithKeyField): %s", name, snippet(body, 64))
	}
	if _, ok := members[name]; ok {
		return nil, fmt.Errorf("the body already has a %q member; leave it to the effect, which sets it from the key", name)
	}
	n, _ := json.Marshal(name) // strings always marshal
	v, _ := json.Marshal(value)
	out := make([]byte, 0, len(rest)+len(n)+len(v)+2)
	out = append(out, '{')
	out = append(out, n...)
	out = append(out, ':')
	out = append(out, v...)
	if len(members) > 0 {
		out = append(out, ',')
	}
	return append(out, rest[1:]...), nil
}

// call sends req (which carries the key) on ctx and classifies the
// outcome.
func (e *Effect[In]) call(ctx context.Context, key effects.Key, req *http.Request) (effects.Result, error) {
	resp, err := e.client.Do(req.WithContext(ctx))
	if err != nil {
		return effects.Result{}, transportError(key, req, err)
	}
	defer resp.Body.Close()
	replayed := e.replayed(resp.Header)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // the status decides; a cut body changes nothing
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))   // so the connection can be reused
		return effects.Result{}, e.statusError(key, req, &ResponseError{StatusCode: resp.StatusCode, Header: resp.Header, Body: body, Replayed: replayed})
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("HTTP %d, then reading its body: %w", resp.StatusCode, err))
	}
	res := effects.Result{Status: effects.Applied}
	if replayed {
		res.Status = effects.Replayed
	}
	if e.ref != nil {
		if res.Ref, err = e.ref(resp, body); err != nil {
			// Applied, so not a refusal: the Ambiguous underneath keeps a
			// journal's lease, and the retry after the fix replays.
			return effects.Result{}, fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "WithRef",
				Reason: fmt.Sprintf("HTTP %d applied the request, but its ref cannot be read (fix WithRef; a retry replays it)", resp.StatusCode)},
				effects.Ambiguous(op, key, err))
		}
	}
	return res, nil
}

// replayed reports whether h carries the server's replay signal.
func (e *Effect[In]) replayed(h http.Header) bool {
	if e.replay == "" {
		return false
	}
	v := strings.TrimSpace(h.Get(e.replay))
	if e.replayA {
		return v != ""
	}
	return strings.EqualFold(v, e.replayV)
}

// outcome returns the outcome of a non-2xx status.
func (e *Effect[In]) outcome(code int) Outcome {
	if o, ok := e.statuses[code]; ok {
		return o
	}
	if code >= 400 && code < 500 {
		return Refused
	}
	return Ambiguous // 5xx, and statuses no server should send
}

// statusError classifies a response that is not 2xx.
func (e *Effect[In]) statusError(key effects.Key, req *http.Request, re *ResponseError) error {
	origin := req.URL.Scheme + "://" + req.URL.Host
	if re.StatusCode >= 300 && re.StatusCode < 400 {
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "request URL " + origin + req.URL.Path,
			Reason: fmt.Sprintf("the server redirects (HTTP %d, Location %q), and Apply does not follow redirects: "+
				"point the request at the final URL", re.StatusCode, re.Header.Get("Location"))}, re)
	}
	if re.StatusCode >= 500 && re.Replayed {
		return &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("%w: %w", ErrReplayedServerError, re)}
	}
	wait := retryAfter(re.Header, time.Now())
	switch e.outcome(re.StatusCode) {
	case InFlight:
		return &effects.Error{Kind: effects.ErrInFlight, Op: op, Key: key, Err: re, RetryAfter: wait}
	case KeyReused:
		return &effects.Error{Kind: effects.ErrKeyReused, Op: op, Key: key, Err: re}
	case Transient:
		return &effects.Error{Kind: effects.ErrTransient, Op: op, Key: key, Err: re, RetryAfter: wait}
	case Misconfigured:
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "credentials or endpoint for " + origin,
			Reason: fmt.Sprintf("HTTP %d %s (no retry fixes this: check the credentials, permissions and URL)", re.StatusCode, http.StatusText(re.StatusCode))}, re)
	case Refused:
		return &effects.Error{Kind: effects.ErrRefused, Op: op, Key: key, Err: re}
	}
	return &effects.Error{Kind: effects.ErrAmbiguous, Op: op, Key: key, Err: re, RetryAfter: wait}
}

// transportError classifies a request that got no response: a wrong
// endpoint (a TLS handshake refused, a host that does not exist) is a
// configuration error; a connection that was never made sent nothing
// (ErrTransient); anything else may have reached the server
// (ErrAmbiguous).
func transportError(key effects.Key, req *http.Request, err error) error {
	if cerr := effects.Misconfigured(op, req.URL.Scheme+"://"+req.URL.Host, err); cerr != nil {
		return cerr
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return effects.Transient(op, key, err)
	}
	return effects.Ambiguous(op, key, err)
}

// validToken reports whether s is an HTTP token (a valid header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
