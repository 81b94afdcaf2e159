package pgtest

import (
	"context"

	"effectively.dev/internal/testserver"
)

// CrashRestartFunc crashes the server of a database made by [DedicatedDB]
// and starts it again. Its CrashRestart method makes it a
// conformance.CrashRestarter, so a conformance harness can embed it.
type CrashRestartFunc func(ctx context.Context) error

// CrashRestart calls f(ctx).
func (f CrashRestartFunc) CrashRestart(ctx context.Context) error { return f(ctx) }

// crashRestart returns the function that crashes c with
// [Cluster.StopImmediate] and starts it again.
func crashRestart(c *Cluster) CrashRestartFunc {
	return CrashRestartFunc(testserver.Bound(func() error {
		if err := c.StopImmediate(); err != nil {
			return err
		}
		return c.Restart()
	}))
}
