// Package conformance is the shared test suite that holds code to its
// word under injected faults: every adapter to its declared
// [effects.Contract] ([Run]), every [journal.Journal] to the journal
// protocol ([RunJournal]) and every [effects.Source] to "side effect
// first, then ack" ([RunSource]). A declaration the suite cannot check is
// reported as not verified, never as passed.
//
// An adapter's test implements a [Harness] (build the adapter against its
// backend through the suite's fault injector, produce inputs, count effects
// in the backend itself) and calls [Run], which fails the test when a
// declared field cannot be verified (see "Writing a harness"):
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, "myadapter", func(t testing.TB) conformance.Harness[MyInput] {
//			return newHarness(t) // starts or connects to the backend, cleans up with t.Cleanup
//		})
//	}
//
// # Scenarios
//
// Every scenario is one record: its name, what it needs, the fields it
// verifies, a line of description and the counterexamples it catches;
// the fields logic and the tables of docs/conformance.md derive from the
// records. Every scenario is a
// subtest named after it ([Scenarios]); each swept
// round trip is a subtest of its own (TestConformance/lost-reply/trip-03),
// so go test -run isolates it. The effect suite runs:
//
//   - redelivery: apply, redeliver three times and once to a new instance.
//   - late-redelivery: redeliver to a new instance seconds later on the
//     wall clock ([WithLateRedelivery]).
//   - horizon (needs [Ager]): age the backend to just inside a non-zero
//     Horizon, or by 400 days for Horizon 0 ("kept until pruned", pruning
//     not run), and redeliver: the key must still replay, and with the
//     other payload still be refused where the contract detects reuse.
//   - concurrent-duplicates: 16 goroutines apply one key at once.
//   - lost-reply, cut-request, cancel-mid-apply: count the round trips of a
//     clean Apply (those Make makes excluded), then fault each in turn. An
//     Apply that returned no error must already show its effect in the
//     backend; one that returned ErrTransient must show none, counted
//     again after a quiet period ([WithQuietPeriod]) so that work handed
//     to a background writer is seen (its promise: nothing was applied). Every round trip is faulted twice, on two keys:
//     once the key is retried on the faulted instance itself (a process
//     that survived and retries, as a consumer does), once the faulted
//     instance is closed and the key retried on a new instance, a
//     successor process that knows nothing the faulted one kept in memory.
//     Then the round trips of a duplicate Apply (of a key applied before)
//     are counted and faulted the same way (dup-trip-NN), retried on a new
//     instance: a duplicate takes paths of its own (a lookup, a rollback,
//     a replay), and no fault on them may add an effect or lose the
//     replay of the first Apply's ref.
//   - key-reuse, concurrent-key-reuse: another payload under the same key.
//   - invalid-keys: refused with ErrInvalidKey before any I/O.
//   - distinct-keys: keys that differ only after a common prefix (up to
//     MaxKeyLen), only in letter case, only in Unicode normalization (NFC
//     vs NFD), keys of MaxKeyLen bytes, keys an unescaped URL path or a
//     second decoding merges ('/' and "%2F", what follows '?' or '#', '+'
//     and ' ', dot segments), NewKey parts that differ only in where the
//     separator falls, and pairs whose CRC-32, FNV-32a or FNV-32 collide:
//     each applies once, is counted once and replays on its own, with its
//     first ref (an empty one included).
//   - replay-storm: 1,000 keys, 99% applied first; the warm-up must report
//     every new key applied and grow the backend by exactly that many, the
//     storm only by the new keys, and every key is counted ([BatchCounter]
//     counts them in one look).
//   - backend-restart (needs [Restarter]).
//   - key-capacity: apply a key, then 5,000 other keys
//     ([WithCapacity]), and redeliver the first on the same and on a new
//     instance, then with the other payload: a dedup that keeps only the
//     newest keys forgets it.
//   - crash-restart (needs [CrashRestarter]): apply keys, crash the
//     backend and start it again, count every key before redelivering
//     (an acknowledged effect must survive), then redeliver.
//   - successor-process (needs [Attacher] and [WithSuccessorProcess]): a
//     key applied here is redelivered, and a key whose last reply was
//     lost is retried, in a child process (the test binary run again
//     for the test that called Run), which shares no memory with this
//     one: a dedup whose authority is process memory (a package-level
//     cache, a per-process session id) is caught. The other scenarios'
//     "new instance" is a new instance in the same process.
//   - slow-reply (needs [WithSlowReply]): every reply of an Apply in turn
//     is held past the adapter's own deadline, the connection up, after
//     the backend processed the request ([SlowReply]); giving up must be
//     reported as an unknown outcome, never ErrTransient.
//   - app-faults: every round trip of a clean and of a duplicate Apply in
//     turn is answered by the backend with an application error, the
//     connection up ([AppErrorBefore]: 40001, 40P01, 55P03, busy, 503,
//     409; [AppErrorAfter]: a 500 once the request was applied), through
//     [Faults.RoundTrip], [Faults.SQLConnector] or a server the harness fails on
//     cue ([Faults.SetAppFaulter]); not run when no such fault can fire.
//   - fault-schedules: seeded schedules of several faults of every kind on
//     one key, judged as a whole; a failure is shrunk to the shortest
//     schedule that still fails and printed with its seed
//     ([WithSchedules], [WithScheduleSeed]).
//   - slow-backend: each round trip in turn takes the backend
//     [WithSlowBackend] before it applies the request ([SlowBackend]),
//     while duplicates arrive on two other instances.
//   - hostile-keys: generated pairs of distinct keys (invisible runes,
//     compatibility and case variants, wildcards, paths and escapes,
//     length thresholds and hash collisions past them), each in both
//     orders.
//   - key-bytes (for a [PayloadSizer]): the store filled past the byte
//     budget the harness states with the largest payloads, then the first
//     key redelivered.
//   - key-scope (for a [KeyScoper]): one key in every scope the backend
//     could key by besides the key.
//
// Each asserts against the contract the adapter declares: EffectivelyOnce
// means exactly one effect per key in every scenario; AtLeastOnce means at
// least one, and more only in scenarios the declared duplicate window
// covers; zero effects after a successful Apply always fails. Every call
// into the code under test has a time limit ([WithApplyTimeout]): a call
// that hangs fails as a hang, naming the call and the round trip it was
// on. A scenario's verdict is derived from its checks: a failed check
// fails it; a scenario that was skipped, or made no check, is not run.
// The report says for each field of the contract (guarantee, duplicate
// window, horizon, key reuse) whether the scenarios verified it.
//
// # Capabilities, and the strict rule
//
// Optional interfaces a harness may implement, and options, let more
// scenarios run: [Restarter] (restart the backend), [CrashRestarter] (stop
// it at once, with no clean shutdown, and start it: what a crash loses
// shows), [Attacher] with [WithSuccessorProcess] (a child process reaches
// the backend), [WithSlowReply] (replies held past the adapter's own
// deadline), [Ager] (move the backend's clock or age its records: the
// horizon), [BatchCounter] (count many keys at once); for journals,
// [ClockSkewer] (an instance whose clock runs ahead).
//
// The suite is strict. For the contract the subject declares, every
// scenario that can falsify a field must run, or the field is not
// verified, and [Run], [RunJournal], [RunSource] and [RunPlan] fail the
// test ([Report.Verify]), naming each scenario left out, why, and what to
// give the harness, unless [AllowUnverified] says why it cannot. A
// scenario whose capability is missing, one [Only] left out, and one run
// reduced ([WithCapacity] below 5,000) all leave their fields
// unverified; one that does not apply to the declared contract (nothing
// to check) does not; one go test -run left out makes its fields not
// verified in the report without failing the run (a developer's local
// selection). [Attacher] without [WithSuccessorProcess], or the option
// without the interface, fails the successor-process scenario. A journal
// whose leases are judged by one clock (the database server's) has no
// clock of its own to skew: its harness names clock-skew in
// [AllowUnverified] with that reason, or implements [ClockSkewer] with an
// ordinary instance so that the scenario checks the claim. With
// [ReportOnly] the Run functions fail nothing and only return the report:
// the suite's own tests run its counterexamples so.
//
// # Writing a harness
//
// A harness is judged by what the suite can verify through it. [Run]
// fails the test when a field of the declared contract cannot be verified
// because a scenario it rests on could not run (the harness lacks a
// capability, [Only] left it out, or the adapter's round trips never
// reach the suite's [Faults]), unless the harness says why with
// [AllowUnverified]; the reason is shown in the report and the matrix
// beside each such field.
//
// A round trip is one request to the backend and its reply: what the
// backend may have applied without the adapter learning the outcome if
// the reply is lost. Over a network it is one write followed by the read
// of the reply, on a connection made through [Faults.DialContext] or an
// HTTP transport made by [Faults.Transport]. A backend with no network to
// hook is faulted at its calls instead:
//
//   - a database/sql driver (an embedded database such as SQLite, or a
//     driver whose dialer the harness cannot reach): open the adapter's
//     *sql.DB with sql.OpenDB([Faults.SQLConnector](base)); every driver call
//     (connect, BEGIN, each statement, COMMIT, ROLLBACK) is a round trip;
//   - anything else (a store in process memory, an embedded engine, a
//     client with no dialer): run each call of the backend through
//     [Faults.RoundTrip], which applies the armed fault around it as a
//     network would: it runs and its result is lost, or it never runs, or
//     the caller's context is cancelled once it ran.
//
// The sweeps count the round trips of a clean Apply and fault each; an
// adapter that makes none through f is reported as not run, which fails
// [Run]. A [Restarter] restarts the backend as an operator would: a
// server is stopped and started on the same address; an in-process
// backend closes every handle it has open (the database, its files, its
// connections) and opens them again over the same files or state.
//
// The rules an adapter's classification of errors must follow, which the
// sweeps check:
//
//   - an error before anything was sent (a refused connection, a cut
//     request the backend never received whole, a BEGIN that failed, a
//     statement of a transaction that then rolled back) means nothing was
//     applied: ErrTransient, safe to retry;
//   - an error once the request may have been applied (a lost reply, a
//     timeout or a cancellation while waiting for it, a failed COMMIT) is
//     an unknown outcome: ErrAmbiguous, never ErrTransient and never
//     success;
//   - an error returned by a callback of the user's (the write function
//     run inside the adapter's transaction) is classified by when it
//     happened: before COMMIT nothing was applied, so it is transient
//     unless the callback marked it permanent (class [effects.Permanent]); it
//     is never permanent by default, for a consumer would then give up on
//     a key whose work could succeed;
//   - only a refusal the backend guarantees was not applied (a validation
//     error, ErrKeyReused) is permanent.
//
// # What a black-box suite cannot check
//
// A probabilistic structure sized for production (a Bloom filter for a
// billion keys with a one-in-a-million false-positive rate) will not show
// a false positive among the few thousand keys of a test run. The rule,
// which no test can enforce for you: a probabilistic structure may decide
// only whether to consult the authoritative record (the dedup row, the
// vendor's key store), never whether to skip the effect. A "maybe seen"
// must lead to the record, and a "never seen" may skip only the lookup.
//
// # Journals and sources
//
// A journal's harness opens instances over one backend; a source's
// harness publishes messages and opens consumers that join one group:
//
//	conformance.RunJournal(t, "myjournal", func(t testing.TB) conformance.JournalHarness {
//		return &journalHarness{url: newDatabase(t)} // Open(ctx, faults) (journal.Journal, close, error)
//	})
//	conformance.RunSource(t, "mysource", func(t testing.TB) conformance.SourceHarness {
//		return &sourceHarness{topic: newTopic(t)} // Publish(ctx, n), Open(ctx, faults)
//	})
//
// The journal suite ([JournalScenarios]) verifies a journal's leases,
// its records and their durability:
//
//   - lease, lease-expiry, fencing: a lease excludes other attempts,
//     expires into a takeover with a higher attempt (the fingerprint
//     still checked), and a stale Release frees nothing;
//   - complete-keeps-first-ref, key-reuse, invalid-keys, distinct-keys:
//     Complete keeps the first reference (an empty one marks a key done
//     too), another fingerprint is refused, keys are exact;
//   - concurrent-begin, crashed-holder: one lease among concurrent Begins;
//     a dead holder's key is taken over once its lease ends;
//   - backend-restart, crash-restart (needs [Restarter], [CrashRestarter]):
//     done stays done, a lease stays held;
//   - lookup-mark-done: for a [journal.DoneJournal], Lookup and MarkDone
//     keep the first reference and refuse key reuse (not applicable to
//     other journals);
//   - clock-skew (needs [ClockSkewer]): an instance whose clock runs ahead
//     takes no live lease over;
//   - round-trip-faults: each round trip of Begin, Complete, Release and
//     Lookup in turn lost, cut or the instance's last, the outcome checked
//     from another instance;
//   - attempt-numbers: the attempt rises on every Begin, the same
//     instance re-taking its own lease included.
//
// The source suite ([SourceScenarios]) verifies delivery (nothing
// unacked is lost), acks (nothing acked comes back) and order; a
// redelivered message must carry the body, headers and ordering of its
// first delivery:
//
//   - acked-stay-acked: after a graceful close;
//   - unacked-after-close, unacked-after-crash: unacked deliveries come
//     back;
//   - out-of-order-acks, never-acked: acks out of order never skip one; a
//     delivery never acked is never committed;
//   - revocation: a second instance joins, and nothing unacked is lost;
//   - released: for an [effects.Releaser], a released delivery comes back
//     and is never taken for acked (not applicable to other sources);
//   - publish-order: each Ordering in publish order, first and again;
//   - published-while-running, close-with-prefetched: messages published
//     while an instance runs reach it; a graceful close commits nothing
//     fetched but not handed out.
//   - rebalance-full-buffers (needs [OrderingPublisher]): a second
//     instance joins while the first holds full fetch buffers, unacked
//     deliveries and an idle ordering: nothing unacked is lost, nothing
//     acked comes back.
//
// In every scenario, a redelivery's Attempt must count it: higher than
// the id's delivery before, to this instance or another, for a source
// that counts attempts; 0 again for one that does not know.
//
// # Plans
//
// [RunPlan] holds a composed plan (an [effects.Plan], or a handler built
// on several effects: a [PlanRunner]) to the composite contract it
// declares. Its [PlanHarness] builds the plan with each step's
// connections through [PlanFaults.Step] and counts each step's effects in
// that step's backend. It checks that Contract() names the weakest step
// (plan-contract), redelivers (redelivery), and faults each round trip of
// each step in turn: a lost reply (lost-reply), a cancellation
// (cancel-mid-plan), a killed instance with a successor (kill-mid-plan),
// a request that never reaches its backend (cut-request); runs events
// whose ids differ only in case or normalization (distinct-ids); and, for
// a harness that is an [Ager], ages every step's backend to the plan's
// horizon (horizon).
// Every step effectively-once exactly once, at-least-once more only after
// an unknown outcome in that step, and none skipped ([PlanScenarios]).
//
// # Proofs
//
// The suite is proven by its own tests: the module's tests hold adapters,
// journals and sources that claim more than they do, and the suite must
// fail each in a named scenario. The model of an honest adapter and its
// harness is this package's harness example (Example_harness): a network
// backend dialled through [Faults.DialContext], effects counted in the
// backend, and each error classified by when it happened.
//
// The package depends only on package effects and the standard library, so
// adapters outside this repository can use it.
package conformance
