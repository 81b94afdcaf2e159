package httpkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
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
	client    http.Client
	build     func(ctx context.Context, in In) (*http.Request, error)
	place     placement
	name      string   // the header's canonical name
	display   string   // the name as configured, for the contract
	field     []string // the JSON member's path, for inField
	format    keyFormat
	replay    string // the replay header's canonical name, "" for none
	replayV   string // the value that marks a replay
	replayA   bool   // any non-empty value marks a replay
	statuses  map[int]Outcome
	rules     []Rule
	bodyRules bool // a rule reads a 2xx body, so a 2xx body is read
	codePath  []string
	reqID     string
	reqPath   []string
	keepBody  bool
	maxBody   int64
	timeout   time.Duration // per call, without a journal
	pathOf    func(string) string
	ref       func(*http.Response, []byte) (string, error)
	j         *journal.Journaled
	contract  effects.Contract
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
//		httpkey.IETF, httpkey.WithHorizon(24*time.Hour), httpkey.WithRef(httpkey.JSONField("id")))
//
// A build error that [effects.ClassOf] does not classify is
// [effects.ErrPoison] (the input cannot become a request); return a
// classified error to say otherwise. New returns a *[effects.ConfigError]
// for a nil client or build, an invalid option, or a missing horizon.
func New[In any](client *http.Client, build func(ctx context.Context, in In) (*http.Request, error), opts ...Option) (*Effect[In], error) {
	cfg := defaults()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(client != nil, build != nil); err != nil {
		return nil, err
	}
	statuses, err := cfg.statusTable()
	if err != nil {
		return nil, err
	}
	e := newEffect(client, build, cfg, statuses)
	if e.j, err = journal.NewJournaled(op, cfg.journal, cfg.journalOptions(e.replay != "", e.serverReuse())...); err != nil {
		return nil, err
	}
	e.contract = contractOf(cfg, e.describeKey(), e.serverReuse(), e.signal())
	if err := e.contract.Validate(); err != nil {
		panic(fmt.Sprintf("httpkey: derived an invalid contract: %v", err)) // a bug in contractOf
	}
	return e, nil
}

// bad returns the *effects.ConfigError of New for option.
func bad(option, format string, args ...any) error {
	return &effects.ConfigError{Op: "httpkey.New", Option: option, Reason: fmt.Sprintf(format, args...)}
}

// validate checks the configuration and New's arguments.
func (cfg *config) validate(client, build bool) error {
	switch {
	case !client:
		return bad("client", "nil; pass the *http.Client to send requests with (http.DefaultClient, or one with your transport)")
	case !build:
		return bad("build", "nil; pass the function that makes the request for an input")
	case cfg.place == inField && (len(cfg.field) == 0 || slices.Contains(cfg.field, "")):
		return bad("WithKeyField", "empty member name in %q", cfg.field)
	case cfg.place != inField && !validToken(cfg.name):
		return bad("WithKeyHeader", "%q is not a valid header name", cfg.name)
	case cfg.replayName != "" && !validToken(cfg.replayName):
		return bad("WithReplayHeader", "%q is not a valid header name", cfg.replayName)
	case cfg.replayName != "" && !cfg.replayAny && strings.TrimSpace(cfg.replayValue) == "":
		return bad("WithReplayHeader", "blank value for header %s (an empty value means any)", cfg.replayName)
	case cfg.horizon <= 0:
		return bad("WithHorizon", "the server's key horizon is not set (%v): give how long the API keeps an idempotency key, "+
			"from its documentation (WithHorizon), or your estimate where it publishes none (WithAssumedHorizon)", cfg.horizon)
	case cfg.refSet && cfg.ref == nil:
		return bad("WithRef", "nil function")
	case cfg.maxBody <= 0:
		return bad("WithMaxBody", "%d is not positive", cfg.maxBody)
	case cfg.timeout <= 0:
		return bad("WithTimeout", "%v is not positive", cfg.timeout)
	case cfg.pathOf == nil:
		return bad("WithPathTemplate", "nil function")
	case cfg.requestID != "" && !validToken(cfg.requestID):
		return bad("WithRequestIDHeader", "%q is not a valid header name", cfg.requestID)
	}
	for i, r := range cfg.rules {
		if why := validRule(r); why != "" {
			return bad("WithRule", "rule %d: %s", i+1, why)
		}
	}
	return cfg.keyFmt.validate()
}

// validate checks a key format.
func (f keyFormat) validate() error {
	switch {
	case f.uuid:
		return nil
	case f.alphabet == "" && f.max < minKeyLen:
		return bad("WithMaxKeyLen", "%d: at least %d, to keep shortened keys apart", f.max, minKeyLen)
	case f.alphabet == "":
		return nil
	}
	syms := emitted(f.alphabet)
	for i := 0; i < len(f.alphabet); i++ {
		if c := f.alphabet[i]; c < ' ' || c > '~' {
			return bad("WithKeyAlphabet", "byte %#x: the alphabet holds printable ASCII only", c)
		}
	}
	switch d := digestLen(len(syms)); {
	case len(syms) < 2:
		return bad("WithKeyAlphabet", "%q: at least two symbols other than space", f.alphabet)
	case f.min < 0 || f.max < f.min:
		return bad("WithKeyAlphabet", "lengths %d to %d", f.min, f.max)
	case f.max < d:
		return bad("WithKeyAlphabet", "at most %d bytes cannot hold a %d-bit digest in %d symbols (%d needed)", f.max, digestBits, len(syms), d)
	case float64(f.min)*math.Log2(float64(len(syms))) > 512:
		return bad("WithKeyAlphabet", "at least %d bytes is more than a 512-bit digest fills", f.min)
	}
	return nil
}

// statusTable returns the outcome of each assigned status.
func (cfg *config) statusTable() (map[int]Outcome, error) {
	statuses := make(map[int]Outcome, len(cfg.statuses))
	for code, o := range cfg.statuses {
		statuses[code] = o
	}
	for _, a := range cfg.assigned {
		if a.outcome < InFlight || a.outcome > Misconfigured {
			return nil, bad("WithStatus", "unknown outcome %v (Done needs a Rule, which reads the ref)", a.outcome)
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
	return statuses, nil
}

// newEffect builds the effect from a valid configuration.
func newEffect[In any](client *http.Client, build func(context.Context, In) (*http.Request, error), cfg config, statuses map[int]Outcome) *Effect[In] {
	e := &Effect[In]{
		client:   *client,
		build:    build,
		place:    cfg.place,
		name:     cfg.name,
		display:  cfg.name,
		field:    cfg.field,
		format:   cfg.keyFmt,
		replayV:  strings.TrimSpace(cfg.replayValue),
		replayA:  cfg.replayAny,
		statuses: statuses,
		rules:    cfg.rules,
		codePath: cfg.codePath,
		reqPath:  cfg.requestPath,
		keepBody: cfg.keepBody,
		maxBody:  cfg.maxBody,
		timeout:  cfg.timeout,
		pathOf:   cfg.pathOf,
		ref:      cfg.ref,
	}
	e.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if cfg.place != inField {
		e.name = http.CanonicalHeaderKey(cfg.name)
	}
	if cfg.replayName != "" {
		e.replay = http.CanonicalHeaderKey(cfg.replayName)
	}
	if cfg.requestID != "" {
		e.reqID = http.CanonicalHeaderKey(cfg.requestID)
	}
	for _, r := range cfg.rules {
		success := len(r.Status) == 0 || slices.ContainsFunc(r.Status, func(code int) bool { return code >= 200 && code <= 299 })
		e.bodyRules = e.bodyRules || len(r.Field) > 0 && success
	}
	return e
}

// serverReuse reports whether the server says when a key is reused.
func (e *Effect[In]) serverReuse() bool {
	for _, o := range e.statuses {
		if o == KeyReused {
			return true
		}
	}
	for _, r := range e.rules {
		if r.Outcome == KeyReused {
			return true
		}
	}
	return false
}

// signal reports whether the server tells a replay from a first answer:
// a replay header, or a rule that says Done.
func (e *Effect[In]) signal() bool {
	if e.replay != "" {
		return true
	}
	for _, r := range e.rules {
		if r.Outcome == Done {
			return true
		}
	}
	return false
}

// journalOptions returns the journal's options: the lease gates the call
// unless the server's key guards it as Stripe's does.
func (cfg *config) journalOptions(replayHeader, serverReuse bool) []journal.Option {
	jopts := append(cfg.jopts[:len(cfg.jopts):len(cfg.jopts)],
		journal.WithNotApplied(func(err error) bool { return errors.Is(err, effects.ErrRefused) }))
	if replayHeader && serverReuse && cfg.failsKept {
		// The server's key guards the call as Stripe's does: it answers
		// in-flight while another request executes, replays (and says
		// so) after, and refuses another payload. The journal need not
		// gate the call.
		jopts = append(jopts, journal.WithOwnerIdempotency())
	}
	return jopts
}

// contractOf derives the contract from the configuration; see the package
// doc, "The contract".
func contractOf(cfg config, where string, serverReuse, signal bool) effects.Contract {
	c := effects.Contract{
		Enforcer:        fmt.Sprintf("httpkey: %s, kept by the server for %v", where, cfg.horizon),
		Horizon:         cfg.horizon,
		HorizonAssumed:  cfg.assumed || cfg.unpublished,
		DetectsKeyReuse: serverReuse,
	}
	if c.HorizonAssumed {
		c.Enforcer = fmt.Sprintf("httpkey: %s, kept by the server for an assumed %v (the provider publishes no retention)", where, cfg.horizon)
	}
	switch {
	case cfg.replayName != "" && cfg.replayAny:
		c.Enforcer += ", replays marked by a " + cfg.replayName + " header"
	case cfg.replayName != "":
		c.Enforcer += fmt.Sprintf(", replays marked %s: %s", cfg.replayName, strings.TrimSpace(cfg.replayValue))
	case signal:
		c.Enforcer += ", repeats answered with what the first request created"
	default:
		c.Enforcer += ", no replay signal"
	}
	if !cfg.failsKept {
		c.Enforcer += ", only 2xx answers stored"
	}
	switch {
	case cfg.journal != nil && !cfg.failsKept:
		c.Guarantee = effects.AtLeastOnce
		c.Horizon, c.HorizonAssumed = 0, false
		c.DetectsKeyReuse = true
		c.Enforcer += ", then the journal's record of the response"
		c.DuplicateWindow = effects.Window{Trigger: effects.AfterUnknownOutcome,
			Between: "the server stores only 2xx answers: after a 5xx answered once the request was applied, " +
				"the retry with the key executes it again"}
	case cfg.journal != nil:
		c.Guarantee = effects.EffectivelyOnce
		c.Horizon, c.HorizonAssumed = 0, false
		c.DetectsKeyReuse = true // the journal's fingerprint, or the server's check before the record
		c.Enforcer += ", then the journal's record of the response"
	case signal && cfg.failsKept:
		c.Guarantee = effects.EffectivelyOnce
	default:
		c.Guarantee = effects.AtLeastOnce
		c.DuplicateWindow = effects.Window{
			Trigger: effects.AnyRedelivery,
			Between: fmt.Sprintf("no replay signal: a repeat is reported Applied, though within %v the server answers it "+
				"with its stored response and creates nothing; after %v it executes again", cfg.horizon, cfg.horizon),
		}
		if signal {
			c.DuplicateWindow.Between = "the server stores only 2xx answers: a retry after a failed or lost answer executes again"
		}
	}
	return c
}

// describeKey says where the key goes, for the contract.
func (e *Effect[In]) describeKey() string {
	switch e.place {
	case inField:
		return fmt.Sprintf("key in the JSON body's %q", strings.Join(e.field, "."))
	case inStructuredHeader:
		return "key in the " + e.display + " header (a structured string)"
	}
	return "key in the " + e.display + " header"
}

// Contract is derived from the configuration: effectively-once for the
// server's horizon when the server has a replay signal
// ([WithReplayHeader], or a [Rule] that says [Done]); effectively-once
// with Horizon 0 with a journal; at-least-once otherwise. See the package
// doc.
func (e *Effect[In]) Contract() effects.Contract { return e.contract }

// WireKey returns key as the server receives it (without the quotes of a
// structured header): by default key itself for keys of printable ASCII
// without '%', '"' and '\' within the length limit, else escaped and
// perhaps shortened (see [WithMaxKeyLen]); in the form [WithKeyAlphabet]
// or [WithKeyUUID] sets, when set. Use it to find a request in the
// vendor's dashboard or logs. It returns the error Apply would for an
// invalid key.
func (e *Effect[In]) WireKey(key effects.Key) (string, error) {
	if err := validate(key); err != nil {
		return "", err
	}
	return e.format.wire(key), nil
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
	if e.j.Journal() == nil {
		ctx, cancel := context.WithTimeout(ctx, e.timeout)
		defer cancel()
		return e.call(ctx, key, req)
	}
	return e.j.Apply(ctx, key, e.fingerprint(req, body), func(ctx context.Context, _ *journal.Attempt) (effects.Result, error) {
		return e.call(ctx, key, req)
	})
}

// fingerprint is the journal's record of the payload: the method, the
// path as [WithPathTemplate] reads it, and the body (without the key).
// The host, the query and the headers are left out: regional endpoints
// and credentials change, tracing headers differ per attempt.
func (e *Effect[In]) fingerprint(req *http.Request, body []byte) []byte {
	return effects.Fingerprint([]byte(req.Method), []byte(e.pathOf(req.URL.EscapedPath())), body)
}

// versionSegment matches a path segment that names an API version: v1,
// v70, v2.1, 2024-06-01.
var versionSegment = regexp.MustCompile(`^(v[0-9]+(\.[0-9]+)*|[0-9]{4}-[0-9]{2}-[0-9]{2})$`)

// versionlessPath is the default of [WithPathTemplate]: path with every
// segment that names an API version ("v70", "v2.1", "2024-06-01") written
// as "{version}", so /checkout/v70/payments and /checkout/v71/payments
// are one path.
func versionlessPath(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if versionSegment.MatchString(s) {
			segs[i] = "{version}"
		}
	}
	return strings.Join(segs, "/")
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
		return nil, nil, misbuilt("request URL %q is not an absolute http:// or https:// URL", redactURL(req.URL))
	}
	var body []byte
	if e.place == inField || e.j.Journal() != nil {
		if body, err = readBody(req); err != nil {
			return nil, nil, &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("reading the request's body: %w", err)}
		}
	}
	wire := e.format.wire(key)
	switch e.place {
	case inField:
		withKey, err := addMember(body, e.field, wire)
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
			wire = `"` + wire + `"` // no key format leaves anything a String must escape
		}
		req.Header[e.name] = []string{wire}
	}
	return req, body, nil
}

// redactURL returns u without its user information, query and fragment,
// which may hold credentials (an api_key parameter, a password), for an
// error's text.
func redactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, Opaque: u.Opaque}
	s := r.String()
	if u.RawQuery != "" || u.ForceQuery {
		s += "?(query left out)"
	}
	return s
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

// drainLimit is how much of a response's unread body Apply reads and
// discards so that the connection can be reused; a longer rest closes it.
const drainLimit = 64 << 10

// call sends req (which carries the key) on ctx and classifies the
// outcome.
func (e *Effect[In]) call(ctx context.Context, key effects.Key, req *http.Request) (effects.Result, error) {
	resp, err := e.client.Do(req.WithContext(ctx))
	if err != nil {
		return effects.Result{}, transportError(key, req, err)
	}
	defer resp.Body.Close()
	defer func() { _, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit)) }()
	success := resp.StatusCode >= 200 && resp.StatusCode <= 299
	var body []byte
	switch {
	case !success:
		body, _ = io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // a cut body still has its error code early
	case e.ref != nil || e.bodyRules:
		if body, err = readAtMost(resp.Body, e.maxBody); errors.Is(err, errTooLarge) {
			return effects.Result{}, fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "WithMaxBody",
				Reason: fmt.Sprintf("HTTP %d applied the request, but its body is longer than %d bytes (raise WithMaxBody; a retry replays it)", resp.StatusCode, e.maxBody)},
				effects.Ambiguous(op, key, err))
		} else if err != nil {
			return effects.Result{}, effects.Ambiguous(op, key, fmt.Errorf("HTTP %d, then reading its body: %w", resp.StatusCode, err))
		}
	}
	if resp.StatusCode < 300 || resp.StatusCode >= 400 {
		for i := range e.rules {
			if r := &e.rules[i]; r.matches(resp.StatusCode, resp.Header, body) {
				return e.ruled(key, req, resp, body, r)
			}
		}
	}
	if !success {
		return effects.Result{}, e.statusError(key, req, e.outcome(resp.StatusCode), e.responseError(resp, body))
	}
	res := effects.Result{Status: effects.Applied}
	if e.replayed(resp.Header) {
		res.Status = effects.Replayed
	}
	if e.ref != nil {
		if res.Ref, err = e.ref(resp, body); err != nil {
			return effects.Result{}, refError(key, resp.StatusCode, "WithRef", err)
		}
	}
	return res, nil
}

// refError is the error of a response that applied the request but whose
// ref cannot be read: a configuration error, but not a refusal: the
// Ambiguous underneath keeps a journal's lease, and the retry after the
// fix replays.
func refError(key effects.Key, status int, option string, err error) error {
	return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: option,
		Reason: fmt.Sprintf("HTTP %d applied the request, but its ref cannot be read (fix %s; a retry replays it)", status, option)},
		effects.Ambiguous(op, key, err))
}

// ruled returns the outcome a rule gave the response.
func (e *Effect[In]) ruled(key effects.Key, req *http.Request, resp *http.Response, body []byte, r *Rule) (effects.Result, error) {
	if r.Outcome != Done {
		return effects.Result{}, e.statusError(key, req, r.Outcome, e.responseError(resp, body))
	}
	ref, err := r.Ref(resp, body)
	if err != nil {
		return effects.Result{}, refError(key, resp.StatusCode, "the Done rule's Ref", err)
	}
	return effects.Result{Status: effects.Replayed, Ref: ref}, nil
}

// responseError describes resp, whose start of body is body, without the
// body unless WithErrorBody asked for it.
func (e *Effect[In]) responseError(resp *http.Response, body []byte) *ResponseError {
	re := &ResponseError{StatusCode: resp.StatusCode, Header: resp.Header, Replayed: e.replayed(resp.Header),
		Code: firstLabel(body, e.codePath)}
	switch {
	case e.reqID != "":
		re.RequestID = label(resp.Header.Get(e.reqID))
	case len(e.reqPath) > 0:
		re.RequestID = firstLabel(body, e.reqPath)
	}
	if e.keepBody {
		re.Body = body
	}
	return re
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

// statusError classifies a response that is not a success: a non-2xx
// status, or a 2xx that a rule made an error.
func (e *Effect[In]) statusError(key effects.Key, req *http.Request, outcome Outcome, re *ResponseError) error {
	origin := req.URL.Scheme + "://" + req.URL.Host
	if re.StatusCode >= 300 && re.StatusCode < 400 {
		loc, _ := url.Parse(re.Header.Get("Location"))
		return fmt.Errorf("%w: %w", &effects.ConfigError{Op: op, Option: "request URL " + origin + req.URL.Path,
			Reason: fmt.Sprintf("the server redirects (HTTP %d, Location %q), and Apply does not follow redirects: "+
				"point the request at the final URL", re.StatusCode, redactURL(loc))}, re)
	}
	if re.StatusCode >= 500 && re.Replayed {
		return &effects.Error{Kind: effects.ErrPoison, Op: op, Key: key, Err: fmt.Errorf("%w: %w", ErrReplayedServerError, re)}
	}
	wait := retryAfter(re.Header, time.Now())
	switch outcome {
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
// (ErrAmbiguous). The URL in the error loses its user information and
// query.
func transportError(key effects.Key, req *http.Request, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = redactURL(req.URL)
	}
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
