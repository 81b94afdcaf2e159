package conformance

import "time"

// genConfig holds the options of the generated scenarios: fault
// schedules, application faults, slow backends and hostile keys.
type genConfig struct {
	schedules    int           // WithSchedules; 0: defaultSchedules
	scheduleSeed uint64        // WithScheduleSeed; 0: a new seed each run
	slowBackend  time.Duration // WithSlowBackend; 0: defaultSlowBackend
}

func (g genConfig) scheduleCount() int {
	if g.schedules <= 0 {
		return defaultSchedules
	}
	return g.schedules
}

func (g genConfig) slowBackendTime() time.Duration {
	if g.slowBackend <= 0 {
		return defaultSlowBackend
	}
	return g.slowBackend
}

// WithSchedules sets how many generated fault schedules the
// fault-schedules scenario runs (default 8, sized for
// CI; at least 1). Each schedule puts several faults on one key.
func WithSchedules(n int) EffectOption {
	return opt(func(c *config) {
		if n < 1 {
			c.bad("WithSchedules", "%d: at least 1", n)
		}
		c.gen.schedules = n
	})
}

// WithScheduleSeed makes the fault-schedules scenario draw its schedules
// from seed, seed+1, ... (and hostile-keys its random pairs from seed),
// instead of a new seed each run: with WithSchedules(1), it reruns the
// schedule a failure printed.
func WithScheduleSeed(seed uint64) EffectOption {
	return opt(func(c *config) { c.gen.scheduleSeed = seed })
}

// WithSlowBackend sets how long the slow-backend scenario makes the
// backend work on one request (default 2s): make it
// longer than any lease or lock the adapter or its backend holds while
// it works.
func WithSlowBackend(d time.Duration) EffectOption {
	return opt(func(c *config) {
		if d <= 0 {
			c.bad("WithSlowBackend", "%v: must be positive", d)
		}
		c.gen.slowBackend = d
	})
}
