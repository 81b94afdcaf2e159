package chargehook

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"effectively.dev/kafka/outbox"
	"effectively.dev/postgres"
	"effectively.dev/postgres/pgtest"
)

// dbName is the database the demo creates on its throwaway clusters.
const dbName = "chargehook"

// Tables. The ledgers have no unique index on event_id: nothing but the
// handler keeps a second row for an event out, so the row count is the
// truth about double charges.
const schema = `
CREATE TABLE IF NOT EXISTS chargehook_naive_ledger (
	id bigserial PRIMARY KEY, event_id text NOT NULL, account text NOT NULL,
	cents bigint NOT NULL, payment_intent text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS chargehook_naive_seen (
	event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS chargehook_ledger (
	id bigint PRIMARY KEY, event_id text NOT NULL, account text NOT NULL,
	cents bigint NOT NULL, payment_intent text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
TRUNCATE chargehook_naive_ledger, chargehook_naive_seen, chargehook_ledger;
`

// database is the PostgreSQL one handler's run uses: a primary made for
// it and, with a failover or Config.Standby, one synchronous standby; or
// the server named by Config.DatabaseURL.
type database struct {
	cfg      Config
	external string          // Config.DatabaseURL
	primary  *pgtest.Cluster // the current primary; nil with external
	standby  *pgtest.Cluster // its synchronous standby; nil when none
	clusters []*pgtest.Cluster
}

// startDatabase starts the primary (or checks the external server) and
// creates the schema.
func startDatabase(ctx context.Context, cfg Config) (*database, error) {
	d := &database{cfg: cfg, external: cfg.DatabaseURL}
	if d.external == "" {
		cfg.logf("starting a throwaway PostgreSQL primary")
		c, err := pgtest.New(pgtest.Options{})
		if err != nil {
			return nil, err
		}
		d.primary = c
		d.clusters = append(d.clusters, c)
		if err := c.CreateDatabase(ctx, dbName); err != nil {
			d.close()
			return nil, err
		}
	}
	conn, err := pgx.Connect(ctx, d.adminURL())
	if err != nil {
		d.close()
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if err := postgres.Migrate(ctx, conn); err != nil {
		d.close()
		return nil, err
	}
	if err := outbox.Migrate(ctx, conn); err != nil {
		d.close()
		return nil, err
	}
	if _, err := conn.Exec(ctx, schema); err != nil {
		d.close()
		return nil, fmt.Errorf("creating the demo's tables: %w", err)
	}
	return d, nil
}

// adminURL reaches the current primary alone.
func (d *database) adminURL() string {
	if d.external != "" {
		return d.external
	}
	return d.primary.URL(dbName)
}

// poolURL is what the worker's pool connects with: with a standby, both
// hosts and target_session_attrs=read-write, so that after a failover new
// connections find the promoted standby by themselves.
func (d *database) poolURL() string {
	if d.external != "" {
		return d.external
	}
	hosts := fmt.Sprintf("127.0.0.1:%d", d.primary.Port())
	if d.standby != nil {
		hosts += fmt.Sprintf(",127.0.0.1:%d", d.standby.Port())
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", hosts, dbName)
}

// addStandby starts a standby of the current primary and makes it
// synchronous: from then on every COMMIT the primary acknowledges is on the
// standby too, so a failover loses no acknowledged commit.
func (d *database) addStandby(ctx context.Context) error {
	const name = "chargehook_standby"
	d.cfg.logf("starting a synchronous standby (%s)", name)
	s, err := d.primary.StartStandby(pgtest.Options{Name: name})
	if err != nil {
		return err
	}
	d.clusters = append(d.clusters, s)
	conn, err := pgx.Connect(ctx, d.primary.URL(dbName))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// Set after the base backup, so that the standby, once promoted, does
	// not wait for a standby of its own.
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%q'", name)); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var state string
		err := conn.QueryRow(wait, "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", name).Scan(&state)
		if err == nil && state == "sync" {
			break
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("waiting for %s to become synchronous: %w", name, err)
		}
		select {
		case <-wait.Done():
			return fmt.Errorf("standby %s did not become synchronous: %w", name, wait.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	d.standby = s
	return nil
}

// failover crashes the primary (immediate shutdown: every connection dies
// at once, in-flight transactions with it) and promotes the synchronous
// standby. It returns when the new primary accepts writes.
func (d *database) failover(ctx context.Context) error {
	if d.standby == nil {
		return errors.New("chargehook: failover without a standby")
	}
	if err := d.primary.StopImmediate(); err != nil {
		return err
	}
	// An operator or a failover manager notices the dead primary.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(150 * time.Millisecond):
	}
	if err := d.standby.Promote(ctx); err != nil {
		return err
	}
	d.primary, d.standby = d.standby, nil
	return nil
}

// newPool opens the worker's pool.
func (d *database) newPool(ctx context.Context, workers int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(d.poolURL())
	if err != nil {
		return nil, err
	}
	// A handler holds one connection for the ledger's transaction and
	// borrows others for journal records; the webhook tier needs none.
	pcfg.MaxConns = int32(3*workers + 4)
	pcfg.HealthCheckPeriod = 500 * time.Millisecond
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// close stops every cluster the demo started.
func (d *database) close() {
	for _, c := range d.clusters {
		_ = c.Stop()
	}
	d.clusters = nil
}

// describeDatabase says where the demo's PostgreSQL is, for the report.
func describeDatabase(cfg Config) string {
	if cfg.DatabaseURL != "" {
		u := cfg.DatabaseURL
		if i := strings.Index(u, "@"); i >= 0 {
			u = u[i+1:] // no credentials in the report
		}
		return "DATABASE_URL (" + u + ")"
	}
	return "a throwaway PostgreSQL cluster per run"
}
