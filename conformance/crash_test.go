package conformance_test

import "context"

// CrashRestart crashes the ledger service: every connection dropped at
// once, as a killed process drops them. The service writes a record
// before it replies, so a crash keeps what it acknowledged, as a restart
// does (conformance.CrashRestarter: the crash-restart scenario).
func (h *ledgerHarness) CrashRestart(context.Context) error { return h.srv.Restart() }
