package kafka

// The share source's lock timing, for tests that let a lock lapse.
var (
	WithRenewBefore = withRenewBefore
	WithLockMargin  = withLockMargin
)
