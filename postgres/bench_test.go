package postgres_test

// Benchmarks of the ways to dedup a ledger write, all on one durable
// cluster (fsync on, full_page_writes on, synchronous_commit on) started by
// pgtest, sequential, one key per op. The figures in BENCHMARKS.md come
// from:
//
//	go test -run '^$' -bench 'LedgerPaired|ApplyShapes' -benchtime 300x -count 5 ./postgres/
//	go test -run '^$' -bench 'BatchPaired' -benchtime 20x -count 5 ./postgres/
//	go test -run '^$' -bench 'Ledger$' -benchtime 500x -count 5 ./postgres/
//
// BenchmarkLedger's sub-benchmarks report keys/s and walB/op: the WAL the
// whole cluster wrote during the timed loop divided by b.N
// (pg_current_wal_lsn before and after). Nothing else runs on the cluster,
// but autovacuum could add to it.
//
// Commit latency is dominated by fsync, which on a shared virtual disk
// drifts by a factor of 2 or more within a minute, so sub-benchmarks that
// run one after the other are not comparable in time. The Paired
// benchmarks run their variants round-robin, key by key, and time each
// call: drift hits them alike, and the ratios they report are the ones to
// trust.

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/effects"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// benchSeq makes keys unique across sub-benchmarks and their reruns.
var benchSeq atomic.Int64

func benchKeys(n int) []effects.Key {
	keys := make([]effects.Key, n)
	for i := range keys {
		keys[i] = effects.Key("evt_" + strconv.FormatInt(benchSeq.Add(1), 10) + ":ledger")
	}
	return keys
}

func benchPayment(k effects.Key) payment { return payment{EventID: string(k), Amount: 4200} }

const insertLedgerSQL = `INSERT INTO ledger (event_id, amount) VALUES ($1, $2) RETURNING id`

// ledgerBench holds the variants under test, on one database.
type ledgerBench struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	fx      *postgres.Effect[payment] // stores the ledger id as ref
	fxNoRef *postgres.Effect[payment] // returns no ref
	writes  atomic.Int64              // socket writes to the server: one per round trip
}

// newLedgerBench creates a fresh database on the durable cluster with the
// schema, the ledger table and the naive handler's seen table. Its pool
// counts the client's writes to the server: each is one round trip (pgx
// flushes a statement, or a pipelined batch, with one write and then waits
// for the reply).
func newLedgerBench(b *testing.B) *ledgerBench {
	b.Helper()
	lb := &ledgerBench{ctx: context.Background()}
	pool := newPool(b, newDBWith(b, pgtest.Options{Durable: true}), func(c *pgxpool.Config) {
		countWrites(c, &lb.writes)
	})
	mustExec(b, pool, `CREATE TABLE seen (key text PRIMARY KEY)`)
	fx, err := postgres.New(pool, "billing", writeLedger)
	if err != nil {
		b.Fatal(err)
	}
	fxNoRef, err := postgres.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, p payment) (string, error) {
		_, err := writeLedger(ctx, tx, p)
		return "", err
	})
	if err != nil {
		b.Fatal(err)
	}
	lb.pool, lb.fx, lb.fxNoRef = pool, fx, fxNoRef
	return lb
}

// countWrites makes c's connections count their writes in writes: one per
// round trip (pgx flushes a statement, or a pipelined batch, with one
// write).
func countWrites(c *pgxpool.Config, writes *atomic.Int64) {
	c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return &countingConn{Conn: conn, writes: writes}, err
	}
}

// countingPool returns a pool of at most maxConns connections to url, and
// the count of the writes on their sockets: one per round trip (see
// countWrites).
func countingPool(t testing.TB, url string, maxConns int32) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	var writes atomic.Int64
	pool := newPool(t, url, func(c *pgxpool.Config) {
		c.MaxConns = maxConns
		countWrites(c, &writes)
	})
	return pool, &writes
}

// countingConn counts writes.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// plainInsert is the baseline: the write alone, no dedup.
func (lb *ledgerBench) plainInsert(b *testing.B, k effects.Key) {
	tx, err := lb.pool.Begin(lb.ctx)
	if err != nil {
		b.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(lb.ctx, insertLedgerSQL, string(k), 4200).Scan(&id); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(lb.ctx); err != nil {
		b.Fatal(err)
	}
}

func (lb *ledgerBench) apply(b *testing.B, fx *postgres.Effect[payment], k effects.Key, want effects.Status) {
	res, err := fx.Apply(lb.ctx, k, benchPayment(k))
	if err != nil || res.Status != want {
		b.Fatalf("Apply = %+v, %v; want %v", res, err, want)
	}
}

// twoTransaction is the seed's naive handler: check "seen", insert the
// ledger row, mark seen, each in its own transaction. It is not
// effectively once: a crash between the last two duplicates the row.
func (lb *ledgerBench) twoTransaction(b *testing.B, k effects.Key) {
	var seen bool
	if err := lb.pool.QueryRow(lb.ctx, `SELECT EXISTS (SELECT 1 FROM seen WHERE key = $1)`, string(k)).Scan(&seen); err != nil || seen {
		b.Fatal(seen, err)
	}
	var id int64
	if err := lb.pool.QueryRow(lb.ctx, insertLedgerSQL, string(k), 4200).Scan(&id); err != nil {
		b.Fatal(err)
	}
	if _, err := lb.pool.Exec(lb.ctx, `INSERT INTO seen (key) VALUES ($1)`, string(k)); err != nil {
		b.Fatal(err)
	}
}

// savepoint is the SAVEPOINT pattern: a plain INSERT of the key under a
// savepoint, catch 23505, ROLLBACK TO SAVEPOINT and read the stored row.
// Otherwise the same work as Apply (ledger row, ref stored).
func (lb *ledgerBench) savepoint(b *testing.B, k effects.Key) (replayed bool) {
	ctx := lb.ctx
	tx, err := lb.pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	fp, _ := effects.FingerprintJSON(benchPayment(k))
	if _, err := tx.Exec(ctx, `SAVEPOINT claim`); err != nil {
		b.Fatal(err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ('billing', $1, $2)`, string(k), fp)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT claim`); err != nil {
			b.Fatal(err)
		}
		var storedFP []byte
		var ref string
		if err := tx.QueryRow(ctx, `SELECT fingerprint, ref FROM effectively_keys WHERE scope = 'billing' AND key = $1`, string(k)).Scan(&storedFP, &ref); err != nil {
			b.Fatal(err)
		}
		return true // and roll back
	}
	if err != nil {
		b.Fatal(err)
	}
	ref, err := writeLedger(ctx, tx, benchPayment(k))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE effectively_keys SET ref = $2 WHERE scope = 'billing' AND key = $1`, string(k), ref); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	return false
}

// batch processes keys in batches of size: one transaction claims a batch
// with ClaimBatch, inserts the new keys' ledger rows with one INSERT ...
// SELECT unnest, and commits (rolls back when nothing was new).
func (lb *ledgerBench) batch(b *testing.B, keys []effects.Key, size int, want effects.Status) {
	ctx := lb.ctx
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), size)]
		keys = keys[len(chunk):]
		items := make([]postgres.BatchItem, len(chunk))
		for i, k := range chunk {
			fp, _ := effects.FingerprintJSON(benchPayment(k))
			items[i] = postgres.BatchItem{Key: k, Fingerprint: fp}
		}
		tx, err := lb.pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		results, err := postgres.ClaimBatch(ctx, tx, "billing", items)
		if err != nil {
			b.Fatal(err)
		}
		var events []string
		var amounts []int64
		for i, r := range results {
			if r.Status != want {
				b.Fatalf("item %d = %+v, want %v", i, r, want)
			}
			if r.Status == effects.Applied {
				events = append(events, string(chunk[i]))
				amounts = append(amounts, 4200)
			}
		}
		if len(events) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, amount) SELECT * FROM unnest($1::text[], $2::bigint[])`, events, amounts); err != nil {
				b.Fatal(err)
			}
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// seed commits keys as processed, with the fingerprint Apply computes, so
// that applying them again is a duplicate.
func (lb *ledgerBench) seed(b *testing.B, keys []effects.Key) {
	b.Helper()
	lb.batch(b, keys, 1000, effects.Applied)
}

// measure runs a CHECKPOINT (so that no sub-benchmark has the dirty buffers
// of database creation or seeding flushed behind its back, and all pay the
// same full-page writes after it), times loop (b.N keys), and reports
// keys/s and walB/op.
func (lb *ledgerBench) measure(b *testing.B, loop func()) {
	b.Helper()
	mustExec(b, lb.pool, `CHECKPOINT`)
	var start string
	if err := lb.pool.QueryRow(lb.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	loop()
	b.StopTimer()
	var wal float64
	if err := lb.pool.QueryRow(lb.ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, start).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(wal/float64(b.N), "walB/op")
}

func BenchmarkLedger(b *testing.B) {
	lb := newLedgerBench(b)
	each := func(b *testing.B, f func(k effects.Key)) {
		keys := benchKeys(b.N)
		lb.measure(b, func() {
			for _, k := range keys {
				f(k)
			}
		})
	}
	seeded := func(b *testing.B, f func(k effects.Key)) {
		keys := benchKeys(b.N)
		lb.seed(b, keys)
		lb.measure(b, func() {
			for _, k := range keys {
				f(k)
			}
		})
	}
	b.Run("plain_insert", func(b *testing.B) {
		each(b, func(k effects.Key) { lb.plainInsert(b, k) })
	})
	b.Run("effectively_once_new", func(b *testing.B) {
		each(b, func(k effects.Key) { lb.apply(b, lb.fx, k, effects.Applied) })
	})
	b.Run("effectively_once_new_noref", func(b *testing.B) {
		each(b, func(k effects.Key) { lb.apply(b, lb.fxNoRef, k, effects.Applied) })
	})
	b.Run("effectively_once_duplicate", func(b *testing.B) {
		seeded(b, func(k effects.Key) { lb.apply(b, lb.fx, k, effects.Replayed) })
	})
	b.Run("two_transaction_new", func(b *testing.B) {
		each(b, func(k effects.Key) { lb.twoTransaction(b, k) })
	})
	b.Run("savepoint_23505_new", func(b *testing.B) {
		each(b, func(k effects.Key) {
			if lb.savepoint(b, k) {
				b.Fatal("replayed a new key")
			}
		})
	})
	b.Run("savepoint_23505_duplicate", func(b *testing.B) {
		seeded(b, func(k effects.Key) {
			if !lb.savepoint(b, k) {
				b.Fatal("applied a seen key")
			}
		})
	})
	// ns/op is per key; b.N keys go through in batches.
	for _, size := range []int{100, 1000} {
		b.Run("batch_"+strconv.Itoa(size)+"_new", func(b *testing.B) {
			keys := benchKeys(b.N)
			lb.measure(b, func() { lb.batch(b, keys, size, effects.Applied) })
		})
	}
	b.Run("batch_1000_duplicate", func(b *testing.B) {
		keys := benchKeys(b.N)
		lb.seed(b, keys)
		lb.measure(b, func() { lb.batch(b, keys, 1000, effects.Replayed) })
	})
}

// handwritten is the essay's fixed handler written by hand: BEGIN; INSERT
// the key ON CONFLICT DO NOTHING; the write; COMMIT. It keeps no ref,
// compares no fingerprint and reads no setting.
func (lb *ledgerBench) handwritten(b *testing.B, k effects.Key) {
	fp, _ := effects.FingerprintJSON(benchPayment(k))
	lb.handwrittenClaim(b, k, `INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ('billing', $1, $2) ON CONFLICT DO NOTHING`, string(k), fp)
}

// handwrittenClaim is the hand-written handler's transaction with claim
// (args its arguments) as the claim: BEGIN; claim; the write; COMMIT.
func (lb *ledgerBench) handwrittenClaim(b *testing.B, k effects.Key, claim string, args ...any) {
	ctx := lb.ctx
	tx, err := lb.pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, claim, args...)
	if err != nil || tag.RowsAffected() != 1 {
		b.Fatal(tag, err)
	}
	if _, err := writeLedger(ctx, tx, benchPayment(k)); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// endInBatch is the plain insert transaction on a connection, ended by
// one pipeline of last (run with the scope, the key, its fingerprint and
// a ref) and COMMIT.
func (lb *ledgerBench) endInBatch(b *testing.B, k effects.Key, last string) {
	ctx := lb.ctx
	fp, _ := effects.FingerprintJSON(benchPayment(k))
	conn, err := lb.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		b.Fatal(err)
	}
	var id int64
	if err := conn.QueryRow(ctx, insertLedgerSQL, string(k), 4200).Scan(&id); err != nil {
		b.Fatal(err)
	}
	var batch pgx.Batch
	batch.Queue(last, "billing", string(k), fp, strconv.FormatInt(id, 10))
	batch.Queue("COMMIT")
	if err := conn.SendBatch(ctx, &batch).Close(); err != nil {
		b.Fatal(err)
	}
}

// variant is one way to handle one key, timed by paired.
type variant struct {
	name string
	run  func(k effects.Key)
}

// paired runs variants one key each per op, in a shuffled order, after one
// warm-up key each (so that every
// connection has its statements prepared), and reports for each variant
// its mean latency as <variant>-ns/key, its round trips as
// <variant>-rt/key, and its time ratio to the first variant twice: of the
// means as <variant>/<first>, and of the per-key medians (robust to the
// stalls a loaded machine inflicts on a few calls) as
// <variant>/<first>-p50.
func (lb *ledgerBench) paired(b *testing.B, variants []variant) {
	for _, v := range variants {
		v.run(benchKeys(1)[0])
	}
	keys := benchKeys(b.N * len(variants))
	took := make([][]time.Duration, len(variants))
	trips := make([]int64, len(variants))
	mustExec(b, lb.pool, `CHECKPOINT`)
	b.ResetTimer()
	order := make([]int, len(variants))
	for i := range order {
		order[i] = i
	}
	for i := range b.N {
		// A new order every op, so that no variant always follows the
		// same neighbour.
		rand.Shuffle(len(order), func(x, y int) { order[x], order[y] = order[y], order[x] })
		for j, v := range order {
			w := lb.writes.Load()
			start := time.Now()
			variants[v].run(keys[i*len(variants)+j])
			took[v] = append(took[v], time.Since(start))
			trips[v] += lb.writes.Load() - w
		}
	}
	b.StopTimer()
	mean := func(d []time.Duration) float64 {
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		return float64(sum) / float64(len(d))
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2])
	}
	for v, variant := range variants {
		b.ReportMetric(mean(took[v]), variant.name+"-ns/key")
		b.ReportMetric(float64(trips[v])/float64(b.N), variant.name+"-rt/key")
		if v > 0 {
			b.ReportMetric(mean(took[v])/mean(took[0]), variant.name+"/"+variants[0].name)
			b.ReportMetric(median(took[v])/median(took[0]), variant.name+"/"+variants[0].name+"-p50")
		}
	}
}

// BenchmarkLedgerPaired runs the single-key variants for new keys
// round-robin, key by key: Apply against the plain insert transaction (no
// dedup), the hand-written handler and the other patterns, with round
// trips counted. Two variants take Apply's lone shape apart, written by
// hand on a connection: commit_batch is the plain transaction with its
// COMMIT pipelined after a statement that writes nothing (what ending in
// one batch costs), and key_at_commit sends Apply's own key INSERT with
// COMMIT (Apply's statements, without the library).
func BenchmarkLedgerPaired(b *testing.B) {
	lb := newLedgerBench(b)
	lb.paired(b, []variant{
		{"plain_insert", func(k effects.Key) { lb.plainInsert(b, k) }},
		{"commit_batch", func(k effects.Key) { lb.endInBatch(b, k, `SELECT $1::text, $2::text, $3::bytea, $4::text`) }},
		{"key_at_commit", func(k effects.Key) { lb.endInBatch(b, k, postgres.GuardedInsertKeySQL) }},
		{"effectively_once", func(k effects.Key) { lb.apply(b, lb.fx, k, effects.Applied) }},
		{"effectively_once_noref", func(k effects.Key) { lb.apply(b, lb.fxNoRef, k, effects.Applied) }},
		{"handwritten", func(k effects.Key) { lb.handwritten(b, k) }},
		{"savepoint_23505", func(k effects.Key) { lb.savepoint(b, k) }},
		{"two_transaction", func(k effects.Key) { lb.twoTransaction(b, k) }},
	})
}

// BenchmarkBatchPaired compares, interleaved, one key per transaction
// (Apply) with batches of 1000 new keys: ClaimBatch plus one INSERT ...
// SELECT unnest of the ledger rows (the batch written by hand), and
// ApplyBatch, whose write runs once per item (a round trip each). One op is
// 1000 keys through each batch variant and 50 through Apply; reported per
// key, with each batch variant's speed-up over Apply as
// <variant>-speedup.
func BenchmarkBatchPaired(b *testing.B) {
	lb := newLedgerBench(b)
	const batch, single = 1000, 50
	applyBatch := func(keys []effects.Key) {
		items := make([]postgres.BatchItem, len(keys))
		for i, k := range keys {
			fp, _ := effects.FingerprintJSON(benchPayment(k))
			items[i] = postgres.BatchItem{Key: k, Fingerprint: fp}
		}
		results, err := postgres.ApplyBatch(lb.ctx, lb.pool, "billing", items, func(ctx context.Context, tx pgx.Tx, i int) (string, error) {
			return writeLedger(ctx, tx, benchPayment(keys[i]))
		})
		if err != nil {
			b.Fatal(err)
		}
		for i, r := range results {
			if r.Err != nil || r.Status != effects.Applied {
				b.Fatalf("item %d = %+v", i, r)
			}
		}
	}
	variants := []struct {
		name string
		n    int // keys per op
		run  func(keys []effects.Key)
	}{
		{"apply", single, func(keys []effects.Key) {
			for _, k := range keys {
				lb.apply(b, lb.fx, k, effects.Applied)
			}
		}},
		{"claim_batch_1000", batch, func(keys []effects.Key) { lb.batch(b, keys, batch, effects.Applied) }},
		{"apply_batch_1000", batch, applyBatch},
	}
	for _, v := range variants {
		v.run(benchKeys(v.n))
	}
	spent := make([]time.Duration, len(variants))
	mustExec(b, lb.pool, `CHECKPOINT`)
	b.ResetTimer()
	for i := range b.N {
		for j := range variants {
			v := variants[(i+j)%len(variants)]
			keys := benchKeys(v.n)
			start := time.Now()
			v.run(keys)
			spent[(i+j)%len(variants)] += time.Since(start)
		}
	}
	b.StopTimer()
	perKey := make([]float64, len(variants))
	for v, variant := range variants {
		perKey[v] = float64(spent[v].Nanoseconds()) / float64(b.N*variant.n)
		b.ReportMetric(perKey[v], variant.name+"-ns/key")
		if v > 0 {
			b.ReportMetric(perKey[0]/perKey[v], variant.name+"-speedup")
		}
	}
}

// BenchmarkClaimStatement compares ways to claim a key and refuse
// synchronous_commit=off, each in BEGIN; claim; ROLLBACK (no commit, so the
// statement's own cost shows): the plain INSERT that cannot see the
// setting, the same plus SHOW synchronous_commit (a second round trip), and
// the CTE that Apply uses (one round trip). The variants run round-robin
// like BenchmarkLedgerPaired.
func BenchmarkClaimStatement(b *testing.B) {
	lb := newLedgerBench(b)
	ctx := lb.ctx
	const plain = `INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ($1, $2, $3) ON CONFLICT (scope, key) DO NOTHING`
	const cte = `WITH ins AS (
	INSERT INTO effectively_keys (scope, key, fingerprint) VALUES ($1, $2, $3)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins), current_setting('synchronous_commit')`
	fp := effects.Fingerprint([]byte("x"))
	variants := []struct {
		name  string
		claim func(tx pgx.Tx, k effects.Key) bool
	}{
		{"plain_insert", func(tx pgx.Tx, k effects.Key) bool {
			tag, err := tx.Exec(ctx, plain, "billing", string(k), fp)
			return err == nil && tag.RowsAffected() == 1
		}},
		{"plain_insert_then_show", func(tx pgx.Tx, k effects.Key) bool {
			tag, err := tx.Exec(ctx, plain, "billing", string(k), fp)
			var sc string
			err2 := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sc)
			return err == nil && err2 == nil && tag.RowsAffected() == 1 && sc == "on"
		}},
		{"cte_with_setting", func(tx pgx.Tx, k effects.Key) bool {
			var inserted bool
			var sc string
			err := tx.QueryRow(ctx, cte, "billing", string(k), fp).Scan(&inserted, &sc)
			return err == nil && inserted && sc == "on"
		}},
	}
	keys := benchKeys(b.N * len(variants))
	spent := make([]time.Duration, len(variants))
	b.ResetTimer()
	for i := range b.N {
		for j := range variants {
			v := (i + j) % len(variants)
			start := time.Now()
			tx, err := lb.pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if !variants[v].claim(tx, keys[i*len(variants)+j]) {
				b.Fatal("not inserted")
			}
			if err := tx.Rollback(ctx); err != nil {
				b.Fatal(err)
			}
			spent[v] += time.Since(start)
		}
	}
	b.StopTimer()
	for v, variant := range variants {
		b.ReportMetric(float64(spent[v].Nanoseconds())/float64(b.N), variant.name+"-ns/key")
	}
}
