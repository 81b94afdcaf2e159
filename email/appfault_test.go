package email_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/email"
	"effectively.dev/email/smtptest"
)

// smtpAppCodes are the transient SMTP replies the harness makes smtptest
// answer (conformance.AppFaultCodes): 421 service not available, 451
// local error in processing, 452 insufficient storage. A server sends
// them instead of accepting the command, so the message is not taken;
// the suite injects them before the request was applied.
var smtpAppCodes = []string{"421", "451", "452"}

// AppFaultCodes are smtpAppCodes (conformance.AppFaultCodes).
func (h *harness) AppFaultCodes() []string { return smtpAppCodes }

// commands follows what an instance's connections send, so that its
// The SetAppFaulter hook knows which SMTP command the round trip about to start
// carries: the Faults calls the hook inside the write that starts
// the round trip, which the connections dialled through dial see first.
// The journal's PostgreSQL connections go through it too, as "not SMTP":
// smtptest cannot fail them. A round trip is one write at a time per
// instance in the scenarios that arm application faults (one Apply).
type commands struct {
	mu      sync.Mutex
	current smtptest.Stage // the stage the write in progress answers at; 0: none
}

// dial wraps dial's connections; smtp says whether they carry SMTP.
func (c *commands) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error), smtp bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commandConn{Conn: conn, cmds: c, smtp: smtp}, nil
	}
}

// commandConn tells its commands which stage each write answers at.
type commandConn struct {
	net.Conn
	cmds     *commands
	smtp     bool
	lastData bool // the last command written was DATA: the next write is the message
}

func (c *commandConn) Write(p []byte) (int, error) {
	var stage smtptest.Stage
	if c.smtp {
		switch {
		case c.lastData:
			stage = smtptest.Data
		case hasPrefixFold(p, "MAIL FROM:"):
			stage = smtptest.Mail
		case hasPrefixFold(p, "RCPT TO:"):
			stage = smtptest.Rcpt
		}
		c.lastData = hasPrefixFold(p, "DATA\r\n")
	}
	c.cmds.mu.Lock()
	c.cmds.current = stage
	c.cmds.mu.Unlock()
	return c.Conn.Write(p)
}

func hasPrefixFold(p []byte, prefix string) bool {
	return len(p) >= len(prefix) && bytes.EqualFold(p[:len(prefix)], []byte(prefix))
}

// appFaulter makes srv answer the SMTP command about to be sent with e's
// transient reply (conformance.Faults.SetAppFaulter): at MAIL FROM, RCPT TO, or
// after the message's data (smtptest's FailNext: the message is not
// kept). Other commands (EHLO, DATA itself, QUIT) and the journal's
// round trips are not failed.
func appFaulter(srv *smtptest.Server, c *commands) func(e *conformance.AppError) error {
	return func(e *conformance.AppError) error {
		code, err := strconv.Atoi(e.Code)
		if err != nil || code < 400 || code > 499 || e.Applied {
			return fmt.Errorf("smtptest answers no %s here", e.Code)
		}
		c.mu.Lock()
		stage := c.current
		c.mu.Unlock()
		if stage == 0 {
			return errors.New("the round trip carries no MAIL, RCPT or message data")
		}
		srv.FailNext(stage, code, "injected transient failure")
		return nil
	}
}

// greylistIsABounce reads a 4xx reply (a greylisting 451, a full queue's
// 452) as a bounce and gives the message up: a consumer dead-letters
// mail a retry minutes later would have delivered.
type greylistIsABounce struct {
	effects.Effect[email.Message]
}

func (g greylistIsABounce) Apply(ctx context.Context, key effects.Key, m email.Message) (effects.Result, error) {
	res, err := g.Effect.Apply(ctx, key, m)
	var se *email.SMTPError
	if errors.As(err, &se) && se.Code/100 == 4 {
		return res, fmt.Errorf("bounced: %v", err) // the bug: %v drops ErrTransient
	}
	return res, err
}

// app-faults answers MAIL, RCPT or the message with 421, 451 or 452: the
// liar's permanent error is caught.
func TestCounterexampleGreylistIsABounceFails(t *testing.T) {
	rep := conformance.Run(t, "counterexample: 4xx read as a bounce", func(t testing.TB) conformance.Harness[email.Message] {
		h := newHarness(t, nil) // the real Sender and its journal
		h.build = func(ctx context.Context, h *harness, f *conformance.Faults) (effects.Effect[email.Message], func(), error) {
			e, closeFn, err := buildSender(ctx, h, f)
			if err != nil {
				return nil, nil, err
			}
			return greylistIsABounce{e}, closeFn, nil
		}
		return h
	}, conformance.Only(conformance.ScenarioAppFaults), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioAppFaults)
	if row.Verdict != conformance.Fail {
		t.Fatalf("app-faults: %s, want FAIL (notes %v)", row.Verdict, row.Notes)
	}
	t.Logf("caught: %s", row.Failures[0])
}
