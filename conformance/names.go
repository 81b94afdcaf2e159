package conformance

// Scenario names, as they appear in subtest names, reports, [Only] and
// [AllowUnverified]. Names are unique within a suite; suites share some
// ("redelivery", "crash-restart").
const (
	// The effect suite ([Run]).
	ScenarioRedelivery     = "redelivery"
	ScenarioLateRedelivery = "late-redelivery"
	ScenarioHorizon        = "horizon"
	ScenarioConcurrent     = "concurrent-duplicates"
	ScenarioLostReply      = "lost-reply"
	ScenarioCut            = "cut-request"
	ScenarioCancel         = "cancel-mid-apply"
	ScenarioKeyReuse       = "key-reuse"
	ScenarioRaceReuse      = "concurrent-key-reuse"
	ScenarioInvalidKey     = "invalid-keys"
	ScenarioDistinctKeys   = "distinct-keys"
	ScenarioStorm          = "replay-storm"
	ScenarioRestart        = "backend-restart"
	ScenarioSlowReply      = "slow-reply"
	ScenarioKeyCapacity    = "key-capacity"
	ScenarioProcess        = "successor-process"
	ScenarioCrashRestart   = "crash-restart"
	ScenarioSchedules      = "fault-schedules"
	ScenarioAppFaults      = "app-faults"
	ScenarioSlowBackend    = "slow-backend"
	ScenarioHostileKeys    = "hostile-keys"
	ScenarioKeyScope       = "key-scope"
	ScenarioKeyBytes       = "key-bytes"

	// The journal suite ([RunJournal]).
	JournalLease          = "lease"
	JournalLeaseExpiry    = "lease-expiry"
	JournalFencing        = "fencing"
	JournalFirstRef       = "complete-keeps-first-ref"
	JournalKeyReuse       = "key-reuse"
	JournalInvalidKeys    = "invalid-keys"
	JournalDistinctKeys   = "distinct-keys"
	JournalConcurrent     = "concurrent-begin"
	JournalCrashedHolder  = "crashed-holder"
	JournalBackendRestart = "backend-restart"
	JournalLookupMarkDone = "lookup-mark-done"
	JournalTripFaults     = "round-trip-faults"
	JournalAttempts       = "attempt-numbers"
	JournalClockSkew      = "clock-skew"
	JournalCrashRestart   = "crash-restart"

	// The source suite ([RunSource]).
	SourceAckedStayAcked      = "acked-stay-acked"
	SourceUnackedAfterClose   = "unacked-after-close"
	SourceUnackedAfterCrash   = "unacked-after-crash"
	SourceOutOfOrderAcks      = "out-of-order-acks"
	SourceNeverAcked          = "never-acked"
	SourceRevocation          = "revocation"
	SourceReleased            = "released"
	SourcePublishOrder        = "publish-order"
	SourceLivePublish         = "published-while-running"
	SourceCloseWithPrefetched = "close-with-prefetched"
	// A rebalance while an instance's fetch buffers are full and some
	// orderings are idle.
	SourceRebalanceFullBuffers = "rebalance-full-buffers"

	// The plan suite ([RunPlan]).
	PlanDeclared    = "plan-contract"
	PlanRedelivery  = "redelivery"
	PlanLostReply   = "lost-reply"
	PlanCancel      = "cancel-mid-plan"
	PlanKill        = "kill-mid-plan"
	PlanDistinctIDs = "distinct-ids"
	PlanCut         = "cut-request"
	PlanHorizon     = "horizon"
)

// The scenarios of each suite, in the order its Run function runs them.
var (
	Scenarios        = names(effectTable[struct{}]())
	JournalScenarios = names(journalTable())
	SourceScenarios  = names(sourceTable())
	PlanScenarios    = names(planTable[struct{}]())
)
