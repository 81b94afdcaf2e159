package pgtest

import (
	"context"
	"os"
	"testing"

	"effectively.dev/internal/testserver"
)

// CrashRestartFunc crashes the server of a database made by [DedicatedDB]
// and starts it again. Its CrashRestart method makes it a
// conformance.CrashRestarter, so a conformance harness can embed it.
type CrashRestartFunc func(ctx context.Context) error

// CrashRestart calls f(ctx).
func (f CrashRestartFunc) CrashRestart(ctx context.Context) error { return f(ctx) }

// DedicatedCrash returns the function that crashes the cluster of t's
// top-level test ([DedicatedDB]'s) with [Cluster.StopImmediate] (no
// checkpoint, every client cut) and starts it again on the same port,
// which runs crash recovery: committed data survives, UNLOGGED tables
// come back empty. It is nil when DATABASE_URL is set: that server is not
// the test's to crash. Call it after DedicatedDB.
func DedicatedCrash(t testing.TB) CrashRestartFunc {
	t.Helper()
	if os.Getenv("DATABASE_URL") != "" {
		return nil
	}
	c, err := registered(testserver.DedicatedKey(t), Options{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return CrashRestartFunc(testserver.Bound(func() error {
		if err := c.StopImmediate(); err != nil {
			return err
		}
		return c.Restart()
	}))
}
