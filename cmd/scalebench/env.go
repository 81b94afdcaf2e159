package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// env is the cluster every experiment runs on.
type env struct {
	pg       *pgtest.Cluster
	version  string
	settings []string // "name = value" of the settings that decide the costs measured
	cg       *cgroup  // the cluster's memory cgroup, when -memlimit is set
	logf     func(string, ...any)
}

// reported are the server settings the report prints.
var reported = []string{"shared_buffers", "max_wal_size", "checkpoint_timeout", "full_page_writes",
	"wal_compression", "autovacuum_naptime", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_cost_limit",
	"maintenance_work_mem"}

func start(ctx context.Context, cfg config, logf func(string, ...any)) (*env, error) {
	logf("starting a durable throwaway PostgreSQL cluster (fsync on) with %v", cfg.settings)
	pg, err := pgtest.New(pgtest.Options{Durable: true, Settings: cfg.settings})
	if err != nil {
		return nil, err
	}
	e := &env{pg: pg, logf: logf}
	if cfg.memLimit > 0 {
		if e.cg, err = confine(pg, cfg.memLimit); err != nil {
			e.close()
			return nil, fmt.Errorf("-memlimit: %w", err)
		}
		logf("the cluster's processes are in memory cgroup %s, limited to %d MiB (page cache included)", e.cg.dir, cfg.memLimit>>20)
	}
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		e.close()
		return nil, err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&e.version); err != nil {
		e.close()
		return nil, err
	}
	for _, name := range reported {
		var v string
		if err := conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			e.close()
			return nil, err
		}
		e.settings = append(e.settings, name+"="+v)
	}
	return e, nil
}

func (e *env) close() {
	if e.pg != nil {
		if err := e.pg.Stop(); err != nil {
			e.logf("stopping the cluster: %v", err)
		}
	}
	if e.cg != nil {
		if err := e.cg.remove(); err != nil {
			e.logf("removing the memory cgroup: %v", err)
		}
	}
}

// db is one database of the cluster with the schema, the accounts table
// the effect's write updates, and a pool.
type db struct {
	name string
	pool *pgxpool.Pool
}

// accounts is how many rows the write's table has: a constant size, so
// that only the key table grows, and enough rows that concurrent batches
// seldom wait for each other's.
const accounts = 100_000

// newDB creates database name with the schema and a pool of conns
// connections.
func (e *env) newDB(ctx context.Context, name string, conns int) (*db, error) {
	if err := e.pg.CreateDatabase(ctx, name); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(e.pg.URL(name))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := &db{name: name, pool: pool}
	if err := postgres.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE EXTENSION pgstattuple; CREATE EXTENSION pg_walinspect;
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id) SELECT generate_series(1, %d)`, accounts)); err != nil {
		pool.Close()
		return nil, err
	}
	return d, nil
}

// drop closes d's pool and drops its database.
func (e *env) drop(ctx context.Context, d *db) error {
	d.pool.Close()
	conn, err := pgx.Connect(ctx, e.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `DROP DATABASE `+pgx.Identifier{d.name}.Sanitize()+` WITH (FORCE)`)
	return err
}

// fillChunk is how many rows one INSERT of a fill writes.
const fillChunk = 1_000_000

// fill bulk-loads n keys of shape into scope, their created_at spread
// evenly from newest-span to newest (time-ordered ids carry the same
// time), the way a table that grew by Apply holds them; then it builds
// the indexes, vacuums and analyzes the table, and checkpoints. The
// indexes are dropped during the load and built after it (as pg_restore
// does): a B-tree built that way has its leaves 90 % full, where one grown
// by random inserts averages about 70 %.
func (d *db) fill(ctx context.Context, logf func(string, ...any), scope, shape string, n int64, newest time.Time, span time.Duration) error {
	started := time.Now()
	if _, err := d.pool.Exec(ctx, `ALTER TABLE effectively_keys DROP CONSTRAINT effectively_keys_pkey;
		DROP INDEX effectively_keys_scope_created_at`); err != nil {
		return err
	}
	if err := d.insertKeys(ctx, logf, scope, shape, n, newest, span); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	for _, sql := range []string{
		`ALTER TABLE effectively_keys ADD CONSTRAINT effectively_keys_pkey PRIMARY KEY (scope, key)`,
		`CREATE INDEX effectively_keys_scope_created_at ON effectively_keys (scope, created_at)`,
		`VACUUM (ANALYZE) effectively_keys`,
		`CHECKPOINT`,
	} {
		if _, err := d.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("fill: %s: %w", sql, err)
		}
	}
	logf("  %s: filled %d %s keys in %v", d.name, n, shape, time.Since(started).Round(time.Second))
	return nil
}

// insertKeys inserts n keys of shape into scope, their created_at spread
// evenly from newest-span to newest, fillChunk rows per statement.
func (d *db) insertKeys(ctx context.Context, logf func(string, ...any), scope, shape string, n int64, newest time.Time, span time.Duration) error {
	t0 := newest.Add(-span)
	stepUS := float64(span.Microseconds()) / float64(max(n, 1))
	// created_at = t0 + i·step; the id's milliseconds are the same instant's.
	at := `($2::timestamptz + (i * $3::float8) * interval '1 microsecond')`
	ms := `(extract(epoch from ` + at + `) * 1000)::bigint`
	insert := fmt.Sprintf(`INSERT INTO effectively_keys (scope, key, fingerprint, ref, created_at)
		SELECT $1, %s, %s, '', %s FROM generate_series($4::bigint, $5::bigint) AS g (i)`,
		keySQL(idSQL(shape, ms)), fingerprintSQL, at)
	for lo := int64(1); lo <= n; lo += fillChunk {
		hi := min(lo+fillChunk-1, n)
		if _, err := d.pool.Exec(ctx, insert, scope, t0, stepUS, lo, hi); err != nil {
			return err
		}
		if n > fillChunk {
			logf("  %s: %d of %d rows", d.name, hi, n)
		}
	}
	return nil
}

// topUp inserts expired keys of shape into scope (created_at in the
// fill's span, newest-span to newest) until at least want are older than
// cutoff, so that every pruning window starts with the same backlog and
// a window after an unpaced loop that emptied it still has work. It
// returns how many it inserted.
func (d *db) topUp(ctx context.Context, logf func(string, ...any), scope, shape string, want int64, cutoff, newest time.Time, span time.Duration) (int64, error) {
	var have int64
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM effectively_keys WHERE scope = $1 AND created_at < $2`, scope, cutoff).Scan(&have); err != nil {
		return 0, err
	}
	if have >= want {
		return 0, nil
	}
	return want - have, d.insertKeys(ctx, logf, scope, shape, want-have, newest, span)
}

// sizes are the key table's relation sizes, in bytes.
type sizes struct {
	heap, pkey, createdAt int64
}

func (s sizes) index() int64 { return s.pkey + s.createdAt }
func (s sizes) total() int64 { return s.heap + s.index() }

func (d *db) sizes(ctx context.Context) (sizes, error) {
	var s sizes
	err := d.pool.QueryRow(ctx, `SELECT pg_relation_size('effectively_keys'), pg_relation_size('effectively_keys_pkey'),
		pg_relation_size('effectively_keys_scope_created_at')`).Scan(&s.heap, &s.pkey, &s.createdAt)
	return s, err
}

// lsn returns the cluster's current WAL insert position.
func (d *db) lsn(ctx context.Context) (string, error) {
	var l string
	err := d.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&l)
	return l, err
}

// walStats is the WAL the cluster wrote between two positions: all of it
// and the full-page images in it (pg_walinspect's pg_get_wal_stats, which
// reads the WAL).
type walStats struct{ bytes, fpiBytes int64 }

// walSince returns the WAL written since from; with fpi, it reads the
// WAL to count the full-page images.
func (d *db) walSince(ctx context.Context, from string, fpi bool) (walStats, error) {
	var w walStats
	if err := d.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, from).Scan(&w.bytes); err != nil || !fpi {
		return w, err
	}
	err := d.pool.QueryRow(ctx, `SELECT coalesce(sum(fpi_size), 0)::bigint FROM pg_get_wal_stats($1::pg_lsn, pg_current_wal_flush_lsn())`, from).Scan(&w.fpiBytes)
	return w, err
}

// quiesce closes d's pool's connections and waits until their backends
// have exited, which flushes their I/O counts to the cumulative
// statistics (a busy backend flushes them at most once a second).
func (d *db) quiesce(ctx context.Context) error {
	d.pool.Reset()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d backends of %s still running 10s after their connections were closed", n, d.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// blocks are the database's block accesses so far: those found in
// shared_buffers and those read from the operating system (its page
// cache, or the disk).
type blocks struct{ hit, read int64 }

func (d *db) blocks(ctx context.Context) (blocks, error) {
	var b blocks
	err := d.pool.QueryRow(ctx, `SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()`).Scan(&b.hit, &b.read)
	return b, err
}

// btree describes the primary key's B-tree (pageinspect's bt_metap and
// pgstattuple's pgstatindex; pgstatindex reads the whole index).
type btree struct {
	levels     int     // the root's level + 1
	leafPages  int64   // leaf pages
	leafFill   float64 // average leaf density, percent
	deleted    int64   // deleted (recyclable) pages
	emptyPages int64   // empty pages
}

func (d *db) btree(ctx context.Context) (btree, error) {
	var b btree
	err := d.pool.QueryRow(ctx, `SELECT tree_level + 1, leaf_pages, avg_leaf_density, deleted_pages, empty_pages
		FROM pgstatindex('effectively_keys_pkey')`).Scan(&b.levels, &b.leafPages, &b.leafFill, &b.deleted, &b.emptyPages)
	return b, err
}

// settingsString lists settings for the report.
func settingsString(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}
