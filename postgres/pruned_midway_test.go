package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
)

// tailCutConn: when armed, the next reply is read whole from the server
// (up to its final ReadyForQuery), delivered but for its last cut bytes,
// and the connection is closed.
type tailCutConn struct {
	net.Conn
	armed *atomic.Bool
	cut   int
	buf   []byte
	eof   bool
}

func (c *tailCutConn) Read(p []byte) (int, error) {
	if c.buf == nil && !c.eof && c.armed.CompareAndSwap(true, false) {
		var all []byte
		tmp := make([]byte, 64<<10)
		for {
			n, err := c.Conn.Read(tmp)
			all = append(all, tmp[:n]...)
			if err != nil {
				break
			}
			if l := len(all); l >= 6 && all[l-6] == 'Z' && bytes.Equal(all[l-5:l-1], []byte{0, 0, 0, 5}) {
				break
			}
		}
		c.Conn.Close()
		c.buf = all[:max(0, len(all)-c.cut)]
		c.eof = true
	}
	if c.eof {
		if len(c.buf) == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// TestApplyKeyPrunedThenCommitReplyLost: the key was committed before; it is
// pruned while the pipeline runs, so the key's INSERT and COMMIT succeed
// (the write is applied again); COMMIT's reply is lost. Apply must not
// report Replayed with the old ref: the outcome is ambiguous.
func TestApplyKeyPrunedThenCommitReplyLost(t *testing.T) {
	url := newDB(t)
	ctx := testCtx(t)
	admin := newPool(t, url, nil)
	var armed atomic.Bool
	pool := newPool(t, url, func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			return &tailCutConn{Conn: conn, armed: &armed, cut: 18}, err
		}
	})
	var n atomic.Int64
	fx, err := postgres.NewPipelined(pool, "billing", func(_ context.Context, k effects.Key, p payment) (string, []postgres.Statement, error) {
		ref := "ref-" + string(rune('0'+n.Add(1)))
		return ref, []postgres.Statement{
			{SQL: `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, Args: []any{p.EventID, p.Amount}},
			{SQL: `SELECT pg_sleep($1::float8)`, Args: []any{0.4}},
		}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	key := effects.MustKey("evt_found_lost", "ledger")
	ev := payment{EventID: "evt_found_lost", Amount: 7}
	first, err := fx.Apply(ctx, key, ev)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first: %+v", first)
	go func() {
		time.Sleep(150 * time.Millisecond)
		_, err := admin.Exec(ctx, `DELETE FROM effectively_keys WHERE key = $1`, string(key)) // a Prune of an old key
		t.Logf("pruned: %v", err)
	}()
	armed.Store(true)
	res, err := fx.Apply(ctx, key, ev)
	var ref string
	_ = admin.QueryRow(ctx, `SELECT ref FROM effectively_keys WHERE key = $1`, string(key)).Scan(&ref)
	t.Logf("second Apply: %+v, %v; ledger rows %d; stored ref now %q", res, err, count(t, admin, `SELECT count(*) FROM ledger WHERE event_id = $1`, ev.EventID), ref)
	if err == nil && res.Status == effects.Replayed && ref != res.Ref {
		t.Errorf("Apply reported Replayed %q, but its own write and key (ref %q) committed", res.Ref, ref)
	}
	if !errors.Is(err, effects.ErrAmbiguous) {
		t.Errorf("Apply = %+v, %v; want ErrAmbiguous: COMMIT's reply was lost", res, err)
	}
}
